"""RubiConv's GEMM form (``kernels.rubiconv.gemm``, docs/rubiconv.md) with its stages fused in three Triton kernels.

Complex values are two planes of one buffer ``[2, n_cols, k, D]`` (real, imaginary), one half column (k tokens
x D channels) contiguous per plane, numbered as in ``gemm.RubiPlan``. The padded input never exists (the block
stage reads x with a mask); the forward writes the half spectrum twice and reads it twice: block stage ->
fused F_k stage (forward DFT, product, inverse DFT, all on chip) -> inverse block stage.

    _rubi_block_fwd_kernel  Z[c] = tw[c] * sum_b w_m^(b c) X[b]; a program: one document, BC half columns,
                            BN of the k*D values of a column (contiguous in memory)
    _rubi_spectrum_kernel   a program: one half column, BD channels, chunks of BKD frequency rows d:
        MODE_CONV           S = F_k Z; W = S * Hs (conj(Hs) for dx); O += conj(F_k)[:, d] W; O *= conj(tw);
                            with STORE_S also S itself, in fp32
        MODE_SPECTRUM       Hs = alpha_c / P * F_k Z, the filter spectra (one half-column set per m)
        MODE_CORRELATE      W = alpha_c / P * sum over the m-group's documents of Sdy conj(Sx), the F_k
                            products MODE_CONV stored, then as MODE_CONV: dh's spectrum, one half-column set
                            per m
    _rubi_block_inv_kernel  y[b] = sum_c Re(w_m^(-b c) O[c]); a program: one output document, BB columns,
                            BN values; REDUCE adds every m-group's dh piece (its first `reach` taps)

Backward: dx is the forward pipeline on dy with conj(Hs); dh correlates dy's and x's spectra, summed per m-group
before one inverse transform per group. Where dh is wanted the forward's F_k stage also stores x's S = F_k Z (fp32,
as large as Z in fp32), and the dx stage dy's, so the correlation only multiplies stored spectra and transforms
back (without dx the dx stage still runs, for dy's S). No atomics: every sum has a fixed order, so results are
bitwise reproducible.

Precision "fp32": fp32 spectra and tf32 dots, every operand rounded to the nearest tf32 first (the tensor
cores would truncate, and that bias adds up to ~3.5e-3 over the stages instead of ~6e-4). "bf16": bfloat16
spectra and DFT tables, fp32 accumulation. Twiddles, scales and the spectrum product are fp32 throughout.
"""

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from mixlab.kernels import triton_utils as tu
from mixlab.kernels._triton import tl, triton
from mixlab.kernels.rubiconv.gemm import RubiPlan, get_plan
from mixlab.kernels.utils import host_to_device

# F_k-stage modes (module docstring); constexpr globals so the kernel can compare against them
MODE_CONV, MODE_SPECTRUM, MODE_CORRELATE = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


@triton.jit
def _operand(b, table_ptr, TF32: tl.constexpr, UPCAST: tl.constexpr):
    """A dot operand in the tables' dtype. TF32: round fp32 to the nearest tf32 (tensor cores read only the
    top 19 bits of an fp32 operand, a truncation whose bias adds up over the stages). UPCAST: widen bfloat16
    back to fp32, as the interpreter's dot cannot take bfloat16."""
    b = b.to(table_ptr.dtype.element_ty)
    if TF32:
        b = ((b.to(tl.int32, bitcast=True) + 0x1000) & -8192).to(tl.float32, bitcast=True)
    if UPCAST:
        b = b.to(tl.float32)
    return b


@triton.jit
def _rubi_block_fwd_kernel(
    x_ptr,
    z_ptr,
    item_ptr,
    start_ptr,
    len_ptr,
    m_ptr,
    col_ptr,
    gcol_ptr,
    blk_ptr,
    br_ptr,
    bi_ptr,
    twr_ptr,
    twi_ptr,
    D,
    Z_PLANE,
    N_ITEMS,
    K: tl.constexpr,
    BC: tl.constexpr,
    BB: tl.constexpr,
    BN: tl.constexpr,
    DOT_PREC: tl.constexpr,
    TF32: tl.constexpr,
    UPCAST: tl.constexpr,
):
    # item_ptr [2, N_ITEMS]: each program's document and tile of its half columns (``_items``)
    i_item, i_n = tl.program_id(0), tl.program_id(1)
    i_doc, i_c = tl.load(item_ptr + i_item), tl.load(item_ptr + N_ITEMS + i_item)
    m = tl.load(m_ptr + i_doc)
    mh = m // 2 + 1
    start = tl.load(start_ptr + i_doc).to(tl.int64)
    L = tl.load(len_ptr + i_doc)
    blk = tl.load(blk_ptr + i_doc)
    o_c = i_c * BC + tl.arange(0, BC)  # [BC] half columns
    o_n = i_n * BN + tl.arange(0, BN)  # [BN] values of a column: token a = n // D, channel n % D
    o_a = o_n // D
    m_c, m_n = o_c < mh, o_n < K * D
    b_zr = tl.zeros([BC, BN], dtype=tl.float32)
    b_zi = tl.zeros([BC, BN], dtype=tl.float32)
    for b0 in range(0, m, BB):
        o_b = b0 + tl.arange(0, BB)  # [BB] columns of the padded document
        m_cb = m_c[:, None] & (o_b < m)[None, :]
        p_blk = blk + o_c[:, None] * m + o_b[None, :]
        b_br = _operand(tl.load(br_ptr + p_blk, mask=m_cb, other=0.0), br_ptr, False, UPCAST)  # [BC, BB]
        b_bi = _operand(tl.load(bi_ptr + p_blk, mask=m_cb, other=0.0), br_ptr, False, UPCAST)
        # tokens past the document end are the zero padding
        m_x = (o_a[None, :] + K * o_b[:, None] < L) & m_n[None, :]
        p_x = x_ptr + (start + K * o_b[:, None]) * D + o_n[None, :]
        b_x = _operand(tl.load(p_x, mask=m_x, other=0.0), br_ptr, TF32, UPCAST)  # [BB, BN]
        b_zr = tl.dot(b_br, b_x, b_zr, input_precision=DOT_PREC)
        b_zi = tl.dot(b_bi, b_x, b_zi, input_precision=DOT_PREC)
    # twiddle w_P^(a c): row gcol + c of the table of this column count
    m_cn = m_c[:, None] & m_n[None, :]
    p_tw = (tl.load(gcol_ptr + i_doc) + o_c)[:, None] * K + o_a[None, :]
    b_tr = tl.load(twr_ptr + p_tw, mask=m_cn, other=0.0)  # [BC, BN]
    b_ti = tl.load(twi_ptr + p_tw, mask=m_cn, other=0.0)
    col = tl.load(col_ptr + i_doc)
    p_z = z_ptr + (col + o_c).to(tl.int64)[:, None] * (K * D) + o_n[None, :]
    tl.store(p_z, (b_zr * b_tr - b_zi * b_ti).to(z_ptr.dtype.element_ty), mask=m_cn)
    tl.store(p_z + Z_PLANE, (b_zr * b_ti + b_zi * b_tr).to(z_ptr.dtype.element_ty), mask=m_cn)


@triton.jit
def _dft_rows(
    fr_ptr, fi_ptr, z_ptr, Z_PLANE, col, o_r, o_d, m_d, D,
    K: tl.constexpr, BKD: tl.constexpr, BKA: tl.constexpr, BD: tl.constexpr, DOT_PREC: tl.constexpr,
    TF32: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """Rows o_r ([BKD] frequencies) of F_k times half column ``col`` of a spectrum -> ([BKD, BD] re, im).
    Every dot accumulates in place (a negated operand, not a subtraction); the tables come already rounded
    to the dot precision."""
    b_sr = tl.zeros([BKD, BD], dtype=tl.float32)
    b_si = tl.zeros([BKD, BD], dtype=tl.float32)
    p_col = z_ptr + col.to(tl.int64) * (K * D)
    for a0 in range(0, K, BKA):
        o_a = a0 + tl.arange(0, BKA)
        p_f = o_r[:, None] * K + o_a[None, :]
        b_fr = _operand(tl.load(fr_ptr + p_f), fr_ptr, False, UPCAST)  # [BKD, BKA]
        b_fi = _operand(tl.load(fi_ptr + p_f), fr_ptr, False, UPCAST)
        p_z = p_col + o_a[:, None] * D + o_d[None, :]
        b_zr = _operand(tl.load(p_z, mask=m_d[None, :], other=0.0), fr_ptr, TF32, UPCAST)  # [BKA, BD]
        b_zi = _operand(tl.load(p_z + Z_PLANE, mask=m_d[None, :], other=0.0), fr_ptr, TF32, UPCAST)
        b_sr = tl.dot(b_fr, b_zr, b_sr, input_precision=DOT_PREC)
        b_sr = tl.dot(-b_fi, b_zi, b_sr, input_precision=DOT_PREC)
        b_si = tl.dot(b_fr, b_zi, b_si, input_precision=DOT_PREC)
        b_si = tl.dot(b_fi, b_zr, b_si, input_precision=DOT_PREC)
    return b_sr, b_si


@triton.jit
def _rubi_spectrum_kernel(
    z_ptr,
    zx_ptr,
    hs_ptr,
    out_ptr,
    s_ptr,
    fr_ptr,
    fi_ptr,
    twr_ptr,
    twi_ptr,
    scale_ptr,
    gcol_ptr,
    c_ptr,
    lo_ptr,
    hi_ptr,
    doc_col_ptr,
    D,
    Z_PLANE,
    HS_PLANE,
    OUT_PLANE,
    K: tl.constexpr,
    BKD: tl.constexpr,
    BKA: tl.constexpr,
    BD: tl.constexpr,
    MODE: tl.constexpr,
    CONJ_H: tl.constexpr,
    STORE_S: tl.constexpr,
    DOT_PREC: tl.constexpr,
    TF32: tl.constexpr,
    UPCAST: tl.constexpr,
):
    # s_ptr: STORE_S (MODE_CONV), where S = F_k Z goes, fp32 and shaped as z; MODE_CORRELATE, dy's S, with x's S
    # at zx_ptr (z_ptr then unused)
    i_col, i_d = tl.program_id(0), tl.program_id(1)
    o_d = i_d * BD + tl.arange(0, BD)  # [BD] channels
    m_d = o_d < D
    o_k = tl.arange(0, K)  # [K] tokens a of the column (inverse F_k rows)
    # row of the twiddle and scale tables: the filter half column of the same m and c
    gcol = tl.load(gcol_ptr + i_col)
    if MODE == MODE_CORRELATE:
        c = tl.load(c_ptr + i_col)
        lo = tl.load(lo_ptr + i_col)
        hi = tl.load(hi_ptr + i_col)
    b_or = tl.zeros([K, BD], dtype=tl.float32)
    b_oi = tl.zeros([K, BD], dtype=tl.float32)
    for d0 in range(0, K, BKD):
        o_r = d0 + tl.arange(0, BKD)  # [BKD] frequency rows d
        p_rd = o_r[:, None] * D + o_d[None, :]
        if MODE == MODE_CORRELATE:
            b_wr = tl.zeros([BKD, BD], dtype=tl.float32)
            b_wi = tl.zeros([BKD, BD], dtype=tl.float32)
            for j in range(lo, hi):
                col = tl.load(doc_col_ptr + j) + c
                p_s = col.to(tl.int64) * (K * D) + p_rd
                b_gr = tl.load(s_ptr + p_s, mask=m_d[None, :], other=0.0)  # [BKD, BD]
                b_gi = tl.load(s_ptr + Z_PLANE + p_s, mask=m_d[None, :], other=0.0)
                b_xr = tl.load(zx_ptr + p_s, mask=m_d[None, :], other=0.0)
                b_xi = tl.load(zx_ptr + Z_PLANE + p_s, mask=m_d[None, :], other=0.0)
                b_wr += b_gr * b_xr + b_gi * b_xi  # dy spectrum times conj(x spectrum)
                b_wi += b_gi * b_xr - b_gr * b_xi
            b_scale = tl.load(scale_ptr + gcol)
            b_wr, b_wi = b_wr * b_scale, b_wi * b_scale
        else:
            b_sr, b_si = _dft_rows(
                fr_ptr, fi_ptr, z_ptr, Z_PLANE, i_col, o_r, o_d, m_d, D,
                K, BKD, BKA, BD, DOT_PREC, TF32, UPCAST,
            )  # fmt: skip
            if MODE == MODE_SPECTRUM:
                b_scale = tl.load(scale_ptr + gcol)
                p_out = out_ptr + i_col.to(tl.int64) * (K * D) + p_rd
                tl.store(p_out, (b_sr * b_scale).to(out_ptr.dtype.element_ty), mask=m_d[None, :])
                tl.store(p_out + OUT_PLANE, (b_si * b_scale).to(out_ptr.dtype.element_ty), mask=m_d[None, :])
            else:
                if STORE_S:
                    p_s = s_ptr + i_col.to(tl.int64) * (K * D) + p_rd
                    tl.store(p_s, b_sr, mask=m_d[None, :])
                    tl.store(p_s + Z_PLANE, b_si, mask=m_d[None, :])
                p_h = hs_ptr + gcol.to(tl.int64) * (K * D) + p_rd
                b_hr = tl.load(p_h, mask=m_d[None, :], other=0.0).to(tl.float32)  # [BKD, BD]
                b_hi = tl.load(p_h + HS_PLANE, mask=m_d[None, :], other=0.0).to(tl.float32)
                if CONJ_H:
                    b_hi = -b_hi
                b_wr = b_sr * b_hr - b_si * b_hi
                b_wi = b_sr * b_hi + b_si * b_hr
        if MODE != MODE_SPECTRUM:
            # O[a] += sum_d conj(w_k^(a d)) W[d]; F_k is symmetric, so its columns d are rows too
            p_f = o_k[:, None] * K + o_r[None, :]
            b_fr = _operand(tl.load(fr_ptr + p_f), fr_ptr, False, UPCAST)  # [K, BKD]
            b_fi = _operand(tl.load(fi_ptr + p_f), fr_ptr, False, UPCAST)
            b_wr = _operand(b_wr, fr_ptr, TF32, UPCAST)
            b_wi = _operand(b_wi, fr_ptr, TF32, UPCAST)
            b_or = tl.dot(b_fr, b_wr, b_or, input_precision=DOT_PREC)
            b_or = tl.dot(b_fi, b_wi, b_or, input_precision=DOT_PREC)
            b_oi = tl.dot(b_fr, b_wi, b_oi, input_precision=DOT_PREC)
            b_oi = tl.dot(b_fi, -b_wr, b_oi, input_precision=DOT_PREC)
    if MODE != MODE_SPECTRUM:
        b_tr = tl.load(twr_ptr + gcol * K + o_k)[:, None]  # [K, 1]: conj(w_P^(a c)) = tr - i ti
        b_ti = tl.load(twi_ptr + gcol * K + o_k)[:, None]
        p_out = out_ptr + i_col.to(tl.int64) * (K * D) + o_k[:, None] * D + o_d[None, :]
        b_or, b_oi = b_or * b_tr + b_oi * b_ti, b_oi * b_tr - b_or * b_ti
        tl.store(p_out, b_or.to(out_ptr.dtype.element_ty), mask=m_d[None, :])
        tl.store(p_out + OUT_PLANE, b_oi.to(out_ptr.dtype.element_ty), mask=m_d[None, :])


@triton.jit
def _rubi_block_inv_kernel(
    o_ptr,
    y_ptr,
    item_ptr,
    out_start_ptr,
    out_len_ptr,
    m_ptr,
    col_ptr,
    blk_ptr,
    reach_ptr,
    br_ptr,
    bi_ptr,
    D,
    O_PLANE,
    N_SRC,
    N_ITEMS,
    K: tl.constexpr,
    BB: tl.constexpr,
    BC: tl.constexpr,
    BN: tl.constexpr,
    REDUCE: tl.constexpr,
    DOT_PREC: tl.constexpr,
    TF32: tl.constexpr,
    UPCAST: tl.constexpr,
):
    # item_ptr [2, N_ITEMS]: each program's output and tile of its columns (``_items``)
    i_item, i_n = tl.program_id(0), tl.program_id(1)
    i_out, i_b = tl.load(item_ptr + i_item), tl.load(item_ptr + N_ITEMS + i_item)
    L = tl.load(out_len_ptr + i_out)
    o_b = i_b * BB + tl.arange(0, BB)  # [BB] output columns b
    o_n = i_n * BN + tl.arange(0, BN)  # [BN] values of a column
    o_a = o_n // D
    m_n = o_n < K * D
    # REDUCE: every source (one per m-group) adds its piece; else the output document is its own source
    lo = 0 if REDUCE else i_out
    hi = N_SRC if REDUCE else i_out + 1
    b_y = tl.zeros([BB, BN], dtype=tl.float32)
    for j in range(lo, hi):
        m = tl.load(m_ptr + j)
        mh = m // 2 + 1
        col = tl.load(col_ptr + j)
        blk = tl.load(blk_ptr + j)
        reach = tl.load(reach_ptr + j)
        b_part = tl.zeros([BB, BN], dtype=tl.float32)
        for c0 in range(0, mh, BC):
            o_c = c0 + tl.arange(0, BC)  # [BC] half columns
            m_c = o_c < mh
            # Re(w_m^(-b c) O[c]) = Re(w_m^(b c)) O_r + Im(w_m^(b c)) O_i: the forward block table transposed
            m_bc = (o_b < m)[:, None] & m_c[None, :]
            p_blk = blk + o_c[None, :] * m + o_b[:, None]
            b_br = _operand(tl.load(br_ptr + p_blk, mask=m_bc, other=0.0), br_ptr, False, UPCAST)  # [BB, BC]
            b_bi = _operand(tl.load(bi_ptr + p_blk, mask=m_bc, other=0.0), br_ptr, False, UPCAST)
            m_cn = m_c[:, None] & m_n[None, :]
            p_o = o_ptr + (col + o_c).to(tl.int64)[:, None] * (K * D) + o_n[None, :]
            b_or = _operand(tl.load(p_o, mask=m_cn, other=0.0), br_ptr, TF32, UPCAST)  # [BC, BN]
            b_oi = _operand(tl.load(p_o + O_PLANE, mask=m_cn, other=0.0), br_ptr, TF32, UPCAST)
            b_part = tl.dot(b_br, b_or, b_part, input_precision=DOT_PREC)
            b_part = tl.dot(b_bi, b_oi, b_part, input_precision=DOT_PREC)
        # a source only reaches its first `reach` tokens (document length, or taps its documents can use)
        b_y += tl.where(o_a[None, :] + K * o_b[:, None] < reach, b_part, 0.0)
    start = tl.load(out_start_ptr + i_out).to(tl.int64)
    m_y = (o_a[None, :] + K * o_b[:, None] < L) & m_n[None, :]
    p_y = y_ptr + (start + K * o_b[:, None]) * D + o_n[None, :]
    tl.store(p_y, b_y.to(y_ptr.dtype.element_ty), mask=m_y)


# ---- host side: tables, launchers, autograd ----

@dataclass(frozen=True, kw_only=True)
class BlockTiles:
    """A block stage's launch: the forward's program a [BC, BN] tile of (half columns, values of a column), its dots
    BB document columns deep; the inverse's a [BB, BN] tile of (output columns, values), its dots BC half columns
    deep; ``warps`` warps, ``stages`` pipelining stages."""

    BC: int
    BB: int
    BN: int
    warps: int
    stages: int

    def __post_init__(self) -> None:
        tu.check_config(self, ("BC", "BB", "BN", "warps"))
        if min(self.BC, self.BB) < 16:
            raise ValueError(f"BlockTiles.BC and BB must be at least 16 (tl.dot), got {self.BC}, {self.BB}")


@dataclass(frozen=True, kw_only=True)
class SpectrumTiles:
    """The F_k stage's launch (``_spectrum_tiles``): ``rows`` frequency rows a chunk (at most k), ``inner`` of the
    DFT's inner dimension a dot; with the inverse at most ``acc`` fp32 values in each plane of its [k, BD]
    accumulator (BD at most 64), without it (the filter spectra) ``wide`` channels a program; ``warps`` warps,
    ``stages`` pipelining stages."""

    rows: int
    inner: int
    acc: int
    wide: int
    warps: int
    stages: int

    def __post_init__(self) -> None:
        tu.check_config(self, ("rows", "inner", "acc", "wide", "warps"))


# (stage, smallest block k served) -> launch settings, chosen by timing on the H100/H200 (see BENCHMARKS.md).
# Chunks of 16 frequency rows make every dot of the F_k stage 16 rows tall, below what Hopper's warpgroup MMA takes
# in one instruction (64); whole-k chunks would need a narrower BD to fit. 8,192 accumulator values compile for
# sm_90 without register spills at k = 64..256.
CONFIGS = {
    ("block_fwd", 16): BlockTiles(BC=16, BB=16, BN=128, warps=4, stages=4),
    ("block_inv", 16): BlockTiles(BB=32, BC=16, BN=128, warps=8, stages=3),
    ("spectrum", 16): SpectrumTiles(rows=16, inner=32, acc=4096, wide=128, warps=4, stages=3),
    ("spectrum", 128): SpectrumTiles(rows=32, inner=32, acc=8192, wide=128, warps=8, stages=3),
}
# Tests set this to True: the interpreter then rounds fp32 dot operands to tf32 as the GPU path does.
EMULATE_TF32 = False


def config_for(stage: str, k: int) -> BlockTiles | SpectrumTiles:
    """The launch settings of ``stage`` ("block_fwd", "spectrum" or "block_inv") at block k: the row of the
    largest block at or below k that the stage has a row for."""
    return CONFIGS[stage, max(block for name, block in CONFIGS if name == stage and block <= k)]


def _spectrum_tiles(k: int, D: int, accumulate: bool, config: SpectrumTiles) -> tuple[int, int, int]:
    """(BKD, BKA, BD) of the F_k stage. Each program reads all of F_k (from L2), so a wider BD reads it
    less often; with the inverse (``accumulate``) its [k, BD] complex accumulator caps BD at ``config.acc`` fp32
    values."""
    widest = min(64, config.acc // k) if accumulate else config.wide
    return min(k, config.rows), min(k, config.inner), max(16, min(widest, tu.next_power_of_2(D)))


def _round_tf32(a: torch.Tensor) -> torch.Tensor:
    """fp32 -> the nearest tf32 (ties away from zero), kept in fp32: what ``_operand`` does in a kernel."""
    return ((a.view(torch.int32) + 0x1000) & -8192).view(torch.float32)


def _tables(plan: RubiPlan, precision: str) -> dict:
    """The plan's device tables: DFT matrices in the dot dtype (rounded to tf32 when the dots are), twiddles
    and scales in fp32, int32 indices.

    "doc": the documents (sorted by m); "grp": one filter "document" per m-group, its first ``taps`` taps
    padded to P; "fcol": per filter half column, its c and its group's documents [lo, hi).
    """

    tf32 = precision == "fp32" and (EMULATE_TF32 or not tu.is_interpreted(_rubi_spectrum_kernel))

    def make() -> dict:
        dev, tabs = plan.device, plan.tables()
        dot_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        i32 = lambda a: host_to_device(np.asarray(a, dtype=np.int32), torch.int32, dev)  # noqa: E731
        f32 = lambda a: host_to_device(a, torch.float32, dev)  # noqa: E731
        as_dot = lambda a: _round_tf32(f32(a)) if tf32 else f32(a).to(dot_dtype)  # noqa: E731
        mh = plan.group_m // 2 + 1
        group_blk = np.concatenate([[0], np.cumsum(mh * plan.group_m)[:-1]])  # offsets of the F_m tables
        doc_group = np.repeat(np.arange(plan.n_groups), plan.group_hi - plan.group_lo)
        col_group = np.repeat(np.arange(plan.n_groups), mh)
        group_col = plan.group_col[:-1]
        return {
            "dot_dtype": dot_dtype,
            "tf32": tf32,
            "fk_r": as_dot(tabs["fk_r"]),
            "fk_i": as_dot(tabs["fk_i"]),
            "b_r": as_dot(np.concatenate([r.ravel() for r, _ in tabs["blocks"]])),
            "b_i": as_dot(np.concatenate([i.ravel() for _, i in tabs["blocks"]])),
            "tw_r": f32(tabs["tw_r"]),
            "tw_i": f32(tabs["tw_i"]),
            "scale": f32(tabs["scale"]),
            "doc": {
                "start": i32(plan.starts),
                "len": i32(plan.lengths),
                "m": i32(plan.cols),
                "col": i32(plan.doc_col),
                "gcol": i32(plan.group_col[doc_group]),
                "blk": i32(group_blk[doc_group]),
                "reach": i32(plan.lengths),
            },
            "grp": {
                "start": i32(np.zeros(plan.n_groups)),
                "len": i32(plan.group_taps),
                "m": i32(plan.group_m),
                "col": i32(group_col),
                "gcol": i32(group_col),
                "blk": i32(group_blk),
                "reach": i32(plan.group_reach),
            },
            "col_gcol": i32(plan.col_group()),
            "fcol": {
                "gcol": i32(np.arange(plan.n_filter_cols)),
                "c": i32(np.arange(plan.n_filter_cols) - plan.group_col[col_group]),
                "lo": i32(plan.group_lo[col_group]),
                "hi": i32(plan.group_hi[col_group]),
            },
            "taps": {"start": i32([0]), "len": i32([plan.max_taps])},
        }

    return plan.cached(("triton", precision, tf32), make)


def _dot_precision(t: dict) -> str:
    """tf32 tensor-core dots on fp32 operands (about 5e-4 relative RMS); bf16 operands are exact."""
    return "tf32" if t["dot_dtype"] == torch.float32 else "ieee"


def _upcast(t: dict) -> bool:
    return t["dot_dtype"] == torch.bfloat16 and tu.is_interpreted(_rubi_spectrum_kernel)


def _tf32(t: dict) -> bool:
    """Round fp32 operands to tf32 on the GPU; the interpreter's dots are exact fp32 unless EMULATE_TF32."""
    return t["tf32"]


def _items(plan: RubiPlan, kind: str, tile: int) -> torch.Tensor:
    """int32 [2, n]: (source, tile) of every program of a block stage that has work, the grid's first axis. The
    forward's sources are the documents ("docs") or the filters' m-groups ("filters"), its tiles of ``tile`` half
    columns; the inverse's are the documents ("outputs") or the one filter-gradient output ("taps"), its tiles of
    ``tile`` output columns. A grid over (source, the most tiles any source has) would leave most programs of a
    row of mostly short documents with nothing to do (at k=64 and 32 half columns a tile, 86 of the benchmark
    row's 147 (document, tile) pairs)."""

    def make() -> torch.Tensor:
        cdiv = tu.cdiv  # on int64 arrays as on ints
        if kind == "docs":
            counts = cdiv(plan.half_cols, tile)
        elif kind == "filters":
            counts = cdiv(plan.group_m // 2 + 1, tile)
        elif kind == "outputs":
            counts = cdiv(cdiv(plan.lengths, plan.k), tile)
        else:
            counts = np.array([cdiv(cdiv(plan.max_taps, plan.k), tile)])
        src = np.repeat(np.arange(len(counts)), counts)
        idx = np.arange(len(src)) - np.repeat(np.cumsum(counts) - counts, counts)  # tile within its source
        return host_to_device(np.stack([src, idx]).astype(np.int32), torch.int32, plan.device)

    return plan.cached(("items", kind, tile), make)


def _block_fwd(src: torch.Tensor, plan: RubiPlan, t: dict, filters: bool, *,
               config: BlockTiles | None = None) -> torch.Tensor:
    """src: [n, D] tokens (x or dy; with ``filters`` the filter taps h^T) -> spectra [2, cols, k, D]. ``config``:
    the launch, by default ``config_for``'s."""
    k, D = plan.k, src.shape[1]
    config = config or config_for("block_fwd", k)
    docs = t["grp"] if filters else t["doc"]
    n_cols = plan.n_filter_cols if filters else plan.n_cols
    z = tu.empty((2, n_cols, k, D), t["dot_dtype"], src.device)
    items = _items(plan, "filters" if filters else "docs", config.BC)
    _rubi_block_fwd_kernel[(items.shape[1], tu.cdiv(k * D, config.BN))](
        src, z, items, docs["start"], docs["len"], docs["m"], docs["col"], docs["gcol"], docs["blk"],
        t["b_r"], t["b_i"], t["tw_r"], t["tw_i"], D, z[0].numel(), items.shape[1],
        K=k, BC=config.BC, BB=config.BB, BN=config.BN, DOT_PREC=_dot_precision(t), TF32=_tf32(t),
        UPCAST=_upcast(t), num_warps=config.warps, num_stages=config.stages,
    )  # fmt: skip
    return z


def _spectrum(
    mode: int,
    z: torch.Tensor,
    plan: RubiPlan,
    t: dict,
    hs: torch.Tensor | None = None,
    zx: torch.Tensor | None = None,
    conj_h: bool = False,
    s: torch.Tensor | None = None,
    *,
    config: SpectrumTiles | None = None,
) -> torch.Tensor:
    """The fused F_k stage on spectra z [2, cols, k, D] -> [2, cols', k, D] (cols' = documents' half columns
    for MODE_CONV, filter half columns otherwise). hs: the filter spectra (MODE_CONV). s (fp32, shaped as z):
    MODE_CONV stores S = F_k z into it (if given); MODE_CORRELATE reads dy's S from it and x's from zx (z unused).
    ``config`` as ``_block_fwd``'s."""
    k, D = plan.k, z.shape[-1]
    config = config or config_for("spectrum", k)
    BKD, BKA, BD = _spectrum_tiles(k, D, mode != MODE_SPECTRUM, config)
    gcol = t["col_gcol"] if mode == MODE_CONV else t["fcol"]["gcol"]
    n_cols = plan.n_cols if mode == MODE_CONV else plan.n_filter_cols
    out = tu.empty((2, n_cols, k, D), t["dot_dtype"], z.device)
    hs = z if hs is None else hs  # unused pointers of the other modes
    zx = z if zx is None else zx
    fcol = t["fcol"]
    _rubi_spectrum_kernel[(n_cols, tu.cdiv(D, BD))](
        z, zx, hs, out, z if s is None else s, t["fk_r"], t["fk_i"], t["tw_r"], t["tw_i"], t["scale"],
        gcol, fcol["c"], fcol["lo"], fcol["hi"], t["doc"]["col"],
        D, z[0].numel(), hs[0].numel(), out[0].numel(),
        K=k, BKD=BKD, BKA=BKA, BD=BD, MODE=mode, CONJ_H=conj_h, STORE_S=mode == MODE_CONV and s is not None,
        DOT_PREC=_dot_precision(t), TF32=_tf32(t), UPCAST=_upcast(t), num_warps=config.warps,
        num_stages=config.stages,
    )  # fmt: skip
    return out


def _block_inv(o: torch.Tensor, plan: RubiPlan, t: dict, y: torch.Tensor, reduce: bool, *,
               config: BlockTiles | None = None) -> None:
    """Inverse block stage of half-column spectra o [2, cols, k, D] into y: [n, D] tokens of the documents,
    or with ``reduce`` the [max_taps, D] sum of the m-groups' filter-gradient pieces. ``config`` as
    ``_block_fwd``'s."""
    k, D = plan.k, o.shape[-1]
    config = config or config_for("block_inv", k)
    out, src = (t["taps"], t["grp"]) if reduce else (t["doc"], t["doc"])
    items = _items(plan, "taps" if reduce else "outputs", config.BB)
    _rubi_block_inv_kernel[(items.shape[1], tu.cdiv(k * D, config.BN))](
        o, y, items, out["start"], out["len"], src["m"], src["col"], src["blk"], src["reach"], t["b_r"], t["b_i"],
        D, o[0].numel(), plan.n_groups, items.shape[1],
        K=k, BB=config.BB, BC=config.BC, BN=config.BN, REDUCE=reduce, DOT_PREC=_dot_precision(t),
        TF32=_tf32(t), UPCAST=_upcast(t), num_warps=config.warps, num_stages=config.stages,
    )  # fmt: skip


# Launch settings by stage ("block_fwd", "spectrum", "block_inv") for ``_forward`` and ``_backward``; a stage left
# out takes ``config_for``'s.
Configs = Mapping[str, BlockTiles | SpectrumTiles]


def _filter_spectra(h: torch.Tensor, plan: RubiPlan, t: dict, configs: Configs) -> torch.Tensor:
    """h: [D, L_F] -> alpha_c / P * H, one half-column spectrum per m-group: [2, n_filter_cols, k, D]."""
    taps = h[:, : plan.max_taps].T.contiguous()  # [max_taps, D]
    z = _block_fwd(taps, plan, t, filters=True, config=configs.get("block_fwd"))
    return _spectrum(MODE_SPECTRUM, z, plan, t, config=configs.get("spectrum"))


def _forward(x: torch.Tensor, h: torch.Tensor, plan: RubiPlan, t: dict, save_spectra: bool = False,
             configs: Configs | None = None) -> tuple[torch.Tensor, ...]:
    """x: [B, T, D], h: [D, L_F] -> y [B, T, D], and for the backward x's block spectra zx (with ``save_spectra``,
    where dh is wanted, its S = F_k Z instead, fp32) and h's spectra hs."""
    configs = configs or {}
    D = x.shape[2]
    x = x.contiguous()
    hs = _filter_spectra(h, plan, t, configs)
    zx = _block_fwd(x.view(-1, D), plan, t, filters=False, config=configs.get("block_fwd"))
    sx = tu.empty(zx.shape, torch.float32, x.device) if save_spectra else None
    y = tu.empty(x.shape, x.dtype, x.device)
    o = _spectrum(MODE_CONV, zx, plan, t, hs=hs, s=sx, config=configs.get("spectrum"))
    _block_inv(o, plan, t, y.view(-1, D), reduce=False, config=configs.get("block_inv"))
    return y, zx if sx is None else sx, hs


def _backward(dy: torch.Tensor, sx: torch.Tensor | None, hs: torch.Tensor, h: torch.Tensor, plan: RubiPlan,
              t: dict, need_dx: bool, configs: Configs | None = None) -> tuple[torch.Tensor | None, ...]:
    """dy [B, T, D] -> dx (dy's dtype; None unless ``need_dx``) and dh (h's shape and dtype; None without sx, x's
    S = F_k Z as ``_forward(save_spectra=True)`` saved it)."""
    configs = configs or {}
    D = dy.shape[2]
    dy = dy.contiguous()
    zg = _block_fwd(dy.view(-1, D), plan, t, filters=False, config=configs.get("block_fwd"))
    sg = tu.empty(zg.shape, torch.float32, dy.device) if sx is not None else None
    dx = dh = None
    if need_dx or sg is not None:
        o = _spectrum(MODE_CONV, zg, plan, t, hs=hs, conj_h=True, s=sg, config=configs.get("spectrum"))
        if need_dx:
            dx = tu.empty(dy.shape, dy.dtype, dy.device)
            _block_inv(o, plan, t, dx.view(-1, D), False, config=configs.get("block_inv"))
    if sx is not None:
        dh_taps = tu.empty((plan.max_taps, D), torch.float32, dy.device)
        corr = _spectrum(MODE_CORRELATE, zg, plan, t, zx=sx, s=sg, config=configs.get("spectrum"))
        _block_inv(corr, plan, t, dh_taps, reduce=True, config=configs.get("block_inv"))
        dh = dy.new_zeros(h.shape, dtype=h.dtype)
        dh[:, : plan.max_taps] = dh_taps.T
    return dx, dh


class RubiConvTriton(torch.autograd.Function):
    """y = rubiconv(x, h) on a plan; backward gives dx (x's dtype) and dh (h's dtype)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, h: torch.Tensor, plan: RubiPlan, precision: str) -> torch.Tensor:
        t = _tables(plan, precision)
        # x's spectra are needed only for dh
        y, sx, hs = _forward(x, h, plan, t, save_spectra=ctx.needs_input_grad[1])
        ctx.plan, ctx.t = plan, t
        ctx.save_for_backward(sx if ctx.needs_input_grad[1] else None, hs, h)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        sx, hs, h = ctx.saved_tensors
        dx, dh = _backward(dy, sx, hs, h, ctx.plan, ctx.t, ctx.needs_input_grad[0])
        return dx, dh, None, None


# Inside torch.func transforms (a stacked run's call from a per-run vmap rule, kernels.triton_utils.per_run) an
# autograd.Function cannot run, so there the same launchers go through a custom op whose autograd is registered.
# The op takes the offsets, not the plan (a custom op takes tensors and plain values): get_plan's cache finds it.
@torch.library.custom_op("mixlab::rubiconv_triton", mutates_args=())
def _rubiconv_op(x: torch.Tensor, h: torch.Tensor, cu_seqlens: torch.Tensor | None, block: int | None,
                 precision: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    plan = get_plan(cu_seqlens, x.shape[0], x.shape[1], h.shape[1], block, x.device)
    return _forward(x, h, plan, _tables(plan, precision), save_spectra=True)


@torch.library.custom_op("mixlab::rubiconv_triton_bwd", mutates_args=())
def _rubiconv_bwd_op(dy: torch.Tensor, sx: torch.Tensor, hs: torch.Tensor, h: torch.Tensor,
                     cu_seqlens: torch.Tensor | None, block: int | None,
                     precision: str) -> tuple[torch.Tensor, torch.Tensor]:
    plan = get_plan(cu_seqlens, dy.shape[0], dy.shape[1], h.shape[1], block, dy.device)
    return _backward(dy, sx, hs, h, plan, _tables(plan, precision), need_dx=True)


def _op_setup(ctx, inputs: tuple, output: tuple) -> None:
    x, h, cu_seqlens, block, precision = inputs
    _, sx, hs = output
    ctx.save_for_backward(sx, hs, h, cu_seqlens)
    ctx.block, ctx.precision = block, precision


def _op_backward(ctx, dy: torch.Tensor, _dsx: torch.Tensor, _dhs: torch.Tensor) -> tuple:
    sx, hs, h, cu_seqlens = ctx.saved_tensors
    dx, dh = _rubiconv_bwd_op(dy, sx, hs, h, cu_seqlens, ctx.block, ctx.precision)
    return dx, dh, None, None, None


_rubiconv_op.register_autograd(_op_backward, setup_context=_op_setup)


def rubiconv_triton(
    x: torch.Tensor, h: torch.Tensor, plan: RubiPlan, precision: str = "fp32"
) -> torch.Tensor:
    """x: [B, T, D] float16/bfloat16/float32, h: [D, L_F] -> y: [B, T, D] in x's dtype (inputs checked)."""
    return RubiConvTriton.apply(x, h, plan, precision)


def rubiconv_triton_in_transform(x: torch.Tensor, h: torch.Tensor, cu_seqlens: torch.Tensor | None,
                                 block: int | None, precision: str = "fp32") -> torch.Tensor:
    """As ``rubiconv_triton`` with the plan of ``get_plan(cu_seqlens, B, T, L_F, block)``, for calls on plain
    tensors inside torch.func transforms (``tu.in_transform``); x not itself batched."""
    return _rubiconv_op(x, h, cu_seqlens, block, precision)[0]
