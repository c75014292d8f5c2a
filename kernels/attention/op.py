"""Causal softmax attention ``causal_attention``: its input checks, then the public op over two backends.

- "torch": ``naive.causal_attention_ref``, the [T, T] scores materialised.
- "triton": ``triton.causal_attention_triton``, flash-style kernels for tiny heads (a forward, a one-pass backward).
"""

import math

import torch
from mixlab.kernels import triton_utils as tu
from mixlab.kernels._triton import HAS_TRITON
from mixlab.kernels.attention.naive import causal_attention_ref
from mixlab.kernels.attention.triton import MAX_HEAD_DIM, _attn_fwd_kernel, causal_attention_triton
from mixlab.kernels.utils import TRITON_OPS, check_tensor

if HAS_TRITON:
    TRITON_OPS.add("causal_attention")


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> None:
    check_tensor("q", q, 4)
    for name, t in (("k", k), ("v", v)):
        check_tensor(name, t, 4)
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
        if t.shape != q.shape:
            raise ValueError(f"{name} must have q's shape {tuple(q.shape)}, got {tuple(t.shape)}")
        if t.dtype != q.dtype:
            raise ValueError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
    number = isinstance(scale, int | float) and not isinstance(scale, bool)
    if scale is not None and not (number and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number or None, got {scale!r}")


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Causal softmax attention, ``o[t] = sum_{s <= t} softmax_s(scale * q[t] . k[s]) v[s]`` per batch and head.

    Args:
        q, k, v: [B, H, T, hd] float16/bfloat16/float32/float64, one shape and dtype. The Triton backend takes
            them contiguous or as transposed contiguous [B, T, H, hd] without a copy.
        scale: multiplies the scores, > 0; None is hd ** -0.5.
        backend: "torch", "triton" or None (auto, ``kernels.utils.resolve_backend``; float64, and head sizes
            above the kernels' largest (128), stay on "torch" under auto).

    Returns:
        o: [B, H, T, hd] in q's dtype (half types compute in float32), laid out as q on "triton".
    """
    _check_inputs(q, k, v, scale)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if tu.use_triton(backend, "causal_attention", _attn_fwd_kernel, q, k, v):
        if q.shape[-1] <= MAX_HEAD_DIM:
            return causal_attention_triton(q, k, v, scale)
        if backend == "triton":
            raise ValueError(f"backend='triton' takes head sizes up to {MAX_HEAD_DIM}, got {q.shape[-1]}")
    return causal_attention_ref(q, k, v, scale)
