"""Causal softmax attention for tiny heads in Triton: the kernels, their launchers and the op with its backward
(``kernels.attention.op`` checks the inputs and picks the backend).

q, k, v, o: [B, H, T, hd], each (batch, head) pair one independent sequence of T rows. With ``c = scale *
log2(e)`` the scores are kept in base-2 units, ``s[t, u] = c * q[t] . k[u]`` for u <= t, so every exponential
is one ``exp2``.

Forward, a program per (row tile of BT queries, PAIRS consecutive pairs), flash-style: the key tiles up to the
diagonal stream past with a running row maximum m, sum l and fp32 accumulator, rescaled as m grows; the
tiles left of the diagonal need no mask, the diagonal tile is masked. Stored: o = acc / l and, per row, the
log-sum-exp ``lse = m + log2(l)`` (fp32 [B, H, T], base 2), so the backward recomputes p = exp2(s - lse)
without a second pass over the row.

Backward, with dp = do @ v^T, delta[t] = sum_d o[t, d] do[t, d] and ds = p * (dp - delta), in one pass: a
program per group of pairs walks each pair's key tiles, and for each the query tiles from the diagonal to T, so p
and ds are computed once per pair of tiles (one exponential a score):
    dk = scale * ds^T @ q        summed in registers over the key tile's query tiles, stored once
    dv = p^T @ do
    dq = scale * ds @ k          partial sums wait in an fp32 scratch [B * H, T, hd] until the query tile's
                                 diagonal, the last key tile it meets, completes them
delta is recomputed per pair of tiles from o and do. Each gradient element is summed by one program in a fixed
order (key tiles in order): no atomics, results are bitwise repeatable.

Head sizes below 16: ``tl.dot`` needs an inner dimension of at least 16, so the head dim is padded to
HDP = max(16, next power of two) with masked loads (zeros add nothing to q . k, and the padded columns of
o, dq, dk, dv are never stored). One code path for every head size, and the products stay on the tensor
cores; elementwise products would move the two [BT, BT, hd] contractions onto the CUDA cores instead.

Layout: the kernels take one set of (batch, head, time) strides for every [B, H, T, hd] tensor, the head dim
contiguous. q may be contiguous or a transposed contiguous [B, T, H, hd] (the mixers' layout, no copy); k, v,
the upstream gradient and every output take q's layout (copied when they differ).

Dots: in the inputs' half type on the tensor cores with fp32 accumulation, p and ds rounded to it first (as
flash attention does); fp32 inputs in exact fp32 products. The interpreter's bf16 ``tl.dot`` is wrong
(Triton 3.9), so there bf16 operands are widened to fp32 after the same rounding.
"""

import math
from dataclasses import dataclass
from functools import partial

import torch
from mixlab.kernels import triton_utils as tu
from mixlab.kernels._triton import tl, triton

# The largest head size the kernels take (registers: [BT, HDP] tiles of q, k, v, do and two accumulators).
MAX_HEAD_DIM = 128
LOG2E = math.log2(math.e)


@dataclass(frozen=True, kw_only=True)
class Tiles:
    """A pass's launch: tiles of BT query and key rows (16 to BT, clamped to T); a program takes one row tile of
    about ``pair_rows`` / (tiles x BT) consecutive (batch, head) pairs (at least one), so short rows do not get
    one tiny program per pair; ``warps`` warps, ``stages`` pipelining stages."""

    BT: int
    pair_rows: int
    warps: int
    stages: int

    def __post_init__(self) -> None:
        tu.check_config(self, ("BT", "warps"))
        if self.BT < 16:
            raise ValueError(f"Tiles.BT must be at least 16 (tl.dot), got {self.BT}")


# pass -> launch settings, chosen by timing on the H100/H200 (see BENCHMARKS.md) at a stack of MAD runs (bf16,
# H=16, hd=8, T=127 and 1023).
CONFIGS = {"fwd": Tiles(BT=64, pair_rows=128, warps=4, stages=2), "bwd": Tiles(BT=64, pair_rows=128, warps=4, stages=1)}


def config_for(backward: bool) -> Tiles:
    """A pass's launch settings: one row each, whatever the shapes."""
    return CONFIGS["bwd" if backward else "fwd"]


@triton.jit
def _dot(a, b, NATIVE_DOT: tl.constexpr, PRECISION: tl.constexpr):
    """a @ b in fp32: on the tensor cores in the operands' half type (NATIVE_DOT), else widened to fp32."""
    if NATIVE_DOT:
        return tl.dot(a, b)
    return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PRECISION)


@triton.jit
def _program_tile(N_TB, BT: tl.constexpr, HDP: tl.constexpr, PAIRS: tl.constexpr):
    """The forward's 1-D grid -> (query tile, first pair, [BT] rows of the tile, [HDP] head-dim offsets, padded
    for tl.dot).

    Tiles vary fastest, so a pair's programs run together and share its rows in L2; the tiles with the most
    work, the last query tiles, go first."""
    i_p = tl.program_id(0)
    i_t = i_p % N_TB
    i_t = N_TB - 1 - i_t
    return i_t, (i_p // N_TB) * PAIRS, i_t * BT + tl.arange(0, BT), tl.arange(0, HDP)


@triton.jit
def _pair(i_bh, H, BH, T, s_b, s_h):
    """Pair i_bh -> (offset of its [T, hd] rows, rows it holds: T, or 0 for a pair past the last one)."""
    i_b, i_h = i_bh // H, i_bh % H
    return i_b.to(tl.int64) * s_b + i_h.to(tl.int64) * s_h, tl.where(i_bh < BH, T, 0)


@triton.jit
def _rows(ptr, base, o_t, m_t, o_d, s_t, HD: tl.constexpr):
    """([BT, HDP] pointers to rows o_t of a pair's [T, HD] block, their mask). Every row starts at a multiple
    of HD elements (``_plan``'s strides are multiples of it), so the loads and stores of a row vectorise."""
    o_row = tl.multiple_of(base + o_t.to(tl.int64) * s_t, HD & -HD)  # [BT]
    return ptr + o_row[:, None] + o_d[None, :], m_t[:, None] & (o_d < HD)[None, :]


@triton.jit
def _load_rows(ptr, base, o_t, m_t, o_d, s_t, HD: tl.constexpr):
    """[BT, HDP] rows o_t of a pair's [T, HD] block, zero past its rows and head dim."""
    p, m = _rows(ptr, base, o_t, m_t, o_d, s_t, HD)
    return tl.load(p, mask=m, other=0.0)


@triton.jit
def _store_rows(ptr, b, base, o_t, m_t, o_d, s_t, HD: tl.constexpr):
    p, m = _rows(ptr, base, o_t, m_t, o_d, s_t, HD)
    tl.store(p, b.to(ptr.dtype.element_ty), mask=m)


@triton.jit
def _key_tile(b_q, k_ptr, v_ptr, base, i_n, n_t, s_t, o_d, HD: tl.constexpr, BT: tl.constexpr,
              NATIVE_DOT: tl.constexpr, PRECISION: tl.constexpr):
    """A pair's key tile i_n..i_n+BT -> ([BT] key rows, k and v [BT, HDP], the products q . k [BT, BT] of the
    query tile b_q with it, unscaled and unmasked: callers scale them by c inside the subtraction that
    precedes exp2, one fused multiply-add an element)."""
    o_n = i_n + tl.arange(0, BT)
    m_n = o_n < n_t
    b_k = _load_rows(k_ptr, base, o_n, m_n, o_d, s_t, HD)
    b_v = _load_rows(v_ptr, base, o_n, m_n, o_d, s_t, HD)
    return o_n, b_k, b_v, _dot(b_q, tl.trans(b_k), NATIVE_DOT, PRECISION)


# fmt: off
@triton.jit
def _fwd_tile(
    b_q, b_m, b_l, b_acc, k_ptr, v_ptr,  # query tile, running state, pointers
    base, o_m, i_n, n_t, s_t, o_d, qk_scale,  # where
    HD: tl.constexpr, BT: tl.constexpr, CAUSAL_MASK: tl.constexpr, NATIVE_DOT: tl.constexpr, PRECISION: tl.constexpr,
):
    """One key tile (rows i_n..i_n+BT) into the running (m, l, acc) of the query tile b_q."""
    o_n, b_k, b_v, b_s = _key_tile(b_q, k_ptr, v_ptr, base, i_n, n_t, s_t, o_d, HD, BT, NATIVE_DOT, PRECISION)
    if CAUSAL_MASK:
        b_s = tl.where(o_m[:, None] >= o_n[None, :], b_s, float("-inf"))
    # finite: key i_n is at or before every query of the tile; c > 0, so max(c s) = c max(s)
    b_mn = tl.maximum(b_m, tl.max(b_s, axis=1) * qk_scale)
    b_p = tl.exp2(b_s * qk_scale - b_mn[:, None])  # [BT, BT]
    b_alpha = tl.exp2(b_m - b_mn)  # [BT], 0 on the first tile (m = -inf)
    b_l = b_l * b_alpha + tl.sum(b_p, axis=1)
    b_pv = _dot(b_p.to(b_v.dtype), b_v, NATIVE_DOT, PRECISION)  # [BT, HDP]
    return b_mn, b_l, b_acc * b_alpha[:, None] + b_pv
# fmt: on


# fmt: off
@triton.jit
def _attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,  # pointers
    T, H, BH, N_TB, s_b, s_h, s_t, qk_scale,  # sizes, strides, scale
    HD: tl.constexpr, HDP: tl.constexpr, BT: tl.constexpr, PAIRS: tl.constexpr,  # tile shape
    NATIVE_DOT: tl.constexpr, PRECISION: tl.constexpr,  # flags
):
    i_t, i_bh0, o_m, o_d = _program_tile(N_TB, BT, HDP, PAIRS)  # o_m: [BT] query rows
    for j in range(PAIRS):
        i_bh = i_bh0 + j
        base, n_t = _pair(i_bh, H, BH, T, s_b, s_h)
        m_m = o_m < n_t
        b_q = _load_rows(q_ptr, base, o_m, m_m, o_d, s_t, HD)  # [BT, HDP]
        b_m = tl.full([BT], float("-inf"), dtype=tl.float32)  # running row maximum
        b_l = tl.zeros([BT], dtype=tl.float32)  # running row sum of exp2(s - m)
        b_acc = tl.zeros([BT, HDP], dtype=tl.float32)
        # key tiles left of the diagonal: every key precedes every query of the tile
        for i_n in range(0, tl.minimum(i_t * BT, n_t), BT):
            b_m, b_l, b_acc = _fwd_tile(b_q, b_m, b_l, b_acc, k_ptr, v_ptr, base, o_m, i_n, n_t, s_t, o_d,
                                        qk_scale, HD, BT, False, NATIVE_DOT, PRECISION)
        b_m, b_l, b_acc = _fwd_tile(b_q, b_m, b_l, b_acc, k_ptr, v_ptr, base, o_m, i_t * BT, n_t, s_t, o_d,
                                    qk_scale, HD, BT, True, NATIVE_DOT, PRECISION)
        _store_rows(o_ptr, b_acc / b_l[:, None], base, o_m, m_m, o_d, s_t, HD)
        tl.store(lse_ptr + i_bh.to(tl.int64) * T + o_m, b_m + tl.log2(b_l), mask=m_m)
# fmt: on


# fmt: off
@triton.jit
def _one_pass_tile(
    b_dk, b_dv, b_k, b_v, q_ptr, o_ptr, do_ptr, lse_ptr, dqa_ptr, dq_ptr,  # key tile state, pointers
    base, row0, o_n, i_n, i_m, n_t, s_t, o_d, scale, qk_scale,  # where
    HD: tl.constexpr, BT: tl.constexpr, DIAGONAL: tl.constexpr, NATIVE_DOT: tl.constexpr, PRECISION: tl.constexpr,
):
    """Query tile i_m against key tile i_n (rows o_n): ds once, into the key tile's (unscaled) dk and dv and the
    query tile's dq; dq's partial sum over key tiles before i_n comes from the scratch dqa and goes back to it,
    or, on the diagonal (the last key tile the query tile meets), out to dq, scaled."""
    o_m = i_m + tl.arange(0, BT)  # [BT] query rows
    m_m = o_m < n_t
    b_q = _load_rows(q_ptr, base, o_m, m_m, o_d, s_t, HD)  # [BT, HDP]
    b_do = _load_rows(do_ptr, base, o_m, m_m, o_d, s_t, HD)
    b_o = _load_rows(o_ptr, base, o_m, m_m, o_d, s_t, HD)
    b_delta = tl.sum(b_o.to(tl.float32) * b_do.to(tl.float32), axis=1)  # [BT]
    # queries past the pair's end get p = exp2(s - inf) = 0
    b_lse = tl.load(lse_ptr + row0 + o_m, mask=m_m, other=float("inf"))
    b_st = _dot(b_k, tl.trans(b_q), NATIVE_DOT, PRECISION)  # [BT keys, BT queries]
    b_pt = tl.exp2(b_st * qk_scale - b_lse[None, :])
    if DIAGONAL:
        b_pt = tl.where(o_m[None, :] >= o_n[:, None], b_pt, 0.0)
    b_dv += _dot(b_pt.to(b_do.dtype), b_do, NATIVE_DOT, PRECISION)
    b_dpt = _dot(b_v, tl.trans(b_do), NATIVE_DOT, PRECISION)  # [BT, BT]
    b_dst = (b_pt * (b_dpt - b_delta[None, :])).to(b_q.dtype)
    b_dk += _dot(b_dst, b_q, NATIVE_DOT, PRECISION)
    b_dq = _dot(tl.trans(b_dst), b_k, NATIVE_DOT, PRECISION)  # [BT queries, HDP]
    # the scratch rows [BT, HD] of the query tile; nothing to read before the first key tile
    p_a = dqa_ptr + (row0 + o_m)[:, None] * HD + o_d[None, :]
    m_a = m_m[:, None] & (o_d < HD)[None, :]
    b_dq += tl.load(p_a, mask=m_a & (i_n > 0), other=0.0)
    if DIAGONAL:
        _store_rows(dq_ptr, b_dq * scale, base, o_m, m_m, o_d, s_t, HD)
    else:
        tl.store(p_a, b_dq, mask=m_a)
    return b_dk, b_dv
# fmt: on


# fmt: off
@triton.jit
def _attn_bwd_one_pass_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, do_ptr, lse_ptr, dqa_ptr, dq_ptr, dk_ptr, dv_ptr,  # pointers
    T, H, BH, s_b, s_h, s_t, scale, qk_scale,  # sizes, strides, scales
    HD: tl.constexpr, HDP: tl.constexpr, BT: tl.constexpr, PAIRS: tl.constexpr,  # tile shape
    NATIVE_DOT: tl.constexpr, PRECISION: tl.constexpr,  # flags
):
    o_d = tl.arange(0, HDP)
    for j in range(PAIRS):
        i_bh = tl.program_id(0) * PAIRS + j
        base, n_t = _pair(i_bh, H, BH, T, s_b, s_h)
        row0 = i_bh.to(tl.int64) * T  # the pair's first row of lse and of the scratch
        for i_n in range(0, n_t, BT):
            o_n = i_n + tl.arange(0, BT)  # [BT] key rows
            m_n = o_n < n_t
            b_k = _load_rows(k_ptr, base, o_n, m_n, o_d, s_t, HD)  # [BT, HDP]
            b_v = _load_rows(v_ptr, base, o_n, m_n, o_d, s_t, HD)
            b_dk = tl.zeros([BT, HDP], dtype=tl.float32)
            b_dv = tl.zeros([BT, HDP], dtype=tl.float32)
            # the scratch the previous key tile stored is read below, maybe by other threads of the program
            tl.debug_barrier()
            b_dk, b_dv = _one_pass_tile(b_dk, b_dv, b_k, b_v, q_ptr, o_ptr, do_ptr, lse_ptr, dqa_ptr, dq_ptr, base,
                                        row0, o_n, i_n, i_n, n_t, s_t, o_d, scale, qk_scale, HD, BT, True,
                                        NATIVE_DOT, PRECISION)
            # query tiles right of the diagonal: every query follows every key of the tile
            for i_m in range(i_n + BT, n_t, BT):
                b_dk, b_dv = _one_pass_tile(b_dk, b_dv, b_k, b_v, q_ptr, o_ptr, do_ptr, lse_ptr, dqa_ptr, dq_ptr,
                                            base, row0, o_n, i_n, i_m, n_t, s_t, o_d, scale, qk_scale, HD, BT,
                                            False, NATIVE_DOT, PRECISION)
            _store_rows(dk_ptr, b_dk * scale, base, o_n, m_n, o_d, s_t, HD)
            _store_rows(dv_ptr, b_dv, base, o_n, m_n, o_d, s_t, HD)
# fmt: on


# ---- host side: layouts, launchers, autograd ----


def _dense(q: torch.Tensor) -> torch.Tensor:
    """q if it is contiguous [B, H, T, hd] or a transposed contiguous [B, T, H, hd], else a contiguous copy."""
    return q if q.is_contiguous() or q.transpose(1, 2).is_contiguous() else q.contiguous()


def _empty_as(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An output shaped and laid out as ``ref`` (a ``_dense`` [B, H, T, hd]), NaN-filled in tests."""
    B, H, T, hd = ref.shape
    if ref.is_contiguous():
        return tu.empty((B, H, T, hd), dtype, ref.device)
    return tu.empty((B, T, H, hd), dtype, ref.device).transpose(1, 2)


def _as_layout(t: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """t in ref's layout, so that one set of strides serves both: t itself, or a copy."""
    return t if t.stride() == ref.stride() else _empty_as(ref, t.dtype).copy_(t)


def _plan(q: torch.Tensor, config: Tiles) -> tuple[tuple[int, ...], dict]:
    """(grid, the launch arguments every kernel shares after its pointers) for q: [B, H, T, hd] under a pass's
    launch settings."""
    B, H, T, hd = q.shape
    BT, HDP = tu.tiles(T, hd, config.BT, MAX_HEAD_DIM)
    n_tb = tu.cdiv(T, BT)
    pairs = max(1, config.pair_rows // (n_tb * BT))
    # a _dense q's strides, written out: every one a multiple of hd (_rows relies on it), whatever the strides
    # torch keeps for axes of size 1 (whose only index is 0)
    s_b, s_h, s_t = (H * T * hd, T * hd, hd) if q.is_contiguous() else (T * H * hd, hd, H * hd)
    native = q.dtype == torch.float16 or (q.dtype == torch.bfloat16 and not tu.is_interpreted(_attn_fwd_kernel))
    sizes = {"T": T, "H": H, "BH": B * H, "N_TB": n_tb, "s_b": s_b, "s_h": s_h, "s_t": s_t}
    tile = {"HD": hd, "HDP": HDP, "BT": BT, "PAIRS": pairs, "NATIVE_DOT": native,
            "PRECISION": tu.dot_precision(q)}
    return (n_tb * tu.cdiv(B * H, pairs),), sizes | tile


def _attention_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, *, config: Tiles | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k, v: [B, H, T, hd] -> (o [B, H, T, hd] in q's dtype and layout, lse fp32 [B, H, T] in base 2).
    ``config``: the launch, by default ``config_for``'s."""
    config = config or config_for(False)
    q = _dense(q)
    k, v = _as_layout(k, q), _as_layout(v, q)
    B, H, T, _ = q.shape
    o = _empty_as(q, q.dtype)
    lse = tu.empty((B, H, T), torch.float32, q.device)
    grid, args = _plan(q, config)
    _attn_fwd_kernel[grid](q, k, v, o, lse, **args, qk_scale=scale * LOG2E, num_warps=config.warps,
                           num_stages=config.stages)
    return o, lse


def _attention_bwd(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    scale: float,
    *,
    config: Tiles | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """do and the forward's q, k, v, o, lse -> (dq, dk, dv) [B, H, T, hd] in q's dtype and layout. ``config`` as
    ``_attention_fwd``'s."""
    config = config or config_for(True)
    q = _dense(q)
    k, v, o, do = (_as_layout(t, q) for t in (k, v, o, do))
    B, H, T, hd = q.shape
    dq, dk, dv = (_empty_as(q, q.dtype) for _ in range(3))
    _, args = _plan(q, config)
    dq_partial = tu.empty((B * H, T, hd), torch.float32, q.device)
    whole_pairs = {name: value for name, value in args.items() if name != "N_TB"}  # a program per pair group
    _attn_bwd_one_pass_kernel[(tu.cdiv(B * H, args["PAIRS"]),)](
        q, k, v, o, do, lse, dq_partial, dq, dk, dv, **whole_pairs, scale=scale, qk_scale=scale * LOG2E,
        num_warps=config.warps, num_stages=config.stages)
    return dq, dk, dv


def _setup_context(ctx, inputs: tuple, output: tuple) -> None:
    q, k, v, scale = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.scale = scale
    ctx.mark_non_differentiable(lse)


def _backward(bwd, ctx, do: torch.Tensor, _dlse: torch.Tensor | None) -> tuple:
    q, k, v, o, lse = ctx.saved_tensors
    return (*bwd(do, q, k, v, o, lse, ctx.scale), None)


def _fake_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    q = _dense(q)
    return _empty_as(q, q.dtype), q.new_empty(q.shape[:3], dtype=torch.float32)


def _fake_bwd(do: torch.Tensor, q: torch.Tensor, *args) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = _dense(q)
    return _empty_as(q, q.dtype), _empty_as(q, q.dtype), _empty_as(q, q.dtype)


def _fold_runs(info, in_dims: tuple, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    """vmap rule: stacked runs share no weights here, so the run axis folds into the batch axis and the
    kernels launch once; every pair meets the same arithmetic as in a run alone."""
    folded = []
    for t, dim in zip((q, k, v), in_dims[:3], strict=True):
        t = t.movedim(dim, 0) if dim is not None else t.expand(info.batch_size, *t.shape)
        folded.append(t.reshape(-1, *t.shape[2:]))  # [R * B, H, T, hd]
    o, lse = _fwd_op(*folded, scale)
    return (o.unflatten(0, (info.batch_size, -1)), lse.unflatten(0, (info.batch_size, -1))), (0, 0)


# The custom ops serve torch.compile graphs and torch.func.vmap (stacked runs); eager calls go through the
# autograd.Function straight to the launchers. Both share _setup_context and _backward.
_fwd_op = torch.library.custom_op("mixlab::causal_attention", tu.op_function(_attention_fwd), mutates_args=())
_bwd_op = torch.library.custom_op("mixlab::causal_attention_bwd", tu.op_function(_attention_bwd), mutates_args=())
_fwd_op.register_fake(_fake_fwd)
_bwd_op.register_fake(_fake_bwd)
_fwd_op.register_autograd(partial(_backward, _bwd_op), setup_context=_setup_context)
_fwd_op.register_vmap(_fold_runs)


class _CausalAttention(torch.autograd.Function):
    forward = staticmethod(tu.op_function(_attention_fwd))  # apply binds every parameter: the launch's default
    setup_context = staticmethod(_setup_context)
    backward = staticmethod(partial(_backward, _attention_bwd))


def causal_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q, k, v: [B, H, T, hd] (checked by the public op) -> o: [B, H, T, hd] in q's dtype."""
    if torch.compiler.is_compiling() or tu.in_transform():
        return _fwd_op(q, k, v, scale)[0]
    return _CausalAttention.apply(q, k, v, scale)[0]
