"""Low-rank dynamic short causal convolution over packed documents in Triton: the kernels, their launchers
and the op with its backward (``kernels.dynamic_conv.op`` checks the inputs and picks the backend).

As ``kernels.short_conv``, tap k of output t multiplies x[t - k] and reads zero before the start of t's
document; the weights of every tap are those of the output token t.

w[t, k, d] = sum_r z[t, r] U[r, k * D + d] (+ static_w[k, d]): the forward forms each tap's [BT, BD] weights
with one tl.dot (R padded to RP >= 16 with masked loads; in the inputs' own half type when z and U share it,
as the products are exact in the fp32 sum) and never writes them. The backward, with
g[t, (k, d)] = dy[t, d] * x[t - k, d] formed on chip, is two launches:
    dx[t]  = sum_k (z[t + k] @ U[:, k*D + d] + static_w[k]) * dy[t + k]     the weights again formed on chip
    dz[t]  = sum_(k, d) g[t, (k, d)] U[:, (k, d)]       one program per token tile and split of the channel
             blocks, walking its blocks; LR_DZ_SPLITS fp32 partials summed in a fixed order
and, one program per channel block (all taps) and chunk of token tiles,
    dU[:, j] = sum_t z[t]^T g[t, j]    and dstatic_w[j] = sum_t g[t, j]: fp32 partials per chunk
(``LR_DU_FORM``: tap by tap, g^T [BD, BT] @ z, dstatic_w a rank whose z is 1; with ``LR_DZ_DS`` dstatic_w is
summed in the dz launch instead, an fp32 partial a token tile), so the [B, T, W, D] weights and their gradient
never reach device memory either. g may go to the dz and dU dots rounded to the inputs' half type
(``LR_G_HALF``). ``LR_DZ_FORM`` can move dz to
a launch of its own, or make the whole backward one launch (tune knobs, below): one program per channel block and
chunk of token tiles forms dx, its channel block's share of dz (an fp32 partial per channel block) and its chunk's
dU and dstatic_w partials, reading each tile of x and dy from device memory once for all four.

Stacked runs fold into one launch as in ``kernels.short_conv.triton``: x, z [R * B, ...] with U [R, rank, W * D]
and static_w [R, W, D], row b using run b // B's (``RPW``), dU and dstatic_w summed over each run's chunks as a
run alone sums them (``_fold_runs``).
"""

import torch
from mixlab.kernels import triton_utils as tu
from mixlab.kernels._triton import tl, triton

# Tiles, warps and pipelining stages, fixed by shape (no autotuning); scripts/tune_shortconv_gpu.py times
# candidates on the GPU. Forward: [BT, BD] tiles (both >= 16 for tl.dot).
LR_FWD_BT, LR_FWD_BD, LR_FWD_WARPS = 64, 64, 4
# The taps as a loop (LR_FWD_TAP_LOOP) rather than unrolled: compiled for sm_90a (Triton 3.6, 2026-12-04) at
# 32 x 128 122 registers (146 with documents) and 3 layout moves against 168 (158) and 9, Triton pipelining the
# loop's loads through 11 KB of shared memory; 32 x 64 at 4 warps 91 (94). Timed on the H200 (2026-12-05, two
# interleaved rounds, raw forward, µs without / with 64 documents): the loop at 64 x 64 93.0 / 101.6, at 32 x 128
# 92.0 / 114.3; unrolled at 32 x 128 102.9 / 125.0.
LR_FWD_TAP_LOOP = True
# Pipelining stages of that loop (Triton's default, 3, issues the loads of the next two taps ahead of the current
# tap's dot); the unrolled form has no loop to pipeline.
LR_FWD_STAGES = 3
# Software pipelining of x by hand in that loop (LR_FWD_PREFETCH): Triton's pipeliner issues only the loads that
# feed the dot (U) ahead, through shared memory; x[t - k], which multiplies its result, is loaded where used (in
# the TritonGPU IR for sm_90a, Triton 3.6, 2026-12-05: a plain load, then a layout move, at every tap). With it the
# next tap's x is loaded before this tap's dot and carried in registers. Untimed: off.
LR_FWD_PREFETCH = False
# Low-rank backward, dx and dz: one program per [BT] token tile and split of the channel blocks, walking its
# BD-channel blocks; dz is summed over LR_DZ_SPLITS fp32 partials (none when 1).
# sm_90a, bf16: 230-252 registers at [32, 64] and 4 warps, no spills; [32, 128] spills. With dz in a launch of its
# own (LR_DZ_FORM below) the whole backward timed on the H200 (2026-12-05, two interleaved rounds) 484.2 / 484.1 µs
# without / with 64 documents at 32 x 64, 4 warps, 8 splits; 496.2 / 487.4 at 4 splits, 494.0 / 497.9 at 64 x 64
# and 8 warps.
LR_DX_BT, LR_DX_BD, LR_DX_WARPS, LR_DX_STAGES, LR_DZ_SPLITS = 32, 64, 4, 1, 8
# Register cap of the dx kernel (None: the compiler's choice, 218-255 at every tile tried, one block of 8 warps
# an SM); 128 fits two despite the spills (scripts/kernel_resources.py) and timed fastest on the H200 with dz in
# the dx kernel (512 against 539 µs at [64, 128] uncapped, 576 against 644 with 64 documents; BENCHMARKS.md). With
# dz on its own the dx launch takes 78 registers, and the cap timed slower (2026-12-05: 529.1 against 495.7 µs).
LR_DX_MAXNREG = None
# The dz-only launch's tiles ("own" below): [LR_DZ_BT, LR_DZ_BD] and LR_DZ_WARPS, its channel blocks in LR_DZ_SPLITS
# splits. Its dot, g [BT, BD] @ U^T, has BT rows: a warpgroup's (wgmma) from 64 on at 4 warps, mma.sync below.
LR_DZ_BT, LR_DZ_BD, LR_DZ_WARPS = 32, 64, 4
# Pipelining stages of the dx and dz launches' tap loops (LR_DX_STAGES above, LR_DZ_STAGES): from 2 on, Triton
# loads the next taps' tiles ahead through shared memory (cp.async), as in the forward, where 3 stages timed 15%
# faster than 2 (LR_FWD_STAGES). Compiled for sm_90a (Triton 3.6, 2026-12-05), no documents, at the tiles above:
# dx 114 registers at 1 stage, 92 at 2, 78 at 3 (6 blocks an SM), 80 at 4; dz 93, 94, 106, 108, its shared memory
# 4, 14, 20, 26 KB. Untimed: the tune script's group "low-rank bwd stages".
LR_DZ_STAGES = 1
# Software pipelining of dy by hand in the dx launch's tap loop (LR_DX_PREFETCH), as LR_FWD_PREFETCH in the forward:
# dy[t + k] multiplies the weights' dot result, so Triton's pipeliner leaves its load where it is used; with it the
# next tap's dy is loaded before this tap's dot. Untimed: off.
LR_DX_PREFETCH = False
# Low-rank backward, dU and dstatic_w: one program per BD-channel block (all taps) and chunk of BT-token tiles,
# about LOWRANK_BWD_PROGRAMS programs (each chunk's dU partial is R * W * D floats).
LR_DU_BT, LR_DU_BD, LR_DU_WARPS, LR_DU_STAGES = 64, 64, 4, 1
LOWRANK_BWD_PROGRAMS = 1024
# Where that kernel sums dstatic_w over a tile's tokens: False, every tile (a reduction across the tile's threads,
# in its loop's PTX for sm_90a beside the dot's own traffic: 32 shuffles and 10 barriers a tile); True, once after
# its chunk, from a [BT, WP * BD] sum of the tiles' products (as many registers as one tile of them). The same
# sums in another order: rounding differs, each is repeatable. Compiled for sm_90a (Triton 3.9,
# scripts/kernel_resources.py) at 64 x 16: no shuffles and 6 barriers in its loop, but 159 registers (3 blocks an
# SM; 128 and 16 spilled bytes with documents) against 120. The tune script timed it on the H200 (2026-12-04, two
# interleaved rounds, BENCHMARKS.md) with the tiles above: the whole backward 511 µs against 517 for the every-tile
# form at 64 x 16 and 2,048 programs, 484 against 568 with 64 documents.
LR_DU_DS_DEFER = True
# The dU kernel's form (LR_DU_FORM): "wide", one [BT, WP * BD] tile of g a tile of tokens, its columns the W taps of
# the channel block (x gathered at W shifts, dy read once a tap), and one tl.dot with z^T; "taps", dy read once a
# tile and each tap's g = dy * x[t - k] a [BT, BD] tile of its own, with an accumulator [RP, BD] a tap; "taps-t", the
# same transposed (g^T [BD, BT] @ z, so that the dot has BD rows: a warpgroup's dot on the H200). The taps forms sum
# dstatic_w as one more rank whose z is 1, as the fused kernel below does. Timed on the H200 (2026-12-05 session 32,
# the whole raw backward, µs without / with 64 documents, median of two interleaved rounds): "taps-t" at 64 x 64
# 441.3 / 468.4 (its rounds 400.3 and 482.3; the wide form's 476.0 and 476.6), 32 x 64 454.2 / 473.6; "wide" at
# 32 x 32 476.3 / 479.4; "taps" at 32 x 64 471.0 / 477.3. The dU launch alone took 202 of the wide form's 470 µs
# (torch.profiler, same day). To be timed again (tune group "low-rank bwd dU form").
LR_DU_FORM = "taps-t"
# Where dz is summed (LR_DZ_FORM): "dx", in the dx kernel over its split's channel blocks, which then reads x at W
# shifts and holds both products (128 registers with spills, latency-bound in Nsight, 2026-12-03); "own", in a
# second launch of that kernel that forms no dx (its splits as before); "fused", in a single backward kernel
# (``_dynamic_conv_lowrank_bwd_fused_kernel``) that also forms dx, dU and dstatic_w, so x and dy are read from
# device memory once for all of them (the dx + dz and dU launches read them twice, "own" three times); "with-du",
# in that kernel without dx, which a launch of the dx kernel forms alone. With "own" and "with-du" the dx launch
# reads only z, U and dy, every channel block a program (the dynamic-conv1d anchor splits its backward so, into
# dx and dU + dz). Compiled for sm_90a (Triton 3.6, scripts/kernel_resources.py, 2026-12-04): that dx launch 78
# registers (90 at the 128 cap), no spills; the fused kernel below and the dz-only launch in BENCHMARKS.md. Timed
# on the H200 (2026-12-05, two interleaved rounds, the whole raw backward, µs without / with 64 documents): "own"
# 480.0 / 469.4 at its best dx tile, "dx" 508.4 / 481.4, "fused" 591.2 / 708.3 at its best.
LR_DZ_FORM = "own"
# Where dstatic_w is summed with "own" and "dx" (LR_DZ_DS): False, in the dU launch, as one more rank whose z is 1
# (at R = 16 that pads the ranks to 32: the taps-t form's accumulators double); True, in the launch that forms dz,
# which has each tap's g tile at hand: a sum over its tokens a tile (a reduction across the tile's threads), stored
# as an fp32 partial a token tile ([B * tiles, W, D], summed in a fixed order like the others). Compiled for sm_90a
# (Triton 3.6, 2026-12-05 session 33), bf16, R=16, registers without documents: the dz launch 93 -> 127 (20
# shuffles and 11 barriers in its loop, against none and 6), dU "taps-t" at 64 x 64 184 -> 160; with g in bf16
# (LR_G_HALF) 72 -> 125 and 168 -> 94. Untimed: off (the tune script's group "low-rank bwd g and dstatic").
LR_DZ_DS = False
# The products g = dy * x[t - k] as the dz and dU dots take them (LR_G_HALF): False, in fp32, which the tf32 dot
# rounds to a 10-bit mantissa; True, rounded to the inputs' half type when x, z and U share one (bf16: an 8-bit
# mantissa), as the dynamic-conv1d anchor forms them: half the registers for g, the dots at the half type's rate,
# their products exact and summed in fp32. For every dz form and the taps forms of dU; every other dtype, and the
# "wide" dU form, as with False. Compiled for sm_90a (Triton 3.6, 2026-12-05 session 33), bf16, R=16 with static_w,
# registers without documents: the dz-only launch at 32 x 64 93 -> 72 (its mma.sync instructions 8 -> 4), at 64 x
# 64 119 -> 76; dU "taps-t" at 64 x 64 184 -> 168 (wgmma instructions 32 -> 16); the fused kernel unchanged (214),
# without dx 203 -> 168 and 8 bytes spilled. Untimed: the tune script's group "low-rank bwd g and dstatic".
LR_G_HALF = False
# The fused backward ("fused" above): [LR_FU_BT, LR_FU_BD] tiles, about LR_FU_PROGRAMS programs (channel blocks x
# chunks of token tiles; each chunk's dU partial is R * W * D floats, each channel block's dz partial B * T * R).
# dstatic_w rides in the dU product as one more rank whose z is 1 (row R of z^T g is sum_t g), so it costs no
# reduction of its own. Its dx and dz walk the taps as a loop; the dU products, one accumulator a tap, are
# unrolled (unrolling all of it took 255 registers and spilled at every tile tried). Compiled for sm_90a (Triton 3.6,
# 2026-12-04), bf16, R=16: 16 x 64 at 4 warps 214 registers (218 with documents), 16 x 32 201 (223), neither
# spilling; 32 x 64 spills (8 bytes at 8 warps, ~500 at 4). Without dx ("with-du"): 16 x 64 203 (168), 32 x 64 at
# 8 warps 168 (167). Timed on the H200 (2026-12-05): the whole backward at best 591 / 708 µs without / with 64
# documents, against 480 / 469 with dz on its own (LR_DZ_FORM).
LR_FU_BT, LR_FU_BD, LR_FU_WARPS, LR_FU_STAGES, LR_FU_PROGRAMS, LR_FU_MAXNREG = 16, 64, 4, 1, 1024, None


@triton.jit
def _lowrank_taps(z_ptr, u_ptr, o_zt, m_zt, o_r, m_r, k, o_d, m_d, R, D, W: tl.constexpr,
                  NATIVE_DOT: tl.constexpr, PRECISION: tl.constexpr):
    """Tap k's weights of the tokens o_zt, [BT, BD] = z[o_zt] @ U[:, k * D + o_d], in fp32, and U's block
    [RP, BD] (fp32 unless NATIVE_DOT: z and U of one half type, whose products are exact in fp32)."""
    b_z = tl.load(z_ptr + o_zt.to(tl.int64)[:, None] * R + o_r[None, :], mask=m_zt[:, None] & m_r[None, :],
                  other=0.0)  # [BT, RP]
    p_u = u_ptr + o_r[:, None] * (W * D) + k * D + o_d[None, :]
    b_u = tl.load(p_u, mask=m_r[:, None] & m_d[None, :], other=0.0)  # [RP, BD]
    if NATIVE_DOT:
        b_wk = tl.dot(b_z, b_u)
    else:
        b_u = b_u.to(tl.float32)
        b_wk = tl.dot(b_z.to(tl.float32), b_u, input_precision=PRECISION)
    return b_wk, b_u


@triton.jit
def _shifted_x(x_ptr, o_g, o_t, m_t, o_d, m_d, start, k, D, HAS_CU: tl.constexpr):
    """x[t - k] of the tokens o_g in fp32, [BT, BD], zero before t's document start (or its row's)."""
    m_f = m_t & (o_t >= k)
    b_xk = tl.load(x_ptr + (o_g - k).to(tl.int64)[:, None] * D + o_d[None, :], mask=m_f[:, None] & m_d[None, :],
                   other=0.0).to(tl.float32)
    if HAS_CU:
        b_xk = tl.where((o_g - k >= start)[:, None], b_xk, 0.0)
    return b_xk


@triton.jit
def _dy_ahead(dy_ptr, o_g, o_t, m_t, o_d, m_d, k, T, D):
    """dy[t + k] of the tokens o_g in fp32, [BT, BD], zero past the row's end (the caller masks documents)."""
    m_b = m_t & (o_t + k < T)
    p_dyk = dy_ptr + (o_g + k).to(tl.int64)[:, None] * D + o_d[None, :]
    return tl.load(p_dyk, mask=m_b[:, None] & m_d[None, :], other=0.0).to(tl.float32)


@triton.jit
def _dx_tap(b_dx, k, z_ptr, u_ptr, s_ptr, dy_ptr, o_g, o_t, m_t, o_r, m_r, o_d, m_d, end, T, R, D, W: tl.constexpr,
            HAS_CU: tl.constexpr, HAS_STATIC: tl.constexpr, WITH_DX: tl.constexpr, NATIVE_DOT: tl.constexpr,
            PRECISION: tl.constexpr, b_dyk=None, GIVEN_DY: tl.constexpr = False):
    """(b_dx [BT, BD] plus tap k of the outputs t + k, U's block of tap k [RP, BD]): the outputs' weights formed
    on chip, their products zero where t + k leaves t's document (loads masked by the row only; dy[t + k] loaded
    here after the weights' dot, or b_dyk [BT, BD] in fp32 with GIVEN_DY). Without WITH_DX, b_dx as it was and
    U's block alone (in U's dtype)."""
    if WITH_DX:
        m_b = m_t & (o_t + k < T)
        b_wk, b_uk = _lowrank_taps(z_ptr, u_ptr, o_g + k, m_b, o_r, m_r, k, o_d, m_d, R, D, W, NATIVE_DOT, PRECISION)
        if HAS_STATIC:
            b_wk += tl.load(s_ptr + k * D + o_d, mask=m_d, other=0.0).to(tl.float32)[None, :]
        b_dxk = b_wk * (b_dyk if GIVEN_DY else _dy_ahead(dy_ptr, o_g, o_t, m_t, o_d, m_d, k, T, D))
        if HAS_CU:
            b_dxk = tl.where((o_g + k < end)[:, None], b_dxk, 0.0)
        b_dx += b_dxk
    else:
        b_uk = tl.load(u_ptr + o_r[:, None] * (W * D) + k * D + o_d[None, :], mask=m_r[:, None] & m_d[None, :],
                       other=0.0)
    return b_dx, b_uk


@triton.jit
def _fwd_tap(b_y, k, x_ptr, z_ptr, u_ptr, s_ptr, o_g, o_t, m_t, o_r, m_r, o_d, m_d, start, R, D, W: tl.constexpr,
             HAS_CU: tl.constexpr, HAS_STATIC: tl.constexpr, RESIDUAL: tl.constexpr, NATIVE_DOT: tl.constexpr,
             PRECISION: tl.constexpr, b_xk=None, GIVEN_X: tl.constexpr = False):
    """b_y [BT, BD] plus tap k's term: the tokens' weights of tap k (on chip only) times x[t - k] (loaded here
    after the weights' dot, or b_xk [BT, BD] with GIVEN_X)."""
    b_w, _ = _lowrank_taps(z_ptr, u_ptr, o_g, m_t, o_r, m_r, k, o_d, m_d, R, D, W, NATIVE_DOT, PRECISION)
    if HAS_STATIC:
        b_w += tl.load(s_ptr + k * D + o_d, mask=m_d, other=0.0).to(tl.float32)[None, :]
    b_x = b_xk if GIVEN_X else _shifted_x(x_ptr, o_g, o_t, m_t, o_d, m_d, start, k, D, HAS_CU)
    b_y += b_w * b_x
    if RESIDUAL and k == 0:
        b_y += b_x
    return b_y


# fmt: off
@triton.jit
def _dynamic_conv_lowrank_fwd_kernel(
    x_ptr, z_ptr, u_ptr, s_ptr, y_ptr, cu_ptr,  # pointers
    T, D, R, RPW, N_CU, N_SEARCH: tl.constexpr,  # sizes
    W: tl.constexpr, RP: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,  # tile shape
    HAS_CU: tl.constexpr, HAS_STATIC: tl.constexpr, RESIDUAL: tl.constexpr,  # flags
    NATIVE_DOT: tl.constexpr, PRECISION: tl.constexpr, TAP_LOOP: tl.constexpr, PREFETCH: tl.constexpr,  # flags
):
    i_t, i_d, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_r = (i_b // RPW).to(tl.int64)  # the row's run: its U and static_w
    u_ptr += i_r * R * W * D
    if HAS_STATIC:
        s_ptr += i_r * W * D
    o_t = i_t * BT + tl.arange(0, BT)  # [BT] positions in the row
    o_d = i_d * BD + tl.arange(0, BD)  # [BD]
    o_r = tl.arange(0, RP)  # [RP] ranks, padded to >= 16 for tl.dot
    m_t, m_d, m_r = o_t < T, o_d < D, o_r < R
    o_g = i_b * T + o_t  # [BT] tokens on the B*T axis
    start, _ = tu.doc_bounds(cu_ptr, o_g, i_b * T, T, N_CU, N_SEARCH, HAS_CU)
    b_y = tl.zeros([BT, BD], dtype=tl.float32)
    if TAP_LOOP and PREFETCH:  # x of the next tap loaded before this tap's dot (the last tap's again: an L1 hit)
        b_xn = _shifted_x(x_ptr, o_g, o_t, m_t, o_d, m_d, start, 0, D, HAS_CU)
        for k in range(W):
            b_x = b_xn
            b_xn = _shifted_x(x_ptr, o_g, o_t, m_t, o_d, m_d, start, tl.minimum(k + 1, W - 1), D, HAS_CU)
            b_y = _fwd_tap(b_y, k, x_ptr, z_ptr, u_ptr, s_ptr, o_g, o_t, m_t, o_r, m_r, o_d, m_d, start, R, D, W,
                           HAS_CU, HAS_STATIC, RESIDUAL, NATIVE_DOT, PRECISION, b_x, True)
    elif TAP_LOOP:  # one tap's tiles live at a time, and Triton pipelines the loop's loads
        for k in range(W):
            b_y = _fwd_tap(b_y, k, x_ptr, z_ptr, u_ptr, s_ptr, o_g, o_t, m_t, o_r, m_r, o_d, m_d, start, R, D, W,
                           HAS_CU, HAS_STATIC, RESIDUAL, NATIVE_DOT, PRECISION)
    else:
        for k in tl.static_range(W):
            b_y = _fwd_tap(b_y, k, x_ptr, z_ptr, u_ptr, s_ptr, o_g, o_t, m_t, o_r, m_r, o_d, m_d, start, R, D, W,
                           HAS_CU, HAS_STATIC, RESIDUAL, NATIVE_DOT, PRECISION)
    p_y = y_ptr + o_g.to(tl.int64)[:, None] * D + o_d[None, :]
    tl.store(p_y, b_y.to(y_ptr.dtype.element_ty), mask=m_t[:, None] & m_d[None, :])
# fmt: on


# fmt: off
@triton.jit
def _dynamic_conv_lowrank_bwd_dx_kernel(
    x_ptr, z_ptr, u_ptr, s_ptr, dy_ptr, dx_ptr, dzp_ptr, dsp_ptr, cu_ptr,  # pointers
    T, D, R, RPW, N_TOK, NDB, N_CU, N_SEARCH: tl.constexpr,  # sizes
    W: tl.constexpr, RP: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,  # tile shape
    HAS_CU: tl.constexpr, HAS_STATIC: tl.constexpr, RESIDUAL: tl.constexpr,  # flags
    NATIVE_DOT: tl.constexpr, PRECISION: tl.constexpr, WITH_DX: tl.constexpr, WITH_DZ: tl.constexpr,  # flags
    G_HALF: tl.constexpr, PREFETCH: tl.constexpr, WITH_DS: tl.constexpr,  # flags
):
    i_t, i_s, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_r = (i_b // RPW).to(tl.int64)  # the row's run: its U and static_w
    u_ptr += i_r * R * W * D
    if HAS_STATIC:
        s_ptr += i_r * W * D
    o_t = i_t * BT + tl.arange(0, BT)  # [BT] positions in the row
    o_r = tl.arange(0, RP)  # [RP] ranks, padded to >= 16 for tl.dot
    m_t, m_r = o_t < T, o_r < R
    o_g = i_b * T + o_t  # [BT] tokens on the B*T axis
    start, end = tu.doc_bounds(cu_ptr, o_g, i_b * T, T, N_CU, N_SEARCH, HAS_CU)
    b_dz = tl.zeros([BT, RP], dtype=tl.float32)  # sum over this split's channels of g[t] @ U^T
    for j in range(NDB):
        o_d = (i_s * NDB + j) * BD + tl.arange(0, BD)  # [BD]
        m_d = o_d < D
        p_dy = dy_ptr + o_g.to(tl.int64)[:, None] * D + o_d[None, :]
        b_dy = tl.load(p_dy, mask=m_t[:, None] & m_d[None, :], other=0.0).to(tl.float32)  # [BT, BD]
        b_dx = b_dy if RESIDUAL else tl.zeros([BT, BD], dtype=tl.float32)
        b_dyn = b_dy  # PREFETCH: dy[t + k] of the next tap, loaded before this tap's dot (tap 0's is b_dy)
        for k in range(W):  # a loop, not unrolled: one tap's tiles live at a time
            b_dyk = b_dyn
            if WITH_DX and PREFETCH:
                b_dyn = _dy_ahead(dy_ptr, o_g, o_t, m_t, o_d, m_d, tl.minimum(k + 1, W - 1), T, D)  # last: L1 hit
            b_dx, b_uk = _dx_tap(b_dx, k, z_ptr, u_ptr, s_ptr, dy_ptr, o_g, o_t, m_t, o_r, m_r, o_d, m_d, end, T, R,
                                 D, W, HAS_CU, HAS_STATIC, WITH_DX, NATIVE_DOT, PRECISION, b_dyk, WITH_DX and PREFETCH)
            if WITH_DZ:  # dz: g[t, (k, d)] = dy[t, d] * x[t - k, d], zero before t's document start
                b_g = b_dy * _shifted_x(x_ptr, o_g, o_t, m_t, o_d, m_d, start, k, D, HAS_CU)  # [BT, BD]
                if WITH_DS:  # this tile's sum of g: row (i_b, i_t) of the [B * tiles, W, D] partials
                    p_ds = dsp_ptr + ((i_b * tl.cdiv(T, BT) + i_t) * W + k).to(tl.int64) * D + o_d
                    tl.store(p_ds, tl.sum(b_g, axis=0), mask=m_d)
                if G_HALF:  # g rounded to U's half type: the dot's products exact, summed in fp32
                    b_dz = tl.dot(b_g.to(b_uk.dtype), tl.trans(b_uk), acc=b_dz)  # [BT, RP]
                else:
                    b_dz += tl.dot(b_g, tl.trans(b_uk.to(tl.float32)), input_precision=PRECISION)  # [BT, RP]
        if WITH_DX:
            p_dx = dx_ptr + o_g.to(tl.int64)[:, None] * D + o_d[None, :]
            tl.store(p_dx, b_dx.to(dx_ptr.dtype.element_ty), mask=m_t[:, None] & m_d[None, :])
    if WITH_DZ:
        p_dz = dzp_ptr + (i_s.to(tl.int64) * N_TOK + o_g)[:, None] * R + o_r[None, :]
        tl.store(p_dz, b_dz.to(dzp_ptr.dtype.element_ty), mask=m_t[:, None] & m_r[None, :])
# fmt: on


# fmt: off
@triton.jit
def _dynamic_conv_lowrank_bwd_du_kernel(
    x_ptr, z_ptr, dy_ptr, dup_ptr, dsp_ptr, cu_ptr,  # pointers
    T, D, R, RPW, N_CH, N_TB, TPC, N_CU, N_SEARCH: tl.constexpr,  # sizes
    W: tl.constexpr, WP: tl.constexpr, RP: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,  # tile shape
    HAS_CU: tl.constexpr, HAS_STATIC: tl.constexpr, PRECISION: tl.constexpr, DS_DEFER: tl.constexpr,  # flags
):
    i_d, i_c = tl.program_id(0), tl.program_id(1)
    o_r = tl.arange(0, RP)  # [RP] ranks, padded to >= 16 for tl.dot
    m_r = o_r < R
    # tap-channel columns j = k * BD + (d - d0) of this channel block
    o_j = tl.arange(0, WP * BD)  # [WP * BD]
    k_j = o_j // BD
    d_j = i_d * BD + o_j % BD
    m_j = (k_j < W) & (d_j < D)
    b_du = tl.zeros([RP, WP * BD], dtype=tl.float32)  # this chunk's sum of z[t]^T g[t]
    b_ds = tl.zeros([WP * BD], dtype=tl.float32)  # this chunk's sum of g[t]
    b_dsa = tl.zeros([BT, WP * BD], dtype=tl.float32)  # DS_DEFER: the same, token slot by token slot
    for j in range(TPC):
        i_b, o_g, o_t, m_t = tu.chunk_tile(i_c, j, N_CH, TPC, N_TB, T, RPW, BT)
        start, _ = tu.doc_bounds(cu_ptr, o_g, i_b * T, T, N_CU, N_SEARCH, HAS_CU)
        # g[t, (k, d)] = dy[t, d] * x[t - k, d], zero for taps before t's document start
        m_tj = m_t[:, None] & m_j[None, :]
        p_x2 = x_ptr + (o_g[:, None] - k_j[None, :]).to(tl.int64) * D + d_j[None, :]
        b_x2 = tl.load(p_x2, mask=m_tj & (o_t[:, None] >= k_j[None, :]), other=0.0).to(tl.float32)
        if HAS_CU:
            b_x2 = tl.where(o_g[:, None] - k_j[None, :] >= start[:, None], b_x2, 0.0)  # [BT, WP * BD]
        p_dy2 = dy_ptr + o_g.to(tl.int64)[:, None] * D + d_j[None, :]
        b_dy2 = tl.load(p_dy2, mask=m_tj, other=0.0).to(tl.float32)  # [BT, WP * BD]
        b_g = b_dy2 * b_x2
        p_z = z_ptr + o_g.to(tl.int64)[:, None] * R + o_r[None, :]
        b_z = tl.load(p_z, mask=m_t[:, None] & m_r[None, :], other=0.0).to(tl.float32)  # [BT, RP]
        b_du += tl.dot(tl.trans(b_z), b_g, input_precision=PRECISION)
        if HAS_STATIC:
            if DS_DEFER:
                b_dsa += b_g
            else:
                b_ds += tl.sum(b_g, axis=0)
    if HAS_STATIC and DS_DEFER:
        b_ds = tl.sum(b_dsa, axis=0)
    p_du = dup_ptr + (i_c * R + o_r[:, None]).to(tl.int64) * (W * D) + (k_j * D + d_j)[None, :]
    tl.store(p_du, b_du, mask=m_r[:, None] & m_j[None, :])
    if HAS_STATIC:
        p_ds = dsp_ptr + (i_c * W + k_j).to(tl.int64) * D + d_j
        tl.store(p_ds, b_ds, mask=m_j)
# fmt: on


# fmt: off
@triton.jit
def _dynamic_conv_lowrank_bwd_du_taps_kernel(
    x_ptr, z_ptr, dy_ptr, dup_ptr, dsp_ptr, cu_ptr,  # pointers
    T, D, R, RPW, N_CH, N_TB, TPC, N_CU, N_SEARCH: tl.constexpr,  # sizes
    W: tl.constexpr, RP: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,  # tile shape
    HAS_CU: tl.constexpr, HAS_STATIC: tl.constexpr, PRECISION: tl.constexpr, TRANS: tl.constexpr,  # flags
    G_HALF: tl.constexpr,  # flags
):
    i_d, i_c = tl.program_id(0), tl.program_id(1)
    o_r = tl.arange(0, RP)  # [RP] ranks, padded to >= 16 for tl.dot (> R with static_w: rank R is its ones)
    o_d = i_d * BD + tl.arange(0, BD)  # [BD]
    m_r, m_d = o_r < R, o_d < D
    b_dus = ()  # tap k's sum over the chunk of z[t]^T g[t, (k, .)]: [RP, BD] each, TRANS [BD, RP]; row R dstatic_w's
    for _ in tl.static_range(W):
        if TRANS:
            b_dus = b_dus + (tl.zeros([BD, RP], dtype=tl.float32),)
        else:
            b_dus = b_dus + (tl.zeros([RP, BD], dtype=tl.float32),)
    for j in range(TPC):
        i_b, o_g, o_t, m_t = tu.chunk_tile(i_c, j, N_CH, TPC, N_TB, T, RPW, BT)
        start = tu.doc_bounds(cu_ptr, o_g, i_b * T, T, N_CU, N_SEARCH, HAS_CU)[0]  # each token's document start
        p_z = z_ptr + o_g.to(tl.int64)[:, None] * R + o_r[None, :]
        b_z = tl.load(p_z, mask=m_t[:, None] & m_r[None, :], other=0.0)  # [BT, RP]
        b_z = b_z if G_HALF else b_z.to(tl.float32)
        if HAS_STATIC:  # 1 is exact in every type
            b_z = tl.where(m_t[:, None] & (o_r == R)[None, :], 1.0, b_z).to(b_z.dtype)
        if TRANS:  # the channels first: g^T [BD, BT] is the dot's left operand, BD rows (a warpgroup's dot)
            p_dy = dy_ptr + o_g.to(tl.int64)[None, :] * D + o_d[:, None]
            b_dy = tl.load(p_dy, mask=m_d[:, None] & m_t[None, :], other=0.0).to(tl.float32)  # [BD, BT]
        else:
            p_dy = dy_ptr + o_g.to(tl.int64)[:, None] * D + o_d[None, :]
            b_dy = tl.load(p_dy, mask=m_t[:, None] & m_d[None, :], other=0.0).to(tl.float32)  # [BT, BD]
            b_zt = tl.trans(b_z)  # [RP, BT]
        b_new = ()
        for k in tl.static_range(W):  # g[t, (k, d)] = dy[t, d] * x[t - k, d], zero before t's document start
            m_k = m_t & (o_t >= k)
            if HAS_CU:
                m_k = m_k & (o_g - k >= start)
            if TRANS:
                p_x = x_ptr + (o_g - k).to(tl.int64)[None, :] * D + o_d[:, None]
                b_g = b_dy * tl.load(p_x, mask=m_d[:, None] & m_k[None, :], other=0.0).to(tl.float32)  # [BD, BT]
                b_g = b_g.to(b_z.dtype)  # G_HALF: rounded to z's half type, the dot's products exact
                b_new = b_new + (tl.dot(b_g, b_z, acc=b_dus[k], input_precision=PRECISION),)
            else:
                p_x = x_ptr + (o_g - k).to(tl.int64)[:, None] * D + o_d[None, :]
                b_g = b_dy * tl.load(p_x, mask=m_k[:, None] & m_d[None, :], other=0.0).to(tl.float32)  # [BT, BD]
                b_g = b_g.to(b_z.dtype)
                b_new = b_new + (tl.dot(b_zt, b_g, acc=b_dus[k], input_precision=PRECISION),)
        b_dus = b_new
    for k in tl.static_range(W):  # this chunk's partials: rows i_c of [chunks, R, W * D] and [chunks, W, D]
        if TRANS:
            p_du = dup_ptr + (i_c * R + o_r[None, :]).to(tl.int64) * (W * D) + k * D + o_d[:, None]
            tl.store(p_du, b_dus[k], mask=m_d[:, None] & m_r[None, :])
            if HAS_STATIC:
                b_ds = tl.sum(tl.where((o_r == R)[None, :], b_dus[k], 0.0), axis=1)  # [BD]
                tl.store(dsp_ptr + (i_c * W + k).to(tl.int64) * D + o_d, b_ds, mask=m_d)
        else:
            p_du = dup_ptr + (i_c * R + o_r[:, None]).to(tl.int64) * (W * D) + k * D + o_d[None, :]
            tl.store(p_du, b_dus[k], mask=m_r[:, None] & m_d[None, :])
            if HAS_STATIC:
                b_ds = tl.sum(tl.where((o_r == R)[:, None], b_dus[k], 0.0), axis=0)  # [BD]
                tl.store(dsp_ptr + (i_c * W + k).to(tl.int64) * D + o_d, b_ds, mask=m_d)
# fmt: on


# fmt: off
@triton.jit
def _dynamic_conv_lowrank_bwd_fused_kernel(
    x_ptr, z_ptr, u_ptr, s_ptr, dy_ptr, dx_ptr, dzp_ptr, dup_ptr, dsp_ptr, cu_ptr,  # pointers
    T, D, R, RPW, N_CH, N_TB, TPC, N_TOK, N_CU, N_SEARCH: tl.constexpr,  # sizes
    W: tl.constexpr, RP: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,  # tile shape
    HAS_CU: tl.constexpr, HAS_STATIC: tl.constexpr, RESIDUAL: tl.constexpr,  # flags
    NATIVE_DOT: tl.constexpr, PRECISION: tl.constexpr, WITH_DX: tl.constexpr, G_HALF: tl.constexpr,  # flags
):
    i_d, i_c = tl.program_id(0), tl.program_id(1)
    i_r = (i_c // N_CH).to(tl.int64)  # the chunk's run: its U and static_w
    u_ptr += i_r * R * W * D
    if HAS_STATIC:
        s_ptr += i_r * W * D
    o_d = i_d * BD + tl.arange(0, BD)  # [BD]
    o_r = tl.arange(0, RP)  # [RP] ranks, padded to >= 16 for tl.dot (> R with static_w: rank R is its ones)
    m_d, m_r = o_d < D, o_r < R
    b_dus = ()  # tap k's sum over the chunk of z[t]^T g[t, (k, .)], [RP, BD] each; row R is dstatic_w's
    for _ in tl.static_range(W):
        b_dus = b_dus + (tl.zeros([RP, BD], dtype=tl.float32),)
    for j in range(TPC):
        i_b, o_g, o_t, m_t = tu.chunk_tile(i_c, j, N_CH, TPC, N_TB, T, RPW, BT)
        start, end = tu.doc_bounds(cu_ptr, o_g, i_b * T, T, N_CU, N_SEARCH, HAS_CU)
        m_td = m_t[:, None] & m_d[None, :]
        p_dy = dy_ptr + o_g.to(tl.int64)[:, None] * D + o_d[None, :]
        b_dy = tl.load(p_dy, mask=m_td, other=0.0).to(tl.float32)  # [BT, BD]
        p_z = z_ptr + o_g.to(tl.int64)[:, None] * R + o_r[None, :]
        b_z = tl.load(p_z, mask=m_t[:, None] & m_r[None, :], other=0.0)  # [BT, RP]
        b_z = b_z if G_HALF else b_z.to(tl.float32)
        if HAS_STATIC:  # 1 is exact in every type
            b_z = tl.where(m_t[:, None] & (o_r == R)[None, :], 1.0, b_z).to(b_z.dtype)
        b_zt = tl.trans(b_z)  # [RP, BT]
        b_dx = b_dy if RESIDUAL else tl.zeros([BT, BD], dtype=tl.float32)
        b_dz = tl.zeros([BT, RP], dtype=tl.float32)  # this channel block's share of dz
        for k in range(W):  # a loop, not unrolled: one tap's tiles live at a time
            b_g = b_dy * _shifted_x(x_ptr, o_g, o_t, m_t, o_d, m_d, start, k, D, HAS_CU)  # [BT, BD]
            b_dx, b_uk = _dx_tap(b_dx, k, z_ptr, u_ptr, s_ptr, dy_ptr, o_g, o_t, m_t, o_r, m_r, o_d, m_d, end, T, R,
                                 D, W, HAS_CU, HAS_STATIC, WITH_DX, NATIVE_DOT, PRECISION)
            if G_HALF:  # g rounded to U's half type: the dot's products exact, summed in fp32
                b_dz = tl.dot(b_g.to(b_uk.dtype), tl.trans(b_uk), acc=b_dz)  # [BT, RP]
            else:
                b_dz = tl.dot(b_g, tl.trans(b_uk.to(tl.float32)), acc=b_dz, input_precision=PRECISION)  # [BT, RP]
        # dU: each tap's accumulator of its own (unrolled), g formed again from x read back through L1
        b_new = ()
        for k in tl.static_range(W):
            b_g = b_dy * _shifted_x(x_ptr, o_g, o_t, m_t, o_d, m_d, start, k, D, HAS_CU)
            b_new = b_new + (tl.dot(b_zt, b_g.to(b_z.dtype), acc=b_dus[k], input_precision=PRECISION),)
        b_dus = b_new
        if WITH_DX:
            p_dx = dx_ptr + o_g.to(tl.int64)[:, None] * D + o_d[None, :]
            tl.store(p_dx, b_dx.to(dx_ptr.dtype.element_ty), mask=m_td)
        p_dz = dzp_ptr + (i_d.to(tl.int64) * N_TOK + o_g)[:, None] * R + o_r[None, :]  # row i_d of [NDB, B*T, R]
        tl.store(p_dz, b_dz, mask=m_t[:, None] & m_r[None, :])
    for k in tl.static_range(W):  # this chunk's partials: rows i_c of [chunks, R, W * D] and [chunks, W, D]
        p_du = dup_ptr + (i_c * R + o_r[:, None]).to(tl.int64) * (W * D) + k * D + o_d[None, :]
        tl.store(p_du, b_dus[k], mask=m_r[:, None] & m_d[None, :])
        if HAS_STATIC:
            b_ds = tl.sum(tl.where((o_r == R)[:, None], b_dus[k], 0.0), axis=0)  # [BD]
            tl.store(dsp_ptr + (i_c * W + k).to(tl.int64) * D + o_d, b_ds, mask=m_d)
# fmt: on


def _native_dot(z: torch.Tensor, U: torch.Tensor) -> bool:
    """z @ U on the tensor cores in their own half type: their products are exact in the fp32 sum. Not bf16
    under the interpreter, whose bf16 tl.dot returns garbage (Triton 3.9); the fp16 tests cover the path."""
    if z.dtype != U.dtype:
        return False
    return z.dtype == torch.float16 or (
        z.dtype == torch.bfloat16 and not tu.is_interpreted(_dynamic_conv_lowrank_fwd_kernel)
    )


def _g_half(x: torch.Tensor, z: torch.Tensor, U: torch.Tensor) -> bool:
    """LR_G_HALF applies: x, z and U share one half type, which the dots take natively."""
    return LR_G_HALF and x.dtype == z.dtype and _native_dot(z, U)


def _lowrank_fwd(
    x: torch.Tensor,
    z: torch.Tensor,
    U: torch.Tensor,
    static_w: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    residual: bool,
) -> torch.Tensor:
    """x: [B, T, D], z: [B, T, R], U: [R, W * D], static_w: [W, D] or None -> y: [B, T, D] in x's dtype. Stacked
    runs: U [runs, R, W * D] and static_w [runs, W, D], each run B / runs rows."""
    B, T, D = x.shape
    R, W, runs = z.shape[2], U.shape[-1] // D, (U.shape[0] if U.dim() == 3 else 1)
    x, z, U, static_w = tu.contiguous(x, z, U, static_w)
    y = tu.empty((B, T, D), x.dtype, x.device)
    BT, BD = tu.tiles(T, D, LR_FWD_BT, LR_FWD_BD)
    n_cu, n_search = tu.search_steps(cu_seqlens)
    grid = (tu.cdiv(T, BT), tu.cdiv(D, BD), B)
    # fmt: off
    _dynamic_conv_lowrank_fwd_kernel[grid](
        x, z, U, static_w, y, cu_seqlens, T, D, R, B // runs, n_cu, n_search, W=W,
        RP=max(16, tu.next_power_of_2(R)), BT=BT, BD=BD, HAS_CU=cu_seqlens is not None,
        HAS_STATIC=static_w is not None, RESIDUAL=residual, NATIVE_DOT=_native_dot(z, U),
        PRECISION=tu.dot_precision(x), TAP_LOOP=LR_FWD_TAP_LOOP, PREFETCH=LR_FWD_PREFETCH, num_warps=LR_FWD_WARPS,
        num_stages=LR_FWD_STAGES,
    )
    # fmt: on
    return y


def _lowrank_bwd(
    dy: torch.Tensor,
    x: torch.Tensor,
    z: torch.Tensor,
    U: torch.Tensor,
    static_w: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    residual: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dy, x: [B, T, D], z: [B, T, R], U: [R, W * D], static_w: [W, D] or None -> (dx [B, T, D], dz [B, T, R],
    dU [R, W * D], dstatic_w [W, D], or [0] without static_w), each in the dtype of its input. Stacked runs: U and
    static_w (and their gradients) with a leading run axis, as ``_lowrank_fwd``."""
    B, T, D = x.shape
    R, W, runs = z.shape[2], U.shape[-1] // D, (U.shape[0] if U.dim() == 3 else 1)
    rows = B // runs  # of each run
    dy, x, z, U, static_w = tu.contiguous(dy, x, z, U, static_w)
    WP, RP = tu.next_power_of_2(W), max(16, tu.next_power_of_2(R))
    n_cu, n_search = tu.search_steps(cu_seqlens)
    flags = dict(HAS_CU=cu_seqlens is not None, HAS_STATIC=static_w is not None, PRECISION=tu.dot_precision(x))
    dx = tu.empty((B, T, D), x.dtype, x.device)
    fused = LR_DZ_FORM in ("fused", "with-du")
    # dx and dz in the dx kernel: the split count is a function of the shape only, so dz sums its partials in a
    # fixed order; a launch without dz makes every channel block a program of its own
    BT, BD = tu.tiles(T, D, LR_DX_BT, LR_DX_BD)
    n_db = tu.cdiv(D, BD)
    n_split = max(1, min(LR_DZ_SPLITS, n_db))
    # the dz-only launch ("own") on tiles of its own, its splits of its own channel blocks
    BTZ, BDZ = tu.tiles(T, D, LR_DZ_BT, LR_DZ_BD)
    n_dbz = tu.cdiv(D, BDZ)
    n_splitz = max(1, min(LR_DZ_SPLITS, n_dbz))
    dz = dz_partial = ds_partial = None
    # dstatic_w summed in the dz launch (LR_DZ_DS): fp32 partials a token tile of it, and no rank of its own in dU
    ds_in_dz = LR_DZ_DS and static_w is not None and LR_DZ_FORM in ("own", "dx")
    if ds_in_dz:
        bt_ds = BTZ if LR_DZ_FORM == "own" else BT
        ds_partial = tu.empty((B * tu.cdiv(T, bt_ds), W, D), torch.float32, x.device)
    if not fused:
        n_part = n_splitz if LR_DZ_FORM == "own" else n_split
        dz = tu.empty((B, T, R), z.dtype, x.device)
        dz_partial = dz if n_part == 1 else tu.empty((n_part, B, T, R), torch.float32, x.device)
    # (dx, dz, token tile, channel block, its programs a tile, channel blocks, warps, stages)
    launches = {"dx": [(True, True, BT, BD, n_split, n_db, LR_DX_WARPS, LR_DX_STAGES)],
                "own": [(True, False, BT, BD, n_db, n_db, LR_DX_WARPS, LR_DX_STAGES),
                        (False, True, BTZ, BDZ, n_splitz, n_dbz, LR_DZ_WARPS, LR_DZ_STAGES)],
                "with-du": [(True, False, BT, BD, n_db, n_db, LR_DX_WARPS, LR_DX_STAGES)], "fused": []}[LR_DZ_FORM]
    for with_dx, with_dz, bt, bd, n_prog, n_blocks, warps, stages in launches:
        # fmt: off
        _dynamic_conv_lowrank_bwd_dx_kernel[(tu.cdiv(T, bt), n_prog, B)](
            x, z, U, static_w, dy, dx, dz_partial, ds_partial, cu_seqlens, T, D, R, rows, B * T,
            tu.cdiv(n_blocks, n_prog), n_cu, n_search, W=W, RP=RP, BT=bt, BD=bd, RESIDUAL=residual,
            NATIVE_DOT=_native_dot(z, U), **flags, WITH_DX=with_dx, WITH_DZ=with_dz,
            G_HALF=with_dz and _g_half(x, z, U), PREFETCH=LR_DX_PREFETCH, WITH_DS=with_dz and ds_in_dz,
            num_warps=warps, num_stages=stages, maxnreg=LR_DX_MAXNREG,
        )
        # fmt: on
    if fused:
        # the fused kernel: fp32 partials of dz (per channel block) and of dU, dstatic_w (per chunk), and dx
        BT, BD = tu.tiles(T, D, LR_FU_BT, LR_FU_BD)
        n_tb, n_db = tu.cdiv(T, BT), tu.cdiv(D, BD)
        per_chunk, n_chunks = tu.chunk_plan(rows * n_tb, n_db, LR_FU_PROGRAMS)  # a run alone's plan
        dz_partial = tu.empty((n_db, B * T, R), torch.float32, x.device)
        du_partial = tu.empty((runs * n_chunks, R, W * D), torch.float32, x.device)
        ds_partial = None if static_w is None else tu.empty((runs * n_chunks, W, D), torch.float32, x.device)
        # fmt: off
        _dynamic_conv_lowrank_bwd_fused_kernel[(n_db, runs * n_chunks)](
            x, z, U, static_w, dy, dx, dz_partial, du_partial, ds_partial, cu_seqlens, T, D, R, rows, n_chunks, n_tb,
            per_chunk, B * T, n_cu, n_search, W=W, RP=max(16, tu.next_power_of_2(R + (static_w is not None))), BT=BT,
            BD=BD, RESIDUAL=residual, NATIVE_DOT=_native_dot(z, U), **flags, WITH_DX=LR_DZ_FORM == "fused",
            G_HALF=_g_half(x, z, U), num_warps=LR_FU_WARPS, num_stages=LR_FU_STAGES, maxnreg=LR_FU_MAXNREG,
        )
        # fmt: on
        dz = tu.sum_partials(dz_partial, z.dtype).view(B, T, R)
    else:
        if dz_partial is not dz:
            dz = tu.sum_partials(dz_partial, z.dtype)
        # dU and dstatic_w: fp32 partials per chunk of token tiles
        BT, BD = tu.tiles(T, D, LR_DU_BT, LR_DU_BD)
        n_tb, n_db = tu.cdiv(T, BT), tu.cdiv(D, BD)
        per_chunk, n_chunks = tu.chunk_plan(rows * n_tb, n_db, LOWRANK_BWD_PROGRAMS)  # a run alone's plan
        du_partial = tu.empty((runs * n_chunks, R, W * D), torch.float32, x.device)
        du_static = static_w is not None and not ds_in_dz  # dstatic_w summed here too
        if du_static:
            ds_partial = tu.empty((runs * n_chunks, W, D), torch.float32, x.device)
        du_flags = dict(flags, HAS_STATIC=du_static)
        # fmt: off
        if LR_DU_FORM == "wide":
            _dynamic_conv_lowrank_bwd_du_kernel[(n_db, runs * n_chunks)](
                x, z, dy, du_partial, ds_partial, cu_seqlens, T, D, R, rows, n_chunks, n_tb, per_chunk, n_cu,
                n_search, W=W, WP=WP, RP=RP, BT=BT, BD=BD, **du_flags, DS_DEFER=LR_DU_DS_DEFER,
                num_warps=LR_DU_WARPS, num_stages=LR_DU_STAGES,
            )
        else:
            _dynamic_conv_lowrank_bwd_du_taps_kernel[(n_db, runs * n_chunks)](
                x, z, dy, du_partial, ds_partial, cu_seqlens, T, D, R, rows, n_chunks, n_tb, per_chunk, n_cu,
                n_search, W=W, RP=max(16, tu.next_power_of_2(R + du_static)), BT=BT, BD=BD, **du_flags,
                TRANS=LR_DU_FORM == "taps-t", G_HALF=_g_half(x, z, U), num_warps=LR_DU_WARPS,
                num_stages=LR_DU_STAGES,
            )
        # fmt: on
    dU = tu.sum_partials(du_partial, U.dtype, groups=runs).view(U.shape)
    if static_w is None:
        return dx, dz, dU, x.new_empty(0)
    return dx, dz, dU, tu.sum_partials(ds_partial, static_w.dtype, groups=runs).view(static_w.shape)


def _fold_runs(info, in_dims: tuple, x: torch.Tensor, z: torch.Tensor, U: torch.Tensor,
               static_w: torch.Tensor | None, cu_seqlens: torch.Tensor | None, residual: bool):
    """vmap rule: the runs' rows fold into the batch and their U and static_w into a leading run axis, one
    launch for all (stacked runs: x [R, B, T, D]); with documents (offsets into one run's B*T tokens), or with
    U or static_w shared by the runs, one launch per run."""
    x_dim, z_dim, u_dim, s_dim = in_dims[:4]
    if cu_seqlens is not None or u_dim is None or (static_w is not None and s_dim is None):
        return tu.per_run_vmap(lowrank_triton.op)(info, in_dims, x, z, U, static_w, cu_seqlens, residual)
    n = info.batch_size
    static_w = None if static_w is None else static_w.movedim(s_dim, 0)
    y = lowrank_triton.op(tu.run_rows(x, x_dim, n), tu.run_rows(z, z_dim, n), U.movedim(u_dim, 0), static_w, None,
                          residual)
    return y.unflatten(0, (n, -1)), 0


# lowrank_triton(x, z, U, static_w, cu_seqlens, residual) -> y, inputs as ``_lowrank_fwd`` takes them
lowrank_triton = tu.TritonOp("dynamic_conv_lowrank", _lowrank_fwd, _lowrank_bwd, vmap=_fold_runs)
