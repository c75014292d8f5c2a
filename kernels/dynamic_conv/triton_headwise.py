"""Head-wise dynamic short causal convolution over packed documents in Triton: the kernels, their launchers
and the op with its backward (``kernels.dynamic_conv.op`` checks the inputs and picks the backend).

As ``kernels.short_conv``, tap k of output t multiplies x[t - k] and reads zero before the start of t's
document; the weights of every tap are those of the output token t.

Weight [B, T, H, W], a channel's head is d // hs with hs = D / H. A tile is [BT, NH, HSP]: NH heads of hs
channels (padded to the power of two HSP), so a head's channels are one axis of the tile and
    dweight[t, h, k] = sum over the head's channels of dy[t, d] * x[t - k, d]
is a sum along that axis. Backward programs own (a head block, a chunk of token tiles):
    dx[t] = sum_k (weight[t + k, h, k] + static_w[k]) * dy[t + k]     for t + k in t's document
and dstatic_w[k] = sum_t dy[t] * x[t - k] goes through fp32 partials per chunk (``kernels.triton_utils``).

The streaming forms walk each row's positions a few at a time, keeping the last W rows of x (and dy) in registers
(``kernels.short_conv.triton`` explains them). Where heads hold several channels they may take a second layout,
[NH, HSP // WP, WP] (WP the width rounded up to a power of two): channel g * WP + j reads tap j of its head, so a
thread's WP channels read the head's taps as one vector and pass tap k to one another inside the thread.

Stacked runs fold into one launch as in ``kernels.short_conv.triton``: x and weight [R * B, ...] with static_w
[R, W, D], row b using run b // B's (``RPW``), dstatic_w summed over each run's chunks as a run alone sums them
(``_fold_runs``).
"""

import torch
from mixlab.kernels import triton_utils as tu
from mixlab.kernels._triton import tl, triton

# Tiles, warps and pipelining stages, fixed by shape (no autotuning); scripts/tune_shortconv_gpu.py times
# candidates on the GPU. Forward: about HW_FWD_TILE elements a [BT, NH, HSP] tile of HW_FWD_CHANNELS channels
# (NH heads of HSP; at head size 1, 128 channels leave 4 tokens a tile, so each of the W shifted loads re-reads
# most of the tile: fewer channels buy longer tiles, yet 512 x 128 timed fastest on the H200, BENCHMARKS.md).
HW_FWD_TILE, HW_FWD_WARPS, HW_FWD_CHANNELS = 512, 4, 128
# The forward's tile where heads hold several channels (HW_FWD_TILE above then serves head size 1 only): the two
# shared one tile when the tune script chose 512 for their sum (2026-12-03); at head size 16 alone 1024 timed
# faster on the H200 in an earlier kernel (2026-12-02: 81.9 / 89.9 µs without / with 64 documents against 95.9 /
# 124.4; BENCHMARKS.md). Its own tune group ("head-wise fwd wide heads") timed it on the H200 (2026-12-05, two
# interleaved rounds): 1024 79.3 / 87.1 µs without / with 64 documents, 512 82.5 / 110.3, 2048 91.3 / 82.5. It
# serves the wide heads only where the streaming forward below does not (HW_FWD_STREAM_WIDE off, or odd head sizes).
HW_FWD_TILE_WIDE = 1024
# How the forward reads a token's weights: False, all W taps as one [BT, NH, W] tile (contiguous), each tap then
# picked out of it and moved into the activations' layout (through shared memory); True, tap by tap as the
# backward does ([BT, NH] strided loads of the same lines), which at head size 16 need no move at all (at head
# size 1 they still do: W elements apart, they cannot share the activations' layout). Timed by the tune script.
HW_FWD_TAP_LOADS = False
# Backward: one program per head block and chunk of token tiles, about HW_BWD_PROGRAMS programs. 1024-element
# tiles timed fastest with dstatic_w deferred (below; head size 16: 175 µs against 205 at 512, 269 at 256).
HW_BWD_TILE, HW_BWD_WARPS, HW_BWD_STAGES, HW_BWD_PROGRAMS, HW_BWD_CHANNELS = 1024, 4, 1, 4096, 128
# Register cap of the backward (None: the compiler's choice: at head size 1, 110 registers at a 512-element tile,
# 190 at 1024; scripts/kernel_resources.py). Timed by the tune script; no cap was faster on the H200.
HW_BWD_MAXNREG = None
# How the backward stores dweight: False, tap by tap (W strided stores that fill the same lines); True, the W taps
# of a tile assembled in registers and stored as one [BT, NH, W] tile (contiguous, but the assembly costs
# registers and a layout change through shared memory). True timed faster on the H200 (BENCHMARKS.md).
HW_BWD_DW_TILE = True
# Where the backward of every head size sums dstatic_w over a tile's tokens: False, at every tap of every tile (a
# reduction across the tile's threads); True (widths up to 8), once after its chunk of tiles, each tap's products
# added up token slot by token slot in a [BT, NH, HSP] sum of its own, as the static backward does (registers: W
# more tiles). Its first form, one [WP, BT, NH, HSP] sum updated whole at every tap (W times the arithmetic),
# timed slower on the H200 (2026-12-03, BENCHMARKS.md): head size 16 at 512 x 128 280 µs against 197 (302
# against 221 with 64 documents). This one, compiled for sm_90a (Triton 3.9, scripts/kernel_resources.py) at head
# size 16, 512 x 128: 72 registers (64 with documents), no spills, 8 shuffles and no barrier in its loop (summed
# every tile: 40 and 16). The tune script timed it on the H200 (2026-12-04, two interleaved rounds, BENCHMARKS.md)
# at head size 16: 175 µs at 1024 x 128 against 197 for the every-tile form at 512 x 128 (192 against 221 with 64
# documents); head size 1 takes its own kernel (below) either way.
HW_BWD_DS_DEFER = True
# Backward at head size 1 (H = D): True, the taps become the tile's third axis ([BT, NH, WP], the weights' own
# layout): x and dy are gathered at their W shifts into it, the weights and dweight read and written as stored,
# every tap summed in one reduction, no tap picked out of a tile or moved between layouts one by one (compiled
# for the H200: 4 layout moves against the default kernel's 9). The tune script timed it on the H200 at 819 µs
# (tile 512 x 64) against the default kernel's 899 (B=4, T=4096, D=2048, W=4, bf16; BENCHMARKS.md). The forward
# written the same way ran 2.8x slower than the default kernel there (383 against 135 µs) and was removed.
HW_HS1_BWD_TAPS_AXIS = True
# Its own tile (a [BT, NH, WP] tile holds W times the elements of the default kernel's): about HW_HS1_BWD_TILE
# elements of HW_HS1_BWD_CHANNELS channels before the taps axis. Compiled for the H200 (scripts/kernel_resources,
# BENCHMARKS.md): 512 x 128 95 registers, 256 x 128 80, 1024 x 128 128 (164 with documents). Timed there with
# dstatic_w summed every tile: 512 x 64 fastest, 512 x 128 861 µs, 1024 x 128 976, 256 x 64 or 128 about 1,480;
# summed once a chunk (below), 512 x 128 fastest (2026-12-03): 631 µs against 668 at 512 x 64, 875 at 512 x 32.
HW_HS1_BWD_TILE, HW_HS1_BWD_CHANNELS = 512, 128
# Where that kernel sums dstatic_w over the tile's tokens: False, every tile (a reduction across threads: its
# loop's PTX for sm_90a holds 48 shuffles and 14 barriers, 32 and 6 with True; scripts/kernel_resources.py); True,
# once after its chunk of tiles, the tiles added up token slot by token slot in a [BT, ND, WP] accumulator
# (registers). The same sums in another order: rounding differs, each is repeatable. The tune script timed it on
# the H200 (2026-12-03, BENCHMARKS.md) at 631 µs (512 x 128) against 821 every tile (512 x 64); 681 against 864
# with 64 documents.
HW_HS1_BWD_DS_DEFER = True
# How that kernel reads weight[t + k, d, k] for dx: False, gathered where used (the tap axis crosses rows, so each
# thread loads one 2-byte element at a time: 16 narrow loads a tile, each warp's request spanning four times the
# bytes it uses; Nsight Compute put the kernel at 94% of L1 throughput, 19% of DRAM's); True, the rows t0 ..
# t0 + 2 BT - 1 of weight and dy loaded as stored (contiguous taps: one wide load a row) and each output's taps
# picked out of them in the tile (tl.gather along the token axis). Needs W - 1 <= BT (else False is used).
# The tune script timed it on the H200 (2026-12-03, BENCHMARKS.md) at 492 µs against 631 (512 x 128), 537 against
# 682 with 64 documents.
HW_HS1_BWD_GATHER = True
# The streaming forms (``kernels.short_conv.triton`` explains them): one program per row, block of about
# HW_STREAM_*_BD channels (whole heads, [NH, HSP]) and CH positions walked U a step, x and dy read once into
# registers and shifted there; a token's weights read tap by tap where used, and dweight summed over a head's
# channels position by position. Widths up to tu.SLOTS. Timed on the H200 (2026-12-04, two interleaved rounds,
# BENCHMARKS.md), raw launchers, µs without (with 64) documents: backward at 128 positions, 4 a step, 64 channels:
# head size 1 340 (421) against 486 (531) for the tiled kernel above, head size 16 214 (255) against 172 (188); so
# the backward streams at head sizes up to HW_BWD_STREAM_HS (0: never). The forward at its best setting (32, 8, 64
# channels): head size 1 125 (173) against 135 (152) tiled, head size 16 92 (141) against 82 (110). Wide heads
# now stream on a layout of their own (HW_FWD_STREAM_WIDE below), so the forward, too, streams on this one at head
# sizes up to HW_FWD_STREAM_HS (0: never): at head size 1 and 4 positions a step it timed 126.3 (137.6) against 136
# (152) tiled (2026-12-05, with the joined dweight and weight rows below: the backward at 128 positions, 4 a step,
# 32 channels 238.6 (246.4)). Head sizes that neither covers take the tiled kernels.
HW_FWD_STREAM_HS, HW_STREAM_FWD_CH, HW_STREAM_FWD_U, HW_STREAM_FWD_BD, HW_STREAM_FWD_WARPS = 1, 32, 4, 64, 1
HW_BWD_STREAM_HS, HW_STREAM_BWD_CH, HW_STREAM_BWD_U, HW_STREAM_BWD_BD, HW_STREAM_BWD_WARPS = 1, 128, 4, 32, 1
# How that backward stores dweight: tap by tap, [NH] values W elements apart (each store first moved into a layout
# of its own), or (HW_STREAM_BWD_DW_TILE, widths 2 and 4) the W taps joined into one [NH, W] tile of contiguous
# elements and stored once. Compiled for sm_90a (Triton 3.6, scripts/kernel_resources.py) at head size 1: 16 layout
# moves and 32 shuffles a step tap by tap, 4 and 16 joined (32 / 64 and 8 / 32 with documents), 128 registers
# either way. Timed on the H200 (2026-12-05, two interleaved rounds, raw backward at head size 1, µs without / with
# 64 documents): joined 271.6 / 364.8, tap by tap 342.0 / 426.0; with W_ROWS below, 236.6 / 317.7 against 257.7 /
# 335.2.
HW_STREAM_BWD_DW_TILE = True
# How that backward reads the weights for dx: False, output t's tap k where it is used, weight[t + k, h, k], W
# elements apart (at head size 1 one 2-byte load per channel, tap and position: 32 a step at U=4, W=4 and 64
# channels on 32 threads); True (widths 2 and 4), each position's W taps of its heads as one contiguous [NH, W]
# tile (``_hw_weight_rows``), U + W - 1 positions a step, split into taps in registers. Compiled for sm_90a
# (Triton 3.6, 2026-12-04) at head size 1: no 2-byte loads left (14 of 8 bytes a step), but the taps' moves into
# the rows' layout cost 17 layout moves and 56 shuffles a step with the joined dweight above (4 and 16 without
# W_ROWS), 117 registers (166 with documents). Timed on the H200 (2026-12-05): on, see DW_TILE above.
HW_STREAM_BWD_W_ROWS = True
# The streaming forward's weights as rows too (HW_FWD_STREAM_W_ROWS, widths 2 and 4, heads off the taps-aligned
# layout below): each position's W taps of its heads read as one contiguous [NH, W] tile and split into taps in
# registers, where tap by tap each is a 2-byte load a channel (at head size 1, 32 a step at U=4 and 64 channels,
# 64 with documents; the forward there runs at 75% of the copy rate, BENCHMARKS.md session 31). Compiled for sm_90a
# (Triton 3.6, 2026-12-05) at head size 1, U=4, 64 channels: 7 loads of 4 bytes and 8 of 8 a step against 32 of 2
# and 7 of 4, but 12 layout moves and 32 shuffles a step (24 and 64 with documents) to bring the taps into x's
# layout; 63 registers (96). Timed on the H200 (2026-12-05 session 32, two interleaved rounds, raw forward at head
# size 1, µs without / with 64 documents): 108.5 / 133.3 against 125.4 / 136.1 tap by tap; on.
HW_FWD_STREAM_W_ROWS = True
# The streaming forward where heads hold several channels, on tiles of its own. As above, a position's weights load
# tap by tap as [NH, HSP] tiles whose HSP channels of a head read the same element: each a 2-byte load of its own,
# 64 a step at head size 16 (U=8, 64 channels), with 23 layout moves and 38 shuffles (Triton 3.6); it timed 92 µs
# at best against 82 tiled. Here, where HS is a multiple of the padded width WP, the channels form a [NH, HSP // WP,
# WP] tile whose last axis lines up with the taps: channel g * WP + j of head h loads tap j, so a thread's WP
# channels read the head's WP taps as one vector, and tap k reaches all of them by a sum over that axis inside the
# thread. Compiled for sm_90a (Triton 3.6, 2026-12-05) at head size 16, U=8, 128 channels a warp: 68 registers, no
# layout move, no shuffle, 19 loads of 8 bytes a step (the static forward's streaming kernel: 86, none, none, 19 x
# 8 B). At 64 channels a warp a thread holds 2 channels, so the sum crosses threads (32 shuffles). Timed on the
# H200 (2026-12-05, two interleaved rounds, raw forward at head size 16, µs without / with 64 documents): U=4 61.8 /
# 83.9, U=8 73.2 / 96.2, U=16 86.7 / 153.1, against 79.1 / 86.7 tiled. Head sizes of other widths stream on the
# plain layout up to HW_FWD_STREAM_HS and take the tiled kernel past it (as the backward: HW_BWD_STREAM_HS).
HW_FWD_STREAM_WIDE, HW_STREAM_FWD_WIDE_CH, HW_STREAM_FWD_WIDE_U, HW_STREAM_FWD_WIDE_BD, HW_STREAM_FWD_WIDE_WARPS = (
    True, 32, 4, 128, 1)
# The streaming backward of wide heads on the same layout (it timed 214 µs at head size 16 on the plain one against
# 172 tiled): each position's W taps read once as a vector a thread, output t + k's tap k for dx taken out of it by
# a sum inside the thread; dweight's W sums over a head's channels gathered into one [NH, G, WP] tile (tap k at
# place k), summed over the groups once and stored by each head's first group from that tile's own layout. Compiled
# for sm_90a (Triton 3.6, 2026-12-05) at head size 16, U=4, 128 channels a warp: 128 registers (168 with
# documents), no layout move, no barrier, 32 shuffles (the groups' sums) and 21 loads of 8 bytes a step, against
# 106, 31 moves, 86 shuffles, 32 x 2 B and 14 x 4 B loads on the plain layout. Timed on the H200 (2026-12-05, two
# interleaved rounds, raw backward at head size 16, µs without / with 64 documents): U=2 134.8 / 134.1, U=4 123.8 /
# 147.9 (its rounds 102-146 apart), against 174.7 / 190.8 tiled; a later tune at these settings 122.3 / 119.4.
HW_BWD_STREAM_WIDE, HW_STREAM_BWD_WIDE_CH, HW_STREAM_BWD_WIDE_U, HW_STREAM_BWD_WIDE_BD, HW_STREAM_BWD_WIDE_WARPS = (
    True, 128, 2, 128, 1)
# Software pipelining by hand in the streaming forms (``kernels.short_conv.triton``'s STREAM_*_PREFETCH): a step
# loads the next step's U new rows of x (the backward: and of dy and, on the taps-aligned layout, of the weights)
# before its own work and keeps the W - 1 rows it shares with the next in registers, where without it each step
# reads U + W - 1 rows of each (the shared ones again, through L1: 2.5 times the rows at U=2, W=4). Wide heads and
# the rest each have their own switch. Untimed: off (the tune script's "prefetch" groups time them).
HW_STREAM_BWD_WIDE_PREFETCH, HW_STREAM_BWD_PREFETCH = False, False
HW_STREAM_FWD_WIDE_PREFETCH, HW_STREAM_FWD_PREFETCH = False, False


# fmt: off
@triton.jit
def _dynamic_conv_headwise_fwd_kernel(
    x_ptr, w_ptr, s_ptr, y_ptr, cu_ptr,  # pointers
    T, D, H, RPW, N_CU, N_SEARCH: tl.constexpr,  # sizes
    W: tl.constexpr, WP: tl.constexpr, HS: tl.constexpr, HSP: tl.constexpr, NH: tl.constexpr,
    BT: tl.constexpr,  # tile shape
    HAS_CU: tl.constexpr, HAS_STATIC: tl.constexpr, RESIDUAL: tl.constexpr, TAP_LOADS: tl.constexpr,  # flags
):
    i_t, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if HAS_STATIC:
        s_ptr += (i_b // RPW).to(tl.int64) * W * D  # the row's run's static weights
    o_t = i_t * BT + tl.arange(0, BT)  # [BT] positions in the row
    m_t = o_t < T
    o_g = i_b * T + o_t  # [BT] tokens on the B*T axis
    o_h = i_h * NH + tl.arange(0, NH)  # [NH] heads
    o_c = tl.arange(0, HSP)  # [HSP] channels within a head
    o_k = tl.arange(0, WP)  # [WP] taps, padded to a power of two
    m_h = o_h < H
    o_d = o_h[:, None] * HS + o_c[None, :]  # [NH, HSP] channels
    m_hc = m_h[:, None] & (o_c < HS)[None, :]
    if not TAP_LOADS:
        # the token's weights of every tap at once, [BT, NH, WP]: NH * W contiguous elements a token
        p_w = w_ptr + (o_g.to(tl.int64)[:, None, None] * H + o_h[None, :, None]) * W + o_k[None, None, :]
        m_w = m_t[:, None, None] & m_h[None, :, None] & (o_k < W)[None, None, :]
        b_w3 = tl.load(p_w, mask=m_w, other=0.0)
    start, _ = tu.doc_bounds(cu_ptr, o_g, i_b * T, T, N_CU, N_SEARCH, HAS_CU)
    b_y = tl.zeros([BT, NH, HSP], dtype=tl.float32)
    for k in tl.static_range(W):
        # the load is masked by the row only; taps before the document start are zeroed after it
        m_k = m_t & (o_t >= k)
        p_x = x_ptr + (o_g - k).to(tl.int64)[:, None, None] * D + o_d[None, :, :]
        b_x = tl.load(p_x, mask=m_k[:, None, None] & m_hc[None, :, :], other=0.0).to(tl.float32)
        if HAS_CU:
            b_x = tl.where((o_g - k >= start)[:, None, None], b_x, 0.0)
        if TAP_LOADS:
            p_wk = w_ptr + (o_g.to(tl.int64)[:, None] * H + o_h[None, :]) * W + k
            b_w = tl.load(p_wk, mask=m_t[:, None] & m_h[None, :], other=0.0).to(tl.float32)  # [BT, NH]
        else:
            b_w = tl.sum(tl.where(o_k[None, None, :] == k, b_w3, 0.0), axis=2).to(tl.float32)  # [BT, NH]
        b_wk = b_w[:, :, None]  # [BT, NH, 1], shared by the head's channels
        if HAS_STATIC:
            # read as a [BT, NH, HSP] tile (the same lines BT times, from L1) so that it takes the activations'
            # layout: an [NH, HSP] load would be moved into it through shared memory at every tap
            p_s = tl.broadcast_to(s_ptr + k * D + o_d[None, :, :], [BT, NH, HSP])
            b_s = tl.load(p_s, mask=m_hc[None, :, :], other=0.0).to(tl.float32)  # [BT, NH, HSP]
            b_wk = b_wk + b_s
        b_y += b_wk * b_x
        if RESIDUAL and k == 0:
            b_y += b_x
    p_y = y_ptr + o_g.to(tl.int64)[:, None, None] * D + o_d[None, :, :]
    tl.store(p_y, b_y.to(y_ptr.dtype.element_ty), mask=m_t[:, None, None] & m_hc[None, :, :])
# fmt: on


# fmt: off
@triton.jit
def _dynamic_conv_headwise_bwd_kernel(
    x_ptr, w_ptr, s_ptr, dy_ptr, dx_ptr, dw_ptr, dsp_ptr, cu_ptr,  # pointers
    # D and H fixed at compile time: the W shifted loads then share their address registers (an offset of k
    # rows is a constant), 110 -> 80 registers at head size 16 (scripts/kernel_resources.py)
    T, D: tl.constexpr, H: tl.constexpr, RPW, N_CH, N_TB, TPC, N_CU, N_SEARCH: tl.constexpr,  # sizes
    W: tl.constexpr, WP: tl.constexpr, HS: tl.constexpr, HSP: tl.constexpr, NH: tl.constexpr,
    BT: tl.constexpr,  # tile shape
    HAS_CU: tl.constexpr, HAS_STATIC: tl.constexpr, RESIDUAL: tl.constexpr, DW_TILE: tl.constexpr,  # flags
    DS_DEFER: tl.constexpr,
):
    i_h, i_c = tl.program_id(0), tl.program_id(1)
    i_r = i_c // N_CH  # the run whose N_CH chunks this is one of
    if HAS_STATIC:
        s_ptr += i_r.to(tl.int64) * W * D
    o_h = i_h * NH + tl.arange(0, NH)  # [NH] heads
    o_c = tl.arange(0, HSP)  # [HSP] channels within a head
    m_h = o_h < H
    o_d = o_h[:, None] * HS + o_c[None, :]  # [NH, HSP] channels
    m_hc = m_h[:, None] & (o_c < HS)[None, :]
    o_k = tl.arange(0, WP)  # [WP] taps, padded to a power of two
    b_ds = tl.zeros([WP, NH, HSP], dtype=tl.float32)  # this chunk's sum of dy[t] * x[t - k]
    # DS_DEFER (W <= tu.SLOTS): tap k's products added up token slot by token slot in a [BT, NH, HSP] sum of its
    # own (a0 ... a7; those past W are never used), reduced over tokens once after the chunk
    a0 = tl.zeros([BT, NH, HSP], dtype=tl.float32)
    a1 = tl.zeros([BT, NH, HSP], dtype=tl.float32)
    a2 = tl.zeros([BT, NH, HSP], dtype=tl.float32)
    a3 = tl.zeros([BT, NH, HSP], dtype=tl.float32)
    a4 = tl.zeros([BT, NH, HSP], dtype=tl.float32)
    a5 = tl.zeros([BT, NH, HSP], dtype=tl.float32)
    a6 = tl.zeros([BT, NH, HSP], dtype=tl.float32)
    a7 = tl.zeros([BT, NH, HSP], dtype=tl.float32)
    for j in range(TPC):
        i_b, o_g, o_t, m_t = tu.chunk_tile(i_c, j, N_CH, TPC, N_TB, T, RPW, BT)
        start, end = tu.doc_bounds(cu_ptr, o_g, i_b * T, T, N_CU, N_SEARCH, HAS_CU)
        m_tc = m_t[:, None, None] & m_hc[None, :, :]
        p_dy = dy_ptr + o_g.to(tl.int64)[:, None, None] * D + o_d[None, :, :]
        b_dy = tl.load(p_dy, mask=m_tc, other=0.0).to(tl.float32)  # [BT, NH, HSP]
        b_dx = b_dy if RESIDUAL else tl.zeros([BT, NH, HSP], dtype=tl.float32)
        if DW_TILE:
            b_dw3 = tl.zeros([BT, NH, WP], dtype=tl.float32)  # dweight of the tile's tokens, stored once
        for k in tl.static_range(W):
            # tap k of output t + k, which must lie in t's document (loads masked by the row only)
            m_b = m_t & (o_t + k < T)
            p_dyk = dy_ptr + (o_g + k).to(tl.int64)[:, None, None] * D + o_d[None, :, :]
            b_dyk = tl.load(p_dyk, mask=m_b[:, None, None] & m_hc[None, :, :], other=0.0).to(tl.float32)
            p_wk = w_ptr + ((o_g + k).to(tl.int64)[:, None] * H + o_h[None, :]) * W + k
            b_wk = tl.load(p_wk, mask=m_b[:, None] & m_h[None, :], other=0.0).to(tl.float32)  # [BT, NH]
            b_wk3 = b_wk[:, :, None]  # [BT, NH, 1]
            if HAS_STATIC:
                p_s = tl.broadcast_to(s_ptr + k * D + o_d[None, :, :], [BT, NH, HSP])
                b_s = tl.load(p_s, mask=m_hc[None, :, :], other=0.0).to(tl.float32)  # [BT, NH, HSP]
                b_wk3 = b_wk3 + b_s
            b_dxk = b_wk3 * b_dyk
            if HAS_CU:
                b_dxk = tl.where((o_g + k < end)[:, None, None], b_dxk, 0.0)
            b_dx += b_dxk
            # tap k of output t reads x[t - k], zero before t's document start
            m_f = m_t & (o_t >= k)
            p_xk = x_ptr + (o_g - k).to(tl.int64)[:, None, None] * D + o_d[None, :, :]
            b_xk = tl.load(p_xk, mask=m_f[:, None, None] & m_hc[None, :, :], other=0.0).to(tl.float32)
            if HAS_CU:
                b_xk = tl.where((o_g - k >= start)[:, None, None], b_xk, 0.0)
            b_g = b_dy * b_xk  # [BT, NH, HSP]
            b_dw = tl.sum(b_g, axis=2)  # [BT, NH], the head's channels summed
            if DW_TILE:
                b_dw3 = tl.where(o_k[None, None, :] == k, b_dw[:, :, None], b_dw3)
            else:
                # tap k of every (token, head), W elements apart: the W stores of a tile fill the same lines,
                # and no [BT, NH, W] tile to assemble (at head size 1 it cost 40 registers)
                p_dw = dw_ptr + (o_g.to(tl.int64)[:, None] * H + o_h[None, :]) * W + k
                tl.store(p_dw, b_dw.to(dw_ptr.dtype.element_ty), mask=m_t[:, None] & m_h[None, :])
            if HAS_STATIC:
                if DS_DEFER:  # into tap k's own sum (k is known at compile time)
                    a0, a1, a2, a3, a4, a5, a6, a7 = tu.slots_add(a0, a1, a2, a3, a4, a5, a6, a7, b_g, k)
                else:
                    b_dsk = tl.sum(b_g, axis=0)  # [NH, HSP]
                    b_ds = tl.where(o_k[:, None, None] == k, b_ds + b_dsk[None, :, :], b_ds)
        if DW_TILE:
            p_dw = dw_ptr + (o_g.to(tl.int64)[:, None, None] * H + o_h[None, :, None]) * W + o_k[None, None, :]
            m_dw = m_t[:, None, None] & m_h[None, :, None] & (o_k < W)[None, None, :]
            tl.store(p_dw, b_dw3.to(dw_ptr.dtype.element_ty), mask=m_dw)
        p_dx = dx_ptr + o_g.to(tl.int64)[:, None, None] * D + o_d[None, :, :]
        tl.store(p_dx, b_dx.to(dx_ptr.dtype.element_ty), mask=m_tc)
    if HAS_STATIC:
        if DS_DEFER:  # each tap's sum over its token slots, into row k of b_ds
            b_ds = tu.slot_row3(tu.slot_row3(b_ds, a0, o_k, 0, W), a1, o_k, 1, W)
            b_ds = tu.slot_row3(tu.slot_row3(b_ds, a2, o_k, 2, W), a3, o_k, 3, W)
            b_ds = tu.slot_row3(tu.slot_row3(b_ds, a4, o_k, 4, W), a5, o_k, 5, W)
            b_ds = tu.slot_row3(tu.slot_row3(b_ds, a6, o_k, 6, W), a7, o_k, 7, W)
        p_ds = dsp_ptr + (i_c * W + o_k[:, None, None]).to(tl.int64) * D + o_d[None, :, :]
        tl.store(p_ds, b_ds, mask=(o_k < W)[:, None, None] & m_hc[None, :, :])
# fmt: on


# fmt: off
@triton.jit
def _headwise_hs1_bwd_kernel(
    x_ptr, w_ptr, s_ptr, dy_ptr, dx_ptr, dw_ptr, dsp_ptr, cu_ptr,  # pointers
    T, D: tl.constexpr, RPW, N_CH, N_TB, TPC, N_CU, N_SEARCH: tl.constexpr,  # sizes
    W: tl.constexpr, WP: tl.constexpr, ND: tl.constexpr, BT: tl.constexpr,  # tile shape
    HAS_CU: tl.constexpr, HAS_STATIC: tl.constexpr, RESIDUAL: tl.constexpr, DS_DEFER: tl.constexpr,  # flags
    GATHER: tl.constexpr,
):
    """Head size 1, the taps an axis of the tile:
        dweight[t, d, k] = dy[t, d] * x[t - k, d]                          t - k in t's document
        dx[t, d] = sum_k (weight[t + k, d, k] + static_w[k, d]) * dy[t + k, d] (+ dy[t, d])   t + k in t's document
        dstatic_w[k, d] = sum_t dweight[t, d, k], per chunk into the fp32 partials."""
    i_d, i_c = tl.program_id(0), tl.program_id(1)
    i_r = i_c // N_CH  # the run whose N_CH chunks this is one of
    if HAS_STATIC:
        s_ptr += i_r.to(tl.int64) * W * D
    o_d = i_d * ND + tl.arange(0, ND)  # [ND] channels (= heads)
    o_k = tl.arange(0, WP)  # [WP] taps
    m_d = o_d < D
    m_dk = m_d[None, :, None] & (o_k < W)[None, None, :]  # [1, ND, WP]
    if HAS_STATIC:
        p_s = s_ptr + o_k[None, None, :] * D + o_d[None, :, None]  # [1, ND, WP]
        if GATHER:  # added to the [2BT, ND, WP] rows as stored
            b_s = tl.load(p_s, mask=m_dk, other=0.0).to(tl.float32)
        else:  # [BT, ND, WP], loaded at the tile's shape
            b_s = tl.load(tl.broadcast_to(p_s, [BT, ND, WP]), mask=tl.broadcast_to(m_dk, [BT, ND, WP]),
                          other=0.0).to(tl.float32)
    if DS_DEFER:
        b_dsa = tl.zeros([BT, ND, WP], dtype=tl.float32)  # the chunk's dy[t] * x[t - k], per token slot
    else:
        b_ds = tl.zeros([ND, WP], dtype=tl.float32)  # this chunk's sum of dy[t] * x[t - k]
    for j in range(TPC):
        i_b, o_g, o_t, m_t = tu.chunk_tile(i_c, j, N_CH, TPC, N_TB, T, RPW, BT)
        start, end = tu.doc_bounds(cu_ptr, o_g, i_b * T, T, N_CU, N_SEARCH, HAS_CU)
        m_3 = m_t[:, None, None] & m_dk  # [BT, ND, WP]
        o_tk = o_t[:, None, None] + o_k[None, None, :]  # [BT, 1, WP]
        # dweight: dy[t] (the same for every tap) times x[t - k], loads masked by the row only
        p_dy = tl.broadcast_to(dy_ptr + o_g.to(tl.int64)[:, None, None] * D + o_d[None, :, None], [BT, ND, WP])
        b_dy = tl.load(p_dy, mask=m_3, other=0.0).to(tl.float32)
        o_s = o_g[:, None, None] - o_k[None, None, :]  # [BT, 1, WP] source tokens of x
        p_x = x_ptr + o_s.to(tl.int64) * D + o_d[None, :, None]
        b_x = tl.load(p_x, mask=m_3 & (o_t[:, None, None] >= o_k[None, None, :]), other=0.0).to(tl.float32)
        if HAS_CU:
            b_x = tl.where(o_s >= start[:, None, None], b_x, 0.0)
        b_g = b_dy * b_x  # [BT, ND, WP]
        p_dw = dw_ptr + (o_g.to(tl.int64)[:, None, None] * D + o_d[None, :, None]) * W + o_k[None, None, :]
        tl.store(p_dw, b_g.to(dw_ptr.dtype.element_ty), mask=m_3)
        if HAS_STATIC:
            if DS_DEFER:
                b_dsa += b_g
            else:
                b_ds += tl.sum(b_g, axis=0)
        # dx: tap k of output t + k, which must lie in t's document
        o_u = o_g[:, None, None] + o_k[None, None, :]  # [BT, 1, WP] tokens whose tap k reads t
        m_u = m_3 & (o_tk < T)
        if GATHER:
            # rows u = t0 .. t0 + 2 BT - 1 of this row as stored; output i takes tap k from row i + k of the product
            q = (i_c % N_CH) * TPC + j
            o_t2 = (q % N_TB) * BT + tl.arange(0, 2 * BT)  # [2BT] positions in the row
            o_g2 = i_b * T + o_t2  # [2BT] on the B*T axis (i_b counts the stacked rows)
            m_2 = ((o_t2 < T) & ((q // N_TB) * T + o_t2 < RPW * T))[:, None, None] & m_dk  # [2BT, ND, WP]
            p_w2 = w_ptr + (o_g2.to(tl.int64)[:, None, None] * D + o_d[None, :, None]) * W + o_k[None, None, :]
            b_w2 = tl.load(p_w2, mask=m_2, other=0.0).to(tl.float32)
            if HAS_STATIC:
                b_w2 += b_s
            if RESIDUAL:
                b_w2 += tl.where(o_k == 0, 1.0, 0.0)[None, None, :]
            p_dy2 = dy_ptr + o_g2.to(tl.int64)[:, None, None] * D + o_d[None, :, None]
            b_dy2 = tl.load(p_dy2, mask=m_2, other=0.0).to(tl.float32)
            o_i = tl.broadcast_to(tl.arange(0, BT)[:, None, None] + o_k[None, None, :], [BT, ND, WP])
            b_gu = tl.gather(b_w2 * b_dy2, o_i, 0)  # [BT, ND, WP]
            b_gu = tl.where(m_u, b_gu, 0.0)
        else:
            p_wu = w_ptr + (o_u.to(tl.int64) * D + o_d[None, :, None]) * W + o_k[None, None, :]
            b_wu = tl.load(p_wu, mask=m_u, other=0.0).to(tl.float32)
            if HAS_STATIC:
                b_wu += b_s
            if RESIDUAL:
                b_wu += tl.where(o_k == 0, 1.0, 0.0)[None, None, :]
            p_dyu = dy_ptr + o_u.to(tl.int64) * D + o_d[None, :, None]
            b_dyu = tl.load(p_dyu, mask=m_u, other=0.0).to(tl.float32)
            b_gu = b_wu * b_dyu
        if HAS_CU:
            b_gu = tl.where(o_u < end[:, None, None], b_gu, 0.0)
        b_dx = tl.sum(b_gu, axis=2)  # [BT, ND]
        p_dx = dx_ptr + o_g.to(tl.int64)[:, None] * D + o_d[None, :]
        tl.store(p_dx, b_dx.to(dx_ptr.dtype.element_ty), mask=m_t[:, None] & m_d[None, :])
    if HAS_STATIC:
        if DS_DEFER:
            b_ds = tl.sum(b_dsa, axis=0)  # [ND, WP]
        p_ds = dsp_ptr + (i_c * W + o_k[None, :]).to(tl.int64) * D + o_d[:, None]
        tl.store(p_ds, b_ds, mask=m_d[:, None] & (o_k < W)[None, :])
# fmt: on


@triton.jit
def _hw_stream_setup(s_ptr, i_h, i_b, D, H, RPW, W: tl.constexpr, HS: tl.constexpr, HSP: tl.constexpr,
                     NH: tl.constexpr, HAS_STATIC: tl.constexpr):
    """A streaming program's heads ([NH], mask), channels ([NH, HSP], mask), each channel's head ([NH, HSP]) and
    its row's run's static weights (W [NH, HSP] tiles in fp32, or none)."""
    o_h = i_h * NH + tl.arange(0, NH)  # [NH] heads
    o_c = tl.arange(0, HSP)  # [HSP] channels within a head
    m_h = o_h < H
    o_d = o_h[:, None] * HS + o_c[None, :]  # [NH, HSP] channels
    m_hc = m_h[:, None] & (o_c < HS)[None, :]
    o_hd = o_h[:, None] + tl.zeros_like(o_d)  # [NH, HSP] each channel's head
    b_ss = ()
    if HAS_STATIC:
        s_ptr += (i_b // RPW).to(tl.int64) * W * D  # the row's run's static weights
        for k in tl.static_range(W):
            b_ss = b_ss + (tl.load(s_ptr + k * D + o_d, mask=m_hc, other=0.0).to(tl.float32),)  # [NH, HSP]
    return o_h, m_h, o_d, m_hc, o_hd, b_ss


@triton.jit
def _hw_stream_setup_taps(s_ptr, i_h, i_b, D, H, RPW, W: tl.constexpr, WP: tl.constexpr, HS: tl.constexpr,
                          HSP: tl.constexpr, NH: tl.constexpr, HAS_STATIC: tl.constexpr):
    """``_hw_stream_setup`` with the channels as a [NH, HSP // WP, WP] tile (``HW_FWD_STREAM_WIDE``): channel
    g * WP + j of each head; also the tap j each channel reads and the mask of each head's first group (g = 0),
    both [NH, HSP // WP, WP]."""
    o_h = i_h * NH + tl.arange(0, NH)  # [NH] heads
    o_j = tl.arange(0, WP)[None, None, :]  # [1, 1, WP] tap a channel reads
    o_c = tl.arange(0, HSP // WP)[None, :, None] * WP + o_j  # [1, G, WP] channels within a head
    m_h = o_h < H
    o_d = o_h[:, None, None] * HS + o_c  # [NH, G, WP] channels
    m_hc = m_h[:, None, None] & (o_c < HS)
    o_hd = o_h[:, None, None] + tl.zeros_like(o_d)  # [NH, G, WP] each channel's head
    o_jw = o_j + tl.zeros_like(o_d)  # [NH, G, WP]
    m_g0 = m_hc & (o_c < WP)  # [NH, G, WP]: the first group of each head
    b_ss = ()
    if HAS_STATIC:
        s_ptr += (i_b // RPW).to(tl.int64) * W * D  # the row's run's static weights
        for k in tl.static_range(W):
            b_ss = b_ss + (tl.load(s_ptr + k * D + o_d, mask=m_hc, other=0.0).to(tl.float32),)  # [NH, G, WP]
    return o_h, m_h, o_d, m_hc, o_hd, o_jw, m_g0, b_ss


@triton.jit
def _hw_fwd_step(p_y, w_ptr, b_xs, b_ss, cu_ptr, row, tb, T, D, H, o_h, m_h, o_hd, o_d, m_hc, o_jw, i_doc, start,
                 end, W: tl.constexpr, U: tl.constexpr, MASKED: tl.constexpr, HAS_STATIC: tl.constexpr,
                 RESIDUAL: tl.constexpr, TAP_AXIS: tl.constexpr, W_ROWS: tl.constexpr):
    """Outputs tb ... tb + U - 1 of one row (channel tiles) from b_xs = x[tb - W + 1] ... x[tb + U - 1]; MASKED:
    each position finds its document and reads zero before its start, else no tap of the step leaves it.
    TAP_AXIS: the tiles are [NH, G, WP] and o_jw the tap each channel reads (``_hw_stream_setup_taps``). W_ROWS:
    the weights of positions tb ... tb + U - 1 read first, as rows (``_hw_weight_rows``)."""
    if W_ROWS:
        b_wts = _hw_weight_rows(w_ptr, row, tb, T, H, o_h, m_h, W, U)
    for u in tl.static_range(U):
        t = tb + u
        if MASKED:  # positions past T (the last step's tail) stay in the row's last document
            i_doc, start, end = tu.doc_walk(cu_ptr, row + tl.minimum(t, T - 1), i_doc, start, end)
        # token t's weights, tap 0, at every channel of its head: [NH, HSP] loads of the same element HSP times (from
        # L1), so that they take x's layout ([NH] loads would be moved into it through shared memory)
        p_w = w_ptr + ((row + t).to(tl.int64) * H + o_hd) * W
        m_w = m_hc & (tl.zeros_like(o_d) + t < T)
        if TAP_AXIS:  # channel (g, j) reads tap j: a head's W taps, one vector a thread
            b_w = tl.load(p_w + o_jw, mask=m_w & (o_jw < W), other=0.0).to(tl.float32)  # [NH, G, WP]
        b_y = tl.zeros_like(b_xs[0])
        for k in tl.static_range(W):
            if TAP_AXIS:  # tap k from the thread's own copy of it, at each of the head's channels
                b_wk = tl.sum(tl.where(o_jw == k, b_w, 0.0), axis=2, keep_dims=True)  # [NH, G, 1]
            elif W_ROWS:
                b_wk = b_wts[u * W + k]  # [NH, 1]
            else:
                b_wk = tl.load(p_w + k, mask=m_w, other=0.0).to(tl.float32)  # [NH, HSP]
            if HAS_STATIC:
                b_wk = b_wk + b_ss[k]  # [NH, HSP]
            b_x = b_xs[u + W - 1 - k]  # x[t - k], zero before the row (load mask)
            if MASKED:
                b_x = tl.where(row + t - k >= start, b_x, 0.0)
            b_y += b_x * b_wk
            if RESIDUAL and k == 0:
                b_y += b_x
        m_y = m_hc & (tl.zeros_like(o_d) + t < T)
        tl.store(p_y + t.to(tl.int64) * D, b_y.to(p_y.dtype.element_ty), mask=m_y)
    return i_doc, start, end


# fmt: off
@triton.jit
def _headwise_fwd_stream_kernel(
    x_ptr, w_ptr, s_ptr, y_ptr, cu_ptr,  # pointers
    T, D, H, RPW, CH, N_CU, N_SEARCH: tl.constexpr,  # sizes
    W: tl.constexpr, HS: tl.constexpr, HSP: tl.constexpr, NH: tl.constexpr, U: tl.constexpr,  # tile shape
    HAS_CU: tl.constexpr, HAS_STATIC: tl.constexpr, RESIDUAL: tl.constexpr, TAP_AXIS: tl.constexpr,  # flags
    WP: tl.constexpr, W_ROWS: tl.constexpr, PREFETCH: tl.constexpr,
):
    i_t, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if TAP_AXIS:
        o_h, m_h, o_d, m_hc, o_hd, o_jw, _, b_ss = _hw_stream_setup_taps(s_ptr, i_h, i_b, D, H, RPW, W, WP, HS, HSP,
                                                                         NH, HAS_STATIC)
    else:
        o_h, m_h, o_d, m_hc, o_hd, b_ss = _hw_stream_setup(s_ptr, i_h, i_b, D, H, RPW, W, HS, HSP, NH, HAS_STATIC)
        o_jw = o_hd  # unused
    row = i_b * T  # the row's position 0 on the B*T axis
    p_x = x_ptr + row.to(tl.int64) * D + o_d  # [NH, HSP] (TAP_AXIS: [NH, G, WP])
    p_y = y_ptr + row.to(tl.int64) * D + o_d
    t0 = i_t * CH
    i_doc, start, end = tu.doc_start_state(cu_ptr, row, t0, T, N_CU, N_SEARCH, HAS_CU)
    if PREFETCH:
        b_xs = tu.stream_rows(p_x, o_d, m_hc, t0 - (W - 1), T, D, U + W - 1)
    for tb in range(t0, t0 + CH, U):
        if PREFETCH:  # the next step's U new rows first (none past the program's end)
            b_xn = tu.stream_rows(p_x, o_d, m_hc, tb + U, tl.minimum(T, t0 + CH), D, U)
        else:
            b_xs = tu.stream_rows(p_x, o_d, m_hc, tb - (W - 1), T, D, U + W - 1)  # x[tb - W + 1] ... x[tb + U - 1]
        if HAS_CU:
            one, i_doc, start, end = tu.in_one_doc(cu_ptr, row, tb - (W - 1), tb + U - 1, T, i_doc, start, end)
            if one:
                i_doc, start, end = _hw_fwd_step(p_y, w_ptr, b_xs, b_ss, cu_ptr, row, tb, T, D, H, o_h, m_h, o_hd,
                                                 o_d, m_hc, o_jw, i_doc, start, end, W, U, False, HAS_STATIC,
                                                 RESIDUAL, TAP_AXIS, W_ROWS)
            else:
                i_doc, start, end = _hw_fwd_step(p_y, w_ptr, b_xs, b_ss, cu_ptr, row, tb, T, D, H, o_h, m_h, o_hd,
                                                 o_d, m_hc, o_jw, i_doc, start, end, W, U, True, HAS_STATIC,
                                                 RESIDUAL, TAP_AXIS, W_ROWS)
        else:
            _hw_fwd_step(p_y, w_ptr, b_xs, b_ss, cu_ptr, row, tb, T, D, H, o_h, m_h, o_hd, o_d, m_hc, o_jw, i_doc,
                         start, end, W, U, False, HAS_STATIC, RESIDUAL, TAP_AXIS, W_ROWS)
        if PREFETCH:
            b_xs = tu.shift_rows(b_xs, b_xn, U, W - 1)
# fmt: on


@triton.jit
def _hw_weight_rows(w_ptr, row, first, T, H, o_h, m_h, W: tl.constexpr, N: tl.constexpr):
    """The weights of positions first ... first + N - 1 of one row: each position's W taps of the heads o_h read
    as one contiguous [NH, W] tile and split in registers into W [NH, 1] vectors (fp32, zero past T), a flat
    tuple with position j's tap k at j * W + k. Widths 2 and 4."""
    NH: tl.constexpr = o_h.shape[0]
    o_k = tl.arange(0, W)
    out = ()
    for j in tl.static_range(N):
        r = tl.zeros_like(o_h) + (first + j)  # a vector: the interpreter's scalar & vector mask is int32
        p = w_ptr + ((row + r).to(tl.int64) * H + o_h)[:, None] * W + o_k[None, :]
        b = tl.load(p, mask=(m_h & (r < T))[:, None], other=0.0).to(tl.float32)  # [NH, W]
        if W == 2:
            k0, k1 = tl.split(b)
            out = out + (k0[:, None], k1[:, None])
        else:  # [NH, 2, 2][n, a, c] = tap 2a + c: the first split takes c, the second a
            even, odd = tl.split(tl.reshape(b, [NH, 2, 2]))
            k0, k2 = tl.split(even)
            k1, k3 = tl.split(odd)
            out = out + (k0[:, None], k1[:, None], k2[:, None], k3[:, None])
    return out


@triton.jit
def _hw_tap_rows(w_ptr, row, first, T, H, o_hd, o_jw, m_hc, W: tl.constexpr, N: tl.constexpr):
    """The weights of positions first ... first + N - 1 of one row on the taps-aligned layout (channel (g, j)
    holding tap j of its head: one vector a thread), N [NH, G, WP] tiles in fp32, zero at or past T."""
    rows = ()
    for j in tl.static_range(N):
        r = tl.zeros_like(o_hd) + (first + j)
        p_w = w_ptr + ((row + r).to(tl.int64) * H + o_hd) * W + o_jw
        rows = rows + (tl.load(p_w, mask=m_hc & (o_jw < W) & (r < T), other=0.0).to(tl.float32),)
    return rows


@triton.jit
def _hw_bwd_step(p_dx, w_ptr, dw_ptr, b_xs, b_dys, b_wtr, b_ss, a0, a1, a2, a3, a4, a5, a6, a7, cu_ptr, row, tb, T, D,
                 H, o_h, m_h, o_hd, o_d, m_hc, o_jw, m_g0, i_doc, start, end, W: tl.constexpr, U: tl.constexpr,
                 MASKED: tl.constexpr, HAS_STATIC: tl.constexpr, RESIDUAL: tl.constexpr, DW_TILE: tl.constexpr,
                 W_ROWS: tl.constexpr, TAP_AXIS: tl.constexpr):
    """dx and dweight at positions tb ... tb + U - 1 of one row, their products dy[t] * x[t - k] added to tap k's
    slot (dstatic_w), from b_xs = x[tb - W + 1] ... x[tb + U - 1] and b_dys = dy[tb] ... dy[tb + U + W - 2];
    W_ROWS: the weights of positions tb ... tb + U + W - 2 read first, as rows. TAP_AXIS: the tiles are
    [NH, G, WP], o_jw the tap each channel reads and m_g0 each head's first group (``_hw_stream_setup_taps``),
    and b_wtr those positions' weights on that layout (``_hw_tap_rows``; unused otherwise)."""
    if W_ROWS:
        b_wts = _hw_weight_rows(w_ptr, row, tb, T, H, o_h, m_h, W, U + W - 1)
    if TAP_AXIS:  # position tb + j's taps, channel (g, j') holding tap j': one vector a thread
        b_wts = b_wtr
    for u in tl.static_range(U):
        t = tb + u
        if MASKED:
            i_doc, start, end = tu.doc_walk(cu_ptr, row + tl.minimum(t, T - 1), i_doc, start, end)
        m_t = (tl.zeros_like(o_h) + t) < T  # [NH]
        p_dw = dw_ptr + ((row + t).to(tl.int64) * H + o_h) * W  # [NH] token t's weight gradients, tap 0
        b_dy = b_dys[u]
        b_dx = b_dy if RESIDUAL else tl.zeros_like(b_dy)
        b_dws = ()  # DW_TILE: the W taps' dweight, [NH] each, stored together after the taps
        b_dwg = tl.zeros_like(b_dy)  # TAP_AXIS: tap k's sums over each thread's channels at place k of that axis
        for k in tl.static_range(W):
            # dx[t] takes tap k of output t + k while t + k is in t's document (zeroed after the product, so a
            # weight of another document never reaches it); dweight and dstatic_w take dy[t] * x[t - k] while
            # t - k is (past the row every load reads zero)
            if TAP_AXIS:  # [NH, G, 1]: output t + k's tap k, at each of the head's channels
                b_wk = tl.sum(tl.where(o_jw == k, b_wts[u + k], 0.0), axis=2, keep_dims=True)
            elif W_ROWS:
                b_wk = b_wts[(u + k) * W + k]  # [NH, 1], shared by the head's channels
            else:
                m_wk = m_hc & (tl.zeros_like(o_d) + (t + k) < T)
                p_wk = w_ptr + ((row + t + k).to(tl.int64) * H + o_hd) * W + k  # as the forward's, [NH, HSP]
                b_wk = tl.load(p_wk, mask=m_wk, other=0.0).to(tl.float32)
            if HAS_STATIC:
                b_wk = b_wk + b_ss[k]
            b_c = b_dys[u + k] * b_wk
            b_xk = b_xs[u + W - 1 - k]
            if MASKED:
                b_c = tl.where(row + t + k < end, b_c, 0.0)
                b_xk = tl.where(row + t - k >= start, b_xk, 0.0)
            b_dx += b_c
            b_p = b_dy * b_xk  # [NH, HSP] (TAP_AXIS: [NH, G, WP])
            if TAP_AXIS:
                b_dwg = tl.where(o_jw == k, tl.sum(b_p, axis=2, keep_dims=True), b_dwg)
            elif DW_TILE:
                b_dws = b_dws + (tl.sum(b_p, axis=1).to(p_dw.dtype.element_ty),)
            else:
                tl.store(p_dw + k, tl.sum(b_p, axis=1).to(p_dw.dtype.element_ty), mask=m_h & m_t)
            if HAS_STATIC:
                a0, a1, a2, a3, a4, a5, a6, a7 = tu.slots_add(a0, a1, a2, a3, a4, a5, a6, a7, b_p, k)
        if TAP_AXIS:  # summed over the groups: the token's NH * W weight gradients, stored by the first group on
            # the tile's own layout (a [NH, W] store would first move the sum into a layout of its own)
            b_dw = tl.broadcast_to(tl.sum(b_dwg, axis=1, keep_dims=True), b_dwg.shape).to(p_dw.dtype.element_ty)
            m_dw = m_g0 & (o_jw < W) & ((tl.zeros_like(o_d) + t) < T)
            tl.store(p_dw[:, None, None] + o_jw, b_dw, mask=m_dw)
        elif DW_TILE:  # [NH, W]: the token's NH * W weight gradients are contiguous, one store
            o_k = tl.arange(0, W)
            m_dw = (m_h & m_t)[:, None] & (o_k < W)[None, :]
            tl.store(p_dw[:, None] + o_k[None, :], tu.join_taps(b_dws, W), mask=m_dw)
        m_x = m_hc & (tl.zeros_like(o_d) + t < T)
        tl.store(p_dx + t.to(tl.int64) * D, b_dx.to(p_dx.dtype.element_ty), mask=m_x)
    return a0, a1, a2, a3, a4, a5, a6, a7, i_doc, start, end


# fmt: off
@triton.jit
def _headwise_bwd_stream_kernel(
    x_ptr, w_ptr, s_ptr, dy_ptr, dx_ptr, dw_ptr, dsp_ptr, cu_ptr,  # pointers
    T, D, H, RPW, CH, N_TC, N_CU, N_SEARCH: tl.constexpr,  # sizes
    W: tl.constexpr, HS: tl.constexpr, HSP: tl.constexpr, NH: tl.constexpr, U: tl.constexpr,  # tile shape
    HAS_CU: tl.constexpr, HAS_STATIC: tl.constexpr, RESIDUAL: tl.constexpr, DW_TILE: tl.constexpr,  # flags
    W_ROWS: tl.constexpr, TAP_AXIS: tl.constexpr, WP: tl.constexpr, PREFETCH: tl.constexpr,  # flags
):
    i_t, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if TAP_AXIS:
        o_h, m_h, o_d, m_hc, o_hd, o_jw, m_g0, b_ss = _hw_stream_setup_taps(s_ptr, i_h, i_b, D, H, RPW, W, WP, HS,
                                                                            HSP, NH, HAS_STATIC)
    else:
        o_h, m_h, o_d, m_hc, o_hd, b_ss = _hw_stream_setup(s_ptr, i_h, i_b, D, H, RPW, W, HS, HSP, NH, HAS_STATIC)
        o_jw, m_g0 = o_hd, m_hc  # unused
    row = i_b * T
    p_x = x_ptr + row.to(tl.int64) * D + o_d  # [NH, HSP] (TAP_AXIS: [NH, G, WP])
    p_dy = dy_ptr + row.to(tl.int64) * D + o_d
    p_dx = dx_ptr + row.to(tl.int64) * D + o_d
    t0 = i_t * CH
    i_doc, start, end = tu.doc_start_state(cu_ptr, row, t0, T, N_CU, N_SEARCH, HAS_CU)
    # dstatic_w[k] = sum_t dy[t] * x[t - k] over this program's positions, tap k in slot k (widths up to tu.SLOTS)
    a0 = tl.zeros_like(o_d).to(tl.float32)
    a1 = tl.zeros_like(a0)
    a2 = tl.zeros_like(a0)
    a3 = tl.zeros_like(a0)
    a4 = tl.zeros_like(a0)
    a5 = tl.zeros_like(a0)
    a6 = tl.zeros_like(a0)
    a7 = tl.zeros_like(a0)
    # b_wtr (TAP_AXIS): the weights of positions tb ... tb + U + W - 2, as b_dys covers them
    if PREFETCH:
        b_xs = tu.stream_rows(p_x, o_d, m_hc, t0 - (W - 1), T, D, U + W - 1)
        b_dys = tu.stream_rows(p_dy, o_d, m_hc, t0, T, D, U + W - 1)
        b_wtr = _hw_tap_rows(w_ptr, row, t0, T, H, o_hd, o_jw, m_hc, W, U + W - 1) if TAP_AXIS else ()
    for tb in range(t0, t0 + CH, U):
        if PREFETCH:  # the next step's U new rows first (dy's and the weights' reach W - 1 past the program)
            b_xn = tu.stream_rows(p_x, o_d, m_hc, tb + U, tl.minimum(T, t0 + CH), D, U)
            b_dyn = tu.stream_rows(p_dy, o_d, m_hc, tb + U + W - 1, tl.minimum(T, t0 + CH + W - 1), D, U)
            if TAP_AXIS:
                b_wn = _hw_tap_rows(w_ptr, row, tb + U + W - 1, tl.minimum(T, t0 + CH + W - 1), H, o_hd, o_jw, m_hc,
                                    W, U)
        else:
            b_xs = tu.stream_rows(p_x, o_d, m_hc, tb - (W - 1), T, D, U + W - 1)  # x[tb - W + 1] ... x[tb + U - 1]
            b_dys = tu.stream_rows(p_dy, o_d, m_hc, tb, T, D, U + W - 1)  # dy[tb] ... dy[tb + U + W - 2]
            b_wtr = _hw_tap_rows(w_ptr, row, tb, T, H, o_hd, o_jw, m_hc, W, U + W - 1) if TAP_AXIS else ()
        if HAS_CU:
            one, i_doc, start, end = tu.in_one_doc(cu_ptr, row, tb - (W - 1), tb + U + W - 2, T, i_doc, start, end)
            if one:
                a0, a1, a2, a3, a4, a5, a6, a7, i_doc, start, end = _hw_bwd_step(
                    p_dx, w_ptr, dw_ptr, b_xs, b_dys, b_wtr, b_ss, a0, a1, a2, a3, a4, a5, a6, a7, cu_ptr, row, tb, T,
                    D, H, o_h, m_h, o_hd, o_d, m_hc, o_jw, m_g0, i_doc, start, end, W, U, False, HAS_STATIC, RESIDUAL,
                    DW_TILE, W_ROWS, TAP_AXIS)
            else:
                a0, a1, a2, a3, a4, a5, a6, a7, i_doc, start, end = _hw_bwd_step(
                    p_dx, w_ptr, dw_ptr, b_xs, b_dys, b_wtr, b_ss, a0, a1, a2, a3, a4, a5, a6, a7, cu_ptr, row, tb, T,
                    D, H, o_h, m_h, o_hd, o_d, m_hc, o_jw, m_g0, i_doc, start, end, W, U, True, HAS_STATIC, RESIDUAL,
                    DW_TILE, W_ROWS, TAP_AXIS)
        else:
            a0, a1, a2, a3, a4, a5, a6, a7, i_doc, start, end = _hw_bwd_step(
                p_dx, w_ptr, dw_ptr, b_xs, b_dys, b_wtr, b_ss, a0, a1, a2, a3, a4, a5, a6, a7, cu_ptr, row, tb, T, D,
                H, o_h, m_h, o_hd, o_d, m_hc, o_jw, m_g0, i_doc, start, end, W, U, False, HAS_STATIC, RESIDUAL, DW_TILE,
                W_ROWS, TAP_AXIS)
        if PREFETCH:
            b_xs, b_dys = tu.shift_rows(b_xs, b_xn, U, W - 1), tu.shift_rows(b_dys, b_dyn, U, W - 1)
            if TAP_AXIS:
                b_wtr = tu.shift_rows(b_wtr, b_wn, U, W - 1)
    if HAS_STATIC:  # this program's partial, row i_b * N_TC + i_t of [B * N_TC, W, D]
        p_ds = dsp_ptr + (i_b * N_TC + i_t).to(tl.int64) * W * D + o_d
        tu.slots_store(p_ds, a0, a1, a2, a3, a4, a5, a6, a7, W, D, m_hc)
# fmt: on


def _stream_form(T: int, H: int, hs: int, backward: bool, wide: bool) -> tuple[int, int, int, int, int]:
    """(CH, U, warps, NH, HSP) of a streaming form at its constants, the wide heads' own where ``wide`` (read at
    each call, so that the tune script's settings take): positions a program, a step, and its heads as ``_heads``
    gives them."""
    if backward:
        CH, U, BD, warps = ((HW_STREAM_BWD_WIDE_CH, HW_STREAM_BWD_WIDE_U, HW_STREAM_BWD_WIDE_BD,
                             HW_STREAM_BWD_WIDE_WARPS) if wide else
                            (HW_STREAM_BWD_CH, HW_STREAM_BWD_U, HW_STREAM_BWD_BD, HW_STREAM_BWD_WARPS))
    else:
        CH, U, BD, warps = ((HW_STREAM_FWD_WIDE_CH, HW_STREAM_FWD_WIDE_U, HW_STREAM_FWD_WIDE_BD,
                             HW_STREAM_FWD_WIDE_WARPS) if wide else
                            (HW_STREAM_FWD_CH, HW_STREAM_FWD_U, HW_STREAM_FWD_BD, HW_STREAM_FWD_WARPS))
    return tu.stream_positions(T, CH, U), U, warps, *_heads(H, hs, BD)


def _heads(H: int, hs: int, channels: int) -> tuple[int, int]:
    """(NH, HSP): NH heads of HSP >= hs channels, about ``channels`` channels (at least one head)."""
    HSP = tu.next_power_of_2(hs)
    return min(tu.next_power_of_2(H), max(1, channels // HSP)), HSP


def _head_tiles(T: int, H: int, hs: int, tile: int, channels: int) -> tuple[int, int, int]:
    """(BT, NH, HSP): ``_heads``, and about ``tile`` elements a tile."""
    NH, HSP = _heads(H, hs, channels)
    BT = max(1, min(tu.next_power_of_2(T), tile // (NH * HSP)))
    return BT, NH, HSP



def _headwise_fwd(
    x: torch.Tensor,
    weight: torch.Tensor,
    static_w: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    residual: bool,
) -> torch.Tensor:
    """x: [B, T, D], weight: [B, T, H, W], static_w: [W, D] or None -> y: [B, T, D] in x's dtype. Stacked runs:
    static_w [runs, W, D], each run B / runs rows."""
    B, T, D = x.shape
    H, W = weight.shape[2], weight.shape[3]
    runs = static_w.shape[0] if static_w is not None and static_w.dim() == 3 else 1
    x, weight, static_w = tu.contiguous(x, weight, static_w)
    y = tu.empty((B, T, D), x.dtype, x.device)
    n_cu, n_search = tu.search_steps(cu_seqlens)
    WP = tu.next_power_of_2(W)
    wide = HW_FWD_STREAM_WIDE and H < D and (D // H) % WP == 0  # the taps-aligned layout fits
    if tu.streams((D // H <= HW_FWD_STREAM_HS or wide) and W <= tu.SLOTS, _headwise_fwd_stream_kernel):
        CH, U, warps, NH, HSP = _stream_form(T, H, D // H, backward=False, wide=wide)
        # fmt: off
        _headwise_fwd_stream_kernel[(tu.cdiv(T, CH), tu.cdiv(H, NH), B)](
            x, weight, static_w, y, cu_seqlens, T, D, H, B // runs, CH, n_cu, n_search, W=W, HS=D // H, HSP=HSP,
            NH=NH, U=U, HAS_CU=cu_seqlens is not None, HAS_STATIC=static_w is not None,
            RESIDUAL=residual, TAP_AXIS=wide, WP=WP, W_ROWS=HW_FWD_STREAM_W_ROWS and W in (2, 4) and not wide,
            PREFETCH=HW_STREAM_FWD_WIDE_PREFETCH if wide else HW_STREAM_FWD_PREFETCH, num_warps=warps,
        )
        # fmt: on
        return y
    BT, NH, HSP = _head_tiles(T, H, D // H, HW_FWD_TILE if H == D else HW_FWD_TILE_WIDE, HW_FWD_CHANNELS)
    grid = (tu.cdiv(T, BT), tu.cdiv(H, NH), B)
    # fmt: off
    _dynamic_conv_headwise_fwd_kernel[grid](
        x, weight, static_w, y, cu_seqlens, T, D, H, B // runs, n_cu, n_search, W=W, WP=tu.next_power_of_2(W),
        HS=D // H, HSP=HSP, NH=NH, BT=BT, HAS_CU=cu_seqlens is not None, HAS_STATIC=static_w is not None,
        RESIDUAL=residual, TAP_LOADS=HW_FWD_TAP_LOADS, num_warps=HW_FWD_WARPS,
    )
    # fmt: on
    return y


def _headwise_bwd(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    static_w: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    residual: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dy, x: [B, T, D], weight: [B, T, H, W], static_w: [W, D] or None -> (dx [B, T, D], dweight
    [B, T, H, W], dstatic_w [W, D], or [0] without static_w), each in the dtype of its input. Stacked runs:
    static_w and its gradient [runs, W, D], as ``_headwise_fwd``."""
    B, T, D = x.shape
    H, W = weight.shape[2], weight.shape[3]
    runs = static_w.shape[0] if static_w is not None and static_w.dim() == 3 else 1
    rows = B // runs  # of each run
    dy, x, weight, static_w = tu.contiguous(dy, x, weight, static_w)
    n_cu, n_search = tu.search_steps(cu_seqlens)
    WP = tu.next_power_of_2(W)
    wide = HW_BWD_STREAM_WIDE and H < D and (D // H) % WP == 0  # the taps-aligned layout fits
    if tu.streams((D // H <= HW_BWD_STREAM_HS or wide) and W <= tu.SLOTS, _headwise_bwd_stream_kernel):
        CH, U, warps, NH, HSP = _stream_form(T, H, D // H, backward=True, wide=wide)
        n_tc = tu.cdiv(T, CH)
        dx = tu.empty((B, T, D), x.dtype, x.device)
        dweight = tu.empty((B, T, H, W), weight.dtype, x.device)
        ds_partial = None if static_w is None else tu.empty((B * n_tc, W, D), torch.float32, x.device)
        # fmt: off
        _headwise_bwd_stream_kernel[(n_tc, tu.cdiv(H, NH), B)](
            x, weight, static_w, dy, dx, dweight, ds_partial, cu_seqlens, T, D, H, rows, CH, n_tc, n_cu, n_search,
            W=W, HS=D // H, HSP=HSP, NH=NH, U=U, HAS_CU=cu_seqlens is not None,
            HAS_STATIC=static_w is not None, RESIDUAL=residual, DW_TILE=HW_STREAM_BWD_DW_TILE and W in (2, 4),
            W_ROWS=HW_STREAM_BWD_W_ROWS and W in (2, 4) and not wide, TAP_AXIS=wide, WP=WP,
            PREFETCH=HW_STREAM_BWD_WIDE_PREFETCH if wide else HW_STREAM_BWD_PREFETCH, num_warps=warps,
        )
        # fmt: on
        if static_w is None:
            return dx, dweight, x.new_empty(0)
        return dx, dweight, tu.sum_partials(ds_partial, static_w.dtype, groups=runs).view(static_w.shape)
    taps_axis = HW_HS1_BWD_TAPS_AXIS and H == D
    tile, channels = (HW_HS1_BWD_TILE, HW_HS1_BWD_CHANNELS) if taps_axis else (HW_BWD_TILE, HW_BWD_CHANNELS)
    BT, NH, HSP = _head_tiles(T, H, D // H, tile, channels)
    n_tb, n_hb = tu.cdiv(T, BT), tu.cdiv(H, NH)
    per_chunk, n_chunks = tu.chunk_plan(rows * n_tb, n_hb, HW_BWD_PROGRAMS)  # a run alone's plan
    dx = tu.empty((B, T, D), x.dtype, x.device)
    dweight = tu.empty((B, T, H, W), weight.dtype, x.device)
    ds_partial = None if static_w is None else tu.empty((runs * n_chunks, W, D), torch.float32, x.device)
    # fmt: off
    if taps_axis:
        _headwise_hs1_bwd_kernel[(n_hb, runs * n_chunks)](
            x, weight, static_w, dy, dx, dweight, ds_partial, cu_seqlens, T, D, rows, n_chunks, n_tb, per_chunk,
            n_cu, n_search, W=W, WP=tu.next_power_of_2(W), ND=NH, BT=BT, HAS_CU=cu_seqlens is not None,
            HAS_STATIC=static_w is not None, RESIDUAL=residual, DS_DEFER=HW_HS1_BWD_DS_DEFER,
            GATHER=HW_HS1_BWD_GATHER and W - 1 <= BT, num_warps=HW_BWD_WARPS, num_stages=HW_BWD_STAGES,
            maxnreg=HW_BWD_MAXNREG,
        )
    else:
        _dynamic_conv_headwise_bwd_kernel[(n_hb, runs * n_chunks)](
            x, weight, static_w, dy, dx, dweight, ds_partial, cu_seqlens, T, D, H, rows, n_chunks, n_tb, per_chunk,
            n_cu, n_search, W=W, WP=tu.next_power_of_2(W), HS=D // H, HSP=HSP, NH=NH, BT=BT,
            HAS_CU=cu_seqlens is not None, HAS_STATIC=static_w is not None, RESIDUAL=residual,
            DW_TILE=HW_BWD_DW_TILE, DS_DEFER=HW_BWD_DS_DEFER and W <= tu.SLOTS, num_warps=HW_BWD_WARPS,
            num_stages=HW_BWD_STAGES, maxnreg=HW_BWD_MAXNREG,
        )
    # fmt: on
    if static_w is None:
        return dx, dweight, x.new_empty(0)
    return dx, dweight, tu.sum_partials(ds_partial, static_w.dtype, groups=runs).view(static_w.shape)


def _fold_runs(info, in_dims: tuple, x: torch.Tensor, weight: torch.Tensor, static_w: torch.Tensor | None,
               cu_seqlens: torch.Tensor | None, residual: bool):
    """vmap rule: the runs' rows fold into the batch and their static_w into [R, W, D], one launch for all
    (stacked runs: x [R, B, T, D]); with documents (offsets into one run's B*T tokens), or a static_w shared by
    the runs, one launch per run."""
    x_dim, w_dim, s_dim = in_dims[:3]
    if cu_seqlens is not None or (static_w is not None and s_dim is None):
        return tu.per_run_vmap(headwise_triton.op)(info, in_dims, x, weight, static_w, cu_seqlens, residual)
    n = info.batch_size
    static_w = None if static_w is None else static_w.movedim(s_dim, 0)
    y = headwise_triton.op(tu.run_rows(x, x_dim, n), tu.run_rows(weight, w_dim, n), static_w, None, residual)
    return y.unflatten(0, (n, -1)), 0


# headwise_triton(x, weight, static_w, cu_seqlens, residual) -> y, inputs as ``_headwise_fwd`` takes them
headwise_triton = tu.TritonOp("dynamic_conv_headwise", _headwise_fwd, _headwise_bwd, vmap=_fold_runs)
