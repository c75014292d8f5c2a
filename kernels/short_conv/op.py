"""The static short causal convolution ``short_conv``: its input checks, then the public op over two backends.

- "torch": ``naive.short_conv_ref``, one shifted copy of x per tap.
- "triton": ``triton.short_conv_triton``, a forward and a backward kernel.
"""

import torch
from mixlab.kernels import triton_utils as tu
from mixlab.kernels._triton import HAS_TRITON
from mixlab.kernels.short_conv.naive import short_conv_ref
from mixlab.kernels.short_conv.triton import _short_conv_fwd_kernel, short_conv_triton
from mixlab.kernels.utils import TRITON_OPS, check_cu_seqlens_eager, check_tensor

if HAS_TRITON:
    TRITON_OPS.add("short_conv")


def _check_inputs(x: torch.Tensor, weight: torch.Tensor, cu_seqlens: torch.Tensor | None) -> None:
    check_tensor("x", x, 3)
    check_tensor("weight", weight, 2, x)
    if weight.shape[1] != x.shape[2]:
        raise ValueError(f"weight must be [W, D={x.shape[2]}], got {tuple(weight.shape)}")
    check_cu_seqlens_eager(cu_seqlens, x)


def short_conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor | None = None,
    residual: bool = False,
    backend: str | None = None,
) -> torch.Tensor:
    """Depthwise causal convolution, ``y[t, d] = sum_k weight[k, d] * x[t - k, d]`` (+ ``x[t, d]``).

    Args:
        x: [B, T, D] float16/bfloat16/float32/float64.
        weight: [W, D]; tap k multiplies x[t - k].
        cu_seqlens: int32 [n_docs + 1] offsets into the flattened B*T axis (``kernels.utils``), or None for
            one document per row. Taps that reach before the token's document start read zero.
        residual: add x[t] to the output.
        backend: "torch", "triton" or None (auto, ``kernels.utils.resolve_backend``; float64 stays on
            "torch" under auto, the kernels take float16, bfloat16 and float32).

    Returns:
        y: [B, T, D] in x's dtype (half types compute in float32).
    """
    _check_inputs(x, weight, cu_seqlens)
    if tu.use_triton(backend, "short_conv", _short_conv_fwd_kernel, x, weight):
        return short_conv_triton(x, weight, cu_seqlens, residual)
    return short_conv_ref(x, weight, cu_seqlens=cu_seqlens, residual=residual)
