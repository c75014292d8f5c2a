"""Shared pieces of the short-convolution Triton kernels: document bounds found inside a kernel, the tile and
chunk plans, output allocation and the backend/dtype gate.

Documents: a kernel gets ``cu_seqlens`` itself (int32 [n_docs + 1]) and binary-searches it for the tokens
of its tile (``doc_bounds``), so no per-token tensor is built on the host: a packed call costs no extra
launch.
Without ``cu_seqlens`` every row is one document.

Reductions over tokens (weight gradients) never use atomics: the token tiles are split into a fixed number of
contiguous chunks (``chunk_plan``, a function of the shape only), each program sums its chunk in a fixed order
into an fp32 partial, and the host sums the partials with ``torch.sum``. Results are bitwise reproducible.
"""

import torch
import triton
import triton.language as tl

from kernels.utils import resolve_backend

TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Tests set this to True: every buffer a launcher allocates then starts full of NaN, so an element a kernel
# forgets to write shows up as a non-finite result.
POISON_OUTPUTS = False
# About how many programs a backward launch aims for; the fewer, the smaller the fp32 partial buffers.
BWD_PROGRAMS = 1024


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.empty, or a NaN-filled buffer while POISON_OUTPUTS is set."""
    out = torch.empty(shape, dtype=dtype, device=device)
    if POISON_OUTPUTS:
        out.fill_(float("nan"))
    return out


def is_interpreted(kernel) -> bool:
    """True when ``kernel`` runs under the Triton interpreter (TRITON_INTERPRET=1 at import time)."""
    return type(kernel).__name__ == "InterpretedFunction"


def use_triton(backend: str | None, op: str, kernel, *tensors: torch.Tensor | None) -> bool:
    """Whether ``op`` runs its Triton kernel on these inputs (the first is x).

    Follows ``resolve_backend``; the kernels take float16, bfloat16 and float32, so under auto (None) a
    float64 input runs the reference and an explicit ``backend="triton"`` raises ValueError. A CPU tensor
    needs the interpreter (TRITON_INTERPRET=1 set before ``kernels`` is imported).
    """
    x = tensors[0]
    if resolve_backend(backend, x, op=op) != "triton":
        return False
    for t in tensors:
        if t is not None and t.dtype not in TRITON_DTYPES:
            if backend is None:
                return False
            raise ValueError(f"{op}: backend='triton' takes float16, bfloat16 or float32, got {t.dtype}")
    if not x.is_cuda and not is_interpreted(kernel):
        raise ValueError(
            f"{op}: backend='triton' on a {x.device.type} tensor needs TRITON_INTERPRET=1 set before kernels "
            "is imported"
        )
    return True


def search_steps(cu_seqlens: torch.Tensor | None) -> tuple[int, int]:
    """(offsets, binary-search steps) for ``doc_bounds``: ceil(log2(n_docs)) steps find any token's
    document."""
    if cu_seqlens is None:
        return 0, 0
    n_cu = cu_seqlens.numel()
    return n_cu, (n_cu - 2).bit_length()


def chunk_plan(n_tiles: int, n_cols: int, programs: int | None = None) -> tuple[int, int]:
    """(tiles per chunk, chunks): ``n_tiles`` token tiles in contiguous chunks, about ``programs`` (default
    BWD_PROGRAMS) programs over ``n_cols`` column blocks. A function of the shape only, so results never
    depend on scheduling."""
    programs = BWD_PROGRAMS if programs is None else programs
    n_chunks = max(1, min(n_tiles, programs // n_cols))
    per_chunk = triton.cdiv(n_tiles, n_chunks)
    return per_chunk, triton.cdiv(n_tiles, per_chunk)


def dot_precision(x: torch.Tensor) -> str:
    """tl.dot input precision: exact fp32 products for fp32 results; tf32 (exact on bf16/fp16 inputs, 10-bit
    mantissa on fp32 intermediates) when the result is rounded to a half type anyway."""
    return "ieee" if x.dtype == torch.float32 else "tf32"


@triton.jit
def doc_bounds(cu_ptr, o_g, row_start, T, N_CU, N_SEARCH, HAS_CU: tl.constexpr):
    """[BT] tokens on the flattened B*T axis -> ([BT] start, [BT] end) of each token's document.

    With cu_seqlens: the last offset <= token (so empty documents are skipped) and the next one. The search
    keeps cu[lo] <= token < cu[hi]; extra steps leave it unchanged, and indices stay inside cu_seqlens for
    masked-out tokens past B*T too.
    """
    if HAS_CU:
        lo = tl.zeros_like(o_g)
        hi = lo + (N_CU - 1)
        for _ in range(N_SEARCH):
            mid = (lo + hi) // 2
            right = tl.load(cu_ptr + mid) <= o_g
            lo = tl.where(right, mid, lo)
            hi = tl.where(right, hi, mid)
        start = tl.load(cu_ptr + lo)
        end = tl.load(cu_ptr + lo + 1)
    else:
        start = tl.zeros_like(o_g) + row_start
        end = start + T
    return start, end


@triton.jit
def chunk_tile(i_c, j, TPC, N_TB, T, N_TOK, BT: tl.constexpr):
    """Tile j of chunk i_c -> (row, [BT] tokens on the B*T axis, [BT] mask).

    Tiles are numbered row by row (N_TB per row); a chunk's tail past the last tile (tokens >= N_TOK = B*T)
    is masked out. The mask compares two vectors: the interpreter turns vector & scalar bools into int32."""
    q = i_c * TPC + j
    i_b = q // N_TB
    o_t = (q % N_TB) * BT + tl.arange(0, BT)  # [BT] positions in the row
    o_g = i_b * T + o_t
    return i_b, o_g, (o_t < T) & (o_g < N_TOK)
