"""Shared pieces of the short-convolution Triton kernels: document bounds found inside a kernel, the tile and
chunk plans, output allocation, the backend/dtype gate and the wiring of an op's launchers to autograd
(``TritonOp``).

Documents: a kernel gets ``cu_seqlens`` itself (int32 [n_docs + 1]) and binary-searches it for the tokens
of its tile (``doc_bounds``), so no per-token tensor is built on the host: a packed call costs no extra
launch.
Without ``cu_seqlens`` every row is one document.

Reductions over tokens (weight gradients) never use atomics: the token tiles are split into a fixed number of
contiguous chunks (``chunk_plan``, a function of the shape only), each program sums its chunk in a fixed order
into an fp32 partial, and ``sum_partials`` adds the partials in a fixed order too, in one launch that also
casts to the gradient's dtype. Results are bitwise reproducible.

Speed at the sizes that matter (B*T*D ~ 1e7-1e8) comes from three habits: every load's mask depends on the row
bounds only, the document masks are applied to the loaded values afterwards with ``tl.where`` (so the loads
need not wait for the document search, and a NaN in another document still never reaches the result); the
search is unrolled (``N_SEARCH`` is a compile-time constant rounded up to an even count, so a few values
cover every layout); and the eager path of each op calls its launchers from a ``torch.autograd.Function``,
the custom op being kept for ``torch.compile`` graphs and for ``torch.func.vmap`` (stacked runs,
``runners.train.engine``), where the short convs' rules fold the runs into one launch (each row with its run's
weights) and other ops' rule (``per_run_vmap``) launches the op once per run.

Launch settings (tiles, warps, stages, program counts) are fixed, not autotuned: the weight gradients' sums
depend on the tiles and chunks, and results must not depend on a timing. Each kernel module keeps them in one
small table of frozen dataclass rows (``CONFIGS``) read by one function (``config_for``); every launcher takes
an explicit ``config`` (keyword-only) for tests and ``runners.bench.tune``, the table's row by default.
"""

import inspect
from dataclasses import dataclass, fields
from functools import partial

import torch
from mixlab.kernels._triton import HAS_TRITON, tl, triton
from mixlab.kernels.utils import resolve_backend

TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Tests set this to True: every buffer a launcher allocates then starts full of NaN, so an element a kernel
# forgets to write shows up as a non-finite result.
POISON_OUTPUTS = False


def check_config(config, powers_of_two: tuple[str, ...] = ()) -> None:
    """Raise ValueError unless every field of ``config`` (a launch-settings dataclass) is a positive int, and
    those named in ``powers_of_two`` (tile sides of ``tl.arange``, warps) are powers of two."""
    for f in fields(config):
        value = getattr(config, f.name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{type(config).__name__}.{f.name} must be a positive int, got {value!r}")
        if f.name in powers_of_two and value & (value - 1):
            raise ValueError(f"{type(config).__name__}.{f.name} must be a power of two, got {value}")


@dataclass(frozen=True, kw_only=True)
class SumConfig:
    """``sum_partials``' launch: BM columns a program, BP rows added a step."""

    BM: int
    BP: int
    warps: int

    def __post_init__(self) -> None:
        check_config(self, ("BM", "BP", "warps"))


@dataclass(frozen=True, kw_only=True)
class Stream:
    """A streaming form's launch (the short convs): one program per row, block of about BD channels and CH
    positions, walked U positions a step (CH a multiple of U), ``warps`` warps."""

    CH: int
    U: int
    BD: int
    warps: int

    def __post_init__(self) -> None:
        check_config(self, ("BD", "warps"))
        if self.CH % self.U:
            raise ValueError(f"Stream.CH={self.CH} must be a multiple of Stream.U={self.U}")


# sum_partials' one row
SUM_CONFIG = SumConfig(BM=128, BP=32, warps=4)


# Host-side sizes for the launchers. triton.cdiv and triton.next_power_of_2 are constexpr functions whose host calls
# unwrap every argument first: about 5 µs each on a 2-core CPU, a dozen per forward+backward of a short conv.
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, n - 1).bit_length()


def contiguous(*tensors: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """Each tensor made contiguous (the kernels index with dense strides); None (an absent static weight) stays."""
    return tuple(None if t is None else t.contiguous() for t in tensors)


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.empty, or a NaN-filled buffer while POISON_OUTPUTS is set."""
    out = torch.empty(shape, dtype=dtype, device=device)
    if POISON_OUTPUTS:
        out.fill_(float("nan"))
    return out


def is_batched(x: torch.Tensor) -> bool:
    """True when ``x`` is a tensor inside ``torch.func.vmap`` (its batch axis hidden): the op must then go
    through its custom op, whose vmap rule the autograd.Function of the eager path does not have."""
    return torch._C._functorch.is_batchedtensor(x)


def in_transform() -> bool:
    """True inside a torch.func transform (vmap, grad), also on plain tensors (a custom op's vmap rule runs with
    vmap still active): an autograd.Function cannot run there, a custom op with registered autograd can."""
    return torch._C._are_functorch_transforms_active()


def per_run_vmap(op):
    """A vmap rule for a custom op whose weights are each run's own (so the runs cannot fold into the op's
    batch): ``op`` (the op, or any function of its arguments) once per run on that run's slices, outputs
    stacked on a leading run axis. The calls are on plain tensors, so autograd records them (and a custom op's
    registered backward) as in a run trained alone."""

    def rule(info, in_dims, *args):
        outs = [op(*(a if d is None else a.select(d, n) for a, d in zip(args, in_dims)))
                for n in range(info.batch_size)]
        return torch.stack(outs), 0

    return rule


def run_rows(t: torch.Tensor, dim: int | None, runs: int) -> torch.Tensor:
    """A per-token input of stacked runs, [runs, B, ...] at ``dim`` (None: one tensor shared by every run), as
    one batch [runs * B, ...] in run order: what the short convs' folding vmap rules launch on."""
    t = t.movedim(dim, 0) if dim is not None else t.expand(runs, *t.shape)
    return t.reshape(-1, *t.shape[2:])


def per_run(name: str, fn, fake=None):
    """``fn`` (tensors and plain arguments in, one tensor out, type-hinted for a custom-op schema) made callable
    inside ``torch.func.vmap`` although its body is not vmappable (it reads offsets on the host, or its shapes
    depend on them): batched arguments go through the custom op ``mixlab::<name>``, whose vmap rule
    (``per_run_vmap``) calls ``fn`` itself once per run, so autograd records each run's ops as if it trained
    alone; plain arguments call ``fn`` directly. ``fake`` gives the output for torch.compile (default: shaped
    like the first argument)."""
    op = torch.library.custom_op(f"mixlab::{name}", fn, mutates_args=())
    op.register_fake(fake or _fake_output)
    op.register_vmap(per_run_vmap(fn))

    def call(*args):
        if any(isinstance(a, torch.Tensor) and is_batched(a) for a in args):
            return op(*args)
        return fn(*args)

    return call


def _setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
    *tensors, residual = inputs  # the op's tensor inputs, then cu_seqlens
    ctx.save_for_backward(*tensors)
    ctx.residual = residual


def _backward(bwd, ctx, dy: torch.Tensor) -> tuple:
    *inputs, cu_seqlens = ctx.saved_tensors
    grads = bwd(dy, *inputs, cu_seqlens, ctx.residual)
    # an input passed as None gets no gradient (its launcher returns an empty placeholder for it)
    return (*(None if t is None else g for t, g in zip(inputs, grads, strict=True)), None, None)


def _fake_output(x: torch.Tensor, *args) -> torch.Tensor:
    return x.new_empty(x.shape)


def _fake_grads(dy: torch.Tensor, x: torch.Tensor, *args) -> tuple[torch.Tensor, ...]:
    *rest, _cu_seqlens, _residual = args
    return tuple(x.new_empty(0) if t is None else t.new_empty(t.shape) for t in (x, *rest))


def op_function(fn):
    """``fn`` as a custom op sees it: its positional parameters only, so the schema comes from their type hints;
    its keyword-only ``config`` keeps its default (the launcher's table row)."""
    signature = inspect.signature(fn)

    def call(*args):
        return fn(*args)

    call.__name__, call.__qualname__, call.__module__ = fn.__name__, fn.__qualname__, fn.__module__
    call.__signature__ = signature.replace(
        parameters=[p for p in signature.parameters.values() if p.kind != p.KEYWORD_ONLY])
    return call


class TritonOp:
    """One op of Triton launchers, its backward wired once for the eager path and the custom op.

    ``fwd(*inputs, cu_seqlens, residual) -> y`` (y shaped like the first input x) and ``bwd(dy, *inputs,
    cu_seqlens, residual)`` -> one gradient per input, each in its input's dtype (an empty tensor for an input
    passed as None: a custom op cannot return None). Their type hints give the schemas of the custom ops
    ``mixlab::<name>`` and ``mixlab::<name>_bwd`` (a keyword-only ``config`` stays out of them: the op runs the
    table's launch settings); every input is saved for the backward.

    Calling the TritonOp runs the op on checked inputs: eager calls through a ``torch.autograd.Function`` straight
    to the launchers (no custom-op dispatch on the host), torch.compile graphs and ``torch.func.vmap`` through
    the custom op, whose backward calls the backward custom op. Its vmap rule is ``vmap`` (``torch.library``'s
    signature) where the op can fold stacked runs into one launch, else ``per_run_vmap``.
    """

    def __init__(self, name: str, fwd, bwd, vmap=None) -> None:
        self.fwd, self.bwd = fwd, bwd
        self.op = torch.library.custom_op(f"mixlab::{name}", op_function(fwd), mutates_args=())
        self.bwd_op = torch.library.custom_op(f"mixlab::{name}_bwd", op_function(bwd), mutates_args=())
        self.op.register_fake(_fake_output)
        self.bwd_op.register_fake(_fake_grads)
        self.op.register_autograd(partial(_backward, self.bwd_op), setup_context=_setup_context)
        self.op.register_vmap(vmap or per_run_vmap(self.op))
        def forward(ctx, *inputs):
            _setup_context(ctx, inputs, None)
            return fwd(*inputs)

        # forward takes ctx itself (no setup_context): with one, Function.apply binds the arguments through
        # inspect.signature on every call, some 40 µs of host time; only the custom op runs under transforms
        body = {"forward": staticmethod(forward), "backward": staticmethod(partial(_backward, bwd))}
        self.function = type(name, (torch.autograd.Function,), body)

    def __call__(self, *args) -> torch.Tensor:
        """args: (*inputs, cu_seqlens, residual), checked by the public op."""
        if torch.compiler.is_compiling() or in_transform():
            return self.op(*args)
        return self.function.apply(*args)


def is_interpreted(kernel) -> bool:
    """True when ``kernel`` runs under the Triton interpreter (TRITON_INTERPRET=1 at import time). The short convs'
    routing sends the interpreter to their tiled forms (``config_for``): the streaming forms walk positions one at
    a time, which there is Python per position, about 8x the tiled forms' time (a static conv at [8, 128, 64],
    fwd+bwd: 10.9 s against 1.3); tests run the streaming forms by passing their configs."""
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
    if not HAS_TRITON:
        raise ValueError(f"{op}: backend='triton' needs the triton package, which is not installed")
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
    """(offsets, binary-search steps) for ``doc_bounds``: ceil(log2(n_docs)) steps find any token's document;
    rounded up to an even count (extra steps change nothing, and each costs every token a load) so that few
    compiled variants serve every document count."""
    if cu_seqlens is None:
        return 0, 0
    n_cu = cu_seqlens.numel()
    return n_cu, -(-(n_cu - 2).bit_length() // 2) * 2


def tiles(T: int, D: int, BT: int, BD: int) -> tuple[int, int]:
    """(BT, BD) clamped to the shape: powers of two, at least 16 (tl.dot's smallest)."""
    return max(16, min(next_power_of_2(T), BT)), max(16, min(next_power_of_2(D), BD))


def stream_positions(T: int, CH: int, U: int) -> int:
    """Positions a streaming program walks: CH (a multiple of its step U) clamped to the row's whole steps."""
    return min(CH, cdiv(T, U) * U)


def chunk_plan(n_tiles: int, n_cols: int, programs: int) -> tuple[int, int]:
    """(tiles per chunk, chunks): ``n_tiles`` token tiles in contiguous chunks, about ``programs`` programs
    over ``n_cols`` column blocks. The fewer programs, the smaller the fp32 partial buffers; the more, the
    more waves over the SMs (132 on an H200) and the fewer tiles each program walks in sequence. A function
    of the shape only, so results never depend on scheduling."""
    n_chunks = max(1, min(n_tiles, programs // n_cols))
    per_chunk = cdiv(n_tiles, n_chunks)
    return per_chunk, cdiv(n_tiles, per_chunk)


def sum_partials(partial: torch.Tensor, dtype: torch.dtype, groups: int = 1, *,
                 config: SumConfig = SUM_CONFIG) -> torch.Tensor:
    """fp32 partial [P, *shape] -> [*shape] in ``dtype``: rows added in order 0..P-1, one launch. With
    ``groups`` G > 1: partial [G * P, *shape] -> [G, *shape], each group's P rows added so (stacked runs'
    weight gradients, each run's as it would be alone)."""
    P = partial.shape[0] // groups
    M = partial[0].numel()
    out = empty((groups, *partial.shape[1:]) if groups > 1 else tuple(partial.shape[1:]), dtype, partial.device)
    _sum_partials_kernel[(cdiv(M, config.BM), groups)](
        partial, out, P, M, BM=config.BM, BP=min(config.BP, next_power_of_2(P)), num_warps=config.warps
    )
    return out


def dot_precision(x: torch.Tensor) -> str:
    """tl.dot input precision: exact fp32 products for fp32 results; tf32 (exact on bf16/fp16 inputs, 10-bit
    mantissa on fp32 intermediates) when the result is rounded to a half type anyway."""
    return "ieee" if x.dtype == torch.float32 else "tf32"


@triton.jit
def _sum_partials_kernel(p_ptr, out_ptr, P, M, BM: tl.constexpr, BP: tl.constexpr):
    i_m, i_g = tl.program_id(0), tl.program_id(1)
    o_m = i_m * BM + tl.arange(0, BM)  # [BM]
    m_m = o_m < M
    p_ptr += i_g.to(tl.int64) * P * M  # the group's rows
    out_ptr += i_g.to(tl.int64) * M
    b_acc = tl.zeros([BM], dtype=tl.float32)
    # whole blocks of BP rows, each summed by a fixed tree, then added in row order: a fixed order overall
    for i_p in range(0, P, BP):
        o_p = i_p + tl.arange(0, BP)  # [BP]
        p_p = p_ptr + o_p.to(tl.int64)[:, None] * M + o_m[None, :]
        b_p = tl.load(p_p, mask=(o_p < P)[:, None] & m_m[None, :], other=0.0)  # [BP, BM]
        b_acc += tl.sum(b_p, axis=0)
    tl.store(out_ptr + o_m, b_acc.to(out_ptr.dtype.element_ty), mask=m_m)


# Per-tap sums deferred to the end of a program's run of positions or chunk of tiles (the streaming backwards and
# the head-wise tiled one, widths up to SLOTS): one accumulator a tap, of the tokens' products each (no [W, ...]
# tile updated whole at every tap, which costs W times the arithmetic), reduced over tokens once.
SLOTS = 8


@triton.jit
def slot_add(a, p, k: tl.constexpr, slot: tl.constexpr):
    """a + p when tap k is this slot's, else a (both known at compile time: no code for the other slots)."""
    if k == slot:
        a = a + p
    return a


@triton.jit
def slots_add(a0, a1, a2, a3, a4, a5, a6, a7, p, k: tl.constexpr):
    """p added to tap k's slot of the eight (``slot_add`` for each)."""
    return (slot_add(a0, p, k, 0), slot_add(a1, p, k, 1), slot_add(a2, p, k, 2), slot_add(a3, p, k, 3),
            slot_add(a4, p, k, 4), slot_add(a5, p, k, 5), slot_add(a6, p, k, 6), slot_add(a7, p, k, 7))


@triton.jit
def _slot_store(p, a, slot: tl.constexpr, W: tl.constexpr, D, mask):
    if slot < W:
        tl.store(p + slot * D, a, mask=mask)


@triton.jit
def slots_store(p, a0, a1, a2, a3, a4, a5, a6, a7, W: tl.constexpr, D, mask):
    """Slot k stored at row k of p's [W, D] block (p: pointers to row 0 of the program's channels), k < W."""
    _slot_store(p, a0, 0, W, D, mask)
    _slot_store(p, a1, 1, W, D, mask)
    _slot_store(p, a2, 2, W, D, mask)
    _slot_store(p, a3, 3, W, D, mask)
    _slot_store(p, a4, 4, W, D, mask)
    _slot_store(p, a5, 5, W, D, mask)
    _slot_store(p, a6, 6, W, D, mask)
    _slot_store(p, a7, 7, W, D, mask)


@triton.jit
def slot_row3(b, a, o_k, slot: tl.constexpr, W: tl.constexpr):
    """b [WP, NH, HSP] with row ``slot`` set to a's sum over the tile's tokens (a [BT, NH, HSP]), for the taps that
    exist."""
    if slot < W:
        b = tl.where(o_k[:, None, None] == slot, tl.sum(a, axis=0)[None, :, :], b)
    return b


@triton.jit
def _doc_index(cu_ptr, g, N_CU, N_SEARCH: tl.constexpr):
    """Tokens g (a vector or a scalar) -> the index of the last offset <= each: N_SEARCH binary-search steps keep
    cu[lo] <= g < cu[hi]; extra steps leave it unchanged."""
    lo = g * 0
    hi = lo + (N_CU - 1)
    for _ in tl.static_range(N_SEARCH):
        mid = (lo + hi) // 2
        right = tl.load(cu_ptr + mid) <= g
        lo = tl.where(right, mid, lo)
        hi = tl.where(right, hi, mid)
    return lo


@triton.jit
def doc_bounds(cu_ptr, o_g, row_start, T, N_CU, N_SEARCH: tl.constexpr, HAS_CU: tl.constexpr):
    """[BT] tokens on the flattened B*T axis -> ([BT] start, [BT] end) of each token's document.

    With cu_seqlens: the last offset <= token (so empty documents are skipped) and the next one. The search
    keeps cu[lo] <= token < cu[hi]; extra steps leave it unchanged, and indices stay inside cu_seqlens for
    masked-out tokens past B*T too. Unrolled, so the loads of the caller that do not depend on it can go
    first.
    """
    if HAS_CU:
        lo = _doc_index(cu_ptr, o_g, N_CU, N_SEARCH)
        start = tl.load(cu_ptr + lo)
        end = tl.load(cu_ptr + lo + 1)
    else:
        start = tl.zeros_like(o_g) + row_start
        end = start + T
    return start, end


@triton.jit
def doc_of(cu_ptr, g, N_CU, N_SEARCH: tl.constexpr):
    """One token g on the flattened B*T axis (a scalar) -> (index of its document's offset, start, end): the
    search of ``doc_bounds`` for a single token, where a kernel then walks its tokens in order (``doc_walk``)."""
    lo = _doc_index(cu_ptr, g, N_CU, N_SEARCH)
    return lo, tl.load(cu_ptr + lo), tl.load(cu_ptr + lo + 1)


@triton.jit
def doc_start_state(cu_ptr, row, t0, T, N_CU, N_SEARCH: tl.constexpr, HAS_CU: tl.constexpr):
    """A streaming program's walk state at position t0 of the row starting at token ``row``: (index, start, end)
    of its document (``doc_of``), or the row as one document without cu_seqlens."""
    i_doc, start, end = row * 0, row, row + T
    if HAS_CU:
        i_doc, start, end = doc_of(cu_ptr, row + t0, N_CU, N_SEARCH)
    return i_doc, start, end


@triton.jit
def doc_walk(cu_ptr, g, i_doc, start, end):
    """The document (index, start, end) of token g, given that of an earlier token: it moves on only when g
    reaches the next offset (past every empty document there), a branch all threads take alike. g must be below
    B*T (the last offset)."""
    while g >= end:
        i_doc += 1
        start = end
        end = tl.load(cu_ptr + i_doc + 1)
    return i_doc, start, end


@triton.jit
def stream_rows(p_row, o_d, m_d, first, T, D, N: tl.constexpr):
    """Positions first ... first + N - 1 of one row as N vectors in fp32, zero outside 0 <= t < T or m_d (p_row:
    pointers to the row's position 0 of the channels o_d, any shape; the streaming kernels' steps)."""
    rows = ()
    for j in tl.static_range(N):
        r = tl.zeros_like(o_d) + (first + j)  # a vector: the interpreter's scalar & vector mask is int32
        p = p_row + r.to(tl.int64) * D
        rows = rows + (tl.load(p, mask=m_d & (r >= 0) & (r < T), other=0.0).to(tl.float32),)
    return rows


@triton.jit
def join_taps(ds, W: tl.constexpr):
    """W [N] vectors (tap 0 first) -> [N, W] (W 2 or 4): joined pairwise so that the taps end up in order."""
    if W == 2:
        out = tl.join(ds[0], ds[1])
    else:  # join(join(d0, d2), join(d1, d3))[n, a, b] = d[2a + b]
        out = tl.reshape(tl.join(tl.join(ds[0], ds[2]), tl.join(ds[1], ds[3])), [ds[0].shape[0], 4])
    return out


@triton.jit
def in_one_doc(cu_ptr, row, first, last, T, i_doc, start, end):
    """(True when positions first ... last of the row lie in one document, the walk state at ``first``): the
    common step, which then needs no per-position document masks."""
    i_doc, start, end = doc_walk(cu_ptr, row + tl.minimum(tl.maximum(first, 0), T - 1), i_doc, start, end)
    return (row + first >= start) & (row + last < end), i_doc, start, end


@triton.jit
def chunk_tile(i_c, j, N_CH, TPC, N_TB, T, RPW, BT: tl.constexpr):
    """Tile j of program chunk i_c -> (row, [BT] tokens on the B*T axis, [BT] positions in the row, [BT] mask).

    Stacked runs of RPW rows each have N_CH chunks apiece: run i_c // N_CH walks its tiles in the chunks a run
    alone gets (TPC tiles each, numbered row by row, N_TB per row), placed on the stacked rows. A chunk's tail
    past the run's last tile (tokens >= RPW * T) is masked out. The mask compares two vectors: the interpreter
    turns vector & scalar bools into int32."""
    i_r = i_c // N_CH
    q = (i_c % N_CH) * TPC + j
    i_b = q // N_TB
    o_t = (q % N_TB) * BT + tl.arange(0, BT)  # [BT] positions in the row
    o_g = i_b * T + o_t
    m_t = (o_t < T) & (o_g < RPW * T)
    return i_b + i_r * RPW, o_g + i_r * RPW * T, o_t, m_t
