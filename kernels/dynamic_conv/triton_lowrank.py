"""Low-rank dynamic short causal convolution over packed documents in Triton: the kernels, their launchers
and the op with its backward (``kernels.dynamic_conv.op`` checks the inputs and picks the backend).

As ``kernels.short_conv``, tap k of output t multiplies x[t - k] and reads zero before the start of t's
document; the weights of every tap are those of the output token t.

w[t, k, d] = sum_r z[t, r] U[r, k * D + d] (+ static_w[k, d]): the forward, one launch, forms each tap's [BT, BD]
weights with one tl.dot (R padded to RP >= 16 with masked loads; in the inputs' own half type when z and U share
it, as the products are exact in the fp32 sum) and never writes them. The backward, with
g[t, (k, d)] = dy[t, d] * x[t - k, d] formed on chip, is three launches and the sums of their partials:
    dx[t]  = sum_k (z[t + k] @ U[:, k*D + d] + static_w[k]) * dy[t + k]     the weights again formed on chip;
             a program per token tile and channel block
    dz[t]  = sum_(k, d) g[t, (k, d)] U[:, (k, d)]       a second launch of the same kernel, a program per token
             tile and split of the channel blocks, walking its blocks; one fp32 partial a split
    dU[:, (k, d)] = sum_t z[t]^T g[t, (k, d)] and dstatic_w[k, d] = sum_t g[t, (k, d)]: a program per channel
             block (all taps) and chunk of token tiles, tap by tap g^T [BD, BT] @ z (BD rows: a warpgroup's dot),
             dstatic_w a rank whose z is 1; fp32 partials per chunk
so the [B, T, W, D] weights and their gradient never reach device memory either.

Stacked runs fold into one launch as in ``kernels.short_conv.triton``: x, z [R * B, ...] with U [R, rank, W * D]
and static_w [R, W, D], row b using run b // B's (``RPW``), dU and dstatic_w summed over each run's chunks as a
run alone sums them (``_fold_runs``).
"""

from dataclasses import dataclass

import torch
from mixlab.kernels import triton_utils as tu
from mixlab.kernels._triton import tl, triton


@dataclass(frozen=True, kw_only=True)
class Tiles:
    """A launch's [BT, BD] tiles of tokens and channels (tl.dot takes 16 and more), ``warps`` warps and ``stages``
    pipelining stages of its loops (from 2 on, Triton loads the next iterations' tiles ahead through shared
    memory)."""

    BT: int
    BD: int
    warps: int
    stages: int

    def __post_init__(self) -> None:
        tu.check_config(self, ("BT", "BD", "warps"))
        if min(self.BT, self.BD) < 16:
            raise ValueError(f"{type(self).__name__} tiles must be at least 16 (tl.dot), got {self.BT} x {self.BD}")


@dataclass(frozen=True, kw_only=True)
class DzTiles(Tiles):
    """The dz launch's: each token tile's channel blocks in ``splits`` programs, one fp32 partial of dz each (a
    single split stores dz itself)."""

    splits: int


@dataclass(frozen=True, kw_only=True)
class DuTiles(Tiles):
    """The dU launch's: about ``programs`` programs (channel blocks x chunks of token tiles, ``tu.chunk_plan``)."""

    programs: int


# pass -> launch settings, chosen by timing on the H100/H200 (see BENCHMARKS.md). The dz dot g [BT, BD] @ U^T has
# BT rows: a warpgroup's dot (wgmma) from 64 on at 4 warps, mma.sync below.
CONFIGS = {
    "fwd": Tiles(BT=64, BD=64, warps=4, stages=3),
    "dx": Tiles(BT=32, BD=64, warps=4, stages=1),
    "dz": DzTiles(BT=32, BD=64, warps=4, stages=1, splits=8),
    "du": DuTiles(BT=64, BD=64, warps=4, stages=1, programs=1024),
}


def config_for(launch: str) -> Tiles:
    """The launch settings of ``launch`` ("fwd", "dx", "dz" or "du"): one row each, whatever the shapes."""
    return CONFIGS[launch]


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
            PRECISION: tl.constexpr):
    """(b_dx [BT, BD] plus tap k of the outputs t + k, U's block of tap k [RP, BD]): the outputs' weights formed
    on chip, times dy[t + k] (loaded after the weights' dot), zero where t + k leaves t's document (loads masked by
    the row only). Without WITH_DX (the dz pass), b_dx as it was and U's block alone (in U's dtype)."""
    if WITH_DX:
        m_b = m_t & (o_t + k < T)
        b_wk, b_uk = _lowrank_taps(z_ptr, u_ptr, o_g + k, m_b, o_r, m_r, k, o_d, m_d, R, D, W, NATIVE_DOT, PRECISION)
        if HAS_STATIC:
            b_wk += tl.load(s_ptr + k * D + o_d, mask=m_d, other=0.0).to(tl.float32)[None, :]
        b_dxk = b_wk * _dy_ahead(dy_ptr, o_g, o_t, m_t, o_d, m_d, k, T, D)
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
             PRECISION: tl.constexpr):
    """b_y [BT, BD] plus tap k's term: the tokens' weights of tap k (on chip only) times x[t - k] (loaded after
    the weights' dot)."""
    b_w, _ = _lowrank_taps(z_ptr, u_ptr, o_g, m_t, o_r, m_r, k, o_d, m_d, R, D, W, NATIVE_DOT, PRECISION)
    if HAS_STATIC:
        b_w += tl.load(s_ptr + k * D + o_d, mask=m_d, other=0.0).to(tl.float32)[None, :]
    b_x = _shifted_x(x_ptr, o_g, o_t, m_t, o_d, m_d, start, k, D, HAS_CU)
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
    NATIVE_DOT: tl.constexpr, PRECISION: tl.constexpr,  # flags
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
    for k in range(W):  # a loop, not unrolled: one tap's tiles live at a time, and Triton pipelines its loads
        b_y = _fwd_tap(b_y, k, x_ptr, z_ptr, u_ptr, s_ptr, o_g, o_t, m_t, o_r, m_r, o_d, m_d, start, R, D, W,
                       HAS_CU, HAS_STATIC, RESIDUAL, NATIVE_DOT, PRECISION)
    p_y = y_ptr + o_g.to(tl.int64)[:, None] * D + o_d[None, :]
    tl.store(p_y, b_y.to(y_ptr.dtype.element_ty), mask=m_t[:, None] & m_d[None, :])
# fmt: on


# fmt: off
@triton.jit
def _dynamic_conv_lowrank_bwd_dx_kernel(
    x_ptr, z_ptr, u_ptr, s_ptr, dy_ptr, dx_ptr, dzp_ptr, cu_ptr,  # pointers
    T, D, R, RPW, N_TOK, NDB, N_CU, N_SEARCH: tl.constexpr,  # sizes
    W: tl.constexpr, RP: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,  # tile shape
    HAS_CU: tl.constexpr, HAS_STATIC: tl.constexpr, RESIDUAL: tl.constexpr,  # flags
    NATIVE_DOT: tl.constexpr, PRECISION: tl.constexpr, DZ: tl.constexpr,  # flags
):
    """One program per token tile and run of NDB channel blocks (i_s), launched twice: dx (DZ false, one block
    a program; x and dzp_ptr unused) and dz (DZ true: this run's share of g[t] @ U^T into row i_s of dz's fp32
    partials [splits, B*T, R]; z, static_w and dx_ptr unused)."""
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
    b_dz = tl.zeros([BT, RP], dtype=tl.float32)  # sum over this run's channels of g[t] @ U^T
    for j in range(NDB):
        o_d = (i_s * NDB + j) * BD + tl.arange(0, BD)  # [BD]
        m_d = o_d < D
        p_dy = dy_ptr + o_g.to(tl.int64)[:, None] * D + o_d[None, :]
        b_dy = tl.load(p_dy, mask=m_t[:, None] & m_d[None, :], other=0.0).to(tl.float32)  # [BT, BD]
        b_dx = b_dy if RESIDUAL else tl.zeros([BT, BD], dtype=tl.float32)
        for k in range(W):  # a loop, not unrolled: one tap's tiles live at a time
            b_dx, b_uk = _dx_tap(b_dx, k, z_ptr, u_ptr, s_ptr, dy_ptr, o_g, o_t, m_t, o_r, m_r, o_d, m_d, end, T, R,
                                 D, W, HAS_CU, HAS_STATIC, not DZ, NATIVE_DOT, PRECISION)
            if DZ:  # g[t, (k, d)] = dy[t, d] * x[t - k, d], zero before t's document start
                b_g = b_dy * _shifted_x(x_ptr, o_g, o_t, m_t, o_d, m_d, start, k, D, HAS_CU)  # [BT, BD]
                b_dz += tl.dot(b_g, tl.trans(b_uk.to(tl.float32)), input_precision=PRECISION)  # [BT, RP]
        if not DZ:
            p_dx = dx_ptr + o_g.to(tl.int64)[:, None] * D + o_d[None, :]
            tl.store(p_dx, b_dx.to(dx_ptr.dtype.element_ty), mask=m_t[:, None] & m_d[None, :])
    if DZ:
        p_dz = dzp_ptr + (i_s.to(tl.int64) * N_TOK + o_g)[:, None] * R + o_r[None, :]
        tl.store(p_dz, b_dz.to(dzp_ptr.dtype.element_ty), mask=m_t[:, None] & m_r[None, :])
# fmt: on


# fmt: off
@triton.jit
def _dynamic_conv_lowrank_bwd_du_kernel(
    x_ptr, z_ptr, dy_ptr, dup_ptr, dsp_ptr, cu_ptr,  # pointers
    T, D, R, RPW, N_CH, N_TB, TPC, N_CU, N_SEARCH: tl.constexpr,  # sizes
    W: tl.constexpr, RP: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,  # tile shape
    HAS_CU: tl.constexpr, HAS_STATIC: tl.constexpr, PRECISION: tl.constexpr,  # flags
):
    i_d, i_c = tl.program_id(0), tl.program_id(1)
    o_r = tl.arange(0, RP)  # [RP] ranks, padded to >= 16 for tl.dot (> R with static_w: rank R is its ones)
    o_d = i_d * BD + tl.arange(0, BD)  # [BD]
    m_r, m_d = o_r < R, o_d < D
    b_dus = ()  # tap k's sum over the chunk of g[t, (k, .)]^T z[t]: [BD, RP] each; column R dstatic_w's
    for _ in tl.static_range(W):
        b_dus = b_dus + (tl.zeros([BD, RP], dtype=tl.float32),)
    for j in range(TPC):
        i_b, o_g, o_t, m_t = tu.chunk_tile(i_c, j, N_CH, TPC, N_TB, T, RPW, BT)
        start = tu.doc_bounds(cu_ptr, o_g, i_b * T, T, N_CU, N_SEARCH, HAS_CU)[0]  # each token's document start
        p_z = z_ptr + o_g.to(tl.int64)[:, None] * R + o_r[None, :]
        b_z = tl.load(p_z, mask=m_t[:, None] & m_r[None, :], other=0.0).to(tl.float32)  # [BT, RP]
        if HAS_STATIC:
            b_z = tl.where(m_t[:, None] & (o_r == R)[None, :], 1.0, b_z)
        # the channels first: g^T [BD, BT] is the dot's left operand, BD rows (a warpgroup's dot)
        p_dy = dy_ptr + o_g.to(tl.int64)[None, :] * D + o_d[:, None]
        b_dy = tl.load(p_dy, mask=m_d[:, None] & m_t[None, :], other=0.0).to(tl.float32)  # [BD, BT]
        b_new = ()
        for k in tl.static_range(W):  # g[t, (k, d)] = dy[t, d] * x[t - k, d], zero before t's document start
            m_k = m_t & (o_t >= k)
            if HAS_CU:
                m_k = m_k & (o_g - k >= start)
            p_x = x_ptr + (o_g - k).to(tl.int64)[None, :] * D + o_d[:, None]
            b_g = b_dy * tl.load(p_x, mask=m_d[:, None] & m_k[None, :], other=0.0).to(tl.float32)  # [BD, BT]
            b_new = b_new + (tl.dot(b_g, b_z, acc=b_dus[k], input_precision=PRECISION),)
        b_dus = b_new
    for k in tl.static_range(W):  # this chunk's partials: rows i_c of [chunks, R, W * D] and [chunks, W, D]
        p_du = dup_ptr + (i_c * R + o_r[None, :]).to(tl.int64) * (W * D) + k * D + o_d[:, None]
        tl.store(p_du, b_dus[k], mask=m_d[:, None] & m_r[None, :])
        if HAS_STATIC:
            b_ds = tl.sum(tl.where((o_r == R)[None, :], b_dus[k], 0.0), axis=1)  # [BD]
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


def _lowrank_fwd(
    x: torch.Tensor,
    z: torch.Tensor,
    U: torch.Tensor,
    static_w: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    residual: bool,
    *,
    config: Tiles | None = None,
) -> torch.Tensor:
    """x: [B, T, D], z: [B, T, R], U: [R, W * D], static_w: [W, D] or None -> y: [B, T, D] in x's dtype. Stacked
    runs: U [runs, R, W * D] and static_w [runs, W, D], each run B / runs rows. ``config``: the launch, by default
    ``config_for("fwd")``."""
    B, T, D = x.shape
    R, W, runs = z.shape[2], U.shape[-1] // D, (U.shape[0] if U.dim() == 3 else 1)
    config = config or config_for("fwd")
    x, z, U, static_w = tu.contiguous(x, z, U, static_w)
    y = tu.empty((B, T, D), x.dtype, x.device)
    BT, BD = tu.tiles(T, D, config.BT, config.BD)
    n_cu, n_search = tu.search_steps(cu_seqlens)
    grid = (tu.cdiv(T, BT), tu.cdiv(D, BD), B)
    # fmt: off
    _dynamic_conv_lowrank_fwd_kernel[grid](
        x, z, U, static_w, y, cu_seqlens, T, D, R, B // runs, n_cu, n_search, W=W,
        RP=max(16, tu.next_power_of_2(R)), BT=BT, BD=BD, HAS_CU=cu_seqlens is not None,
        HAS_STATIC=static_w is not None, RESIDUAL=residual, NATIVE_DOT=_native_dot(z, U),
        PRECISION=tu.dot_precision(x), num_warps=config.warps, num_stages=config.stages,
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
    *,
    dx_config: Tiles | None = None,
    dz_config: DzTiles | None = None,
    du_config: DuTiles | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dy, x: [B, T, D], z: [B, T, R], U: [R, W * D], static_w: [W, D] or None -> (dx [B, T, D], dz [B, T, R],
    dU [R, W * D], dstatic_w [W, D], or [0] without static_w), each in the dtype of its input. Stacked runs: U and
    static_w (and their gradients) with a leading run axis, as ``_lowrank_fwd``. The three launches' settings by
    default ``config_for``'s."""
    B, T, D = x.shape
    R, W, runs = z.shape[2], U.shape[-1] // D, (U.shape[0] if U.dim() == 3 else 1)
    rows = B // runs  # of each run
    dx_config, dz_config = dx_config or config_for("dx"), dz_config or config_for("dz")
    du_config = du_config or config_for("du")
    dy, x, z, U, static_w = tu.contiguous(dy, x, z, U, static_w)
    RP = max(16, tu.next_power_of_2(R))
    n_cu, n_search = tu.search_steps(cu_seqlens)
    flags = dict(HAS_CU=cu_seqlens is not None, HAS_STATIC=static_w is not None, PRECISION=tu.dot_precision(x))
    dx = tu.empty((B, T, D), x.dtype, x.device)
    # dz: each token tile's channel blocks in splits, a function of the shape only, so that dz sums its partials
    # in a fixed order
    BTZ, BDZ = tu.tiles(T, D, dz_config.BT, dz_config.BD)
    n_dbz = tu.cdiv(D, BDZ)
    n_split = max(1, min(dz_config.splits, n_dbz))
    dz = tu.empty((B, T, R), z.dtype, x.device)
    dz_partial = dz if n_split == 1 else tu.empty((n_split, B, T, R), torch.float32, x.device)
    # dx, then dz: (token tile, channel block, programs a token tile, channel blocks, launch settings)
    BT, BD = tu.tiles(T, D, dx_config.BT, dx_config.BD)
    n_db = tu.cdiv(D, BD)
    for dz_pass, bt, bd, n_prog, n_blocks, config in ((False, BT, BD, n_db, n_db, dx_config),
                                                      (True, BTZ, BDZ, n_split, n_dbz, dz_config)):
        # fmt: off
        _dynamic_conv_lowrank_bwd_dx_kernel[(tu.cdiv(T, bt), n_prog, B)](
            x, z, U, static_w, dy, dx, dz_partial, cu_seqlens, T, D, R, rows, B * T, tu.cdiv(n_blocks, n_prog),
            n_cu, n_search, W=W, RP=RP, BT=bt, BD=bd, RESIDUAL=residual, NATIVE_DOT=_native_dot(z, U), **flags,
            DZ=dz_pass, num_warps=config.warps, num_stages=config.stages,
        )
        # fmt: on
    if dz_partial is not dz:
        dz = tu.sum_partials(dz_partial, z.dtype)
    # dU and dstatic_w: fp32 partials per chunk of token tiles
    BT, BD = tu.tiles(T, D, du_config.BT, du_config.BD)
    n_tb, n_db = tu.cdiv(T, BT), tu.cdiv(D, BD)
    per_chunk, n_chunks = tu.chunk_plan(rows * n_tb, n_db, du_config.programs)  # a run alone's plan
    du_partial = tu.empty((runs * n_chunks, R, W * D), torch.float32, x.device)
    ds_partial = None if static_w is None else tu.empty((runs * n_chunks, W, D), torch.float32, x.device)
    # fmt: off
    _dynamic_conv_lowrank_bwd_du_kernel[(n_db, runs * n_chunks)](
        x, z, dy, du_partial, ds_partial, cu_seqlens, T, D, R, rows, n_chunks, n_tb, per_chunk, n_cu, n_search,
        W=W, RP=max(16, tu.next_power_of_2(R + (static_w is not None))), BT=BT, BD=BD, **flags,
        num_warps=du_config.warps, num_stages=du_config.stages,
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
