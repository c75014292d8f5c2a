"""Building blocks shared by the mixers and the models: the Mixer base (with what every mixer declares about
itself), the biased Linear, RMSNorm, SwiGLU, rotary and sin-cos position features, and the pre-norm Block."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F
from mixlab.kernels.utils import BACKENDS
from torch import nn


class MixerConfig(Protocol):
    """A ``models.ModelConfig`` as the mixers and the Block see it: they read its fields by name. A protocol, so
    neither this module nor the mixers import ``models.config``, which imports them to check its ``mixer``."""


class Mixer(nn.Module):
    """Base of every sequence mixer: `forward(x [B, T, D], cu_seqlens=None) -> [B, T, D]`.

    `cu_seqlens` (int32 [n_docs + 1], offsets into the flattened B*T axis, every row end included) marks the
    packed documents; without it each row is one document.

    A mixer states what it is on its class, the one place ModelConfig, ``runners.train.engine`` and
    ``analysis.leakage`` read it from (before any module is built), so a new built-in mixer is its module plus
    one line of the registry ``models.mixers.MIXERS``:
        leaks_across_documents: False means each document's outputs are exactly (bitwise, NaN-proof)
            independent of every other document when cu_seqlens is given.
        bitwise_causal: True means outputs before t are bitwise independent of the input at t; FFT-based
            convolutions are causal only up to rounding, so they set it False.
        stacks_on: the ``kernel_backend`` values (None: auto) under which runs of it train stacked in
            ``runners.train.engine`` (``torch.func.vmap``); every one unless a kernel it calls has no vmap rule there
            (RubiConv's Triton path); empty for a mixer whose forward is not known to run under vmap.
        stacks_with_documents: runs of it on packed documents stack too (each run's ``cu_seqlens`` reaches it
            batched under vmap: its ops with a host-side layout go once per run, ``kernels.triton_utils.per_run``).
        takes_qkv_conv: it reads ``ModelConfig.qkv_conv`` (attention); the config refuses a qkv conv for any
            other mixer.
        auto_compiles: ``--speed auto`` compiles the stacks of models that use it on CUDA (``runners.train.speed``);
            False where compiling was timed not to help, so auto leaves those stacks eager.
        check_config(config): ValueError, one line naming the field, for a config it cannot be built from
            (attention's head count).
        available(): False when an optional dependency it needs is not installed (the fla-core baselines);
            ``mixlab leakage --mixer all`` then leaves it out and its check_config says what to install.
        extra: the optional extra of mixlab that installs that dependency (``pip install 'mixlab[EXTRA]'``;
            ``mixlab mixers list`` names it), None for a mixer that needs none.
    An instance's ``fold_runs`` (False unless ``models.build_model(config, fold_runs=True)`` set it, as the stacked
    engine does on CUDA) says that its forward runs under ``torch.func.vmap`` over stacked runs and may fold the
    run axis into the batch axis where its kernels need that (attention's fused SDPA); other mixers ignore it.
    A submodule that calls an op of ``mixlab.kernels`` (or of fla-core: ``models.mixers.fla_ops.KERNEL_OPS``)
    passes its attribute ``backend`` to the call and names the op in its attribute ``kernel_op``, so a caller
    can pick the backend per op (``analysis.leakage.use_backend``).
    """

    leaks_across_documents = False
    bitwise_causal = True
    stacks_on: tuple[str | None, ...] = (None, *BACKENDS)
    stacks_with_documents = True
    takes_qkv_conv = False
    auto_compiles = True
    extra: str | None = None
    fold_runs = False

    @classmethod
    def check_config(cls, config: MixerConfig) -> None:
        """Nothing to check beyond ModelConfig's own checks."""

    @classmethod
    def available(cls) -> bool:
        """Every dependency is installed."""
        return True


class Linear(nn.Linear):
    """nn.Linear whose bias is added after the matmul, in the matmul's output dtype: x W^T, then + b.

    Every Linear with a bias in the models is this one. Under bf16 autocast nn.Linear casts its bias with the
    matmul (bf16 out), but under ``torch.func.vmap`` (stacked runs, ``runners.train.engine``) linear's batch rule
    splits into a matmul, which autocast casts, and an add of the still-fp32 bias, which promotes the output to
    fp32: every op downstream then ran in fp32 (on an H200 that made 18 stacked MAD transformers 3.3x slower)
    and a stacked run no longer matched the run alone. Spelled as two ops, both paths compute the same thing.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        return y if self.bias is None else y + self.bias.to(y.dtype)


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last dim, computed in fp32 and returned in the input's dtype."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)); gate and up are one fused [D -> 2 * hidden] projection."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)  # [B, T, hidden] each
        return self.down(F.silu(gate) * up)


def rope_cos_sin(length: int, dim: int, base: float,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [length, dim] (fp32) of the rotary embedding for positions 0..length-1.

    Rotate-half layout: channel i and channel i + dim/2 form one pair, with frequency base^(-2i/dim).
    """
    inv_freq = base ** (-torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)  # [dim/2]
    angles = torch.arange(length, device=device, dtype=torch.float32)[:, None] * inv_freq  # [L, dim/2]
    angles = torch.cat([angles, angles], dim=-1)  # [L, dim]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [N, L, H, dim] by the tables [L, dim] (positions along dim 1), in fp32."""
    x32 = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat([-x32[..., half:], x32[..., :half]], dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]  # [L, 1, dim]: broadcast over heads
    return (x32 * cos + rotated * sin).to(x.dtype)


def sincos_embedding(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Fixed sinusoidal features [N, dim] (fp32) of integer positions [N]: [sin(p w_i), cos(p w_i)],
    w_i = 10000^(-i / (dim/2)); an odd dim gets one zero channel."""
    half = dim // 2
    freq = torch.exp(-math.log(10000.0) * torch.arange(half, device=positions.device) / max(half, 1))
    angles = positions.float()[:, None] * freq  # [N, half]
    emb = torch.cat([angles.sin(), angles.cos()], dim=-1)  # [N, 2 * half]
    return F.pad(emb, (0, dim - 2 * half))


class Block(nn.Module):
    """Pre-norm residual block: x = x + mixer(norm(x)); x = x + mlp(norm(x)).

    `mixer_factory(config, layer_idx) -> Mixer` builds the sequence mixer (mamba's create_block pattern), so a
    new mixer needs no change here. With `config.mlp_hidden` 0 or None the MLP sublayer is left out.
    """

    def __init__(self, config: MixerConfig, layer_idx: int, mixer_factory: Callable[..., Mixer]) -> None:
        super().__init__()
        self.mixer_norm = RMSNorm(config.d_model, config.norm_eps)
        self.mixer = mixer_factory(config, layer_idx)
        if config.mlp_hidden:
            self.mlp_norm = RMSNorm(config.d_model, config.norm_eps)
            self.mlp = SwiGLU(config.d_model, config.mlp_hidden)
        else:
            self.mlp_norm = self.mlp = None

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.mixer(self.mixer_norm(x), cu_seqlens=cu_seqlens)  # [B, T, D]
        if self.mlp is not None:
            x = x + self.mlp(self.mlp_norm(x))
        return x
