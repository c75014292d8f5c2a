"""Gated long-convolution mixer (Hyena-style, order 1) over RubiConv, and its leaky negative control.

    v, g = in_proj(x)                                       # [B, T, D] each
    y    = (longconv(v, h) + skip * v) * g                  # h [D, L_F], skip [D]
    out  = out_proj(y)
`rubiconv` convolves each document on its own (kernels.rubiconv with cu_seqlens: exact per document);
`fft_conv_leaky` is the same layer with one FFT over each whole packed row, so a document's outputs depend on
the documents before it in the row. Both are causal, but only up to rounding (FFT/DFT arithmetic), so both set
`bitwise_causal = False`. The filter reaches the kernel in fp32; half inputs compute in fp32 there.
"""

from __future__ import annotations

import math

import torch
from mixlab import kernels
from mixlab.models.layers import Mixer, MixerConfig
from torch import nn


def decaying_filter(channels: int, length: int) -> torch.Tensor:
    """Init of the explicit filter h [channels, length]: normal taps under a per-channel envelope exp(-r j),
    rates r log-spaced from 1 (about one token) to 1/length (the whole filter), each row scaled to unit L2
    norm so the convolution keeps the input's scale at init."""
    rates = torch.exp(torch.linspace(0.0, -math.log(length), channels))  # [D]
    envelope = torch.exp(-rates[:, None] * torch.arange(length, dtype=torch.float32))  # [D, L_F]
    taps = nn.init.normal_(torch.empty(channels, length)) * envelope
    return taps / taps.norm(dim=1, keepdim=True)


def long_conv(u: torch.Tensor, h: torch.Tensor, skip: torch.Tensor, cu_seqlens: torch.Tensor | None,
              backend: str | None) -> torch.Tensor:
    """rubiconv(u, h) + skip * u: u [B, T, D], h [D, L_F], skip [D] -> [B, T, D]; per document with cu_seqlens,
    one convolution per row without. Taps j >= T never reach a token, so h is cut to T before the transform."""
    y = kernels.rubiconv(u, h[:, :u.shape[1]], cu_seqlens=cu_seqlens, backend=backend)
    return y + skip.to(u.dtype) * u


class GatedLongConv(Mixer):
    """Registry `rubiconv`: gated long conv, exact per document. Filter length L_F = config.max_seq_len."""

    bitwise_causal = False
    stacks_on = (None, "torch")  # kernels.rubiconv's Triton path has no vmap rule (under auto vmap runs torch)
    kernel_op = "rubiconv"

    def __init__(self, config: MixerConfig, layer_idx: int) -> None:
        super().__init__()
        d = config.d_model
        self.backend = config.kernel_backend
        self.in_proj = nn.Linear(d, 2 * d, bias=False)  # value and gate
        self.filter = nn.Parameter(decaying_filter(d, config.max_seq_len))  # [D, L_F]
        self.skip = nn.Parameter(torch.ones(d))  # per-channel skip: starts as a residual around the conv
        self.out_proj = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        v, gate = self.in_proj(x).chunk(2, dim=-1)  # [B, T, D] each
        documents = None if self.leaks_across_documents else cu_seqlens
        return self.out_proj(long_conv(v.contiguous(), self.filter, self.skip, documents, self.backend) * gate)


class LeakyFFTConv(GatedLongConv):
    """Registry `fft_conv_leaky`: GatedLongConv with one FFT per packed row, ignoring document boundaries (the
    negative control for the leakage probes)."""

    leaks_across_documents = True
