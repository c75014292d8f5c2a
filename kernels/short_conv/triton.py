"""Static short causal convolution over packed documents in Triton: the kernels, their launchers and the op
with its backward (``kernels.short_conv.op`` checks the inputs and picks the backend).

Forward, one program per [BT, BD] tile of one row: ``y[t] = sum_k w[k] * x[t - k]`` with tap k masked
off (read as zero) when ``t - k`` is before the start of t's document. Backward, one program per (channel
block, chunk of token tiles):
    dx[t] = sum_k w[k] * dy[t + k]            tap k of output t + k, valid when t + k is in t's document
    dw[k] = sum_t dy[t + k] * x[t]            the same pairs as sum_s dy[s] * x[s - k], under the same condition,
                                              summed over the chunk into an fp32 partial [chunks, W, D]
and ``dw`` is the sum of the partials (``kernels.triton_utils`` explains why no atomics, and how loads
avoid waiting for the document search). A tile loads x once and dy at W shifts, W + 1 tiles rather than
2W + 1 (the ncu profile in BENCHMARKS.md found the backward bound by its loads at 12.5% occupancy).

Stacked runs (``torch.func.vmap`` in ``runners.engine``) fold into one launch: x [R * B, T, D] with weights
[R, W, D], row b using run b // B's weights (``RPW`` rows per weight set), and the backward walks each run's
token tiles in the chunks a run alone gets, so every run's output and gradients are its own bit for bit
(``_fold_runs``). Runs with their own document layouts go one launch per run.
"""

import torch
from mixlab.kernels import triton_utils as tu
from mixlab.kernels._triton import tl, triton

# Tiles, warps and pipelining stages, fixed by shape (no autotuning); scripts/tune_shortconv_gpu.py times
# candidates on the GPU. Forward: one program per [BT, BD] tile. Backward: one program per channel block and
# chunk of BT-token tiles, about BWD_PROGRAMS programs.
FWD_BT, FWD_BD, FWD_WARPS = 32, 128, 4
BWD_BT, BWD_BD, BWD_WARPS, BWD_STAGES, BWD_PROGRAMS = 16, 64, 4, 1, 2048
# Registers a thread the backward may use (None: the compiler's choice). At the earlier [64, 64] tile a cap of 128
# timed faster; at this tile the compiler's 96 spill nothing (scripts/kernel_resources.py).
BWD_MAXNREG = None
# Where the backward sums dw over a tile's tokens: True (widths up to 8), once after its chunk of tiles, each tap's
# products added up token slot by token slot in a [BT, BD] sum of its own (registers: W more tiles, hence the
# small tile); False (and every width over 8), at every tap of every tile, a reduction across the tile's threads
# (its loop's PTX for sm_90a holds 128 shuffles and 16 barriers a [64, 64] tile). The same sums in another order:
# rounding differs, each is repeatable. On the H200 (2026-12-04, BENCHMARKS.md) the tune timed the deferred form
# at this tile 105.5 µs (118.0 with 64 documents) against 138.7 (144.8) for the other at its best tile, its
# table at these constants 135.1 (133.7); timed again the same day in two interleaved rounds, 107-206 µs between
# rounds on a GPU that had just started timing, its closing table 102.2 (109.9) at 1,024 programs: the order of
# the deferred tiles is still open (issue #25); its medians beat the other form's in both timings.
BWD_DW_DEFER = True


# fmt: off
@triton.jit
def _short_conv_fwd_kernel(
    x_ptr, w_ptr, y_ptr, cu_ptr,  # pointers
    T, D, RPW, N_CU, N_SEARCH: tl.constexpr,  # sizes
    W: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,  # tile shape
    HAS_CU: tl.constexpr, RESIDUAL: tl.constexpr,  # flags
):
    i_t, i_d, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_t = i_t * BT + tl.arange(0, BT)  # [BT] positions in the row
    o_d = i_d * BD + tl.arange(0, BD)  # [BD]
    m_t, m_d = o_t < T, o_d < D
    o_g = i_b * T + o_t  # [BT] tokens on the B*T axis
    w_ptr += (i_b // RPW).to(tl.int64) * W * D  # the row's run's weights
    start, _ = tu.doc_bounds(cu_ptr, o_g, i_b * T, T, N_CU, N_SEARCH, HAS_CU)
    b_y = tl.zeros([BT, BD], dtype=tl.float32)
    for k in tl.static_range(W):
        # the load is masked by the row only; taps before the document start are zeroed after it
        m_k = m_t & (o_t >= k)
        p_x = x_ptr + (o_g - k).to(tl.int64)[:, None] * D + o_d[None, :]
        b_x = tl.load(p_x, mask=m_k[:, None] & m_d[None, :], other=0.0).to(tl.float32)  # [BT, BD]
        if HAS_CU:
            b_x = tl.where((o_g - k >= start)[:, None], b_x, 0.0)
        # read as a [BT, BD] tile (the same line BT times, from L1) so that it takes x's layout: a [BD] load
        # would be moved into it through shared memory at every tap
        p_w = tl.broadcast_to(w_ptr + k * D + o_d[None, :], [BT, BD])
        b_w = tl.load(p_w, mask=m_d[None, :], other=0.0).to(tl.float32)  # [BT, BD]
        b_y += b_x * b_w
        if RESIDUAL and k == 0:
            b_y += b_x
    p_y = y_ptr + o_g.to(tl.int64)[:, None] * D + o_d[None, :]
    tl.store(p_y, b_y.to(y_ptr.dtype.element_ty), mask=m_t[:, None] & m_d[None, :])
# fmt: on


# fmt: off
@triton.jit
def _short_conv_bwd_kernel(
    x_ptr, w_ptr, dy_ptr, dx_ptr, dwp_ptr, cu_ptr,  # pointers
    T, D, RPW, N_CH, N_TB, TPC, N_CU, N_SEARCH: tl.constexpr,  # sizes
    W: tl.constexpr, WP: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,  # tile shape
    HAS_CU: tl.constexpr, RESIDUAL: tl.constexpr, DW_DEFER: tl.constexpr,  # flags
):
    i_d, i_c = tl.program_id(0), tl.program_id(1)
    i_r = i_c // N_CH  # the run (weight set) whose N_CH chunks this is one of
    w_ptr += i_r.to(tl.int64) * W * D
    o_d = i_d * BD + tl.arange(0, BD)  # [BD]
    m_d = o_d < D
    o_k = tl.arange(0, WP)  # [WP] taps, padded to a power of two
    b_dw = tl.zeros([WP, BD], dtype=tl.float32)  # this chunk's sum of dy[t] * x[t - k]
    # DW_DEFER (W <= 8): tap k's products dy[t + k] * x[t] added up token slot by token slot in a [BT, BD] sum of
    # its own (a0 ... a7, one per tap; those past W are never used), reduced over tokens once after the chunk
    a0 = tl.zeros([BT, BD], dtype=tl.float32)
    a1 = tl.zeros([BT, BD], dtype=tl.float32)
    a2 = tl.zeros([BT, BD], dtype=tl.float32)
    a3 = tl.zeros([BT, BD], dtype=tl.float32)
    a4 = tl.zeros([BT, BD], dtype=tl.float32)
    a5 = tl.zeros([BT, BD], dtype=tl.float32)
    a6 = tl.zeros([BT, BD], dtype=tl.float32)
    a7 = tl.zeros([BT, BD], dtype=tl.float32)
    for j in range(TPC):
        i_b, o_g, o_t, m_t = tu.chunk_tile(i_c, j, N_CH, TPC, N_TB, T, RPW, BT)
        _, end = tu.doc_bounds(cu_ptr, o_g, i_b * T, T, N_CU, N_SEARCH, HAS_CU)
        m_td = m_t[:, None] & m_d[None, :]
        p_dy = dy_ptr + o_g.to(tl.int64)[:, None] * D + o_d[None, :]
        b_dy = tl.load(p_dy, mask=m_td, other=0.0).to(tl.float32)  # [BT, BD]
        p_x = x_ptr + o_g.to(tl.int64)[:, None] * D + o_d[None, :]
        b_x = tl.load(p_x, mask=m_td, other=0.0).to(tl.float32)  # [BT, BD]
        b_dx = b_dy if RESIDUAL else tl.zeros([BT, BD], dtype=tl.float32)
        for k in tl.static_range(W):
            b_w = tl.load(w_ptr + k * D + o_d, mask=m_d, other=0.0).to(tl.float32)  # [BD]
            # dy[t + k] serves both sums, under one condition: t + k in t's document (loads masked by the row)
            if k == 0:
                b_dyk = b_dy
            else:
                m_b = m_t & (o_t + k < T)
                p_dyk = dy_ptr + (o_g + k).to(tl.int64)[:, None] * D + o_d[None, :]
                b_dyk = tl.load(p_dyk, mask=m_b[:, None] & m_d[None, :], other=0.0).to(tl.float32)
                if HAS_CU:
                    b_dyk = tl.where((o_g + k < end)[:, None], b_dyk, 0.0)
            b_dx += b_dyk * b_w[None, :]
            if DW_DEFER:
                b_p = b_dyk * b_x  # [BT, BD] tap k's products, into its own sum (k is known at compile time)
                a0, a1 = tu.slot_add(a0, b_p, k, 0), tu.slot_add(a1, b_p, k, 1)
                a2, a3 = tu.slot_add(a2, b_p, k, 2), tu.slot_add(a3, b_p, k, 3)
                a4, a5 = tu.slot_add(a4, b_p, k, 4), tu.slot_add(a5, b_p, k, 5)
                a6, a7 = tu.slot_add(a6, b_p, k, 6), tu.slot_add(a7, b_p, k, 7)
            else:
                b_dwk = tl.sum(b_dyk * b_x, axis=0)  # [BD] sum over this tile's t of dy[t + k] * x[t]
                b_dw = tl.where(o_k[:, None] == k, b_dw + b_dwk[None, :], b_dw)
        p_dx = dx_ptr + o_g.to(tl.int64)[:, None] * D + o_d[None, :]
        tl.store(p_dx, b_dx.to(dx_ptr.dtype.element_ty), mask=m_td)
    if DW_DEFER:  # each tap's sum over its token slots, into row k of b_dw
        b_dw = tu.slot_row(tu.slot_row(b_dw, a0, o_k, 0, W), a1, o_k, 1, W)
        b_dw = tu.slot_row(tu.slot_row(b_dw, a2, o_k, 2, W), a3, o_k, 3, W)
        b_dw = tu.slot_row(tu.slot_row(b_dw, a4, o_k, 4, W), a5, o_k, 5, W)
        b_dw = tu.slot_row(tu.slot_row(b_dw, a6, o_k, 6, W), a7, o_k, 7, W)
    p_dw = dwp_ptr + (i_c * W + o_k[:, None]).to(tl.int64) * D + o_d[None, :]
    tl.store(p_dw, b_dw, mask=(o_k < W)[:, None] & m_d[None, :])
# fmt: on


def _short_conv_fwd(
    x: torch.Tensor, weight: torch.Tensor, cu_seqlens: torch.Tensor | None, residual: bool
) -> torch.Tensor:
    """x: [B, T, D], weight: [W, D] (or [R, W, D]: R runs of B / R rows each) -> y: [B, T, D] in x's dtype."""
    B, T, D = x.shape
    W, runs = weight.shape[-2], (weight.shape[0] if weight.dim() == 3 else 1)
    x, weight = tu.contiguous(x, weight)
    y = tu.empty((B, T, D), x.dtype, x.device)
    BT, BD = tu.tiles(T, D, FWD_BT, FWD_BD)
    n_cu, n_search = tu.search_steps(cu_seqlens)
    grid = (tu.cdiv(T, BT), tu.cdiv(D, BD), B)
    # fmt: off
    _short_conv_fwd_kernel[grid](
        x, weight, y, cu_seqlens, T, D, B // runs, n_cu, n_search, W=W, BT=BT, BD=BD,
        HAS_CU=cu_seqlens is not None, RESIDUAL=residual, num_warps=FWD_WARPS,
    )
    # fmt: on
    return y


def _short_conv_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, cu_seqlens: torch.Tensor | None, residual: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """dy, x: [B, T, D], weight: [W, D] (or [R, W, D]) -> (dx [B, T, D] in x's dtype, dw shaped as weight in
    its dtype)."""
    B, T, D = x.shape
    W, runs = weight.shape[-2], (weight.shape[0] if weight.dim() == 3 else 1)
    rows = B // runs  # of each run
    dy, x, weight = tu.contiguous(dy, x, weight)
    BT, BD = tu.tiles(T, D, BWD_BT, BWD_BD)
    n_tb, n_db = tu.cdiv(T, BT), tu.cdiv(D, BD)
    per_chunk, n_chunks = tu.chunk_plan(rows * n_tb, n_db, BWD_PROGRAMS)  # a run alone's plan
    dx = tu.empty((B, T, D), x.dtype, x.device)
    dw_partial = tu.empty((runs * n_chunks, W, D), torch.float32, x.device)
    n_cu, n_search = tu.search_steps(cu_seqlens)
    # fmt: off
    _short_conv_bwd_kernel[(n_db, runs * n_chunks)](
        x, weight, dy, dx, dw_partial, cu_seqlens, T, D, rows, n_chunks, n_tb, per_chunk, n_cu, n_search, W=W,
        WP=tu.next_power_of_2(W), BT=BT, BD=BD, HAS_CU=cu_seqlens is not None, RESIDUAL=residual,
        DW_DEFER=BWD_DW_DEFER and W <= tu.SLOTS, num_warps=BWD_WARPS, num_stages=BWD_STAGES, maxnreg=BWD_MAXNREG,
    )
    # fmt: on
    return dx, tu.sum_partials(dw_partial, weight.dtype, groups=runs).view(weight.shape)


def _fold_runs(info, in_dims: tuple, x: torch.Tensor, weight: torch.Tensor, cu_seqlens: torch.Tensor | None,
               residual: bool):
    """vmap rule: the runs' rows fold into the batch and their weights into [R, W, D], one launch for all
    (stacked runs: x [R, B, T, D]); with documents (offsets into one run's B*T tokens) one launch per run."""
    x_dim, w_dim = in_dims[:2]
    if cu_seqlens is not None:
        return tu.per_run_vmap(short_conv_triton.op)(info, in_dims, x, weight, cu_seqlens, residual)
    n = info.batch_size
    weight = weight.movedim(w_dim, 0) if w_dim is not None else weight  # [R, W, D], or one [W, D] for all
    y = short_conv_triton.op(tu.run_rows(x, x_dim, n), weight, cu_seqlens, residual)  # [R * B, T, D]
    return y.unflatten(0, (n, -1)), 0


# short_conv_triton(x, weight, cu_seqlens, residual) -> y, inputs as ``_short_conv_fwd`` takes them
short_conv_triton = tu.TritonOp("short_conv", _short_conv_fwd, _short_conv_bwd, vmap=_fold_runs)
