"""RubiConv over packed documents: input checks, then the public op over three backends.

- "torch": ``naive.rubiconv_ref``, an exact FFT convolution per document (float64 stays float64).
- "gemm": ``gemm.rubiconv_gemm``, the block-diagonal DFT (docs/rubiconv.md) in torch matmuls (autograd backward).
- "triton": ``triton.rubiconv_triton``, the same GEMM form in three fused Triton kernels with a hand-written
  backward.
The GEMM backends share one ``gemm.RubiPlan`` per layout (cached), which also picks the block k.
"""

import torch
from mixlab.kernels import triton_utils as tu
from mixlab.kernels._triton import HAS_TRITON
from mixlab.kernels.rubiconv.gemm import MAX_BLOCK, MIN_BLOCK, PRECISIONS, get_plan, rubiconv_gemm
from mixlab.kernels.rubiconv.naive import rubiconv_ref
from mixlab.kernels.rubiconv.triton import _rubi_spectrum_kernel, rubiconv_triton, rubiconv_triton_in_transform
from mixlab.kernels.utils import RUBICONV_BACKENDS, TRITON_OPS, check_cu_seqlens, check_tensor

if HAS_TRITON:
    TRITON_OPS.add("rubiconv")


def _check_inputs(
    x: torch.Tensor, h: torch.Tensor, cu_seqlens: torch.Tensor | None, block: int | None, precision: str
) -> None:
    check_tensor("x", x, 3)
    check_tensor("h", h, 2, x)
    if h.shape[0] != x.shape[2]:
        raise ValueError(f"h must be [D={x.shape[2]}, L_F], got {tuple(h.shape)}")
    if block is not None and (isinstance(block, bool) or not isinstance(block, int) or block < 1):
        raise ValueError(f"block must be a positive int or None, got {block!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected {' or '.join(PRECISIONS)}")
    check_cu_seqlens(cu_seqlens, x)


def _rubiconv_plain(x: torch.Tensor, h: torch.Tensor, cu_seqlens: torch.Tensor, backend: str | None) -> torch.Tensor:
    """One run's packed call of ``rubiconv`` (plain tensors: Triton on CUDA under auto)."""
    return rubiconv(x, h, cu_seqlens=cu_seqlens, backend=backend)


# Stacked runs with documents: each run's layout is its own, read on the host, so the runs go one at a time.
_rubiconv_per_run = tu.per_run("rubiconv_per_run", _rubiconv_plain)


def rubiconv(
    x: torch.Tensor,
    h: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor | None = None,
    block: int | None = None,
    backend: str | None = None,
    precision: str = "fp32",
) -> torch.Tensor:
    """Long depthwise causal convolution that restarts at every document start.

    ``y[t, d] = sum_{j=0}^{min(L_F - 1, t - start(doc(t)))} h[d, j] * x[t - j, d]``.

    Args:
        x: [B, T, D] float16/bfloat16/float32/float64.
        h: [D, L_F] filter, tap j multiplies x[t - j]; L_F may exceed T.
        cu_seqlens: int32 [n_docs + 1] offsets into the flattened B*T axis (``kernels.utils``), or None for
            one document per row.
        block: column count k of the GEMM form (docs/rubiconv.md), or None: the smallest power of two whose square
            covers the longest padded document, within [16, 512]. "gemm" takes any positive k, "triton" a
            power of two in [16, 512]; "torch" ignores it.
        backend: "torch", "gemm", "triton" or None (auto, ``kernels.utils.resolve_backend``: "triton" on CUDA
            for float16/bfloat16/float32, else "torch"; "torch" under ``torch.func.vmap``).
        precision: GEMM precision of "gemm" and "triton": "fp32" (fp32 spectra; Triton dots in tf32, torch
            matmuls under torch's float32 matmul setting) or "bf16" (bfloat16 operands, fp32 accumulation).
            float64 inputs to "gemm" compute in float64 whatever the precision.

    Returns:
        y: [B, T, D] in x's dtype (half types compute in float32).
    """
    _check_inputs(x, h, cu_seqlens, block, precision)
    B, T, _ = x.shape
    if backend == "gemm":
        return rubiconv_gemm(x, h, get_plan(cu_seqlens, B, T, h.shape[1], block, x.device), precision)
    if backend is not None and backend not in RUBICONV_BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected {', '.join(RUBICONV_BACKENDS)}")
    if cu_seqlens is not None and (tu.is_batched(x) or tu.is_batched(cu_seqlens)):
        return _rubiconv_per_run(x, h, cu_seqlens, backend)
    if backend is None and tu.is_batched(x):
        # stacked runs (torch.func.vmap) without documents: the Triton path (an autograd.Function over host-side
        # plans) has no vmap rule, the reference batches its FFTs
        return rubiconv_ref(x, h)
    if tu.use_triton(backend, "rubiconv", _rubi_spectrum_kernel, x, h):
        if block is not None and (block & (block - 1) or not MIN_BLOCK <= block <= MAX_BLOCK):
            raise ValueError(f"backend='triton' takes a power-of-two block in [16, 512], got {block}")
        if tu.in_transform():  # a stacked run's call from the per-run vmap rule: the custom op
            return rubiconv_triton_in_transform(x, h, cu_seqlens, block, precision)
        return rubiconv_triton(x, h, get_plan(cu_seqlens, B, T, h.shape[1], block, x.device), precision)
    return rubiconv_ref(x, h, cu_seqlens=cu_seqlens)
