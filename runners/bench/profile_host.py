"""``mixlab bench profile host``: the host time of the short convs' public ops, what a call costs the CPU before
(or while) the GPU works.

Each op of ``mixlab bench shortconv`` (static, head-wise head sizes 1 and 16, low-rank R=16) is called through
``mixlab.kernels`` with ``backend="triton"``, forward under no_grad and forward+backward through autograd
(``runners.bench.utils``), on small tensors (B=1, T=64, D=64, W=4, fp32). On the CPU every Triton launch is a
no-op (``launches_skipped``; the kernels must be the interpreter's, TRITON_INTERPRET=1 set before mixlab starts, for
the ops to dispatch on CPU tensors): input checks, backend choice, the autograd Function, allocations, launch-size
arithmetic and the autograd engine remain. On CUDA the launches are made: the kernels take a few microseconds at
this size, so a block of calls is bound by the host and its time per call is the host's. A last row times the
same calls through an autograd Function that only allocates its outputs: the floor that autograd itself sets under
any eager op. A last column chains ``CHAIN`` calls in one graph and gives the time per call: autograd starts a
backward (on CUDA, hands it to its device thread) once per graph, so that column is what an op costs inside a
model's backward.

Every op is then taken apart (``op_pieces``): its raw forward and backward launchers (``TritonOp.fwd`` and
``.bwd``: argument handling, allocations, launches, no autograd), its autograd Function called without the public
op's checks, and for the static op one bare launch of its forward kernel through Triton's launcher and the sum of
dw's partials. Together they split an op's host time into autograd's, the lab's Python and Triton's. On the GPU
these microseconds are paid per eager call, so a kernel shorter than them leaves the GPU idle (compiled graphs and
CUDA graphs do not pay them). Medians over ``repeats`` blocks of ``calls`` calls (each CUDA block ends with a
synchronize).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Literal

import torch
from mixlab.core.fields import PositiveInt, check
from mixlab.kernels import triton_utils as tu
from mixlab.kernels._triton import HAS_TRITON
from mixlab.kernels.dynamic_conv.triton_headwise import headwise_triton
from mixlab.kernels.dynamic_conv.triton_lowrank import lowrank_triton
from mixlab.kernels.short_conv import triton as short_triton
from mixlab.runners.bench.shortconv import BenchKernel, bench_kernels
from mixlab.runners.bench.utils import device_line, fwd_bwd_call, fwd_call

B, T, D, W = 1, 64, 64, 4
CHAIN = 8  # ops in one graph for the per-op column
WARM_CALLS = 20  # untimed calls before the blocks: caches (and on CUDA compilation)
# each bench kernel's TritonOp: its raw launchers, below the public op's checks and autograd
TRITON_OPS = {"static": short_triton.short_conv_triton, "headwise": headwise_triton, "lowrank": lowrank_triton}
# launches each raw launcher makes with a static weight: the forward's, then the backward's kernels and one sum of
# fp32 partials per weight gradient (low-rank: dx and dz, dU, then the sums of dz, dU and dstatic_w)
LAUNCHES = {"static": (1, 2), "headwise": (1, 2), "lowrank": (1, 5)}


def median_us(call: Callable[[], object], repeats: int, calls: int, device: torch.device) -> float:
    """Median over ``repeats`` blocks of ``calls`` calls of one call's microseconds, after ``WARM_CALLS``."""
    for _ in range(WARM_CALLS):
        call()
    blocks = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            call()
        if device.type == "cuda":
            torch.cuda.synchronize()
        blocks.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(blocks)


class _Floor(torch.autograd.Function):
    """An op that only allocates its outputs: what any eager autograd op pays on the host, kernels aside."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, weight = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(weight)


def floor_op(x: torch.Tensor, weight: torch.Tensor, **_options) -> torch.Tensor:
    """The floor: an autograd Function that checks and launches nothing, called as the ops are."""
    return _Floor.apply(x, weight)


def chained(op: Callable, n: int) -> Callable:
    """op applied n times in a row, each call's output the next one's x: one graph of n nodes, whose backward
    autograd starts (and, on CUDA, hands to its device thread) once. Against one call, what an op adds inside a
    model's backward, where that start is shared by every layer."""

    def run(x: torch.Tensor, **inputs) -> torch.Tensor:
        for _ in range(n):
            x = op(x, **inputs)
        return x

    return run


def op_pieces(ops: list[BenchKernel]) -> dict[str, Callable[[], object]]:
    """Each op's pieces below the public op, and the static op's below its launchers: name -> a call. ``ops``:
    ``bench_kernels`` at (B, T, D, W), the static op first."""
    pieces = {}
    gen = torch.Generator(device=ops[0].inputs["x"].device).manual_seed(2)
    for k in ops:
        op, args = TRITON_OPS[k.kind], tuple(k.inputs.values())
        dy = torch.randn(k.inputs["x"].shape, generator=gen, device=gen.device)
        n_fwd, n_bwd = LAUNCHES[k.kind]
        pieces[f"{k.name}: raw forward launcher ({n_fwd} launch)"] = lambda op=op, a=args: op.fwd(*a, None, True)
        pieces[f"{k.name}: raw backward launcher ({n_bwd} launches)"] = (
            lambda op=op, a=args, dy=dy: op.bwd(dy, *a, None, True))
        # the op's autograd Function called directly (no input checks, no backend choice): against the public
        # op's row it prices those; against the floor plus the two launchers, what autograd adds around them
        # (on CUDA the backward runs on autograd's device thread, the floor's too)
        direct = lambda op=op, **inputs: op.function.apply(*inputs.values(), None, True)  # noqa: E731
        pieces[f"{k.name}: its autograd Function alone, fwd+bwd"] = fwd_bwd_call(direct, k.inputs, dy)
    x, weight = ops[0].inputs["x"], ops[0].inputs["weight"]
    tiled = short_triton.CONFIGS["fwd", "tiled"]
    BT, BD = tu.tiles(T, D, tiled.BT, tiled.BD)
    y = torch.empty_like(x)
    grid = (tu.cdiv(T, BT), tu.cdiv(D, BD), B)
    partial = torch.zeros(8, W, D, device=x.device)

    # Triton's launcher alone (arguments bound, the compiled kernel found and launched), on the tiled forward
    # kernel: its cost is the launcher's, whichever form the op runs
    def bare_launch() -> None:
        short_triton._short_conv_fwd_kernel[grid](
            x, weight, y, None, T, D, B, 0, 0, W=W, BT=BT, BD=BD, HAS_CU=False, RESIDUAL=True,
            num_warps=tiled.warps,
        )

    pieces["static: one bare launch of the tiled forward kernel"] = bare_launch
    pieces["static: sum of dw's partials (one launch)"] = lambda: tu.sum_partials(partial, weight.dtype)
    return pieces


@contextlib.contextmanager
def launches_skipped() -> Iterator[None]:
    """Within it every Triton launch (compiled or interpreted) returns at once: what remains of a call is the host's
    work before the launch."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    saved = JITFunction.run, InterpretedFunction.run
    JITFunction.run = InterpretedFunction.run = lambda self, *args, **kwargs: None
    try:
        yield
    finally:
        JITFunction.run, InterpretedFunction.run = saved


def host_overhead(device: Literal["cpu", "cuda"] = "cpu", *, repeats: int = 15, calls: int = 200) -> str:
    """Markdown: host µs a call of each short conv's public op (fwd, fwd+bwd, fwd+bwd chained) and the floor, then
    of each op's pieces; on the CPU with every launch skipped (module docstring)."""
    check("device", device, Literal["cpu", "cuda"])
    check("repeats", repeats, PositiveInt)
    check("calls", calls, PositiveInt)
    if not HAS_TRITON:
        raise ValueError("bench profile host times the ops' Triton path, which needs the triton package")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("bench profile host --device cuda needs a CUDA GPU, and torch sees no CUDA device here")
    if dev.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("bench profile host on the CPU needs the Triton interpreter's kernels for the ops to take "
                         "CPU tensors: set TRITON_INTERPRET=1 before mixlab starts (the launches are skipped)")
    machine = "launches made" if dev.type == "cuda" else "launches skipped"
    lines = [
        f"# Host time of the short convs' eager ops, {datetime.date.today().isoformat()}",
        "",
        device_line(dev, f"; {machine}", cpu_name="CPU"),
        f"- host: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}",
        f"- B={B} T={T} D={D} W={W} fp32 {dev.type} tensors, residual on; median of {repeats} blocks of {calls} "
        "calls",
        "",
        f"| op | fwd µs | fwd+bwd µs | fwd+bwd µs an op, {CHAIN} chained |",
        "|---|---|---|---|",
    ]
    with launches_skipped() if dev.type == "cpu" else contextlib.nullcontext():
        ops = bench_kernels(B, T, D, W, torch.float32, dev)
        static = next(k for k in ops if k.key == "static")
        floor = (floor_op, {"x": static.inputs["x"], "weight": static.inputs["weight"]}, {},
                 "floor: an autograd Function that only allocates its outputs")
        cases = [(k.op, k.inputs, {"residual": True, "backend": "triton"}, k.name) for k in ops] + [floor]
        gen = torch.Generator(device=dev).manual_seed(1)
        for op, inputs, options, name in cases:
            dy = torch.randn(inputs["x"].shape, generator=gen, device=dev)
            fwd = median_us(fwd_call(op, inputs, **options), repeats, calls, dev)
            total = median_us(fwd_bwd_call(op, inputs, dy, **options), repeats, calls, dev)
            chain = median_us(fwd_bwd_call(chained(op, CHAIN), inputs, dy, **options), repeats,
                              max(1, calls // CHAIN), dev)
            lines.append(f"| {name} | {fwd:.1f} | {total:.1f} | {chain / CHAIN:.1f} |")
        lines += ["", "| piece | µs a call |", "|---|---|"]
        for name, call in op_pieces(ops).items():
            lines.append(f"| {name} | {median_us(call, repeats, calls, dev):.1f} |")
    return "\n".join(lines)
