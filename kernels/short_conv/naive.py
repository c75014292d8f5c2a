"""Plain-torch reference of the static short causal convolution (lag order: tap k multiplies x[t - k])."""

import torch
from mixlab.kernels.utils import compute_dtype, doc_positions, shift_in_doc


def short_conv_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor | None = None,
    residual: bool = False,
) -> torch.Tensor:
    """y[t, d] = sum_k weight[k, d] * x[t - k, d] (+ x[t, d]); x: [B, T, D], weight: [W, D] -> y: [B, T, D].

    One shifted copy of x per tap; taps before the token's document start read zero. Half types compute in
    float32. Inputs are assumed checked (``kernels.short_conv.op``).
    """
    B, T, _ = x.shape
    dtype = compute_dtype(x)
    pos = None if cu_seqlens is None else doc_positions(cu_seqlens, B, T)  # [B, T]
    with torch.autocast(x.device.type, enabled=False):
        xc = x.to(dtype)  # [B, T, D]
        w = weight.to(dtype)  # [W, D]
        y = xc * w[0]
        for k in range(1, min(w.shape[0], T)):
            y = y + shift_in_doc(xc, k, pos) * w[k]
        if residual:
            y = y + xc
    return y.to(x.dtype)
