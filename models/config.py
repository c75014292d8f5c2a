"""ModelConfig: the typed, keyword-only description of a model, saved whole with every result.

The dataclass refuses unknown keys (the constructor raises TypeError; `from_dict` raises ValueError naming
them) and checks every value in `__post_init__`, so a misspelled or impossible setting fails before training.
What depends on the mixer (attention's head count, a qkv conv only for a mixer that takes one) comes from the
declarations of the mixer's class (`models.layers.Mixer`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from mixlab.core.fields import (
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    added_field,
    check_dataclass,
    from_mapping,
)
from mixlab.kernels.utils import BACKENDS
from mixlab.models.mixers import MIXERS, layer_mixers, pattern_classes

QKV_CONVS = ("none", "static", "dynamic_lowrank", "dynamic_headwise")
OBJECTIVES = ("lm", "compression")
KERNEL_BACKENDS = (None, *BACKENDS)  # None: auto
INITS = ("normal", "torch_linear")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Every setting of a mixlab model. Defaults give the MAD protocol's model (docs/mad.md).

    Fields:
        vocab_size: number of token ids; also the output size. Required.
        d_model: residual-stream width D.
        n_layers: number of blocks; each block is a mixer sublayer then an MLP sublayer (mad-lab counts
            these as two "layers", so the MAD model's 4 layers are 2 blocks).
        mixer: name in `models.MIXERS` (attention, static_conv, dynamic_conv, dynamic_conv_headwise,
            rubiconv, fft_conv_leaky, hyena, hyena_leaky, none, and with fla-core gla, gated_delta_net, retnet,
            based, mamba2), the name of an installed `mixlab.mixers` entry point, or an import path
            `package.module:Factory` (`models.resolve_mixer`; checking it imports the plugin); or a hybrid
            stack's per-layer pattern, a comma list of those cycled over the layers ("static_conv,attention":
            attention in every second block; `models.layer_mixers`).
        n_heads: attention heads; D must divide by it and the head size must be even (rotary embedding).
        mlp_hidden: SwiGLU inner width; 0 or None drops the MLP sublayer (and its norm).
        max_seq_len: longest accepted sequence; the long-conv filter length L_F.
        qkv_conv: short conv on Q, K and V after the projection, before RoPE (attention only; in a hybrid stack
            the layers whose mixer takes it): none, static, dynamic_lowrank or dynamic_headwise.
            Residual: X = X + conv(X).
        conv_width: taps W of every short conv (qkv convs and the short-conv mixers).
        conv_rank: rank R of the low-rank dynamic conv's generator D -> R -> W*C.
        conv_head_size: channels sharing one generated weight in the head-wise dynamic conv (H = C / size).
        rope_base: base of the rotary embedding's frequencies.
        norm_eps: epsilon of every RMSNorm.
        init_std: standard deviation of the normal init of every Linear and Embedding weight (of the Embedding
            weight only under ``init="torch_linear"``).
        objective: "lm" (next-token logits) or "compression" (the MAD compression autoencoder).
        kernel_backend: `backend` passed to every kernels call: None (auto), "torch" or "triton".
        init: "normal" (every Linear and Embedding weight N(0, init_std)) or "torch_linear" (Linear weights keep
            PyTorch's default, uniform with std 1/sqrt(3 * fan_in); Embedding weights N(0, init_std)). Linear
            biases start at zero and norm weights at one under both. mad-lab's language model was "normal" when the MAD
            paper's results were made and is "torch_linear" since its commit 756b19f (2024-12-05).
        proj_bias: biases on attention's QKV and output projections and on the LM's output layer (mad-lab's
            language model has them; its SwiGLU has none, as here).
        hyena_order: order N >= 2 of the Hyena operator (mixers hyena, hyena_leaky): N + 1 projected streams,
            N gates, N - 1 long convolutions.
    Fields added after runs were named by their configs (``init``, ``proj_bias``, ``hyena_order``) are left out
    of a planned run's config while they hold their default (``core.fields.added_field``), so those names hold.
    """

    vocab_size: PositiveInt
    d_model: PositiveInt = 128
    n_layers: PositiveInt = 2
    mixer: str = "attention"
    n_heads: PositiveInt = 16
    mlp_hidden: NonNegativeInt | None = 352
    max_seq_len: PositiveInt = 2048
    qkv_conv: Literal[QKV_CONVS] = "none"
    conv_width: PositiveInt = 4
    conv_rank: PositiveInt = 16
    conv_head_size: PositiveInt = 8
    rope_base: PositiveFloat = 10000.0
    norm_eps: PositiveFloat = 1e-5
    init_std: PositiveFloat = 0.02
    objective: Literal[OBJECTIVES] = "lm"
    kernel_backend: Literal[KERNEL_BACKENDS] = None
    init: Literal[INITS] = added_field("normal")
    proj_bias: bool = added_field(False)
    hyena_order: PositiveInt = added_field(2)

    def __post_init__(self) -> None:
        check_dataclass(self)
        try:
            layer_mixers(self.mixer, self.n_layers)
            mixers = pattern_classes(self.mixer).values()
        except ValueError as exc:
            raise ValueError(f"ModelConfig.mixer: {exc}") from exc
        if self.qkv_conv != "none" and not any(mixer.takes_qkv_conv for mixer in mixers):
            takers = " or ".join(f"mixer={name!r}" for name, cls in MIXERS.items() if cls.takes_qkv_conv)
            raise ValueError(f"ModelConfig.qkv_conv={self.qkv_conv!r} needs {takers}, got mixer={self.mixer!r}")
        for mixer in mixers:
            mixer.check_config(self)

    def to_dict(self) -> dict[str, Any]:
        """All fields as a plain dict (JSON-ready)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelConfig:
        """Inverse of `to_dict`; unknown or missing keys raise ValueError naming them."""
        return from_mapping(cls, data)


# The MAD reference models of the dynamic-conv paper (docs/mad.md): fields over the ModelConfig defaults.
PRESETS: dict[str, dict[str, Any]] = {
    "transformer": {"mixer": "attention"},
    "static_conv_qkv": {"mixer": "attention", "qkv_conv": "static"},
    "dynamic_conv_qkv": {"mixer": "attention", "qkv_conv": "dynamic_lowrank", "conv_rank": 16},
    "dynamic_conv_headwise_qkv": {"mixer": "attention", "qkv_conv": "dynamic_headwise"},
    # mad-lab's striped hybrid at the MAD model's two blocks: a Hyena block, then an attention block
    "striped_hyena_attention": {"mixer": "hyena,attention"},
}


def preset_config(name: str, **fields: Any) -> ModelConfig:
    """ModelConfig of preset `name` with `fields` on top: `preset_config("transformer", vocab_size=16)`."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    return ModelConfig.from_dict({**PRESETS[name], **fields})

