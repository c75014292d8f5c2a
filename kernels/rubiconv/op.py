"""RubiConv over packed documents: input checks, then the public op.

The Triton/GEMM kernels (SPEC 5.2) arrive with issue #5; until then ``backend="torch"``
(``naive.rubiconv_ref``, exact per-document FFT convolution) is the only implementation.
"""

import torch

from kernels.rubiconv.naive import rubiconv_ref
from kernels.utils import check_cu_seqlens, check_tensor, resolve_backend


def _check_inputs(x: torch.Tensor, h: torch.Tensor, cu_seqlens: torch.Tensor | None, block: int | None) -> None:
    check_tensor("x", x, 3)
    check_tensor("h", h, 2, x)
    if h.shape[0] != x.shape[2]:
        raise ValueError(f"h must be [D={x.shape[2]}, L_F], got {tuple(h.shape)}")
    if block is not None and (isinstance(block, bool) or not isinstance(block, int) or block < 1):
        raise ValueError(f"block must be a positive int or None, got {block!r}")
    check_cu_seqlens(cu_seqlens, x)


def rubiconv(
    x: torch.Tensor,
    h: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor | None = None,
    block: int | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Long depthwise causal convolution that restarts at every document start.

    ``y[t, d] = sum_{j=0}^{min(L_F - 1, t - start(doc(t)))} h[d, j] * x[t - j, d]``.

    Args:
        x: [B, T, D] float16/bfloat16/float32/float64.
        h: [D, L_F] filter, tap j multiplies x[t - j]; L_F may exceed T.
        cu_seqlens: int32 [n_docs + 1] offsets into the flattened B*T axis (``kernels.utils``), or None for
            one document per row.
        block: column count k of the GEMM-form DFT (SPEC 5.2), used by the kernels of issue #5; positive int
            or None. The torch backend ignores it.
        backend: "torch", "triton" or None (auto, ``kernels.utils.resolve_backend``).

    Returns:
        y: [B, T, D] in x's dtype (half types compute in float32).
    """
    _check_inputs(x, h, cu_seqlens, block)
    if resolve_backend(backend, x, op="rubiconv") == "triton":
        raise NotImplementedError("rubiconv: the Triton backend arrives with issue #5")
    return rubiconv_ref(x, h, cu_seqlens=cu_seqlens)
