"""The token-mixing ops of the fla baselines (``models.mixers.fla``), from fla-core, on one signature.

    linear_attention(op, q, k, v, g=None, beta=None, cu_seqlens=None, scale=None, backend=None) -> o
    q, k [B, T, H, K], v [B, T, H, V] -> o [B, T, H, V] in q's dtype

    op                 state update (S [K, V] per head)                       g           beta
    gla                S = diag(exp g_t) S + k_t v_t^T                         [B, T, H, K] -
    simple_gla         S = exp(g_t) S + k_t v_t^T                              [B, T, H]    -
    retention          simple_gla with the fixed per-head log decay log(1 - 2^(-5-h))   -   -
    gated_delta_rule   S = exp(g_t) S; S += k_t (beta_t (v_t - S^T k_t))^T     [B, T, H]    [B, T, H]
    based              o_t = sum_{s<=t} f(q_t.k_s) v_s / sum_{s<=t} f(q_t.k_s), f(x) = 1 + x + x^2/2
    and o_t = scale * q_t^T S_t for the recurrent ops; scale None is K^-0.5.

Backends (``kernels.utils.resolve_backend``; every op is in ``kernels.utils.TRITON_OPS`` once fla-core imports):
"triton" runs fla's chunked Triton kernels (CUDA only), or for rows of at most ``RECURRENT_MAX_T[op]`` tokens its
fused recurrent ones (gla, simple_gla, retention; ``kernel_form``). With documents they get ``cu_seqlens`` over one
flattened row, except Based, whose kernel takes none: it runs on the per-document layout below. The kernels are
wrapped in one custom op, ``mixlab::fla_linear_attention``, whose backward recomputes the forward under
autograd and whose vmap rule folds stacked runs' rows into the kernels' batch (``_fold_runs``; with documents
it calls the op once per run, ``kernels.triton_utils.per_run_vmap``), so stacked runs in ``runners.train.engine``
launch each kernel once, every row computed as in a run alone. "torch" runs fla's plain-torch ``naive`` functions:
the recurrence for GLA, the chunked forms for simple_gla and retention, the quadratic form for Based; the gated
delta rule runs the lab's own chunked form (``chunked_gated_delta_rule``), which solves each chunk's writes as one
triangular system where fla's naive form loops over the chunk's positions. They take no ``cu_seqlens``: every
document is copied into its own zero-padded row (``per_document``), so a document's outputs are exactly
independent of the others.

fla-core 0.6 refuses the backward of its gated chunk kernels (``chunk_bwd_dqkwg`` with a per-token gate) on
Hopper GPUs with Triton 3.4 to 3.7.0, which compute it wrongly there (fla's issue #640), unless tilelang is
installed (``gated_backward_refused``). Two ops need that kernel: simple_gla then runs on fla's GLA kernel with
its scalar gate broadcast over the key channels (the same recurrence, and GLA's kernels do not use the refused
one), and the gated delta rule, which has no such twin, keeps fla's kernels with the refused piece computed in
plain torch (``fla_dqkwg``, registered as an fla backend on such a machine). Retention's fixed decay is not a
per-token gate and keeps its kernel.

fla's kernels are Triton autotuners: at the first call of each new shape every process times 4-48 configs per
kernel, minutes on a fresh machine for the many shapes of a sweep, and the configs that win can differ between
machines and runs (a different tiling: other rounding). By default (``MIXLAB_FLA_AUTOTUNE=first``) every fla
autotuner keeps only its first config when fla is imported here (``trim_autotuners``): no tuning, the same
kernels everywhere. ``MIXLAB_FLA_AUTOTUNE=full`` leaves fla's tuning as it is.

fla-core is optional (``pip install 'mixlab[baselines]'``); ``require_fla`` says so in one line.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from mixlab import kernels
from mixlab.kernels.triton_utils import per_run_vmap, run_rows
from mixlab.models.mixers import fla_dqkwg
from mixlab.models.mixers.attention import document_slots

OPS = ("gla", "simple_gla", "retention", "gated_delta_rule", "based")
# chunk length of fla's naive chunked forms on the torch path (simple_gla, retention): short, as the lab's rows are
NAIVE_CHUNK = 16
# chunk length of the gated delta rule's torch form (``chunked_gated_delta_rule``) by device type: its steps are
# a loop over chunks, so longer chunks mean fewer ops but more arithmetic (a chunk's [C, C] products). On CUDA
# (backend "torch") steps this small are bound by their launches; on the CPU by arithmetic.
# Fwd+bwd of 16 heads (keys 8, values 16), non-view aten ops dispatched (counted under a TorchDispatchMode):
# B=32 T=128 143 at chunks of 64, 197 at 32, against 999 for fla's naive chunked form at chunks of 16 (which
# also loops over a chunk's positions); B=4 T=1024 521, 953 and 5,255.
GDR_CHUNK = {"cuda": 64, "cpu": 32}
INSTALL_HINT = "pip install 'mixlab[baselines]'"
# smallest head size handed to fla's kernels (Triton's dot products take blocks of at least 16)
MIN_KERNEL_DIM = 16
# most rows x heads in one launch: fla's chunked kernels put B * H on a grid axis that CUDA caps at 65,535
# blocks (a folded stack of 18 runs evaluating 256 rows of 16 heads failed with "invalid argument")
MAX_GRID_ROWS = 65535
# Rows of at most RECURRENT_MAX_T[op] tokens take fla's fused recurrent kernels (one launch each way, a loop over
# the tokens with each head's [K, V] state on chip) instead of its chunked ones (about ten launches each way, built
# for long rows and wide heads), for the ops that have both (RECURRENT_OPS: the gated delta rule's recurrent
# kernel has no backward, Based has no recurrent form). From `mixlab bench fla` on an H200 (
# BENCHMARKS.md: 16 heads, keys 8 and values 16 padded to 16, bf16, 294,912 tokens, fla autotune first), fwd+bwd
# chunked against recurrent: GLA 45.5 ms against 9.5-11.0 at T = 128-1024, simple_gla (on GLA's chunked kernel
# where fla refuses its own) 45.8-45.9 against 8.1-8.9, retention 2.9 against 7.0-9.0. Longer rows were not timed.
FORMS = ("chunk", "recurrent")
RECURRENT_OPS = ("gla", "simple_gla", "retention")
RECURRENT_MAX_T = {"gla": 1024, "simple_gla": 1024, "retention": 0}
# MIXLAB_FLA_AUTOTUNE: what fla's autotuners try (module docstring), the default first
AUTOTUNE_MODES = ("first", "full")


def autotune_mode() -> str:
    """``MIXLAB_FLA_AUTOTUNE`` (first or full; unset or empty: first); ValueError, one line, for another value."""
    mode = os.environ.get("MIXLAB_FLA_AUTOTUNE", "") or "first"
    if mode not in AUTOTUNE_MODES:
        raise ValueError(f"MIXLAB_FLA_AUTOTUNE={mode!r} is not a mode; expected {' or '.join(AUTOTUNE_MODES)}")
    return mode


def fla_autotuners() -> list:
    """Every Triton autotuner of the fla modules imported so far, once each."""
    from triton.runtime.autotuner import Autotuner

    tuners = {}
    for name, module in list(sys.modules.items()):
        if name != "fla" and not name.startswith("fla."):
            continue
        for obj in list(vars(module).values()):
            # a kernel under @triton.heuristics is a Heuristics whose .fn is the autotuner: follow the chain
            for _ in range(4):
                if isinstance(obj, Autotuner):
                    tuners[id(obj)] = obj
                obj = getattr(obj, "fn", None)
    return list(tuners.values())


def trim_autotuners() -> int:
    """Leave every fla autotuner imported so far its first config only; returns how many there are."""
    tuners = fla_autotuners()
    for tuner in tuners:
        tuner.configs = tuner.configs[:1]
    return len(tuners)


def fla_available() -> bool:
    """Whether fla-core is installed (nothing is imported)."""
    return importlib.util.find_spec("fla") is not None


def require_fla(mixer: str) -> None:
    """ValueError, one line, when fla-core is missing for ``mixer``."""
    if not fla_available():
        raise ValueError(f"mixer {mixer!r} needs fla-core: {INSTALL_HINT}")


def kernel_op_name(op: str) -> str:
    """The name of op ``op`` in ``kernels.utils.TRITON_OPS`` and in a module's ``kernel_op``."""
    return f"fla_{op}"


KERNEL_OPS = tuple(kernel_op_name(op) for op in OPS)


@functools.cache
def _fla():
    """fla's ops, imported once (several seconds). On a machine without a GPU fla warns that Triton falls back
    to the CPU; the torch path calls only its naive functions, so that warning is silenced, as is a deprecation
    warning fla's import raises under recent torch."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
        warnings.filterwarnings("ignore", message="`torch.jit.script_method` is deprecated")
        from fla.ops import based, gated_delta_rule, gla, retention, simple_gla  # with their recurrent modules
        from fla.ops.based.naive import naive_parallel_based
        from fla.ops.gla.naive import naive_recurrent_gla
        from fla.ops.simple_gla.naive import naive_chunk_simple_gla
    if autotune_mode() == "first":
        trim_autotuners()
    if gated_backward_refused():
        fla_dqkwg.register()
    kernels.utils.TRITON_OPS.update(kernel_op_name(op) for op in OPS)
    return {
        "kernels": {
            "gla": gla.chunk_gla,
            "simple_gla": simple_gla.chunk_simple_gla,
            "retention": retention.chunk_retention,
            "gated_delta_rule": gated_delta_rule.chunk_gated_delta_rule,
            "based": based.parallel_based,
        },
        "recurrent": {
            "gla": gla.fused_recurrent_gla,
            "simple_gla": simple_gla.fused_recurrent_simple_gla,
            "retention": retention.fused_recurrent_retention,
        },
        "naive": {
            "gla": naive_recurrent_gla,
            "simple_gla": naive_chunk_simple_gla,
            "based": naive_parallel_based,
        },
    }


@functools.cache
def gated_backward_refused() -> bool:
    """Whether fla-core refuses its gated ``chunk_bwd_dqkwg`` here (module docstring): fla's own condition, read
    from its flags (a Hopper GPU and Triton >= 3.4, < 3.7.1), with tilelang, its workaround, not installed."""
    import fla.utils

    flags = (getattr(fla.utils, name, False) for name in ("IS_NVIDIA_HOPPER", "TRITON_ABOVE_3_4_0"))
    return all(flags) and not getattr(fla.utils, "TRITON_ABOVE_3_7_1", True) \
        and importlib.util.find_spec("tilelang") is None


def load_fla() -> None:
    """Import fla-core's ops now (and register them in ``kernels.utils.TRITON_OPS``)."""
    _fla()


def retention_log_decay(n_heads: int, device: torch.device | None = None) -> torch.Tensor:
    """RetNet's fixed per-head log decay [H]: log(1 - 2^(-5 - h)), as fla's ``chunk_retention`` sets it."""
    return torch.log(1 - 2.0 ** (-5.0 - torch.arange(n_heads, dtype=torch.float32, device=device)))


def per_document(fn: Callable[..., torch.Tensor], cu_seqlens: torch.Tensor,
                 *tensors: torch.Tensor | None) -> torch.Tensor:
    """``fn`` on every document alone: each [B, T, ...] tensor (None passes through) is copied into a
    zero-padded [n_docs, L_max, ...] layout, one document per row starting at position 0, and fn's output
    [n_docs, L_max, ...] read back at the valid positions -> [B, T, ...]. The padding follows each document's
    end, so causal ops never read it, and no row holds two documents."""
    B, T = next(t for t in tensors if t is not None).shape[:2]
    slot, n_docs, max_len = document_slots(cu_seqlens, B * T)

    def pad(t: torch.Tensor) -> torch.Tensor:
        flat = t.reshape(B * T, *t.shape[2:])
        return flat.new_zeros(n_docs * max_len, *t.shape[2:]).index_copy(0, slot, flat).unflatten(0, (n_docs, -1))

    out = fn(*(None if t is None else pad(t) for t in tensors))  # [n_docs, L_max, ...]
    return out.flatten(0, 1).index_select(0, slot).unflatten(0, (B, T))


def naive(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None,
          beta: torch.Tensor | None, scale: float) -> torch.Tensor:
    """The torch path on rows that are one document each: o [B, T, H, V] in q's dtype."""
    fns = _fla()["naive"]
    if op == "gla":  # fla's naive GLA has no scale argument: it is K^-0.5, the only scale linear_attention takes
        o, _ = fns["gla"](q, k, v, g)
    elif op in ("simple_gla", "retention"):
        if op == "retention":
            g = retention_log_decay(q.shape[2], q.device).expand(q.shape[:3])
        o, _ = fns["simple_gla"](q, k, v, g, chunk_size=NAIVE_CHUNK, scale=scale)
    elif op == "gated_delta_rule":
        o = chunked_gated_delta_rule(q, k, v, g, beta, scale)
    else:  # fla's naive Based takes [B, H, T, K]
        o = fns["based"](*(t.transpose(1, 2) for t in (q, k, v)), scale=scale, use_norm=True).transpose(1, 2)
    return o.to(q.dtype)


def chunked_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                             beta: torch.Tensor, scale: float, chunk_size: int | None = None) -> torch.Tensor:
    """The gated delta rule (module docstring) in plain torch on rows that are one document each, in fp32 (also
    under autocast):
    q, k [B, T, H, K], v [B, T, H, V], g, beta [B, T, H] -> o [B, T, H, V] (fp32).

    Rows are cut into chunks of C = min(chunk_size, T) tokens (the last zero-padded: beta 0 writes nothing);
    chunk_size None: ``GDR_CHUNK`` of q's device type (32 for one not named there).
    With G the log decay summed within the chunk and L[i, j] = exp(G_i - G_j) for j <= i (0 above), the writes
    e_i = beta_i (v_i - k_i^T S_before_i) of a chunk entered with state S [K, V] solve
        (I + A) E = beta V - (beta K exp(G)) S,   A[i, j] = beta_i (k_i . k_j) L[i, j] for j < i,
    so E = U - W S with U, W one triangular solve per chunk, independent of S (the WY form of the Gated DeltaNet
    paper). Then o = scale (q exp(G)) S + scale ((q k^T) * L) E and S <- exp(G_C) S + (k exp(G_C - G))^T E,
    the only steps left in the loop over chunks."""
    with torch.autocast(q.device.type, enabled=False):  # fp32 under bf16 autocast too: the state crosses chunks
        return _chunked_gated_delta_rule(q, k, v, g, beta, scale, chunk_size)


def _chunked_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                              beta: torch.Tensor, scale: float, chunk_size: int | None) -> torch.Tensor:
    """``chunked_gated_delta_rule``'s body, autocast off."""
    B, T, H, K = q.shape
    C = min(chunk_size or GDR_CHUNK.get(q.device.type, GDR_CHUNK["cpu"]), T)
    n = -(-T // C)
    pad = n * C - T

    def chunks(t: torch.Tensor) -> torch.Tensor:  # [B, T, H, ...] -> [B, H, n, C, ...] in fp32, zero-padded
        t = F.pad(t.float(), (0, 0) * (t.dim() - 2) + (0, pad))
        return t.transpose(1, 2).unflatten(2, (n, C))

    q, k, v, g, beta = (chunks(t) for t in (q, k, v, g, beta))
    G = g.cumsum(-1)  # [B, H, n, C]
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    # exp of -inf above the diagonal: 0 there, with a zero gradient (not inf * 0)
    L = (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf")).exp()  # [B, H, n, C, C]
    k_beta = k * beta[..., None]
    # unit lower-triangular I + A: solve_triangular reads only the strict lower part and takes the diagonal as 1
    A = (k_beta @ k.transpose(-1, -2)) * L  # [B, H, n, C, C]
    rhs = torch.cat([v * beta[..., None], k_beta * G.exp()[..., None]], -1)  # [B, H, n, C, V + K]
    u, w = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True).split([v.shape[-1], K], -1)
    # u [B, H, n, C, V]: the writes were the entering state zero; w [B, H, n, C, K]: how that state lowers them
    last = G[..., -1:]  # [B, H, n, 1]
    k_out = k * (last - G).exp()[..., None]  # [B, H, n, C, K]: each key's decay to the chunk's end
    state = q.new_zeros(B, H, K, v.shape[-1])
    states, writes = [], []
    for i in range(n):
        states.append(state)
        e = u[:, :, i] - w[:, :, i] @ state  # [B, H, C, V]
        writes.append(e)
        state = state * last[:, :, i, :, None].exp() + k_out[:, :, i].transpose(-1, -2) @ e
    S, E = torch.stack(states, 2), torch.stack(writes, 2)  # [B, H, n, K, V], [B, H, n, C, V]
    q = q * scale
    o = (q * G.exp()[..., None]) @ S + ((q @ k.transpose(-1, -2)) * L) @ E  # [B, H, n, C, V]
    return o.flatten(2, 3)[:, :, :T].transpose(1, 2)


def _pad_last(t: torch.Tensor | None, size: int) -> torch.Tensor | None:
    """t [..., n] zero-padded to [..., max(n, size)]."""
    return t if t is None or t.shape[-1] >= size else F.pad(t, (0, size - t.shape[-1]))


def kernel_form(op: str, T: int) -> str:
    """Which of fla's kernels (``FORMS``) runs ``op`` on rows of T tokens: ``RECURRENT_MAX_T`` decides."""
    return "recurrent" if op in RECURRENT_OPS and RECURRENT_MAX_T.get(op, 0) >= T else "chunk"


def _kernel(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None,
            beta: torch.Tensor | None, cu_seqlens: torch.Tensor | None, scale: float,
            form: str | None = None) -> torch.Tensor:
    """fla's Triton kernel of ``op`` in ``form`` (None: ``kernel_form``): o [B, T, H, V]. With cu_seqlens the rows
    are flattened into one.

    Head sizes below ``MIN_KERNEL_DIM`` (the lab's heads are small: 4 to 16) are zero-padded up to it: zero key
    channels add nothing to q.k (nor to the delta rule's S^T k), zero value channels give outputs that are cut
    off, and the scale is passed explicitly, so the result is the unpadded op's."""
    form = kernel_form(op, q.shape[1]) if form is None else form
    if form not in FORMS or (form == "recurrent" and op not in RECURRENT_OPS):
        raise ValueError(f"op {op!r} has no {form!r} kernel; forms: chunk for every op, recurrent for "
                         f"{', '.join(RECURRENT_OPS)}")
    V, out_dtype = v.shape[-1], q.dtype
    # fla's kernels take q, k, v of one dtype (their dots assert it); under autocast they can differ (the gated
    # delta rule's l2-normalised q, k come out fp32 beside a bf16 v), and the kernel runs at v's dtype
    q, k = q.to(v.dtype), k.to(v.dtype)
    q, k, v = _pad_last(q, MIN_KERNEL_DIM), _pad_last(k, MIN_KERNEL_DIM), _pad_last(v, MIN_KERNEL_DIM)
    if op == "gla":
        g = _pad_last(g, MIN_KERNEL_DIM)
    return _padded_kernel(op, q, k, v, g, beta, cu_seqlens, scale, form)[..., :V].to(out_dtype)


def _padded_kernel(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None,
                   beta: torch.Tensor | None, cu_seqlens: torch.Tensor | None, scale: float,
                   form: str = "chunk") -> torch.Tensor:
    B, H = q.shape[0], q.shape[2]
    if form == "chunk" and cu_seqlens is None and B * H > MAX_GRID_ROWS:  # rows are independent: slice them
        step = max(1, MAX_GRID_ROWS // H)
        return torch.cat([_padded_kernel(op, *(None if t is None else t[i:i + step] for t in (q, k, v, g, beta)),
                                         None, scale, form) for i in range(0, B, step)])
    fn = _fla()[{"chunk": "kernels", "recurrent": "recurrent"}[form]][op]
    if op == "based":
        if cu_seqlens is not None:
            return per_document(lambda *t: fn(*t, scale=scale, use_norm=True), cu_seqlens, q, k, v)
        return fn(q, k, v, scale=scale, use_norm=True)
    if op == "simple_gla" and form == "chunk" and gated_backward_refused():  # fla refuses the chunked backward only
        op, fn = "gla", _fla()["kernels"]["gla"]
        g = g[..., None].expand(*g.shape, q.shape[-1]).contiguous()  # [B, T, H] -> [B, T, H, K]
    B, T = q.shape[:2]
    extra = {}
    if cu_seqlens is not None:
        q, k, v, g, beta = (None if t is None else t.reshape(1, B * T, *t.shape[2:]) for t in (q, k, v, g, beta))
        extra["cu_seqlens"] = cu_seqlens.long()
    gates = {"gla": (g,), "simple_gla": (g,), "retention": (), "gated_delta_rule": (g, beta)}[op]
    o, _ = fn(q, k, v, *gates, scale=scale, **extra)
    return o.reshape(B, T, *o.shape[2:])


def fla_kernel(op: str, form: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
               g: torch.Tensor | None = None, beta: torch.Tensor | None = None,
               cu_seqlens: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    """fla's kernel of ``op`` in ``form`` (``FORMS``) on tensors shaped as ``linear_attention``'s (CUDA, or the
    CPU's under the Triton interpreter, where the recurrent kernels run and the chunked ones do not) -> o [B, T, H,
    V]; differentiable through fla's own backward, outside the custom op (no vmap rule): what ``mixlab bench fla``
    and the GPU checks time and compare form against form."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return _kernel(op, q, k, v, g, beta, cu_seqlens, scale, form)


@torch.library.custom_op("mixlab::fla_linear_attention", mutates_args=())
def fla_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None,
                         beta: torch.Tensor | None, cu_seqlens: torch.Tensor | None, op: str,
                         scale: float) -> torch.Tensor:
    """fla's kernel of ``op`` as one op (module docstring)."""
    return _kernel(op, q, k, v, g, beta, cu_seqlens, scale)


@fla_linear_attention.register_fake
def _(q, k, v, g, beta, cu_seqlens, op, scale):
    return q.new_empty(*q.shape[:3], v.shape[-1])


def _setup_context(ctx, inputs, output) -> None:
    *tensors, ctx.op, ctx.scale = inputs
    ctx.save_for_backward(*tensors)


def _backward(ctx, grad: torch.Tensor) -> tuple:
    """Gradients of q, k, v, g and beta: the forward is recomputed under autograd (fla's own backward kernels),
    once, on the plain tensors the op saw."""
    *inputs, cu_seqlens = ctx.saved_tensors
    with torch.enable_grad():
        leaves = [None if t is None else t.detach().requires_grad_() for t in inputs]
        out = _kernel(ctx.op, *leaves, cu_seqlens, ctx.scale)
        wanted = [t for t in leaves if t is not None]
        grads = iter(torch.autograd.grad(out, wanted, grad))
    return (*(None if t is None else next(grads) for t in leaves), None, None, None)


def _fold_runs(info, in_dims: tuple, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None,
               beta: torch.Tensor | None, cu_seqlens: torch.Tensor | None, op: str, scale: float):
    """vmap rule: the op has no weights of its own and treats every row alone, so the runs' rows fold into its
    batch, one launch for all (stacked runs: q [R, B, T, H, K] -> [R * B, T, H, K]); with documents (offsets
    into one run's B*T tokens) one launch per run. Small stacked models are launch-bound on fla's chunked
    kernels (a GLA stack of 6 ran 1.9x one run with a launch per run, BENCHMARKS.md)."""
    if cu_seqlens is not None:
        return per_run_vmap(fla_linear_attention)(info, in_dims, q, k, v, g, beta, cu_seqlens, op, scale)
    n = info.batch_size
    rows = [None if t is None else run_rows(t, d, n) for t, d in zip((q, k, v, g, beta), in_dims)]
    return fla_linear_attention(*rows, None, op, scale).unflatten(0, (n, -1)), 0


fla_linear_attention.register_autograd(_backward, setup_context=_setup_context)
fla_linear_attention.register_vmap(_fold_runs)


def linear_attention(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, g: torch.Tensor | None = None,
                     beta: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None,
                     scale: float | None = None, backend: str | None = None) -> torch.Tensor:
    """Op ``op`` of ``OPS`` (module docstring) on q, k [B, T, H, K], v [B, T, H, V] -> [B, T, H, V]."""
    if op not in OPS:
        raise ValueError(f"unknown fla op {op!r}; choose from {', '.join(OPS)}")
    if op == "gla" and scale is not None:
        raise ValueError(f"op 'gla' takes only the default scale K^-0.5, got scale={scale}")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    _fla()
    if kernels.resolve_backend(backend, q, kernel_op_name(op)) == "triton":
        if not q.is_cuda:
            raise ValueError(f"fla's Triton kernel of {op!r} needs a CUDA tensor, got device {q.device.type!r}")
        return fla_linear_attention(q, k, v, g, beta, cu_seqlens, op, scale)
    if cu_seqlens is None:
        return naive(op, q, k, v, g, beta, scale)
    return per_document(lambda *t: naive(op, *t, scale), cu_seqlens, q, k, v, g, beta)
