"""A mixer written outside mixlab: gated causal max-pool over a short window, exact per packed document.

    v, g = in_proj(x)                                   # [B, T, D] each
    m[t] = max(v[t], v[t-1], ..., v[t-W+1])             # channel-wise; the window stops at the document start
    out  = out_proj(sigmoid(g) * m)

mixlab's contract for an external mixer: built as ``GatedMaxPool(d_model)`` (mixlab also passes
``conv_width``, a ModelConfig field this signature names);
``forward(x [B, T, D], cu_seqlens=None) -> [B, T, D]``.
Because forward takes ``cu_seqlens`` the mixer claims exact blindness to the other documents of a row;
``leaks_across_documents = False`` says so explicitly. It imports nothing from mixlab.
"""

from __future__ import annotations

import torch
from torch import nn


class GatedMaxPool(nn.Module):
    """Gated causal max-pool over the last conv_width tokens of the same document."""

    leaks_across_documents = False
    bitwise_causal = True

    def __init__(self, d_model: int, conv_width: int = 4) -> None:
        super().__init__()
        if conv_width < 1:
            raise ValueError(f"conv_width must be >= 1, got {conv_width}")
        self.width = conv_width
        self.in_proj = nn.Linear(d_model, 2 * d_model)  # value and gate
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        B, T, D = x.shape
        v, gate = self.in_proj(x).chunk(2, dim=-1)  # [B, T, D] each
        flat = v.reshape(B * T, D)
        token = torch.arange(B * T, device=x.device)  # [B*T]
        if cu_seqlens is None:
            start = token - token % T  # each row one document
        else:
            cu = cu_seqlens.to(device=x.device, dtype=torch.long)
            start = cu[torch.searchsorted(cu, token, right=True) - 1]  # [B*T]: start of each token's document
        taps = [flat]
        for lag in range(1, min(self.width, T)):
            shifted = torch.cat([flat[:lag], flat[:-lag]])  # [B*T, D]: row t holds v[t - lag] (t >= lag)
            inside = (token - lag >= start)[:, None]  # [B*T, 1]
            # where, not a 0/1 product: a tap outside the document is never read, so NaN there stays there
            taps.append(torch.where(inside, shifted, float("-inf")))
        pooled = torch.stack(taps).amax(dim=0)  # [B*T, D]; tap 0 is always inside, so the max is finite
        return self.out_proj(torch.sigmoid(gate) * pooled.view(B, T, D))
