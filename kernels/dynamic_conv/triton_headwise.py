"""Head-wise dynamic short causal convolution over packed documents in Triton: the kernels, their launchers
and the op with its backward (``kernels.dynamic_conv.op`` checks the inputs and picks the backend).

As ``kernels.short_conv``, tap k of output t multiplies x[t - k] and reads zero before the start of t's
document; the weights of every tap are those of the output token t.

Weight [B, T, H, W], a channel's head is d // hs with hs = D / H. Backward:
    dweight[t, h, k] = sum over the head's channels of dy[t, d] * x[t - k, d]
    dx[t] = sum_k (weight[t + k, h, k] + static_w[k]) * dy[t + k]     for t + k in t's document
and dstatic_w[k] = sum_t dy[t] * x[t - k] goes through fp32 partials (``kernels.triton_utils``).

The form of both passes follows from the head size and the width (``config_for``):
- streaming (``kernels.short_conv.triton`` explains it), widths up to ``tu.SLOTS``: one program per row, block of
  whole heads and run of positions, x and dy read once into registers and shifted there, dweight summed over a
  head's channels position by position. At head size 1 on [NH, HSP] tiles, widths 2 and 4 reading each
  position's W taps as one contiguous [NH, W] row (split into taps in registers) and storing its dweight so. Where
  the head size is a multiple of the padded width WP, on [NH, HSP // WP, WP] tiles: channel g * WP + j reads tap j
  of its head, so a thread's WP channels read the head's taps as one vector and pass tap k to one another inside
  the thread (the "taps-aligned" layout).
- tiled, every other head size and width: a forward program per [BT, NH, HSP] tile (NH heads of hs channels,
  padded to the power of two HSP, so a head's channels are one axis of the tile), a backward program per (head
  block, chunk of token tiles). Head size 1 has a backward of its own, the taps a third axis of its [BT, ND, WP]
  tile (the weights' own layout).

Stacked runs fold into one launch as in ``kernels.short_conv.triton``: x and weight [R * B, ...] with static_w
[R, W, D], row b using run b // B's (``RPW``), dstatic_w summed over each run's chunks as a run alone sums them
(``_fold_runs``).
"""

from dataclasses import dataclass

import torch
from mixlab.kernels import triton_utils as tu
from mixlab.kernels._triton import tl, triton


@dataclass(frozen=True, kw_only=True)
class TiledFwd:
    """The tiled forward's launch: a program per [BT, NH, HSP] tile of about ``tile`` elements, NH heads of
    about ``channels`` channels (at least one head), ``warps`` warps."""

    tile: int
    channels: int
    warps: int

    def __post_init__(self) -> None:
        tu.check_config(self, ("tile", "channels", "warps"))


@dataclass(frozen=True, kw_only=True)
class TiledBwd:
    """A tiled backward's launch: tiles as ``TiledFwd``'s, about ``programs`` programs (head blocks x chunks of
    token tiles, ``tu.chunk_plan``), ``warps`` warps and ``stages`` pipelining stages."""

    tile: int
    channels: int
    warps: int
    stages: int
    programs: int

    def __post_init__(self) -> None:
        tu.check_config(self, ("tile", "channels", "warps"))


# (pass, form, heads: head size 1 or wider) -> launch settings, chosen by timing on the H100/H200 (see
# BENCHMARKS.md).
CONFIGS = {
    ("fwd", "stream", "hs1"): tu.Stream(CH=32, U=4, BD=64, warps=1),
    ("fwd", "stream", "wide"): tu.Stream(CH=32, U=4, BD=128, warps=1),
    ("fwd", "tiled", "hs1"): TiledFwd(tile=512, channels=128, warps=4),
    ("fwd", "tiled", "wide"): TiledFwd(tile=1024, channels=128, warps=4),
    ("bwd", "stream", "hs1"): tu.Stream(CH=128, U=4, BD=32, warps=1),
    ("bwd", "stream", "wide"): tu.Stream(CH=128, U=2, BD=128, warps=1),
    ("bwd", "tiled", "hs1"): TiledBwd(tile=512, channels=128, warps=4, stages=1, programs=4096),
    ("bwd", "tiled", "wide"): TiledBwd(tile=1024, channels=128, warps=4, stages=1, programs=4096),
}


def config_for(backward: bool, H: int, D: int, W: int, interpreted: bool) -> tu.Stream | TiledFwd | TiledBwd:
    """A pass's launch settings: streaming for widths up to ``tu.SLOTS`` at head size 1 and at head sizes that are
    multiples of the padded width (the taps-aligned layout), tiled for the rest and under the interpreter
    (``tu.is_interpreted``)."""
    hs = D // H
    streams = W <= tu.SLOTS and not interpreted and (hs == 1 or hs % tu.next_power_of_2(W) == 0)
    return CONFIGS["bwd" if backward else "fwd", "stream" if streams else "tiled", "hs1" if hs == 1 else "wide"]


# fmt: off
@triton.jit
def _dynamic_conv_headwise_fwd_kernel(
    x_ptr, w_ptr, s_ptr, y_ptr, cu_ptr,  # pointers
    T, D, H, RPW, N_CU, N_SEARCH: tl.constexpr,  # sizes
    W: tl.constexpr, WP: tl.constexpr, HS: tl.constexpr, HSP: tl.constexpr, NH: tl.constexpr,
    BT: tl.constexpr,  # tile shape
    HAS_CU: tl.constexpr, HAS_STATIC: tl.constexpr, RESIDUAL: tl.constexpr,  # flags
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
        # tap k picked out of the tile (and moved into the activations' layout through shared memory)
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
    HAS_CU: tl.constexpr, HAS_STATIC: tl.constexpr, RESIDUAL: tl.constexpr, DS_DEFER: tl.constexpr,  # flags
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
            b_dw3 = tl.where(o_k[None, None, :] == k, b_dw[:, :, None], b_dw3)
            if HAS_STATIC:
                if DS_DEFER:  # into tap k's own sum (k is known at compile time)
                    a0, a1, a2, a3, a4, a5, a6, a7 = tu.slots_add(a0, a1, a2, a3, a4, a5, a6, a7, b_g, k)
                else:
                    b_dsk = tl.sum(b_g, axis=0)  # [NH, HSP]
                    b_ds = tl.where(o_k[:, None, None] == k, b_ds + b_dsk[None, :, :], b_ds)
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
    HAS_CU: tl.constexpr, HAS_STATIC: tl.constexpr, RESIDUAL: tl.constexpr, GATHER: tl.constexpr,  # flags
):
    """Head size 1, the taps an axis of the tile:
        dweight[t, d, k] = dy[t, d] * x[t - k, d]                          t - k in t's document
        dx[t, d] = sum_k (weight[t + k, d, k] + static_w[k, d]) * dy[t + k, d] (+ dy[t, d])   t + k in t's document
        dstatic_w[k, d] = sum_t dweight[t, d, k], added up token slot by token slot over the chunk's tiles, then
                          summed over the slots once into the chunk's fp32 partial.
    GATHER (W - 1 <= BT): weight[t + k, d, k] for dx from the rows t0 .. t0 + 2 BT - 1 of weight and dy loaded as
    stored (contiguous taps: one wide load a row), each output's taps picked out of them in the tile; else each
    element loaded where used (the tap axis crosses rows: one 2-byte load per element)."""
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
    b_dsa = tl.zeros([BT, ND, WP], dtype=tl.float32)  # the chunk's dy[t] * x[t - k], per token slot
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
            b_dsa += b_g
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
    """``_hw_stream_setup`` with the channels as a [NH, HSP // WP, WP] tile (the taps-aligned layout): channel
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
                 RESIDUAL: tl.constexpr, TAP_AXIS: tl.constexpr, ROWS: tl.constexpr):
    """Outputs tb ... tb + U - 1 of one row (channel tiles) from b_xs = x[tb - W + 1] ... x[tb + U - 1]; MASKED:
    each position finds its document and reads zero before its start, else no tap of the step leaves it.
    TAP_AXIS: the tiles are [NH, G, WP] and o_jw the tap each channel reads (``_hw_stream_setup_taps``). ROWS:
    the weights of positions tb ... tb + U - 1 read first, as rows (``_hw_weight_rows``); else tap by tap."""
    if ROWS:
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
            elif ROWS:
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
    WP: tl.constexpr, ROWS: tl.constexpr,
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
    for tb in range(t0, t0 + CH, U):
        b_xs = tu.stream_rows(p_x, o_d, m_hc, tb - (W - 1), T, D, U + W - 1)  # x[tb - W + 1] ... x[tb + U - 1]
        if HAS_CU:
            one, i_doc, start, end = tu.in_one_doc(cu_ptr, row, tb - (W - 1), tb + U - 1, T, i_doc, start, end)
            if one:
                i_doc, start, end = _hw_fwd_step(p_y, w_ptr, b_xs, b_ss, cu_ptr, row, tb, T, D, H, o_h, m_h, o_hd,
                                                 o_d, m_hc, o_jw, i_doc, start, end, W, U, False, HAS_STATIC,
                                                 RESIDUAL, TAP_AXIS, ROWS)
            else:
                i_doc, start, end = _hw_fwd_step(p_y, w_ptr, b_xs, b_ss, cu_ptr, row, tb, T, D, H, o_h, m_h, o_hd,
                                                 o_d, m_hc, o_jw, i_doc, start, end, W, U, True, HAS_STATIC,
                                                 RESIDUAL, TAP_AXIS, ROWS)
        else:
            _hw_fwd_step(p_y, w_ptr, b_xs, b_ss, cu_ptr, row, tb, T, D, H, o_h, m_h, o_hd, o_d, m_hc, o_jw, i_doc,
                         start, end, W, U, False, HAS_STATIC, RESIDUAL, TAP_AXIS, ROWS)
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
                 MASKED: tl.constexpr, HAS_STATIC: tl.constexpr, RESIDUAL: tl.constexpr, ROWS: tl.constexpr,
                 TAP_AXIS: tl.constexpr):
    """dx and dweight at positions tb ... tb + U - 1 of one row, their products dy[t] * x[t - k] added to tap k's
    slot (dstatic_w), from b_xs = x[tb - W + 1] ... x[tb + U - 1] and b_dys = dy[tb] ... dy[tb + U + W - 2].
    ROWS: the weights of positions tb ... tb + U + W - 2 read first, as rows, and each position's dweight stored
    as one [NH, W] tile (its NH * W elements are contiguous); else both tap by tap. TAP_AXIS: the tiles are
    [NH, G, WP], o_jw the tap each channel reads and m_g0 each head's first group (``_hw_stream_setup_taps``),
    and b_wtr those positions' weights on that layout (``_hw_tap_rows``; unused otherwise)."""
    if ROWS:
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
        b_dws = ()  # ROWS: the W taps' dweight, [NH] each, stored together after the taps
        b_dwg = tl.zeros_like(b_dy)  # TAP_AXIS: tap k's sums over each thread's channels at place k of that axis
        for k in tl.static_range(W):
            # dx[t] takes tap k of output t + k while t + k is in t's document (zeroed after the product, so a
            # weight of another document never reaches it); dweight and dstatic_w take dy[t] * x[t - k] while
            # t - k is (past the row every load reads zero)
            if TAP_AXIS:  # [NH, G, 1]: output t + k's tap k, at each of the head's channels
                b_wk = tl.sum(tl.where(o_jw == k, b_wts[u + k], 0.0), axis=2, keep_dims=True)
            elif ROWS:
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
            elif ROWS:
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
        elif ROWS:  # [NH, W]: the token's NH * W weight gradients are contiguous, one store
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
    HAS_CU: tl.constexpr, HAS_STATIC: tl.constexpr, RESIDUAL: tl.constexpr, ROWS: tl.constexpr,  # flags
    TAP_AXIS: tl.constexpr, WP: tl.constexpr,  # flags
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
    for tb in range(t0, t0 + CH, U):
        b_xs = tu.stream_rows(p_x, o_d, m_hc, tb - (W - 1), T, D, U + W - 1)  # x[tb - W + 1] ... x[tb + U - 1]
        b_dys = tu.stream_rows(p_dy, o_d, m_hc, tb, T, D, U + W - 1)  # dy[tb] ... dy[tb + U + W - 2]
        # TAP_AXIS: the weights of positions tb ... tb + U + W - 2, as b_dys covers them
        b_wtr = _hw_tap_rows(w_ptr, row, tb, T, H, o_hd, o_jw, m_hc, W, U + W - 1) if TAP_AXIS else ()
        if HAS_CU:
            one, i_doc, start, end = tu.in_one_doc(cu_ptr, row, tb - (W - 1), tb + U + W - 2, T, i_doc, start, end)
            if one:
                a0, a1, a2, a3, a4, a5, a6, a7, i_doc, start, end = _hw_bwd_step(
                    p_dx, w_ptr, dw_ptr, b_xs, b_dys, b_wtr, b_ss, a0, a1, a2, a3, a4, a5, a6, a7, cu_ptr, row, tb, T,
                    D, H, o_h, m_h, o_hd, o_d, m_hc, o_jw, m_g0, i_doc, start, end, W, U, False, HAS_STATIC, RESIDUAL,
                    ROWS, TAP_AXIS)
            else:
                a0, a1, a2, a3, a4, a5, a6, a7, i_doc, start, end = _hw_bwd_step(
                    p_dx, w_ptr, dw_ptr, b_xs, b_dys, b_wtr, b_ss, a0, a1, a2, a3, a4, a5, a6, a7, cu_ptr, row, tb, T,
                    D, H, o_h, m_h, o_hd, o_d, m_hc, o_jw, m_g0, i_doc, start, end, W, U, True, HAS_STATIC, RESIDUAL,
                    ROWS, TAP_AXIS)
        else:
            a0, a1, a2, a3, a4, a5, a6, a7, i_doc, start, end = _hw_bwd_step(
                p_dx, w_ptr, dw_ptr, b_xs, b_dys, b_wtr, b_ss, a0, a1, a2, a3, a4, a5, a6, a7, cu_ptr, row, tb, T, D,
                H, o_h, m_h, o_hd, o_d, m_hc, o_jw, m_g0, i_doc, start, end, W, U, False, HAS_STATIC, RESIDUAL, ROWS,
                TAP_AXIS)
    if HAS_STATIC:  # this program's partial, row i_b * N_TC + i_t of [B * N_TC, W, D]
        p_ds = dsp_ptr + (i_b * N_TC + i_t).to(tl.int64) * W * D + o_d
        tu.slots_store(p_ds, a0, a1, a2, a3, a4, a5, a6, a7, W, D, m_hc)
# fmt: on


def _stream_plan(T: int, H: int, D: int, W: int, config: tu.Stream) -> tuple[bool, int, int, int]:
    """(taps-aligned layout, positions a program, NH, HSP) of a streaming form: head size 1 on the plain layout,
    multiples of the padded width on the taps-aligned one; its heads as ``_heads`` gives them."""
    hs = D // H
    if W > tu.SLOTS or (hs > 1 and hs % tu.next_power_of_2(W)):
        raise ValueError(f"the streaming forms take widths up to {tu.SLOTS} at head size 1 or a multiple of the "
                         f"padded width, got W={W}, head size {hs}")
    return hs > 1, tu.stream_positions(T, config.CH, config.U), *_heads(H, hs, config.BD)


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
    *,
    config: tu.Stream | TiledFwd | None = None,
) -> torch.Tensor:
    """x: [B, T, D], weight: [B, T, H, W], static_w: [W, D] or None -> y: [B, T, D] in x's dtype. Stacked runs:
    static_w [runs, W, D], each run B / runs rows. ``config``: the launch (its type picks the form), by default
    ``config_for``'s."""
    B, T, D = x.shape
    H, W = weight.shape[2], weight.shape[3]
    runs = static_w.shape[0] if static_w is not None and static_w.dim() == 3 else 1
    if config is None:
        config = config_for(False, H, D, W, tu.is_interpreted(_headwise_fwd_stream_kernel))
    x, weight, static_w = tu.contiguous(x, weight, static_w)
    y = tu.empty((B, T, D), x.dtype, x.device)
    n_cu, n_search = tu.search_steps(cu_seqlens)
    WP = tu.next_power_of_2(W)
    if isinstance(config, tu.Stream):
        wide, CH, NH, HSP = _stream_plan(T, H, D, W, config)
        # fmt: off
        _headwise_fwd_stream_kernel[(tu.cdiv(T, CH), tu.cdiv(H, NH), B)](
            x, weight, static_w, y, cu_seqlens, T, D, H, B // runs, CH, n_cu, n_search, W=W, HS=D // H, HSP=HSP,
            NH=NH, U=config.U, HAS_CU=cu_seqlens is not None, HAS_STATIC=static_w is not None,
            RESIDUAL=residual, TAP_AXIS=wide, WP=WP, ROWS=W in (2, 4) and not wide, num_warps=config.warps,
        )
        # fmt: on
        return y
    BT, NH, HSP = _head_tiles(T, H, D // H, config.tile, config.channels)
    grid = (tu.cdiv(T, BT), tu.cdiv(H, NH), B)
    # fmt: off
    _dynamic_conv_headwise_fwd_kernel[grid](
        x, weight, static_w, y, cu_seqlens, T, D, H, B // runs, n_cu, n_search, W=W, WP=WP,
        HS=D // H, HSP=HSP, NH=NH, BT=BT, HAS_CU=cu_seqlens is not None, HAS_STATIC=static_w is not None,
        RESIDUAL=residual, num_warps=config.warps,
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
    *,
    config: tu.Stream | TiledBwd | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dy, x: [B, T, D], weight: [B, T, H, W], static_w: [W, D] or None -> (dx [B, T, D], dweight
    [B, T, H, W], dstatic_w [W, D], or [0] without static_w), each in the dtype of its input. Stacked runs:
    static_w and its gradient [runs, W, D], as ``_headwise_fwd``. ``config`` as ``_headwise_fwd``'s."""
    B, T, D = x.shape
    H, W = weight.shape[2], weight.shape[3]
    runs = static_w.shape[0] if static_w is not None and static_w.dim() == 3 else 1
    rows = B // runs  # of each run
    if config is None:
        config = config_for(True, H, D, W, tu.is_interpreted(_headwise_bwd_stream_kernel))
    dy, x, weight, static_w = tu.contiguous(dy, x, weight, static_w)
    n_cu, n_search = tu.search_steps(cu_seqlens)
    WP = tu.next_power_of_2(W)
    if isinstance(config, tu.Stream):
        wide, CH, NH, HSP = _stream_plan(T, H, D, W, config)
        n_tc = tu.cdiv(T, CH)
        dx = tu.empty((B, T, D), x.dtype, x.device)
        dweight = tu.empty((B, T, H, W), weight.dtype, x.device)
        ds_partial = None if static_w is None else tu.empty((B * n_tc, W, D), torch.float32, x.device)
        # fmt: off
        _headwise_bwd_stream_kernel[(n_tc, tu.cdiv(H, NH), B)](
            x, weight, static_w, dy, dx, dweight, ds_partial, cu_seqlens, T, D, H, rows, CH, n_tc, n_cu, n_search,
            W=W, HS=D // H, HSP=HSP, NH=NH, U=config.U, HAS_CU=cu_seqlens is not None,
            HAS_STATIC=static_w is not None, RESIDUAL=residual, ROWS=W in (2, 4) and not wide, TAP_AXIS=wide, WP=WP,
            num_warps=config.warps,
        )
        # fmt: on
        if static_w is None:
            return dx, dweight, x.new_empty(0)
        return dx, dweight, tu.sum_partials(ds_partial, static_w.dtype, groups=runs).view(static_w.shape)
    BT, NH, HSP = _head_tiles(T, H, D // H, config.tile, config.channels)
    n_tb, n_hb = tu.cdiv(T, BT), tu.cdiv(H, NH)
    per_chunk, n_chunks = tu.chunk_plan(rows * n_tb, n_hb, config.programs)  # a run alone's plan
    dx = tu.empty((B, T, D), x.dtype, x.device)
    dweight = tu.empty((B, T, H, W), weight.dtype, x.device)
    ds_partial = None if static_w is None else tu.empty((runs * n_chunks, W, D), torch.float32, x.device)
    # fmt: off
    if H == D:  # head size 1: the taps a tile axis
        _headwise_hs1_bwd_kernel[(n_hb, runs * n_chunks)](
            x, weight, static_w, dy, dx, dweight, ds_partial, cu_seqlens, T, D, rows, n_chunks, n_tb, per_chunk,
            n_cu, n_search, W=W, WP=WP, ND=NH, BT=BT, HAS_CU=cu_seqlens is not None,
            HAS_STATIC=static_w is not None, RESIDUAL=residual, GATHER=W - 1 <= BT, num_warps=config.warps,
            num_stages=config.stages,
        )
    else:  # dstatic_w summed once a chunk where a slot holds each tap (widths up to tu.SLOTS), else every tile
        _dynamic_conv_headwise_bwd_kernel[(n_hb, runs * n_chunks)](
            x, weight, static_w, dy, dx, dweight, ds_partial, cu_seqlens, T, D, H, rows, n_chunks, n_tb, per_chunk,
            n_cu, n_search, W=W, WP=WP, HS=D // H, HSP=HSP, NH=NH, BT=BT,
            HAS_CU=cu_seqlens is not None, HAS_STATIC=static_w is not None, RESIDUAL=residual,
            DS_DEFER=W <= tu.SLOTS, num_warps=config.warps, num_stages=config.stages,
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
