"""Static short causal convolution over packed documents in Triton: the kernels, their launchers and the op
with its backward (``kernels.short_conv.op`` checks the inputs and picks the backend).

    y[t]  = sum_k w[k] * x[t - k]             tap k read as zero when t - k is before the start of t's document
    dx[t] = sum_k w[k] * dy[t + k]            tap k of output t + k, valid when t + k is in t's document
    dw[k] = sum_t dy[t] * x[t - k]            under the forward's condition, summed per program into an fp32
                                              partial, then ``tu.sum_partials``

Two forms of each pass, chosen by the width (``config_for``). Streaming (widths up to ``tu.SLOTS``): one program
per row, channel block and run of positions, walking them U positions a step; a step reads each of its rows of x
(and dy) once as [BD] vectors, keeps them in registers and shifts between taps there, so the W - 1 rows before
(after) the step are the only ones read twice (from L1). The program finds its first position's document once and
walks on from there; a step whose rows (and the W - 1 on either side) lie in one document, most steps, runs
without per-position masks. dw's partial is one per (row, run of positions), each tap's sum in a slot of its own.
Tiled (wider convolutions): a forward program per [BT, BD] tile,
which reads x once a tap; a backward program per (channel block, chunk of token tiles), x once and dy at W
shifts, dw summed over each tile's tokens at every tap (``kernels.triton_utils`` explains the chunks, why no
atomics, and how loads avoid waiting for the document search).

Stacked runs (``torch.func.vmap`` in ``runners.train.engine``) fold into one launch: x [R * B, T, D] with weights
[R, W, D], row b using run b // B's weights (``RPW`` rows per weight set), and each run's dw partials are the ones
a run alone gets, summed in the same order, so every run's output and gradients are its own bit for bit
(``_fold_runs``). Runs with their own document layouts go one launch per run.
"""

from dataclasses import dataclass

import torch
from mixlab.kernels import triton_utils as tu
from mixlab.kernels._triton import tl, triton


@dataclass(frozen=True, kw_only=True)
class TiledFwd:
    """The tiled forward's launch: a program per [BT, BD] tile of tokens and channels, ``warps`` warps."""

    BT: int
    BD: int
    warps: int

    def __post_init__(self) -> None:
        tu.check_config(self, ("BT", "BD", "warps"))


@dataclass(frozen=True, kw_only=True)
class TiledBwd:
    """The tiled backward's launch: [BT, BD] tiles, about ``programs`` programs (channel blocks x chunks of token
    tiles, ``tu.chunk_plan``), ``warps`` warps and ``stages`` pipelining stages."""

    BT: int
    BD: int
    warps: int
    stages: int
    programs: int

    def __post_init__(self) -> None:
        tu.check_config(self, ("BT", "BD", "warps"))


# (pass, form) -> launch settings, chosen by timing on the H100/H200 (see BENCHMARKS.md).
CONFIGS = {
    ("fwd", "stream"): tu.Stream(CH=32, U=16, BD=128, warps=1),
    ("bwd", "stream"): tu.Stream(CH=128, U=4, BD=256, warps=2),
    ("fwd", "tiled"): TiledFwd(BT=32, BD=128, warps=4),
    ("bwd", "tiled"): TiledBwd(BT=16, BD=64, warps=4, stages=1, programs=2048),
}


def config_for(backward: bool, W: int, interpreted: bool) -> tu.Stream | TiledFwd | TiledBwd:
    """A pass's launch settings: the streaming form for widths up to ``tu.SLOTS`` (a slot of dw's sums per tap),
    the tiled form past them and under the interpreter (``tu.is_interpreted``)."""
    return CONFIGS["bwd" if backward else "fwd", "stream" if W <= tu.SLOTS and not interpreted else "tiled"]


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
    HAS_CU: tl.constexpr, RESIDUAL: tl.constexpr,  # flags
):
    i_d, i_c = tl.program_id(0), tl.program_id(1)
    i_r = i_c // N_CH  # the run (weight set) whose N_CH chunks this is one of
    w_ptr += i_r.to(tl.int64) * W * D
    o_d = i_d * BD + tl.arange(0, BD)  # [BD]
    m_d = o_d < D
    o_k = tl.arange(0, WP)  # [WP] taps, padded to a power of two
    b_dw = tl.zeros([WP, BD], dtype=tl.float32)  # this chunk's sum of dy[t] * x[t - k]
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
            b_dwk = tl.sum(b_dyk * b_x, axis=0)  # [BD] sum over this tile's t of dy[t + k] * x[t]
            b_dw = tl.where(o_k[:, None] == k, b_dw + b_dwk[None, :], b_dw)
        p_dx = dx_ptr + o_g.to(tl.int64)[:, None] * D + o_d[None, :]
        tl.store(p_dx, b_dx.to(dx_ptr.dtype.element_ty), mask=m_td)
    p_dw = dwp_ptr + (i_c * W + o_k[:, None]).to(tl.int64) * D + o_d[None, :]
    tl.store(p_dw, b_dw, mask=(o_k < W)[:, None] & m_d[None, :])
# fmt: on


@triton.jit
def _stream_setup(w_ptr, i_d, i_b, T, D, RPW, W: tl.constexpr, BD: tl.constexpr):
    """A streaming program's channels ([BD] and their mask), its row's run's weights (W [BD] vectors in fp32) and
    the row's position 0 on the B*T axis."""
    o_d = i_d * BD + tl.arange(0, BD)  # [BD]
    m_d = o_d < D
    w_ptr += (i_b // RPW).to(tl.int64) * W * D  # the row's run's weights
    b_ws = ()
    for k in tl.static_range(W):
        b_ws = b_ws + (tl.load(w_ptr + k * D + o_d, mask=m_d, other=0.0).to(tl.float32),)  # [BD] tap k
    return o_d, m_d, b_ws, i_b * T


@triton.jit
def _fwd_step(p_y, b_xs, b_ws, cu_ptr, row, tb, T, D, o_d, m_d, i_doc, start, end, W: tl.constexpr,
              U: tl.constexpr, MASKED: tl.constexpr, RESIDUAL: tl.constexpr):
    """Outputs tb ... tb + U - 1 of one row from b_xs = x[tb - W + 1] ... x[tb + U - 1]; MASKED: each position
    finds its document (walking on from (i_doc, start, end)) and reads zero before its start, else no tap of the
    step leaves its document."""
    for u in tl.static_range(U):
        t = tb + u
        if MASKED:  # positions past T (the last step's tail) stay in the row's last document
            i_doc, start, end = tu.doc_walk(cu_ptr, row + tl.minimum(t, T - 1), i_doc, start, end)
        b_y = tl.zeros_like(b_ws[0])
        for k in tl.static_range(W):
            b_x = b_xs[u + W - 1 - k]  # x[t - k], zero before the row (load mask)
            if MASKED:
                b_x = tl.where(row + t - k >= start, b_x, 0.0)
            b_y += b_x * b_ws[k]
            if RESIDUAL and k == 0:
                b_y += b_x
        m_t = m_d & (tl.zeros_like(o_d) + t < T)
        tl.store(p_y + t.to(tl.int64) * D, b_y.to(p_y.dtype.element_ty), mask=m_t)
    return i_doc, start, end


# fmt: off
@triton.jit
def _short_conv_fwd_stream_kernel(
    x_ptr, w_ptr, y_ptr, cu_ptr,  # pointers
    T, D, RPW, CH, N_CU, N_SEARCH: tl.constexpr,  # sizes
    W: tl.constexpr, U: tl.constexpr, BD: tl.constexpr,  # tile shape
    HAS_CU: tl.constexpr, RESIDUAL: tl.constexpr,  # flags
):
    i_t, i_d, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_d, m_d, b_ws, row = _stream_setup(w_ptr, i_d, i_b, T, D, RPW, W, BD)
    p_x = x_ptr + row.to(tl.int64) * D + o_d  # [BD]
    p_y = y_ptr + row.to(tl.int64) * D + o_d
    t0 = i_t * CH
    i_doc, start, end = tu.doc_start_state(cu_ptr, row, t0, T, N_CU, N_SEARCH, HAS_CU)
    for tb in range(t0, t0 + CH, U):
        # x[tb - W + 1] ... x[tb + U - 1]: every row of the step read once; the W - 1 before it again from L1
        b_xs = tu.stream_rows(p_x, o_d, m_d, tb - (W - 1), T, D, U + W - 1)
        if HAS_CU:
            one, i_doc, start, end = tu.in_one_doc(cu_ptr, row, tb - (W - 1), tb + U - 1, T, i_doc, start, end)
            if one:
                i_doc, start, end = _fwd_step(p_y, b_xs, b_ws, cu_ptr, row, tb, T, D, o_d, m_d, i_doc, start, end,
                                              W, U, False, RESIDUAL)
            else:
                i_doc, start, end = _fwd_step(p_y, b_xs, b_ws, cu_ptr, row, tb, T, D, o_d, m_d, i_doc, start, end,
                                              W, U, True, RESIDUAL)
        else:
            _fwd_step(p_y, b_xs, b_ws, cu_ptr, row, tb, T, D, o_d, m_d, i_doc, start, end, W, U, False, RESIDUAL)
# fmt: on


@triton.jit
def _bwd_step(p_dx, b_xs, b_dys, b_ws, a0, a1, a2, a3, a4, a5, a6, a7, cu_ptr, row, tb, T, D, o_d, m_d, i_doc,
              start, end, W: tl.constexpr, U: tl.constexpr, MASKED: tl.constexpr, RESIDUAL: tl.constexpr):
    """dx at positions tb ... tb + U - 1 of one row, and their products dy[t] * x[t - k] added to tap k's slot,
    from b_xs = x[tb - W + 1] ... x[tb + U - 1] and b_dys = dy[tb] ... dy[tb + U + W - 2]; MASKED as
    ``_fwd_step``."""
    for u in tl.static_range(U):
        t = tb + u
        if MASKED:
            i_doc, start, end = tu.doc_walk(cu_ptr, row + tl.minimum(t, T - 1), i_doc, start, end)
        b_dy = b_dys[u]
        b_dx = b_dy if RESIDUAL else tl.zeros_like(b_dy)
        for k in tl.static_range(W):
            # dx[t] takes dy[t + k] while t + k is in t's document; dw[k] takes dy[t] * x[t - k] while t - k is
            # (past the row both read zero from their loads)
            b_dyk = b_dys[u + k]
            b_xk = b_xs[u + W - 1 - k]
            if MASKED:
                b_dyk = tl.where(row + t + k < end, b_dyk, 0.0)
                b_xk = tl.where(row + t - k >= start, b_xk, 0.0)
            b_dx += b_dyk * b_ws[k]
            b_p = b_dy * b_xk
            a0, a1, a2, a3, a4, a5, a6, a7 = tu.slots_add(a0, a1, a2, a3, a4, a5, a6, a7, b_p, k)
        m_t = m_d & (tl.zeros_like(o_d) + t < T)
        tl.store(p_dx + t.to(tl.int64) * D, b_dx.to(p_dx.dtype.element_ty), mask=m_t)
    return a0, a1, a2, a3, a4, a5, a6, a7, i_doc, start, end


# fmt: off
@triton.jit
def _short_conv_bwd_stream_kernel(
    x_ptr, w_ptr, dy_ptr, dx_ptr, dwp_ptr, cu_ptr,  # pointers
    T, D, RPW, CH, N_TC, N_CU, N_SEARCH: tl.constexpr,  # sizes
    W: tl.constexpr, U: tl.constexpr, BD: tl.constexpr,  # tile shape
    HAS_CU: tl.constexpr, RESIDUAL: tl.constexpr,  # flags
):
    i_t, i_d, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_d, m_d, b_ws, row = _stream_setup(w_ptr, i_d, i_b, T, D, RPW, W, BD)
    p_x = x_ptr + row.to(tl.int64) * D + o_d  # [BD]
    p_dy = dy_ptr + row.to(tl.int64) * D + o_d
    p_dx = dx_ptr + row.to(tl.int64) * D + o_d
    t0 = i_t * CH
    i_doc, start, end = tu.doc_start_state(cu_ptr, row, t0, T, N_CU, N_SEARCH, HAS_CU)
    # dw[k] = sum_t dy[t] * x[t - k] over this program's positions, tap k in slot k (widths up to tu.SLOTS)
    a0 = tl.zeros([BD], dtype=tl.float32)
    a1 = tl.zeros([BD], dtype=tl.float32)
    a2 = tl.zeros([BD], dtype=tl.float32)
    a3 = tl.zeros([BD], dtype=tl.float32)
    a4 = tl.zeros([BD], dtype=tl.float32)
    a5 = tl.zeros([BD], dtype=tl.float32)
    a6 = tl.zeros([BD], dtype=tl.float32)
    a7 = tl.zeros([BD], dtype=tl.float32)
    for tb in range(t0, t0 + CH, U):
        b_xs = tu.stream_rows(p_x, o_d, m_d, tb - (W - 1), T, D, U + W - 1)  # x[tb - W + 1] ... x[tb + U - 1]
        b_dys = tu.stream_rows(p_dy, o_d, m_d, tb, T, D, U + W - 1)  # dy[tb] ... dy[tb + U + W - 2]
        if HAS_CU:
            one, i_doc, start, end = tu.in_one_doc(cu_ptr, row, tb - (W - 1), tb + U + W - 2, T, i_doc, start, end)
            if one:
                a0, a1, a2, a3, a4, a5, a6, a7, i_doc, start, end = _bwd_step(
                    p_dx, b_xs, b_dys, b_ws, a0, a1, a2, a3, a4, a5, a6, a7, cu_ptr, row, tb, T, D, o_d, m_d, i_doc,
                    start, end, W, U, False, RESIDUAL)
            else:
                a0, a1, a2, a3, a4, a5, a6, a7, i_doc, start, end = _bwd_step(
                    p_dx, b_xs, b_dys, b_ws, a0, a1, a2, a3, a4, a5, a6, a7, cu_ptr, row, tb, T, D, o_d, m_d, i_doc,
                    start, end, W, U, True, RESIDUAL)
        else:
            a0, a1, a2, a3, a4, a5, a6, a7, i_doc, start, end = _bwd_step(
                p_dx, b_xs, b_dys, b_ws, a0, a1, a2, a3, a4, a5, a6, a7, cu_ptr, row, tb, T, D, o_d, m_d, i_doc,
                start, end, W, U, False, RESIDUAL)
    # this program's partial, row i_b * N_TC + i_t of [B * N_TC, W, D]
    p_dw = dwp_ptr + (i_b * N_TC + i_t).to(tl.int64) * W * D + o_d
    tu.slots_store(p_dw, a0, a1, a2, a3, a4, a5, a6, a7, W, D, m_d)
# fmt: on


def _stream_plan(T: int, D: int, W: int, config: tu.Stream) -> tuple[int, int]:
    """(positions a program, channels a program) of a streaming form: BD clamped to D's power of two."""
    if W > tu.SLOTS:
        raise ValueError(f"the streaming forms take widths up to {tu.SLOTS}, got W={W}")
    return tu.stream_positions(T, config.CH, config.U), min(config.BD, tu.next_power_of_2(D))


def _short_conv_fwd(
    x: torch.Tensor, weight: torch.Tensor, cu_seqlens: torch.Tensor | None, residual: bool, *,
    config: tu.Stream | TiledFwd | None = None,
) -> torch.Tensor:
    """x: [B, T, D], weight: [W, D] (or [R, W, D]: R runs of B / R rows each) -> y: [B, T, D] in x's dtype.
    ``config``: the launch (its type picks the form), by default ``config_for``'s."""
    B, T, D = x.shape
    W, runs = weight.shape[-2], (weight.shape[0] if weight.dim() == 3 else 1)
    if config is None:
        config = config_for(False, W, tu.is_interpreted(_short_conv_fwd_kernel))
    x, weight = tu.contiguous(x, weight)
    y = tu.empty((B, T, D), x.dtype, x.device)
    n_cu, n_search = tu.search_steps(cu_seqlens)
    if isinstance(config, tu.Stream):
        CH, BD = _stream_plan(T, D, W, config)
        # fmt: off
        _short_conv_fwd_stream_kernel[(tu.cdiv(T, CH), tu.cdiv(D, BD), B)](
            x, weight, y, cu_seqlens, T, D, B // runs, CH, n_cu, n_search, W=W, U=config.U, BD=BD,
            HAS_CU=cu_seqlens is not None, RESIDUAL=residual, num_warps=config.warps,
        )
        # fmt: on
        return y
    BT, BD = tu.tiles(T, D, config.BT, config.BD)
    grid = (tu.cdiv(T, BT), tu.cdiv(D, BD), B)
    # fmt: off
    _short_conv_fwd_kernel[grid](
        x, weight, y, cu_seqlens, T, D, B // runs, n_cu, n_search, W=W, BT=BT, BD=BD,
        HAS_CU=cu_seqlens is not None, RESIDUAL=residual, num_warps=config.warps,
    )
    # fmt: on
    return y


def _short_conv_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, cu_seqlens: torch.Tensor | None, residual: bool, *,
    config: tu.Stream | TiledBwd | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """dy, x: [B, T, D], weight: [W, D] (or [R, W, D]) -> (dx [B, T, D] in x's dtype, dw shaped as weight in
    its dtype). ``config`` as ``_short_conv_fwd``'s."""
    B, T, D = x.shape
    W, runs = weight.shape[-2], (weight.shape[0] if weight.dim() == 3 else 1)
    rows = B // runs  # of each run
    if config is None:
        config = config_for(True, W, tu.is_interpreted(_short_conv_bwd_kernel))
    dy, x, weight = tu.contiguous(dy, x, weight)
    if isinstance(config, tu.Stream):
        CH, BD = _stream_plan(T, D, W, config)
        n_tc = tu.cdiv(T, CH)
        dx = tu.empty((B, T, D), x.dtype, x.device)
        dw_partial = tu.empty((B * n_tc, W, D), torch.float32, x.device)  # a run's rows' partials in a block
        n_cu, n_search = tu.search_steps(cu_seqlens)
        # fmt: off
        _short_conv_bwd_stream_kernel[(n_tc, tu.cdiv(D, BD), B)](
            x, weight, dy, dx, dw_partial, cu_seqlens, T, D, rows, CH, n_tc, n_cu, n_search, W=W, U=config.U,
            BD=BD, HAS_CU=cu_seqlens is not None, RESIDUAL=residual, num_warps=config.warps,
        )
        # fmt: on
        return dx, tu.sum_partials(dw_partial, weight.dtype, groups=runs).view(weight.shape)
    BT, BD = tu.tiles(T, D, config.BT, config.BD)
    n_tb, n_db = tu.cdiv(T, BT), tu.cdiv(D, BD)
    per_chunk, n_chunks = tu.chunk_plan(rows * n_tb, n_db, config.programs)  # a run alone's plan
    dx = tu.empty((B, T, D), x.dtype, x.device)
    dw_partial = tu.empty((runs * n_chunks, W, D), torch.float32, x.device)
    n_cu, n_search = tu.search_steps(cu_seqlens)
    # fmt: off
    _short_conv_bwd_kernel[(n_db, runs * n_chunks)](
        x, weight, dy, dx, dw_partial, cu_seqlens, T, D, rows, n_chunks, n_tb, per_chunk, n_cu, n_search, W=W,
        WP=tu.next_power_of_2(W), BT=BT, BD=BD, HAS_CU=cu_seqlens is not None, RESIDUAL=residual,
        num_warps=config.warps, num_stages=config.stages,
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
