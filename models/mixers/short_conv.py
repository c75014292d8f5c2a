"""Short causal depthwise convolutions: the static and dynamic conv units and the standalone conv mixers.

A conv unit convolves a signal u [B, T, C] along time, residual (u + conv(u), the kernels' residual=True):
    StaticShortConv:      weight [W, C] and an output bias [C], both N(0, 0.02) (the Qwen3 conv study found
                          zero weights without bias clearly worse).
    LowRankDynamicConv:   per-token weights from an affine map of a source x [B, T, D_in]:
                          w[b, t] = ((x A + a) U).view(W, C) + S, A [D_in, R], U [R, W*C]; the map's bias
                          S [W, C] goes to the kernel as static_w: the [B, T, W, C] weights are never built.
    HeadwiseDynamicConv:  w[b, t] = (x G).view(H, W), each weight shared by C/H consecutive channels, plus a
                          per-channel static part S [W, C] (the map's bias, finer than one per head).
Parameters reach the kernels in their own dtype; the kernels compute half inputs in fp32, return u's dtype.
Units share the signature `unit(u, x, cu_seqlens=None)`; x is the source of the dynamic weights (the static
unit ignores it). Inside attention u is the projected [Q, K, V] and x the mixer's input (the block's
normalised input).
"""

from __future__ import annotations

import torch
from mixlab import kernels
from mixlab.models.layers import Linear, Mixer, MixerConfig
from torch import nn

CONV_INIT_STD = 0.02


class StaticShortConv(nn.Module):
    """u + depthwise causal conv(u) + bias on C channels, width W."""

    kernel_op = "short_conv"

    def __init__(self, channels: int, width: int, backend: str | None = None) -> None:
        super().__init__()
        self.backend = backend
        self.weight = nn.Parameter(torch.empty(width, channels))  # tap k multiplies u[t - k]
        self.bias = nn.Parameter(torch.empty(channels))
        nn.init.normal_(self.weight, std=CONV_INIT_STD)
        nn.init.normal_(self.bias, std=CONV_INIT_STD)

    def forward(self, u: torch.Tensor, x: torch.Tensor,
                cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        y = kernels.short_conv(u, self.weight, cu_seqlens=cu_seqlens, residual=True,
                               backend=self.backend)  # [B, T, C]
        return y + self.bias.to(y.dtype)


class LowRankDynamicConv(nn.Module):
    """u + conv(u) with per-token weights ((x A + a) U).view(W, C) + S (module docstring)."""

    kernel_op = "dynamic_conv_lowrank"

    def __init__(self, source_dim: int, channels: int, width: int, rank: int,
                 backend: str | None = None) -> None:
        super().__init__()
        self.backend = backend
        self.to_z = Linear(source_dim, rank)  # z = x A + a
        self.U = nn.Parameter(torch.empty(rank, width * channels))
        self.static_w = nn.Parameter(torch.empty(width, channels))
        nn.init.normal_(self.U, std=CONV_INIT_STD)
        nn.init.normal_(self.static_w, std=CONV_INIT_STD)

    def forward(self, u: torch.Tensor, x: torch.Tensor,
                cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        z = self.to_z(x)  # [B, T, R]
        return kernels.dynamic_conv_lowrank(u, z, self.U, self.static_w, cu_seqlens=cu_seqlens, residual=True,
                                            backend=self.backend)


class HeadwiseDynamicConv(nn.Module):
    """u + conv(u) with per-token, per-head weights (x G).view(H, W) plus a per-channel static S (module
    docstring); H = C / head_size."""

    kernel_op = "dynamic_conv_headwise"

    def __init__(self, source_dim: int, channels: int, width: int, head_size: int,
                 backend: str | None = None) -> None:
        super().__init__()
        if channels % head_size:
            raise ValueError(f"head_size={head_size} does not divide channels={channels}")
        self.backend = backend
        self.n_heads = channels // head_size
        self.width = width
        self.to_w = nn.Linear(source_dim, self.n_heads * width, bias=False)
        self.static_w = nn.Parameter(torch.empty(width, channels))
        nn.init.normal_(self.static_w, std=CONV_INIT_STD)

    def forward(self, u: torch.Tensor, x: torch.Tensor,
                cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        B, T, _ = u.shape
        w = self.to_w(x).view(B, T, self.n_heads, self.width)  # [B, T, H, W]
        return kernels.dynamic_conv_headwise(u, w, self.static_w, cu_seqlens=cu_seqlens,
                                             residual=True, backend=self.backend)


def check_conv_unit(kind: str, config: MixerConfig) -> None:
    """ValueError when conv unit ``kind`` cannot be built on D = config.d_model channels (or a multiple): the
    head-wise conv needs a head size that divides D."""
    if kind == "dynamic_headwise" and config.d_model % config.conv_head_size:
        raise ValueError(f"ModelConfig.conv_head_size={config.conv_head_size} does not divide "
                         f"d_model={config.d_model}")


def make_conv_unit(kind: str, config: MixerConfig, channels: int) -> nn.Module:
    """Conv unit `kind` (static, dynamic_lowrank, dynamic_headwise) on `channels` channels whose dynamic
    weights read a source of width config.d_model."""
    if kind == "static":
        return StaticShortConv(channels, config.conv_width, config.kernel_backend)
    if kind == "dynamic_lowrank":
        return LowRankDynamicConv(config.d_model, channels, config.conv_width, config.conv_rank,
                                  config.kernel_backend)
    if kind == "dynamic_headwise":
        return HeadwiseDynamicConv(config.d_model, channels, config.conv_width, config.conv_head_size,
                                   config.kernel_backend)
    raise ValueError(f"unknown conv kind {kind!r}")


class ShortConvMixer(Mixer):
    """Standalone short-conv mixer: out(x + conv(x) [+ bias]), the conv unit ``conv_kind`` depthwise on the D
    channels of the mixer input (which is also the source of dynamic weights), then a D x D output projection so
    the mixer mixes channels like the others do. No input projection: the block's norm output is convolved
    directly."""

    conv_kind: str

    @classmethod
    def check_config(cls, config: MixerConfig) -> None:
        check_conv_unit(cls.conv_kind, config)

    def __init__(self, config: MixerConfig, layer_idx: int) -> None:
        super().__init__()
        self.conv = make_conv_unit(self.conv_kind, config, config.d_model)
        self.out = nn.Linear(config.d_model, config.d_model, bias=False)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        return self.out(self.conv(x, x, cu_seqlens=cu_seqlens))


class StaticConvMixer(ShortConvMixer):
    """Registry `static_conv`: static depthwise conv mixer, weight and bias N(0, 0.02)."""

    conv_kind = "static"


class DynamicConvMixer(ShortConvMixer):
    """Registry `dynamic_conv`: low-rank (R = conv_rank) dynamic conv mixer."""

    conv_kind = "dynamic_lowrank"


class HeadwiseDynamicConvMixer(ShortConvMixer):
    """Registry `dynamic_conv_headwise`: head-wise (head size conv_head_size) dynamic conv mixer."""

    conv_kind = "dynamic_headwise"
