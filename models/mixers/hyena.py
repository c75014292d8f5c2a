"""The Hyena operator (Poli et al. 2023, *Hyena Hierarchy*) of order N over RubiConv, and its leaky negative control.

    x_0, ..., x_{N-1}, v = short_conv(in_proj(u))          # N + 1 streams [B, T, D]; depthwise, causal
    z = v
    for n = N-1, ..., 1:
        z = longconv(x_n * z, h_n) + skip_n * (x_n * z)   # h_n [D, L_F], skip_n [D]
    out = out_proj(x_0 * z)

Order 2 (the default, ``ModelConfig.hyena_order``) is ``out_proj(q * (h * (k * v) + skip * k * v))`` with
q = x_0, k = x_1: N + 1 streams, N gates and N - 1 long convolutions, as the authors' reference implementation
computes it (the short conv of v stands for the first filter of the paper's recurrence). The short conv is our
residual static conv unit (``short_conv.StaticShortConv``: u + conv(u) + bias, width ``conv_width``) on all
(N + 1) D channels at once; it gives k and q the token shift that associative recall needs. The long filters
are explicit, as in our ``rubiconv`` mixer (``long_conv.decaying_filter``: decaying normal taps, unit norm), one
[D, L_F] filter per long convolution, and the skip starts at 1.

`hyena` computes every long convolution per document (kernels.rubiconv with cu_seqlens: exact);
`hyena_leaky` with one FFT over each packed row, so a document reads the documents before it in its row. Both
keep the short convs document-aware, so the leak is the long convolution's alone. FFT arithmetic is causal up
to rounding only, so both set `bitwise_causal = False`.
"""

from __future__ import annotations

import torch
from mixlab.models.layers import Mixer, MixerConfig
from mixlab.models.mixers.long_conv import GatedLongConv, decaying_filter, long_conv
from mixlab.models.mixers.short_conv import StaticShortConv
from torch import nn


class Hyena(Mixer):
    """Registry `hyena`: the Hyena operator of order N = config.hyena_order, exact per document."""

    bitwise_causal = False
    stacks_on = GatedLongConv.stacks_on  # the long convolutions are RubiConv's; the short conv has a vmap rule
    kernel_op = "rubiconv"

    @classmethod
    def check_config(cls, config: MixerConfig) -> None:
        if config.hyena_order < 2:
            raise ValueError(f"ModelConfig.hyena_order must be >= 2 (one long convolution), "
                             f"got {config.hyena_order}")

    def __init__(self, config: MixerConfig, layer_idx: int) -> None:
        super().__init__()
        d, order = config.d_model, config.hyena_order
        self.backend = config.kernel_backend
        self.streams = order + 1
        self.in_proj = nn.Linear(d, self.streams * d, bias=False)  # x_0 .. x_{N-1}, v
        self.short_conv = StaticShortConv(self.streams * d, config.conv_width, config.kernel_backend)
        filters = [decaying_filter(d, config.max_seq_len) for _ in range(order - 1)]
        self.filters = nn.Parameter(torch.stack(filters))  # [N-1, D, L_F], filters[o] is applied o-th
        self.skip = nn.Parameter(torch.ones(order - 1, d))  # [N-1, D]
        self.out_proj = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        u = self.short_conv(self.in_proj(x), x, cu_seqlens=cu_seqlens)  # [B, T, (N+1) D]
        *gates, z = u.chunk(self.streams, dim=-1)  # N + 1 streams [B, T, D]
        documents = None if self.leaks_across_documents else cu_seqlens
        for o, gate in enumerate(reversed(gates[1:])):  # x_{N-1} first, x_1 last
            z = long_conv(gate * z, self.filters[o], self.skip[o], documents, self.backend)
        return self.out_proj(gates[0] * z)


class HyenaLeaky(Hyena):
    """Registry `hyena_leaky`: Hyena with one FFT per packed row in its long convolutions, ignoring document
    boundaries (the negative control for the leakage probes and the packed tasks)."""

    leaks_across_documents = True
