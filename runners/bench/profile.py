"""``mixlab bench profile MODE``: where the time of a kernel call, a stacked step or a run goes, under torch.profiler
or Nsight Compute. Each mode is a function here that returns a markdown report headed by the device and versions.

- ``ops`` (``profile_ops``): an eager call of each short conv's public op at ``mixlab bench shortconv``'s shape
  (B=4, T=4096, D=2048, W=4, bf16, residual; without and with ``n_docs`` documents), forward+backward
  (``autograd.grad``), ``calls`` times under torch.profiler after two unprofiled calls. Per call: the wall time
  (synchronised at both ends of the window), the GPU's busy time (``busy_seconds``), the device events, and the
  host's runtime calls that wait for the device (``WAITS``); then the kernels and copies the GPU ran, split by
  launch (``kernel_table``), and the host ops by self CPU time (``host_table``).
- ``ncu`` (``ncu_launches``, ``run_for_ncu``): every kernel launched once for Nsight Compute, which says what bounds
  each (registers, achieved occupancy, memory and compute throughput against the peaks) where timings cannot.
  Groups: ``shortconv`` the four short convs of ``ops``, forward+backward through the public ops, without and with
  documents; ``attention`` the tiny-head kernels' launchers at a stack of 18 MAD runs as the engine folds it
  (2,304 sequences, 16 heads of 8, bf16, [B, T, H, hd] layout) at T=127 and T=1023, forward, then backward;
  ``rubiconv`` the Triton backend at ``bench rubiconv``'s row (65,536 tokens in 49 lognormal documents, D=1024),
  fp32 and bf16 activations at precision fp32 (tf32 dots), then bf16 at precision bf16, forward and
  forward+backward. Every call runs twice unprofiled (compilation, caches), then once between
  ``cudaProfilerStart`` and ``cudaProfilerStop`` in an NVTX range named after it; the report lists the calls in
  that order, so the CSV's kernels can be told apart. Without ncu it is a dry run of the same launches::

      ncu --clock-control none --profile-from-start off --nvtx --section SpeedOfLight --section Occupancy \\
          --section LaunchStats --csv mixlab bench profile ncu --ops shortconv,attention > ncu.csv

- ``train`` (``profile_stack_steps``, ``profile_train``): a stack of ``n_runs`` runs of ``mixlab bench train``'s
  setting (MAD in-context recall, the 2-block attention model, bf16 autocast on CUDA) trained once to warm up
  (compilation, graph capture), then again with the profiler recording only steps ``skip`` + 1 to ``steps``, its
  window opened and closed by the engine's ``on_step``: the stack's setup, its first steps and the evaluation after
  the last step fall outside (the training set is one batch longer than the steps, so that evaluation is the only
  one). The window's wall time per step against the GPU's busy time in it: well under 1, the host's launches bound
  the step.
- ``rows`` (``kernel_groups``, ``profile_rows``): ``train``'s stack at each of several row lengths (the task's
  ``seq_len``), one table: per length the wall and GPU busy time a step, train tokens/s, and the kernel time a
  step by what it does (``GROUPS``: attention forward and backward, the convs, matmuls, the optimizer, compiled
  and eager elementwise work, copies), then the largest kernels no group names. Where a MAD step's time goes as
  its rows grow, in one call.
- ``run`` (``profile_one_run``, ``profile_preset``): for each model of a sweep preset (on its first task, seed 0),
  its run trained alone by ``runners.train.run.train_run`` as the sweep trains it, for ``steps`` steps (its training
  steps per second), then for ``profiled`` steps under torch.profiler, data generation and the one evaluation at
  the end included. Only the length of training and the training-set size (steps x batch rows) differ from the
  preset's run.
- ``host``: ``runners.bench.profile_host``.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from mixlab import kernels
from mixlab.core.fields import PositiveInt, check
from mixlab.kernels.attention import triton as attention
from mixlab.runners.bench.rubiconv import lognormal_layout
from mixlab.runners.bench.shortconv import DTYPES, KERNEL_KEYS, bench_kernels, doc_layout
from mixlab.runners.bench.train import bench_runs
from mixlab.runners.bench.utils import device_line, fwd_bwd_call, fwd_call
from mixlab.runners.sweep.spec import load_spec
from mixlab.runners.train.config import RunConfig
from mixlab.runners.train.engine import group_key, train_runs_batched
from mixlab.runners.train.precision import pick_device, uses_bf16
from mixlab.runners.train.resolved import ResolvedRun
from mixlab.runners.train.run import train_run
from mixlab.runners.train.speed import check_speed
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, schedule

# Runtime calls that make the host wait for the device (or for the copy they start).
WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "cudaMemcpyAsync", "cudaEventSynchronize")
# ncu's attention: sequences, heads, head size and lengths of a stack of 18 MAD runs (128 rows each).
ATTENTION = (18 * 128, 16, 8, (127, 1023))
NCU_GROUPS = ("shortconv", "attention", "rubiconv")
# Rows a step of profile_train's runs (bench train's default).
BATCH = 128
# Table names are cut to this many characters.
NAME_WIDTH = 70
# ``rows``' kernel groups, (label, pattern searched in the kernel's name, any case), the first that matches takes it:
# the lab's Triton kernels by their function names, cuBLAS/CUTLASS and inductor's matmul templates, the optimizer's
# multi-tensor kernels, inductor's fused pointwise and reduction kernels (a fused cast counts there), copies and
# fills, aten's eager elementwise and reduction kernels.
GROUPS = tuple((label, re.compile(pattern, re.IGNORECASE)) for label, pattern in (
    ("attention fwd", r"_attn_fwd"),
    ("attention bwd", r"_attn_bwd"),
    ("short convs", r"_short_conv_|_headwise_|_dynamic_conv_|_sum_partials"),
    ("RubiConv", r"_rubi_"),
    ("matmuls", r"gemm|gemv|nvjet|cutlass|xmma|triton_tem_|cublas"),
    ("optimizer", r"multi_tensor_apply|adam"),
    ("compiled elementwise", r"^triton_(poi|red|per)_"),
    ("copies, fills", r"^Memcpy|^Memset|copy|fill|CatArray"),
    ("eager elementwise", r"elementwise|reduce_kernel|softmax|index|gather|scatter"),
))
OTHER = "other"


def busy_seconds(intervals: Sequence[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals given in microseconds, in seconds: the time a device was
    busy, each moment counted once however many of its kernels and copies overlapped it."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total / 1e6


def kernel_table(spans: Sequence[tuple[str, float, float]], rows: int, count: int, per: str = "step") -> str:
    """Markdown: the device's kernels and copies ``(name, start µs, end µs)`` by total time, the first ``rows``,
    per ``per`` of the ``count`` profiled; the share is of the summed kernel time."""
    totals: dict[str, list[float]] = {}
    for name, start, end in spans:
        entry = totals.setdefault(name, [0.0, 0])
        entry[0] += end - start
        entry[1] += 1
    whole = sum(t for t, _ in totals.values()) or 1.0
    lines = [f"| kernel | µs a {per} | share | calls a {per} | mean µs |", "|---|---|---|---|---|"]
    for name, (t, n) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:rows]:
        lines.append(f"| `{name[:NAME_WIDTH]}` | {t / count:,.1f} | {t / whole:.1%} | {n / count:g} | {t / n:,.1f} |")
    return "\n".join(lines)


def host_table(ops: Sequence[tuple[str, float, int]], rows: int, count: int, per: str = "step") -> str:
    """Markdown: the host's ops ``(name, self CPU µs, calls)`` by self CPU time, the first ``rows``, per ``per`` of
    the ``count`` profiled."""
    lines = [f"| host op | self CPU µs a {per} | calls a {per} |", "|---|---|---|"]
    for name, cpu_us, calls in sorted(ops, key=lambda op: -op[1])[:rows]:
        lines.append(f"| `{name[:NAME_WIDTH]}` | {cpu_us / count:,.1f} | {calls / count:g} |")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Window:
    """What torch.profiler saw in a window of ``count`` calls or steps: its wall seconds (the device synchronised at
    both ends), the device's kernels and copies ``(name, start µs, end µs)`` and the host's ops ``(name, self CPU
    µs, calls)``."""

    wall_s: float
    count: int
    device: list[tuple[str, float, float]]
    host: list[tuple[str, float, int]]

    @classmethod
    def of(cls, prof: profile, wall_s: float, count: int) -> Window:
        device = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                  if e.device_type == DeviceType.CUDA]
        host = [(e.key, e.self_cpu_time_total, e.count) for e in prof.key_averages()
                if e.device_type == DeviceType.CPU]
        return cls(wall_s, count, device, host)

    @property
    def busy_s(self) -> float:
        return busy_seconds([(start, end) for _, start, end in self.device])

    def summary(self, per: str, unit: Literal["ms", "µs"] = "ms") -> str:
        """Wall and GPU busy time per ``per`` in ``unit``, their ratio, and the device events per ``per``."""
        scale = {"ms": 1e3, "µs": 1e6}[unit] / self.count
        wall, busy = self.wall_s * scale, self.busy_s * scale
        return (f"{wall:,.2f} {unit} a {per}, GPU busy {busy:,.2f} {unit} a {per} ({busy / wall:.0%} of the wall), "
                f"{len(self.device) / self.count:g} device events a {per}")

    def tables(self, rows: int, per: str) -> list[str]:
        """The kernel table (when the device ran any) and the host table, with a blank line after each."""
        kernel = [kernel_table(self.device, rows, self.count, per), ""] if self.device else []
        return [*kernel, host_table(self.host, rows, self.count, per), ""]


def _activities(device: torch.device) -> list[ProfilerActivity]:
    return [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if device.type == "cuda" else [])]


def _sync(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def _cuda(mode: str, hint: str = "") -> torch.device:
    if not torch.cuda.is_available():
        raise ValueError(f"bench profile {mode} needs a CUDA GPU, and torch sees no CUDA device here{hint}")
    return torch.device("cuda")


def _header(title: str, device: torch.device, *lines: str) -> list[str]:
    return [f"# {title}, {datetime.date.today().isoformat()}", "", device_line(device, cpu_name="CPU"),
            *(f"- {line}" for line in lines), ""]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConvInputs:
    """The short convs' inputs of ``ops`` and ``ncu``: ``shape`` (B, T, D, W), the activations' ``dtype`` (fp32,
    bf16, fp16) and the documents of the packed case; residual on, seeded as ``bench shortconv``'s."""

    shape: tuple[int, int, int, int] = (4, 4096, 2048, 4)
    dtype: str = "bf16"
    n_docs: int = 64

    def __post_init__(self) -> None:
        check("dtype", self.dtype, Literal[tuple(DTYPES)])
        if len(check("shape", self.shape, tuple[PositiveInt, ...])) != 4:
            raise ValueError(f"shape must be four positive integers B,T,D,W, got {self.shape!r}")

    def describe(self) -> str:
        B, T, D, W = self.shape
        return f"B={B} T={T} D={D} W={W} {self.dtype}, residual"

    def calls(self, device: torch.device, only: Sequence[str] = KERNEL_KEYS) -> list[tuple[str, Callable]]:
        """(label, eager forward+backward of the public op) of each kernel of ``only``, without and with
        documents."""
        bad = [key for key in only if key not in KERNEL_KEYS]
        if bad or not only:
            raise ValueError(f"unknown kernel {bad[0] if bad else ''!r}; choose from {', '.join(KERNEL_KEYS)}")
        B, T, D, W = self.shape
        dtype = DTYPES[self.dtype]
        upstream = torch.randn(B, T, D, generator=torch.Generator(device=device).manual_seed(1), device=device)
        cases = [(None, "no documents"), (doc_layout(B, T, self.n_docs, device), f"{self.n_docs} documents")]
        return [(f"{k.name} | {label} | fwd+bwd",
                 fwd_bwd_call(k.op, k.inputs, upstream.to(dtype), cu_seqlens=cu, residual=True, backend="triton"))
                for k in bench_kernels(B, T, D, W, dtype, device) if k.key in only for cu, label in cases]


def profile_calls(run: Callable[[], object], calls: int, device: torch.device) -> Window:
    """``calls`` calls of ``run`` under torch.profiler, after two unprofiled ones."""
    sync = _sync(device)
    for _ in range(2):
        run()
    sync()
    with profile(activities=_activities(device)) as prof:
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            run()
        sync()
        wall = time.perf_counter() - start
    return Window.of(prof, wall, calls)


def profile_ops(conv: ConvInputs = ConvInputs(), *, only: Sequence[str] = KERNEL_KEYS, calls: int = 20,
                rows: int = 12) -> str:
    """Markdown: each short conv of ``only`` (``KERNEL_KEYS``), eager forward+backward, ``calls`` calls under
    torch.profiler; per call its wall and GPU busy time, its host waits, its kernels and its host ops. On CUDA when
    available; a CPU run (host ops only) needs TRITON_INTERPRET=1 and a tiny shape, else ValueError."""
    check("calls", calls, PositiveInt)
    check("rows", rows, PositiveInt)
    if torch.cuda.is_available():
        device = torch.device("cuda")
    elif os.environ.get("TRITON_INTERPRET") == "1":
        device = torch.device("cpu")
    else:
        raise ValueError("bench profile ops profiles Triton kernels on a GPU, and torch sees no CUDA device here (on "
                         "a CPU the kernels run only in the Triton interpreter, TRITON_INTERPRET=1, at tiny shapes)")
    lines = _header("Profile of the short convs' eager ops", device,
                    f"{conv.describe()}; {calls} calls of eager fwd+bwd (the public op, backend triton)")
    for label, run in conv.calls(device, only):
        window = profile_calls(run, calls, device)
        waits = ", ".join(f"{name} {n / calls:g}" for name, _, n in window.host if name in WAITS) or "none"
        lines += [f"## {label}", "", f"{window.summary('call', 'µs')}; host waits a call: {waits}", "",
                  *window.tables(rows, "call")]
    return "\n".join(lines).rstrip("\n")


def _attention_launches(device: torch.device) -> list[tuple[str, Callable]]:
    B, H, hd, lengths = ATTENTION
    gen = torch.Generator(device=device).manual_seed(2)
    scale = hd**-0.5
    launches = []
    for T in lengths:
        q, k, v, do = (torch.randn(B, T, H, hd, generator=gen, device=device).to(torch.bfloat16).transpose(1, 2)
                       for _ in range(4))
        o, lse = attention._attention_fwd(q, k, v, scale)
        launches.append((f"attention T={T} | fwd", lambda q=q, k=k, v=v: attention._attention_fwd(q, k, v, scale)))
        launches.append((f"attention T={T} | bwd", lambda q=q, k=k, v=v, do=do, o=o, lse=lse:
                         attention._attention_bwd(do, q, k, v, o, lse, scale)))
    return launches


def _rubiconv_launches(device: torch.device) -> list[tuple[str, Callable]]:
    n_tokens, d = 65536, 1024
    cu = lognormal_layout(n_tokens, 0, device)
    gen = torch.Generator(device=device).manual_seed(3)
    x = torch.randn(1, n_tokens, d, generator=gen, device=device)
    h = torch.randn(d, n_tokens, generator=gen, device=device) / n_tokens**0.5
    upstream = torch.randn(1, n_tokens, d, generator=gen, device=device)
    launches = []
    for dtype, precision in ((torch.float32, "fp32"), (torch.bfloat16, "fp32"), (torch.bfloat16, "bf16")):
        inputs = {"x": x.to(dtype), "h": h.to(dtype)}
        name = f"rubiconv {str(dtype).removeprefix('torch.')} activations, precision {precision}"
        options = {"cu_seqlens": cu, "backend": "triton", "precision": precision}
        launches.append((f"{name} | fwd", fwd_call(kernels.rubiconv, inputs, **options)))
        launches.append((f"{name} | fwd+bwd", fwd_bwd_call(kernels.rubiconv, inputs, upstream.to(dtype), **options)))
    return launches


def ncu_launches(groups: Sequence[str], conv: ConvInputs, device: torch.device) -> list[tuple[str, Callable]]:
    """(name, call) of every kernel launch of ``groups`` (``NCU_GROUPS``), in the order of the groups given."""
    bad = [g for g in groups if g not in NCU_GROUPS]
    if bad or not groups:
        raise ValueError(f"unknown op group {bad[0] if bad else ''!r}; choose from {', '.join(NCU_GROUPS)}")
    build = {"shortconv": conv.calls, "attention": _attention_launches, "rubiconv": _rubiconv_launches}
    return [launch for group in dict.fromkeys(groups) for launch in build[group](device)]


def run_for_ncu(launches: Sequence[tuple[str, Callable]]) -> None:
    """Each call twice unprofiled (compilation, caches), then each once between ``cudaProfilerStart`` and
    ``cudaProfilerStop`` in an NVTX range of its name, synchronised, for ``ncu --profile-from-start off --nvtx``."""
    for _, call in launches:
        call()
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, call in launches:
        torch.cuda.nvtx.range_push(name)
        call()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    torch.cuda.profiler.stop()


def profile_ncu(groups: Sequence[str] = ("shortconv", "attention"), conv: ConvInputs = ConvInputs()) -> str:
    """Launch every kernel of ``groups`` once for Nsight Compute (``run_for_ncu``); markdown: the launches in the
    order profiled (CUDA)."""
    device = _cuda("ncu")
    launches = ncu_launches(groups, conv, device)
    run_for_ncu(launches)
    lines = _header("Kernel launches profiled for Nsight Compute", device,
                    f"groups {', '.join(dict.fromkeys(groups))}; short convs {conv.describe()}",
                    "one NVTX range a launch, in this order")
    cells = [name.replace("|", "\\|") for name, _ in launches]  # the NVTX names, their bars escaped for markdown
    lines += ["| # | launch (NVTX range) |", "|---|---|", *(f"| {n} | {cell} |" for n, cell in enumerate(cells, 1))]
    return "\n".join(lines)


def profile_stack_steps(runs: Sequence[ResolvedRun], *, speed: str = "eager", skip: int = 5,
                        last: int = 30) -> Window:
    """Train ``runs`` (one stack) twice with ``train_runs_batched``: once to warm up, then with torch.profiler
    recording stack steps ``skip`` + 1 to ``last``, the window opened and closed by the engine's ``on_step``
    (the device synchronised at both ends); the step before the window is the profiler's warm-up, discarded."""
    check_speed(speed)
    if check("skip", skip, PositiveInt) >= check("last", last, PositiveInt):
        raise ValueError(f"skip must be below last={last}, got {skip}")
    reasons = [run.unbatchable_reason for run in runs if run.unbatchable_reason is not None]
    if reasons:
        raise ValueError(f"the runs do not stack ({reasons[0]}): there are no stacked steps to profile")
    stacks = len({group_key(run) for run in runs})
    if stacks != 1:
        raise ValueError(f"the runs form {stacks} stacks; profile the runs of one")
    device = pick_device(runs[0].config.train.device)
    sync = _sync(device)
    train_runs_batched(runs, progress=False, speed=speed)
    sync()
    clock: list[float] = []

    def on_step(step: int) -> None:
        if step in (skip, last):  # the window opens after step skip and closes after step last
            sync()
            clock.append(time.perf_counter())
        prof.step()

    window = schedule(wait=skip - 1, warmup=1, active=last - skip, repeat=1)
    with profile(activities=_activities(device), schedule=window) as prof:
        train_runs_batched(runs, progress=False, speed=speed, on_step=on_step)
    if len(clock) != 2:
        raise ValueError(f"the stack took fewer than last={last} steps")
    return Window.of(prof, clock[1] - clock[0], last - skip)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainProfile:
    """``profile_train``'s stack: ``n_runs`` runs of ``steps`` steps, profiled after ``skip``, stepping at
    ``speed`` (``runners.train.speed``), ``num_test`` test rows (evaluated once, unprofiled); ``rows`` listed."""

    n_runs: int = 6
    steps: int = 30
    skip: int = 5
    speed: str = "eager"
    num_test: int = 128
    rows: int = 25

    def __post_init__(self) -> None:
        for name in ("n_runs", "steps", "skip", "num_test", "rows"):
            check(name, getattr(self, name), PositiveInt)
        if self.skip >= self.steps:
            raise ValueError(f"skip must leave a profiled step: at most steps - 1 = {self.steps - 1}, got {self.skip}")
        check_speed(self.speed)


def profile_train(task: str = "mad/in_context_recall", model: str = "transformer",
                  options: TrainProfile = TrainProfile(), *, task_params: dict[str, Any] | None = None,
                  model_params: dict[str, Any] | None = None) -> str:
    """Markdown: the steady steps of a stack of ``bench train``'s runs (``bench_runs``; ``model_params`` over the
    model's fields): wall and GPU busy time a step, the kernels and the host ops a step (CUDA)."""
    o = options
    device = _cuda("train")
    # one batch more training rows than steps: no epoch ends in the window, the only evaluation follows the last step
    runs = bench_runs(task, model, o.n_runs, o.steps, "cuda", task_params=task_params, model_params=model_params,
                      batch_size=BATCH, num_train=BATCH * (o.steps + 1), num_test=o.num_test)
    window = profile_stack_steps(runs, speed=o.speed, skip=o.skip, last=o.steps)
    tc, model_config = runs[0].config.train, runs[0].model_config
    lines = _header(
        f"Profile of a stack's steps: {task}, model {model}", device,
        f"{o.n_runs} runs of {runs[0].row_tokens}-token rows, batch {tc.batch_size}, {model_config.n_layers} blocks, "
        f"d={model_config.d_model}, {'bf16 autocast' if uses_bf16(tc.precision, device) else 'fp32'}, "
        f"speed {o.speed}; task_params={task_params or {}!r}, model_params={model_params or {}!r}",
        f"profiled steps {o.skip + 1}-{o.steps} of {o.steps}")
    lines += [window.summary("step"), "", *window.tables(o.rows, "step")]
    return "\n".join(lines).rstrip("\n")


def group_of(kernel: str) -> str:
    """The ``GROUPS`` label of a kernel's name, else ``OTHER``."""
    return next((label for label, pattern in GROUPS if pattern.search(kernel)), OTHER)


def kernel_groups(spans: Sequence[tuple[str, float, float]]) -> dict[str, float]:
    """µs of the kernels ``(name, start µs, end µs)`` by ``GROUPS`` label, every label present, ``OTHER`` last."""
    totals = dict.fromkeys([label for label, _ in GROUPS] + [OTHER], 0.0)
    for name, start, end in spans:
        totals[group_of(name)] += end - start
    return totals


def profile_rows(task: str = "mad/in_context_recall", model: str = "transformer",
                 lengths: Sequence[int] = (128, 256, 512, 1024), options: TrainProfile = TrainProfile(), *,
                 device: str = "cuda", task_params: dict[str, Any] | None = None,
                 model_params: dict[str, Any] | None = None) -> str:
    """Markdown: ``profile_train``'s stack at each ``seq_len`` of ``lengths``, one row each: wall and GPU busy time a
    step, train tokens/s, kernel time a step by ``kernel_groups``; then the largest kernels of group ``OTHER``.
    ``device`` "cpu" checks the path (no kernels are seen there)."""
    lengths = check("lengths", tuple(lengths), tuple[PositiveInt, ...])
    if not lengths:
        raise ValueError("lengths must name at least one row length")
    if "seq_len" in (task_params or {}):
        raise ValueError("profile rows takes each stack's seq_len from lengths, not from the task parameters")
    dev = _cuda("rows", " (--device cpu checks the path on a CPU)") if device == "cuda" else torch.device(device)
    o, stacks = options, []
    for length in lengths:  # every length resolved before any is timed: a bad one fails first
        params = {**(task_params or {}), "seq_len": length}
        stacks.append(bench_runs(task, model, o.n_runs, o.steps, dev.type, task_params=params,
                                 model_params=model_params, batch_size=BATCH, num_train=BATCH * (o.steps + 1),
                                 num_test=o.num_test))
    labels = [label for label, _ in GROUPS] + [OTHER]
    table = ["| seq_len | row tokens | ms a step | GPU busy ms | train tokens/s | "
             + " | ".join(f"{label} ms" for label in labels) + " |", "|---" * (5 + len(labels)) + "|"]
    others = []
    for length, runs in zip(lengths, stacks, strict=True):
        window = profile_stack_steps(runs, speed=o.speed, skip=o.skip, last=o.steps)
        step_s = window.wall_s / window.count
        tokens = sum(run.config.train.batch_size * run.row_tokens for run in runs)
        groups = kernel_groups(window.device)
        whole = sum(groups.values()) or 1.0
        cells = [f"{t / window.count / 1e3:,.2f} ({t / whole:.0%})" for t in groups.values()]
        busy = f"{1e3 * window.busy_s / window.count:,.2f}"
        if not window.device:  # a CPU run: no kernels seen
            busy, cells = "—", ["—"] * len(cells)
        head = [str(length), str(runs[0].row_tokens), f"{1e3 * step_s:,.2f}", busy, f"{tokens / step_s:,.0f}"]
        table.append("| " + " | ".join(head + cells) + " |")
        rest = [span for span in window.device if group_of(span[0]) == OTHER]
        if rest:
            others += [f"seq_len {length}:", "", kernel_table(rest, 5, window.count), ""]
    model_config = stacks[0][0].model_config
    lines = _header(
        f"Where a stack's step goes by row length: {task}, model {model}", dev,
        f"{o.n_runs} runs of {BATCH} rows a step, {model_config.n_layers} blocks, d={model_config.d_model}, "
        f"{'bf16 autocast' if uses_bf16(stacks[0][0].config.train.precision, dev) else 'fp32'}, speed {o.speed}; "
        f"task_params={task_params or {}!r}, model_params={model_params or {}!r}",
        f"profiled steps {o.skip + 1}-{o.steps} of {o.steps}; kernel groups: ms a step (share of the kernel time)")
    lines += table + [""]
    if others:
        lines += [f"Largest kernels in \"{OTHER}\":", "", *others]
    return "\n".join(lines).rstrip("\n")


def shortened(config: RunConfig, steps: int) -> RunConfig:
    """The run with ``steps`` steps, one evaluation at the end, no early stop, and just enough training rows."""
    train = dataclasses.replace(config.train, steps=steps, epochs=None, eval_every=steps, early_stop_acc=None,
                                num_train=steps * config.train.batch_size)
    return dataclasses.replace(config, train=train)


def profile_one_run(config: RunConfig, *, steps: int = 200, profiled: int = 20) -> tuple[float, Window]:
    """(training steps per second of ``config`` cut to ``steps`` steps, torch.profiler's window over the whole
    ``train_run`` of it cut to ``profiled`` steps: data, model, steps and the one evaluation; ``count`` 1)."""
    check("steps", steps, PositiveInt)
    check("profiled", profiled, PositiveInt)
    device = pick_device(config.train.device)
    sync = _sync(device)
    record = train_run(shortened(config, steps), progress=False)
    short = shortened(config, profiled)
    sync()
    with profile(activities=_activities(device)) as prof:
        start = time.perf_counter()
        train_run(short, progress=False)
        sync()
        wall = time.perf_counter() - start
    return record["steps_per_s"], Window.of(prof, wall, 1)


def profile_preset(preset: str = "packed_rubiconv", *, steps: int = 200, profiled: int = 20, rows: int = 15,
                   device: Literal["cuda", "cpu"] = "cuda") -> str:
    """Markdown: for each model of ``preset`` (first task, seed 0), its run's speed alone and a profile of a short
    run of it (``profile_one_run``). ``device`` cpu checks the path; its tables hold host ops only."""
    check("device", device, Literal["cuda", "cpu"])
    check("rows", rows, PositiveInt)
    dev = _cuda("run", " (--device cpu checks the path on a CPU)") if device == "cuda" else torch.device("cpu")
    plan = load_spec(preset).plan(device=device)
    first_task = plan.runs[0].meta["task"]
    chosen: dict[str, RunConfig] = {}
    for run in plan.runs:
        if run.meta["task"] == first_task and run.meta["seed"] == 0:
            chosen.setdefault(run.meta["model"], run.config)
    lines = _header(f"Profile of one run alone: preset {preset}", dev,
                    f"task {first_task}, seed 0; {steps} steps timed, then {profiled} steps profiled with their "
                    "data, model and one evaluation (the tables give the whole profiled run)")
    for name, config in chosen.items():
        rate, window = profile_one_run(config, steps=steps, profiled=profiled)
        lines += [f"## {name}", "", f"{rate:.1f} steps/s alone ({1e3 / rate:.1f} ms a step); profiled run: wall "
                  f"{window.wall_s:.2f} s, GPU busy {window.busy_s:.2f} s", "", *window.tables(rows, "run")]
    return "\n".join(lines).rstrip("\n")

