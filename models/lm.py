"""The small models: a pre-norm LM and the MAD compression autoencoder, and `build_model`.

Both embed tokens, run `config.n_layers` Blocks with the configured mixer (or per-layer mixers), and take
`model(input_ids [B, T], doc_ids [B, T] | None, positions [B, S] | None) -> logits [B, T, V]`, or [B, S, V] at
those positions only (the LM runs its norm and head there alone). doc_ids are turned into cu_seqlens once per
forward and handed to every mixer; the training loops pass ``cu_seqlens=`` instead, built on the host with a
static length (``kernels.utils.rows_cu_seqlens``). Every Embedding weight starts N(0, config.init_std), every
Linear weight too under ``config.init="normal"`` or PyTorch's default under "torch_linear"; Linear biases start at zero;
mixer-specific parameters (conv weights, long filters) keep their modules' own init.
"""

from __future__ import annotations

import torch
from mixlab import kernels
from mixlab.models.config import ModelConfig
from mixlab.models.layers import Block, Linear, Mixer, RMSNorm, sincos_embedding
from mixlab.models.mixers import layer_mixers, resolve_mixer
from torch import nn


def init_weights(model: nn.Module, config: ModelConfig) -> None:
    """Normal(0, init_std) on every Embedding weight and, under ``init="normal"``, on every Linear weight
    (under "torch_linear" they keep the init nn.Linear gave them); zero on Linear biases."""
    normal = nn.Linear | nn.Embedding if config.init == "normal" else nn.Embedding
    for module in model.modules():
        if isinstance(module, normal):
            nn.init.normal_(module.weight, std=config.init_std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)


def count_parameters(model: nn.Module) -> int:
    """Number of scalar parameters (each shared tensor counted once)."""
    return sum(p.numel() for p in model.parameters())


class _BlockStack(nn.Module):
    """Token embedding + Blocks; `encode` checks the inputs and returns the last block's states."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        names = layer_mixers(config.mixer, config.n_layers)  # one per block: a hybrid stack's pattern, cycled
        self.blocks = nn.ModuleList(Block(config, i, resolve_mixer(name)) for i, name in enumerate(names))

    def encode(self, input_ids: torch.Tensor, doc_ids: torch.Tensor | None,
               cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> states [B, T, D] after the last block, cu_seqlens (int32 [n_docs + 1]) or None. The layout comes
        as doc_ids or, already converted (``kernels.utils.rows_cu_seqlens``), as cu_seqlens."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, T], got shape {tuple(input_ids.shape)}")
        if input_ids.shape[1] > self.config.max_seq_len:
            raise ValueError(f"sequence length {input_ids.shape[1]} exceeds "
                             f"max_seq_len={self.config.max_seq_len}")
        if doc_ids is not None and cu_seqlens is not None:
            raise ValueError("give the layout as doc_ids or as cu_seqlens, not both")
        if doc_ids is not None:
            if doc_ids.shape != input_ids.shape:
                raise ValueError(f"doc_ids shape {tuple(doc_ids.shape)} != input_ids shape "
                                 f"{tuple(input_ids.shape)}")
            cu_seqlens = kernels.utils.doc_ids_to_cu_seqlens(doc_ids)
        x = self.embed(input_ids)  # [B, T, D]
        for block in self.blocks:
            x = block(x, cu_seqlens=cu_seqlens)
        return x, cu_seqlens


class LanguageModel(_BlockStack):
    """Blocks -> final RMSNorm -> untied linear head (biased with ``proj_bias``): next-token logits [B, T, V]."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.head = Linear(config.d_model, config.vocab_size, bias=config.proj_bias)
        init_weights(self, config)

    def forward(self, input_ids: torch.Tensor, doc_ids: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        x, _ = self.encode(input_ids, doc_ids, cu_seqlens)
        if positions is not None:  # norm and head are per token: run them at these positions only
            x = x.gather(1, positions[..., None].expand(-1, -1, x.shape[-1]))  # [B, S, D]
        return self.head(self.norm(x))  # [B, T or S, V]


class CompressionAutoencoder(_BlockStack):
    """MAD compression model (docs/mad.md; mad-lab `AutoEncoder` with global_pool="last").

    Encoder: the Blocks; the state at the last position of each document (each row without doc_ids) is the
    code. Decoder, for every position p of that document (p counted from the document's start):
    (code + sincos(p)) -> RMSNorm -> Linear -> GELU -> RMSNorm -> Linear -> GELU -> RMSNorm -> Linear(D, V).
    The decoder's Linear layers carry biases, as in mad-lab.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        d, eps = config.d_model, config.norm_eps
        self.decoder = nn.Sequential(
            RMSNorm(d, eps), Linear(d, d), nn.GELU(),
            RMSNorm(d, eps), Linear(d, d), nn.GELU(),
            RMSNorm(d, eps), Linear(d, config.vocab_size),
        )
        init_weights(self, config)

    def forward(self, input_ids: torch.Tensor, doc_ids: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        x, cu_seqlens = self.encode(input_ids, doc_ids, cu_seqlens)
        B, T, D = x.shape
        if cu_seqlens is None:
            # Each row is one document: its code is the row's last state. No searchsorted here: inductor cannot
            # lower it on a sliced boundary tensor, and the MAD stacks compile this path.
            code = x[:, -1:].expand(B, T, D).reshape(B * T, D)  # [B*T, D]
            position = torch.arange(T, device=x.device).repeat(B)  # [B*T]
        else:
            cu = cu_seqlens.long()
            token = torch.arange(B * T, device=x.device)
            doc = torch.searchsorted(cu[1:], token, right=True)  # [B*T]: the document holding each token
            code = x.reshape(B * T, D)[cu[1:][doc] - 1]  # [B*T, D]: state at its document's last position
            position = token - cu[:-1][doc]
        h = code + sincos_embedding(position, D).to(code.dtype)
        logits = self.decoder(h).view(B, T, -1)  # [B, T, V]
        if positions is None:
            return logits
        return logits.gather(1, positions[..., None].expand(-1, -1, logits.shape[-1]))  # [B, S, V]


def build_model(config: ModelConfig, *, fold_runs: bool = False) -> nn.Module:
    """The model of `config`: LanguageModel for objective "lm", CompressionAutoencoder for "compression".

    ``fold_runs``: the model runs under ``torch.func.vmap`` over stacked runs (``runners.train.engine``) and every
    mixer may fold the run axis into its batch axis (``Mixer.fold_runs``); the parameters and their init do not
    change."""
    if not isinstance(config, ModelConfig):
        raise ValueError(f"build_model needs a ModelConfig, got {type(config).__name__}")
    model = CompressionAutoencoder(config) if config.objective == "compression" else LanguageModel(config)
    for module in model.modules():
        if isinstance(module, Mixer):
            module.fold_runs = fold_runs
    return model
