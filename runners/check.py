"""``mixlab check-mixer`` and ``mixlab check-task``: audit a mixer or a task (built-in, plugin or import path)
against the contract every mixlab mixer or task keeps; a mixer is then timed beside ``attention`` and
``dynamic_conv``. The task contract is ``check_task``'s (below).

The mixer is built as a Block would build it (``models.resolve_mixer``; an external factory gets d_model and
the ModelConfig fields it names, see ``models.mixers.external``), initialised from ``seed`` in a forked RNG,
and checked in eval mode at inputs ``[B, T, D]`` = ``[ROWS, SEQ_LEN, d_model]`` drawn from ``seed``. Checks,
each a ``Check(name, passed, detail)`` (``passed`` None: not applicable, or skipped after a failed build or
shape check, whose outputs would mean nothing):

  build        the factory returns an nn.Module
  shape        the output is a tensor of the input's shape, also for one row of one token and an odd length
  dtype        float32 in -> float32 out; bfloat16 in (module cast to bfloat16) -> bfloat16 out
  finite       outputs are finite for standard normal inputs, in both dtypes
  causality    new inputs from position t on leave the outputs before t bitwise equal (within ``CAUSAL_TOL``
               of max |y| for a module with ``bitwise_causal = False``), with and without a packed layout
  gradients    a backward pass with a random cotangent gives finite input and parameter gradients
  determinism  the same input twice gives bitwise equal outputs
  leakage.*    the five leakage probes (``analysis.leakage.probe_function``) on a random packed layout:
               judged when the mixer claims document blindness (its forward takes cu_seqlens and it does
               not set ``leaks_across_documents = True``), shown unjudged for a declared leak, not run for a
               forward without cu_seqlens (packed inputs are refused).

The benchmark runs only when every check passes: the mixer, attention and dynamic_conv built from one
ModelConfig (d_model D, heads of 8 dims, max_seq_len T) at the stated shape [B, T, D]: parameters; forward (no
grad) and forward+backward (input and parameter gradients) times, medians from
``runners.bench.utils.median_time_ms`` (do_bench on CUDA; on the CPU the median of 3 wall-clock calls after
one warm-up), in float32 on the CPU and under bfloat16 autocast on CUDA (as training runs); the bytes autograd
saves for backward of one float32 forward (``saved_tensors_hooks``, each storage once, parameters excluded:
the activation memory training holds for the layer, measured the same way on any device); and on CUDA the
peak allocated memory of forward+backward above what was allocated before (n/a on the CPU).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

import numpy as np
import torch
from mixlab import models, tasks
from mixlab.analysis import leakage
from mixlab.core.fields import PositiveInt, check
from mixlab.core.plugins import error_line as _error
from mixlab.models.config import OBJECTIVES
from mixlab.models.mixers import BUILT_IN, ExternalFactory, accepts_cu_seqlens, claims_document_blindness
from mixlab.runners.bench.utils import median_time_ms
from mixlab.runners.train.precision import bf16_autocast, uses_bf16
from torch import nn

ROWS, SEQ_LEN = 4, 64  # inputs of the checks: [ROWS, SEQ_LEN, d_model]
HEAD_DIM = 8  # attention heads of the checks and the benchmark: d_model / 8 heads (MAD's head size)
CAUSAL_TOL = 1e-5  # relative to max |y|: FFT-based mixers are causal up to rounding
BASELINES = ("attention", "dynamic_conv")
BENCH_SHAPES = {"cpu": (4, 512, 64), "cuda": (4, 2048, 1024)}  # default [B, T, D] per device type
VOCAB_SIZE = 16  # unused by a bare mixer; ModelConfig needs one
AFTER_SHAPE = ("dtype", "finite", "causality", "gradients", "determinism", "leakage")


@dataclasses.dataclass(frozen=True)
class Check:
    """One line of the report; ``passed`` None when the check does not apply or was skipped."""

    name: str
    passed: bool | None
    detail: str


@dataclasses.dataclass(frozen=True)
class BenchRow:
    """One mixer timed at the benchmark shape; peak_mib is None off CUDA."""

    mixer: str
    params: int
    fwd_ms: float
    fwd_bwd_ms: float
    saved_mib: float
    peak_mib: float | None


class _Verdict:
    """What a report of checks concludes: the names of its failed checks, and whether none failed."""

    checks: tuple[Check, ...]

    @property
    def failed(self) -> list[str]:
        """Names of the failed checks."""
        return [c.name for c in self.checks if c.passed is False]

    @property
    def passed(self) -> bool:
        return not self.failed


@dataclasses.dataclass(frozen=True)
class MixerReport(_Verdict):
    """Everything ``check_mixer`` found: the checks in order, then the benchmark rows (empty when a check
    failed or the benchmark was not asked for)."""

    name: str
    origin: str
    device: str
    d_model: int
    module: str  # class name of the built module, "" when the build failed
    params: int | None
    documents: str  # how the mixer treats packed documents
    checks: tuple[Check, ...]
    bench_shape: tuple[int, int, int] | None = None
    bench: tuple[BenchRow, ...] = ()

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "failed": self.failed, "passed": self.passed}

    def format(self) -> str:
        """The report as text: a header, one line per check, then the benchmark as a markdown table."""
        params = "?" if self.params is None else f"{self.params:,}"
        lines = [f"check-mixer {self.name}  [{self.origin}]",
                 f"module {self.module or '-'}, {params} parameters at d_model {self.d_model}, device "
                 f"{self.device}; inputs [{ROWS}, {SEQ_LEN}, {self.d_model}]",
                 f"documents: {self.documents}", ""]
        width = max(len("check"), *(len(c.name) for c in self.checks))
        lines.append(f"{'check':{width}s}  result  detail")
        for c in self.checks:
            result = {True: "ok", False: "FAIL", None: "-"}[c.passed]
            lines.append(f"{c.name:{width}s}  {result:6s}  {c.detail}")
        if self.bench:
            B, T, D = self.bench_shape
            precision = "bf16 autocast" if self.device.startswith("cuda") else "fp32"
            lines += ["", f"benchmark at B={B}, T={T}, D={D}, {precision} on {self.device}: median ms; "
                      "saved = bytes autograd keeps for backward in fp32 (parameters excluded); peak = CUDA "
                      "peak allocated above the start (n/a on the CPU)", "",
                      "| mixer | params | fwd ms | fwd+bwd ms | saved MiB | peak MiB |",
                      "|---|---:|---:|---:|---:|---:|"]
            for r in self.bench:
                peak = "n/a" if r.peak_mib is None else f"{r.peak_mib:.1f}"
                lines.append(f"| {r.mixer} | {r.params:,} | {r.fwd_ms:.3f} | {r.fwd_bwd_ms:.3f} | "
                             f"{r.saved_mib:.2f} | {peak} |")
        lines.append("")
        n = sum(c.passed is not None for c in self.checks)
        lines.append(f"FAILED: {', '.join(self.failed)}" if self.failed else f"all {n} checks passed")
        return "\n".join(lines)


# --- building


def _config(name: str, d_model: int, seq_len: int) -> models.ModelConfig:
    return models.ModelConfig(vocab_size=VOCAB_SIZE, d_model=d_model, n_layers=1, mixer=name,
                              n_heads=d_model // HEAD_DIM, mlp_hidden=None, max_seq_len=seq_len)


def build_mixer(name: str, config: models.ModelConfig, seed: int) -> nn.Module:
    """The module a Block would hold for ``name``, unwrapped for an external mixer (the researcher's own
    module), initialised under ``torch.manual_seed(seed)`` in a forked RNG; ValueError if the factory
    fails."""
    factory = models.resolve_mixer(name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if isinstance(factory, ExternalFactory):
            return factory.build(config, 0)
        return factory(config, 0)


def _call(module: nn.Module, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """module(x [B, T, D]), handing cu_seqlens over only to a forward that takes it."""
    if cu_seqlens is None and not accepts_cu_seqlens(module):
        return module(x)
    return module(x, cu_seqlens=cu_seqlens)


def _guarded(name: str, fn: Callable[[], Check]) -> Check:
    """fn's Check, or a failed one whose detail is the exception fn raised (the mixer's own code raising)."""
    try:
        return fn()
    except Exception as exc:
        return Check(name, False, _error(exc))


def _guarded_list(name: str, fn: Callable[[], list[Check]]) -> list[Check]:
    try:
        return fn()
    except Exception as exc:
        return [Check(name, False, _error(exc))]


# --- checks


def _shape_check(module: nn.Module, x: torch.Tensor, generator: torch.Generator) -> Check:
    D = x.shape[-1]
    for shape in ((1, 1, D), (2, 13, D), tuple(x.shape)):
        inp = x if shape == tuple(x.shape) else _randn(shape, generator, x)
        with torch.no_grad():
            y = _call(module, inp)
        if not isinstance(y, torch.Tensor):
            return Check("shape", False, f"input {shape}: returned a {type(y).__name__}, not a tensor")
        if tuple(y.shape) != shape:
            return Check("shape", False, f"input {shape}: output {tuple(y.shape)}; a mixer maps [B, T, D] to "
                                         "[B, T, D]")
    return Check("shape", True, f"[B, T, D] -> [B, T, D] at (1, 1, {D}), (2, 13, {D}), {tuple(x.shape)}")


def _dtype_checks(module: nn.Module, x: torch.Tensor) -> list[Check]:
    outputs = {}
    problems = []
    for dtype in (torch.float32, torch.bfloat16):
        m = module if dtype == torch.float32 else copy.deepcopy(module).to(dtype)
        try:
            with torch.no_grad():
                outputs[dtype] = y = _call(m, x.to(dtype))
        except Exception as exc:
            problems.append(f"{_dtype_name(dtype)}: {_error(exc)}")
            continue
        if y.dtype != dtype:
            problems.append(f"{_dtype_name(dtype)} input gave {_dtype_name(y.dtype)}")
    dtype_check = Check("dtype", not problems,
                        "; ".join(problems) or "float32 -> float32, bfloat16 -> bfloat16")
    bad = [_dtype_name(dtype) for dtype, y in outputs.items() if not torch.isfinite(y).all()]
    finite = Check("finite", not bad, f"non-finite outputs in {', '.join(bad)}" if bad else
                   f"finite for normal inputs in {', '.join(map(_dtype_name, outputs))}")
    return [dtype_check, finite]


def _causality_check(module: nn.Module, x: torch.Tensor, layouts: list, generator: torch.Generator) -> Check:
    bitwise = bool(getattr(module, "bitwise_causal", True))
    B, T, D = x.shape
    cuts = sorted({1, T // 3, T - 1})
    for cu in layouts:
        with torch.no_grad():
            y = _call(module, x, cu)
            scale = y.abs().max().item()
            for t in cuts:
                changed = x.clone()
                changed[:, t:] = _randn((B, T - t, D), generator, x)
                before, after = y[:, :t], _call(module, changed, cu)[:, :t]
                diff = (after - before).abs().max().item()
                ok = torch.equal(after, before) if bitwise else diff <= CAUSAL_TOL * max(scale, 1e-30)
                if not ok:
                    where = "one document per row" if cu is None else "packed layout"
                    detail = (f"outputs before position {t} changed by up to {diff:.2e} when the inputs from "
                              f"{t} on changed ({where})")
                    return Check("causality", False, detail)
    how = "bitwise" if bitwise else f"within {CAUSAL_TOL:g} x max|y| (bitwise_causal = False)"
    layouts_text = "with and without a packed layout" if len(layouts) > 1 else "one document per row"
    return Check("causality", True, f"{how}, cuts at {', '.join(map(str, cuts))}, {layouts_text}")


def _gradient_check(module: nn.Module, x: torch.Tensor, layouts: list, generator: torch.Generator) -> Check:
    params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    unused: set[str] = set()
    for cu in layouts:
        leaf = x.detach().clone().requires_grad_()
        with torch.enable_grad():
            y = _call(module, leaf, cu)
        grads = torch.autograd.grad(y, [leaf, *(p for _, p in params)], _randn(tuple(y.shape), generator, y),
                                    allow_unused=True)
        for (name, _), grad in zip([("input", leaf), *params], grads):
            if grad is None:
                unused.add(name)
            elif not torch.isfinite(grad).all():
                return Check("gradients", False, f"non-finite gradient of {name}")
    note = f"; no gradient reaches {', '.join(sorted(unused))}" if unused else ""
    return Check("gradients", True, f"finite for the input and {len(params)} parameter tensors{note}")


def _determinism_check(module: nn.Module, x: torch.Tensor, layouts: list) -> Check:
    with torch.no_grad():
        for cu in layouts:
            if not torch.equal(_call(module, x, cu), _call(module, x, cu)):
                where = "one document per row" if cu is None else "packed layout"
                return Check("determinism", False, f"two calls on one input differ ({where})")
    return Check("determinism", True, "bitwise equal outputs for one input twice")


def _leakage_checks(module: nn.Module, name: str, x: torch.Tensor, cu: torch.Tensor,
                    generator: torch.Generator) -> list[Check]:
    claims = claims_document_blindness(module)
    report = leakage.probe_function(lambda inp, c: _call(module, inp, c), x, cu, name=name,
                                    claims_blind=claims, generator=generator)
    outcomes = [
        ("perturbation", report.perturbation, "other documents' outputs bitwise unchanged when one changes",
         "another document's outputs changed when one document's inputs changed"),
        ("nan", report.nan, "NaN in one document leaves the others finite",
         "NaN in one document reached another"),
        ("gradient", report.gradient, f"cross-document gradients exactly 0 ({report.gradient_method})",
         "a cross-document gradient is not 0"),
        ("packing", report.packing, f"alone vs packed max |diff| {report.packing_max_diff:.1e} "
                                    f"(tolerance {report.packing_tol:.0e})",
         f"alone vs packed max |diff| {report.packing_max_diff:.1e} > {report.packing_tol:.0e}"),
        ("metric", not report.leakage > 0, "cross-document Jacobian energy share 0",
         f"cross-document Jacobian energy share {report.leakage:.2e}"),
    ]
    checks = []
    for probe, ok, good, bad in outcomes:
        detail = good if ok else bad
        if claims:
            checks.append(Check(f"leakage.{probe}", ok, detail))
        else:
            checks.append(Check(f"leakage.{probe}", None, f"declared leaky, not judged: {detail}"))
    return checks


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _randn(shape: tuple[int, ...], generator: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    return torch.randn(shape, generator=generator).to(device=like.device, dtype=like.dtype)


def _documents_text(module: nn.Module) -> str:
    if not accepts_cu_seqlens(module):
        return "forward takes no cu_seqlens: packed inputs are refused; the leakage probes do not apply"
    if claims_document_blindness(module):
        return "forward takes cu_seqlens: claims exact blindness to the other documents of a row"
    return "forward takes cu_seqlens and declares leaks_across_documents = True: leaks, probes not judged"


# --- benchmark


def saved_for_backward(fn: Callable[[], torch.Tensor], module: nn.Module) -> tuple[torch.Tensor, int]:
    """(fn(), bytes of the storages autograd saved for backward while it ran, each once, parameters
    excluded)."""
    param_storages = {p.untyped_storage().data_ptr() for p in module.parameters()}
    sizes: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in param_storages:
            sizes[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = fn()
    return y, sum(sizes.values())


def bench_mixer(name: str, shape: tuple[int, int, int], device: torch.device, *, seed: int = 0,
                repeats: int = 100) -> BenchRow:
    """Time mixer ``name`` at ``shape`` [B, T, D] on ``device`` (module docstring)."""
    B, T, D = shape
    module = build_mixer(name, _config(name, D, T), seed).to(device)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator).to(device).requires_grad_()
    cotangent = torch.randn(shape, generator=generator).to(device)
    autocast = bf16_autocast(device, uses_bf16("auto", device))

    def forward() -> None:
        with torch.no_grad(), autocast:
            _call(module, x)

    def forward_backward() -> None:
        with autocast:
            y = _call(module, x)
        y.backward(cotangent.to(y.dtype))

    # in fp32 without autocast: autocast's bf16 copies of the weights would count as saved activations
    y, saved = saved_for_backward(lambda: _call(module, x), module)
    y.backward(cotangent)
    peak = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        forward_backward()
        torch.cuda.synchronize(device)
        peak = (torch.cuda.max_memory_allocated(device) - start) / 2**20
    return BenchRow(mixer=name, params=models.count_parameters(module),
                    fwd_ms=median_time_ms(forward, repeats, device),
                    fwd_bwd_ms=median_time_ms(forward_backward, repeats, device),
                    saved_mib=saved / 2**20, peak_mib=peak)


# --- the audit


def check_mixer(name: str, *, device: str | torch.device = "cpu", d_model: int = 32, seed: int = 0,
                bench: bool = True, bench_shape: tuple[int, int, int] | None = None,
                repeats: int = 100) -> MixerReport:
    """Audit mixer ``name`` (a built-in, an installed plugin's name or ``package.module:Factory``); see the
    module docstring for the checks and the benchmark (default shape: ``BENCH_SHAPES`` of the device type).

    Raises ValueError for an unknown name, an import path that does not import, a bad device, a d_model or
    benchmark width that is not a positive multiple of 8 (attention heads of 8 dims), or a bad shape. What
    the mixer's own code does wrong is reported as failed checks, never raised.
    """
    dev = leakage.pick_device(device)
    if bench_shape is not None and len(check("bench_shape", bench_shape, tuple[PositiveInt, ...])) != 3:
        raise ValueError(f"benchmark shape must be three positive integers B, T, D, got {bench_shape!r}")
    for what, value in (("d_model", d_model), *((("benchmark D", bench_shape[2]),) if bench_shape else ())):
        if check(what, value, PositiveInt) % HEAD_DIM:
            raise ValueError(f"{what} must be a positive multiple of {HEAD_DIM}, got {value!r}")
    factory = models.resolve_mixer(name)  # unknown names, broken imports: bad input (raise), not a check
    origin = factory.origin if isinstance(factory, ExternalFactory) else BUILT_IN
    report = dict(name=name, origin=origin, device=str(dev), d_model=d_model)
    try:
        module = build_mixer(name, _config(name, d_model, SEQ_LEN), seed).to(dev).eval()
    except Exception as exc:
        failed = Check("build", False, str(exc) if isinstance(exc, ValueError) else _error(exc))
        return MixerReport(**report, module="", params=None, documents="?", checks=(failed,))
    checks = [Check("build", True, f"{type(module).__name__} ({origin})")]
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(ROWS, SEQ_LEN, d_model, generator=generator).to(dev)
    cu = leakage.random_layout(np.random.default_rng(seed), ROWS, SEQ_LEN).to(dev)
    layouts = [None, cu] if accepts_cu_seqlens(module) else [None]

    shape = _guarded("shape", lambda: _shape_check(module, x, generator))
    checks.append(shape)
    if shape.passed:
        checks += _guarded_list("dtype", lambda: _dtype_checks(module, x))
        checks.append(_guarded("causality", lambda: _causality_check(module, x, layouts, generator)))
        checks.append(_guarded("gradients", lambda: _gradient_check(module, x, layouts, generator)))
        checks.append(_guarded("determinism", lambda: _determinism_check(module, x, layouts)))
        if accepts_cu_seqlens(module):
            checks += _guarded_list("leakage", lambda: _leakage_checks(module, name, x, cu, generator))
        else:
            checks.append(Check("leakage", None, "n/a: forward takes no cu_seqlens (packed inputs refused)"))
    else:
        checks += [Check(later, None, "skipped: wrong output shape") for later in AFTER_SHAPE]
    rows: list[BenchRow] = []
    shape_b = tuple(bench_shape or BENCH_SHAPES[dev.type])
    if bench and all(c.passed is not False for c in checks):
        try:
            rows = [bench_mixer(mixer, shape_b, dev, seed=seed, repeats=repeats)
                    for mixer in dict.fromkeys((name, *BASELINES))]
        except Exception as exc:  # the mixer passed at the check shape but fails at the benchmark's
            checks.append(Check("benchmark", False, f"at [B, T, D] = {list(shape_b)}: {_error(exc)}"))
            rows = []
    return MixerReport(**report, module=type(module).__name__, params=models.count_parameters(module),
                       documents=_documents_text(module), checks=tuple(checks),
                       bench_shape=shape_b if rows else None, bench=tuple(rows))


# --- the task contract

TASK_ROWS = 8  # rows of the generated batches the task checks read
TASK_CHECKS = ("build", "params", "generate", "seeded", "global_rng", "splits", "roles", "vocabulary", "lengths",
               "documents", "score_groups")


@dataclasses.dataclass(frozen=True)
class TaskReport(_Verdict):
    """Everything ``check_task`` found: the task, where it comes from, its parameters and the checks in order."""

    name: str
    origin: str
    params: dict
    checks: tuple[Check, ...]

    def format(self) -> str:
        """The report as text: a header, one line per check, then the verdict."""
        params = " ".join(f"{k}={','.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in self.params.items())
        lines = [f"check-task {self.name}  [{self.origin}]", f"parameters: {params or '-'}", ""]
        width = max(len("check"), *(len(c.name) for c in self.checks))
        lines.append(f"{'check':{width}s}  result  detail")
        lines += [f"{c.name:{width}s}  {({True: 'ok', False: 'FAIL', None: '-'}[c.passed]):6s}  {c.detail}"
                  for c in self.checks]
        n = sum(c.passed is not None for c in self.checks)
        return "\n".join([*lines, "", f"FAILED: {', '.join(self.failed)}" if self.failed else f"all {n} checks passed"])


def check_task(name: str, params: dict | None = None, *, seed: int = 0, rows: int = TASK_ROWS) -> TaskReport:
    """Audit task ``name`` (a built-in, an installed plugin's name or ``package.module:TaskClass``) with the
    parameters ``params`` over its defaults: what the runners rely on, each a ``Check``:

      build         the parameters build the task (its ``Params`` and ``validate``)
      params        ``Params`` is a frozen dataclass with a default for every field; the defaults written as text
                    (``--set``) read back the same; an unknown parameter is refused, naming it
      generate      ``generate(rows, seed)`` gives TaskData: int64 inputs and targets and uint8 roles [N, T]
      seeded        the same seed gives the same bytes (inputs, targets, roles, documents); another seed others
      global_rng    generating leaves numpy's and torch's global random state alone
      splits        train and test of one seed are different streams
      roles         every role is a ``tasks.Role``
      vocabulary    the data's vocab_size is the task's; inputs and scored targets lie in [0, vocab_size)
      lengths       one row length T > 1 for every count, seed and split (a run learns T from one example); every
                    row has a scored position
      documents     doc_ids (packed rows) count each row's documents up from 0 in steps of one
      score_groups  the task's score groups are boolean masks of the targets' shape inside the scored positions

    Raises ValueError for a name that does not resolve or bad parameter text; what the task's own code does wrong
    is reported as failed checks, never raised.
    """
    cls = tasks.task_class(name)
    origin = tasks.task_origins().get(name, "import path" if ":" in name else "?")
    checks: list[Check] = []
    try:
        task = cls(**(params or {}))
    except Exception as exc:
        failed = Check("build", False, str(exc) if isinstance(exc, ValueError) else _error(exc))
        return TaskReport(name, origin, dict(params or {}), (failed,))
    checks.append(Check("build", True, f"{cls.__name__}: {cls.description}"))
    shown = dataclasses.asdict(task.params)
    checks.append(_guarded("params", lambda: _params_check(cls)))
    generated = _guarded("generate", lambda: _generate_check(task, rows, seed))
    checks.append(generated)
    if generated.passed:
        checks.append(_guarded("seeded", lambda: _seeded_check(task, rows, seed)))
        checks.append(_guarded("global_rng", lambda: _global_rng_check(task, rows, seed)))
        checks.append(_guarded("splits", lambda: _splits_check(task, rows, seed)))
        data = task.generate(rows, seed=seed, split="test")
        checks.append(_guarded("roles", lambda: _roles_check(data)))
        checks.append(_guarded("vocabulary", lambda: _vocabulary_check(task, data)))
        checks.append(_guarded("lengths", lambda: _lengths_check(task, rows, seed)))
        checks.append(_guarded("documents", lambda: _documents_check(data)))
        checks.append(_guarded("score_groups", lambda: _score_groups_check(task, data)))
    else:
        checks += [Check(later, None, "skipped: generate failed") for later in TASK_CHECKS[3:]]
    return TaskReport(name, origin, shown, tuple(checks))


def _params_check(cls: type) -> Check:
    params = cls.Params
    if not (dataclasses.is_dataclass(params) and params.__dataclass_params__.frozen):
        return Check("params", False, "Params must be a frozen dataclass")
    missing = [f.name for f in dataclasses.fields(params)
               if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        return Check("params", False, f"no default for {', '.join(missing)}")
    defaults = cls.defaults()
    text = {k: ",".join(map(str, v)) if isinstance(v, tuple) else str(v) for k, v in defaults.items()}
    if cls.parse_params(text) != defaults:
        return Check("params", False, f"the defaults written as text read back as {cls.parse_params(text)}")
    try:
        cls(no_such_parameter=1)
    except ValueError as exc:
        if "no_such_parameter" in str(exc):
            return Check("params", True, f"{len(defaults)} parameters with defaults; text reads back; unknown "
                                         "ones refused")
    return Check("params", False, "an unknown parameter (no_such_parameter=1) is not refused by name")


def _generate_check(task: tasks.Task, rows: int, seed: int) -> Check:
    data = task.generate(rows, seed=seed)
    if not isinstance(data, tasks.TaskData):
        return Check("generate", False, f"returned a {type(data).__name__}, not TaskData")
    kinds = {"inputs": torch.int64, "targets": torch.int64, "roles": torch.uint8}
    wrong = [f"{k} {getattr(data, k).dtype}" for k, dtype in kinds.items() if getattr(data, k).dtype != dtype]
    if wrong:
        return Check("generate", False, f"dtypes: {', '.join(wrong)} (need int64 inputs and targets, uint8 roles)")
    if len(data) != rows:
        return Check("generate", False, f"{len(data)} rows for generate({rows})")
    return Check("generate", True, f"[{rows}, {data.seq_len}] int64 inputs and targets, uint8 roles")


def _same(a: tasks.TaskData, b: tasks.TaskData) -> bool:
    parts = ("inputs", "targets", "roles", "doc_ids")
    return all((getattr(a, k) is None and getattr(b, k) is None) or (
        getattr(a, k) is not None and getattr(b, k) is not None and getattr(a, k).shape == getattr(b, k).shape
        and torch.equal(getattr(a, k), getattr(b, k))) for k in parts)


def _seeded_check(task: tasks.Task, rows: int, seed: int) -> Check:
    first, again = task.generate(rows, seed=seed), task.generate(rows, seed=seed)
    if not _same(first, again):
        return Check("seeded", False, f"seed {seed} twice gave different data (draw from the generator given)")
    if _same(first, task.generate(rows, seed=seed + 1)):
        return Check("seeded", False, f"seeds {seed} and {seed + 1} gave the same data")
    return Check("seeded", True, f"seed {seed} twice: the same bytes; seed {seed + 1}: other data")


def _global_rng_check(task: tasks.Task, rows: int, seed: int) -> Check:
    numpy_state, torch_state = np.random.get_state(), torch.get_rng_state()
    try:
        task.generate(rows, seed=seed)
        after = np.random.get_state()
        touched = [name for name, same in (
            ("numpy's", all(np.array_equal(x, y) for x, y in zip(numpy_state[1:], after[1:]))),
            ("torch's", torch.equal(torch_state, torch.get_rng_state()))) if not same]
    finally:
        np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
    if touched:
        return Check("global_rng", False, f"generating changed {' and '.join(touched)} global random state")
    return Check("global_rng", True, "numpy's and torch's global random state untouched")


def _splits_check(task: tasks.Task, rows: int, seed: int) -> Check:
    if _same(task.generate(rows, seed=seed, split="train"), task.generate(rows, seed=seed, split="test")):
        return Check("splits", False, f"train and test of seed {seed} are the same data")
    return Check("splits", True, f"train and test of seed {seed} differ")


def _roles_check(data: tasks.TaskData) -> Check:
    bad = sorted(set(data.roles.unique().tolist()) - {int(r) for r in tasks.Role})
    if bad:
        return Check("roles", False, f"role values {bad} are not tasks.Role members")
    used = ", ".join(tasks.ROLE_TAGS[tasks.Role(r)] for r in sorted(set(data.roles.unique().tolist())))
    return Check("roles", True, f"roles used: {used}")


def _vocabulary_check(task: tasks.Task, data: tasks.TaskData) -> Check:
    V = task.vocab_size
    if data.vocab_size != V:
        return Check("vocabulary", False, f"the data says vocab_size {data.vocab_size}, the task {V}")
    scored = data.targets[data.targets != tasks.IGNORE]
    for what, values in (("inputs", data.inputs), ("scored targets", scored)):
        if values.numel() and (int(values.min()) < 0 or int(values.max()) >= V):
            return Check("vocabulary", False, f"{what} span [{int(values.min())}, {int(values.max())}], outside "
                                              f"[0, {V})")
    if task.objective not in OBJECTIVES:
        return Check("vocabulary", False, f"objective {task.objective!r} is not one of {OBJECTIVES}")
    return Check("vocabulary", True, f"inputs and scored targets in [0, {V})")


def _lengths_check(task: tasks.Task, rows: int, seed: int) -> Check:
    lengths = {f"{n} rows, seed {s}, {split}": task.generate(n, seed=s, split=split).seq_len
               for n in (1, rows) for s in (seed, seed + 1) for split in ("train", "test")}
    if len(set(lengths.values())) > 1:
        return Check("lengths", False, "row lengths differ: " + ", ".join(f"{k}: {v}" for k, v in lengths.items()))
    T = next(iter(lengths.values()))
    if T < 2:
        return Check("lengths", False, f"rows of {T} token: nothing to predict from")
    for split in ("train", "test"):
        targets = task.generate(rows, seed=seed, split=split).targets
        empty = int((~(targets != tasks.IGNORE).any(dim=1)).sum())
        if empty:
            return Check("lengths", False, f"{empty} of {rows} {split} rows have no scored position")
    return Check("lengths", True, f"T = {T} for every count, seed and split; every row scored")


def _documents_check(data: tasks.TaskData) -> Check:
    if data.doc_ids is None:
        return Check("documents", None, "n/a: one document per row")
    ids = data.doc_ids
    steps = ids[:, 1:] - ids[:, :-1]
    if bool((ids[:, 0] != 0).any()) or bool(((steps != 0) & (steps != 1)).any()):
        return Check("documents", False, "doc_ids must start at 0 in each row and go up in steps of one")
    return Check("documents", True, f"up to {int(ids.max()) + 1} documents a row, counted from 0")


def _score_groups_check(task: tasks.Task, data: tasks.TaskData) -> Check:
    groups = task.score_groups(data.targets)
    scored = data.targets != tasks.IGNORE
    for name, mask in groups.items():
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != data.targets.shape:
            return Check("score_groups", False, f"group {name!r} is not a boolean mask of the targets' shape")
        if bool((mask & ~scored).any()):
            return Check("score_groups", False, f"group {name!r} holds positions that are not scored")
    return Check("score_groups", True, f"groups: {', '.join(groups)}" if groups else "none")
