"""The dynamic short causal convolutions ``dynamic_conv_headwise`` and ``dynamic_conv_lowrank``: their input
checks, then the public ops over two backends.

- "torch": ``naive.dynamic_conv_headwise_ref`` and ``naive.dynamic_conv_lowrank_ref``, the weights materialised.
- "triton": ``triton_headwise.headwise_triton`` and ``triton_lowrank.lowrank_triton``, the low-rank weights
  formed on chip.
"""

import torch
from mixlab.kernels import triton_utils as tu
from mixlab.kernels._triton import HAS_TRITON
from mixlab.kernels.dynamic_conv.naive import dynamic_conv_headwise_ref, dynamic_conv_lowrank_ref
from mixlab.kernels.dynamic_conv.triton_headwise import _dynamic_conv_headwise_fwd_kernel, headwise_triton
from mixlab.kernels.dynamic_conv.triton_lowrank import _dynamic_conv_lowrank_fwd_kernel, lowrank_triton
from mixlab.kernels.utils import TRITON_OPS, check_cu_seqlens_eager, check_tensor

if HAS_TRITON:
    TRITON_OPS.update({"dynamic_conv_headwise", "dynamic_conv_lowrank"})


def _check_static_w(static_w: torch.Tensor | None, W: int, x: torch.Tensor) -> None:
    if static_w is None:
        return
    check_tensor("static_w", static_w, 2, x)
    if tuple(static_w.shape) != (W, x.shape[2]):
        raise ValueError(f"static_w must be [W={W}, D={x.shape[2]}], got {tuple(static_w.shape)}")


def _check_headwise(
    x: torch.Tensor, weight: torch.Tensor, static_w: torch.Tensor | None, cu_seqlens: torch.Tensor | None
) -> None:
    check_tensor("x", x, 3)
    check_tensor("weight", weight, 4, x)
    B, T, D = x.shape
    if tuple(weight.shape[:2]) != (B, T):
        raise ValueError(f"weight must be [B={B}, T={T}, H, W], got {tuple(weight.shape)}")
    if D % weight.shape[2]:
        raise ValueError(f"the head count H={weight.shape[2]} of weight must divide D={D}")
    _check_static_w(static_w, weight.shape[3], x)
    check_cu_seqlens_eager(cu_seqlens, x)


def _check_lowrank(
    x: torch.Tensor,
    z: torch.Tensor,
    U: torch.Tensor,
    static_w: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
) -> None:
    check_tensor("x", x, 3)
    check_tensor("z", z, 3, x)
    check_tensor("U", U, 2, x)
    B, T, D = x.shape
    if tuple(z.shape[:2]) != (B, T):
        raise ValueError(f"z must be [B={B}, T={T}, R], got {tuple(z.shape)}")
    if U.shape[0] != z.shape[2] or U.shape[1] % D:
        raise ValueError(f"U must be [R={z.shape[2]}, W*D] with D={D}, got {tuple(U.shape)}")
    _check_static_w(static_w, U.shape[1] // D, x)
    check_cu_seqlens_eager(cu_seqlens, x)


def dynamic_conv_headwise(
    x: torch.Tensor,
    weight: torch.Tensor,
    static_w: torch.Tensor | None = None,
    *,
    cu_seqlens: torch.Tensor | None = None,
    residual: bool = False,
    backend: str | None = None,
) -> torch.Tensor:
    """Causal convolution with one weight per token, head and tap, shared by the D / H channels of a head.

    ``y[b, t, d] = sum_k (weight[b, t, d // (D / H), k] + static_w[k, d]) * x[b, t - k, d]``
    (+ ``x[b, t, d]``).

    Args:
        x: [B, T, D] float16/bfloat16/float32/float64.
        weight: [B, T, H, W], H divides D; tap k of token t multiplies x[t - k].
        static_w: [W, D] added to every token's taps, or None.
        cu_seqlens: int32 [n_docs + 1] offsets into the flattened B*T axis (``kernels.utils``), or None for
            one document per row. Taps that reach before the token's document start read zero.
        residual: add x[t] to the output.
        backend: "torch", "triton" or None (auto, ``kernels.utils.resolve_backend``; float64 stays on
            "torch" under auto, the kernels take float16, bfloat16 and float32).

    Returns:
        y: [B, T, D] in x's dtype (half types compute in float32).
    """
    _check_headwise(x, weight, static_w, cu_seqlens)
    if tu.use_triton(
        backend, "dynamic_conv_headwise", _dynamic_conv_headwise_fwd_kernel, x, weight, static_w
    ):
        return headwise_triton(x, weight, static_w, cu_seqlens, residual)
    return dynamic_conv_headwise_ref(x, weight, static_w, cu_seqlens=cu_seqlens, residual=residual)


def dynamic_conv_lowrank(
    x: torch.Tensor,
    z: torch.Tensor,
    U: torch.Tensor,
    static_w: torch.Tensor | None = None,
    *,
    cu_seqlens: torch.Tensor | None = None,
    residual: bool = False,
    backend: str | None = None,
) -> torch.Tensor:
    """Causal convolution with per-token, per-channel weights of rank R: ``(z @ U).view(B, T, W, D)``.

    ``y[b, t, d] = sum_k ((z @ U).view(B, T, W, D)[b, t, k, d] + static_w[k, d]) * x[b, t - k, d]``
    (+ ``x[b, t, d]``).

    Args:
        x: [B, T, D] float16/bfloat16/float32/float64.
        z: [B, T, R] per-token coefficients.
        U: [R, W * D] basis; column k * D + d is tap k of channel d.
        static_w: [W, D] added to every token's taps, or None.
        cu_seqlens: int32 [n_docs + 1] offsets into the flattened B*T axis (``kernels.utils``), or None for
            one document per row. Taps that reach before the token's document start read zero.
        residual: add x[t] to the output.
        backend: "torch", "triton" or None (auto, ``kernels.utils.resolve_backend``; float64 stays on
            "torch" under auto, the kernels take float16, bfloat16 and float32).

    Returns:
        y: [B, T, D] in x's dtype (half types compute in float32).
    """
    _check_lowrank(x, z, U, static_w, cu_seqlens)
    if tu.use_triton(backend, "dynamic_conv_lowrank", _dynamic_conv_lowrank_fwd_kernel, x, z, U, static_w):
        return lowrank_triton(x, z, U, static_w, cu_seqlens, residual)
    return dynamic_conv_lowrank_ref(x, z, U, static_w, cu_seqlens=cu_seqlens, residual=residual)
