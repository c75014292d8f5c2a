"""Plain-torch references of the dynamic (per-token weight) short causal convolutions.

Both follow the static convolution's lag order (tap k multiplies x[t - k]); the weight of every tap is the one
of the output token t. Head-wise: channel d uses head d // (D / H). Low-rank: the weights are (z @ U) viewed
as [B, T, W, D], materialised here (the Triton kernel keeps them on chip).
"""

import torch
from mixlab.kernels.utils import compute_dtype, doc_positions, shift_in_doc


def dynamic_conv_headwise_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    static_w: torch.Tensor | None = None,
    *,
    cu_seqlens: torch.Tensor | None = None,
    residual: bool = False,
) -> torch.Tensor:
    """x: [B, T, D], weight: [B, T, H, W], static_w: [W, D] or None -> y: [B, T, D].

    y[b, t, d] = sum_k (weight[b, t, d // (D / H), k] + static_w[k, d]) * x[b, t - k, d] (+ x[b, t, d]).
    """
    B, T, D = x.shape
    H, W = weight.shape[2], weight.shape[3]
    dtype = compute_dtype(x)
    pos = None if cu_seqlens is None else doc_positions(cu_seqlens, B, T)  # [B, T]
    with torch.autocast(x.device.type, enabled=False):
        xc = x.to(dtype)  # [B, T, D]
        w = weight.to(dtype)  # [B, T, H, W]
        sw = None if static_w is None else static_w.to(dtype).reshape(W, H, D // H)  # [W, H, D/H]
        y = torch.zeros(B, T, H, D // H, dtype=dtype, device=x.device)
        for k in range(min(W, T)):
            w_k = w[..., k, None]  # [B, T, H, 1], broadcast over the channels of the head
            if sw is not None:
                w_k = w_k + sw[k]  # [B, T, H, D/H]
            y = y + shift_in_doc(xc, k, pos).reshape(B, T, H, D // H) * w_k
        y = y.reshape(B, T, D)
        if residual:
            y = y + xc
    return y.to(x.dtype)


def dynamic_conv_lowrank_ref(
    x: torch.Tensor,
    z: torch.Tensor,
    U: torch.Tensor,
    static_w: torch.Tensor | None = None,
    *,
    cu_seqlens: torch.Tensor | None = None,
    residual: bool = False,
) -> torch.Tensor:
    """x: [B, T, D], z: [B, T, R], U: [R, W * D], static_w: [W, D] or None -> y: [B, T, D].

    y[b, t, d] = sum_k ((z @ U).view(B, T, W, D)[b, t, k, d] + static_w[k, d]) * x[b, t - k, d]
    (+ x[b, t, d]).
    """
    B, T, D = x.shape
    W = U.shape[1] // D
    dtype = compute_dtype(x)
    pos = None if cu_seqlens is None else doc_positions(cu_seqlens, B, T)  # [B, T]
    with torch.autocast(x.device.type, enabled=False):
        xc = x.to(dtype)  # [B, T, D]
        w = (z.to(dtype) @ U.to(dtype)).reshape(B, T, W, D)  # [B, T, W, D]
        if static_w is not None:
            w = w + static_w.to(dtype)
        y = torch.zeros_like(xc)
        for k in range(min(W, T)):
            y = y + shift_in_doc(xc, k, pos) * w[:, :, k]
        if residual:
            y = y + xc
    return y.to(x.dtype)
