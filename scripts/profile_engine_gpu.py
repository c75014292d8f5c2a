"""Where a batched training step's GPU time goes: torch.profiler over the steady steps of a stack of runs.

    PYTHONPATH=. python scripts/profile_engine_gpu.py --n-runs 6 --steps 30 [--speed cuda-graph]
    PYTHONPATH=. python scripts/profile_engine_gpu.py --n-runs 18 --speed compile \
        --model-params '{"proj_bias": true}'        # the MAD profile's model

Trains ``n_runs`` runs of ``mixlab bench train``'s setting (MAD in-context recall unless ``--task``, the 2-block
attention model, bf16 autocast; ``--model-params`` / ``--task-params`` as bench train's) once to warm up
(compilation, graph capture), then again with the profiler recording only steps ``--skip`` to ``--steps`` (the
stack's setup, its first steps and the evaluation after the last step fall outside). Prints the window's wall
time per step (synchronised at its two ends), the GPU's busy time in it (the union of its kernels' and copies'
intervals, so nothing is counted twice) and their ratio: well under 1, the host's launches bound the step; then
the kernels by GPU time per step, and the host ops by self CPU time.
"""

from __future__ import annotations

import argparse
import json
import time
from unittest import mock

import torch
from mixlab.runners.bench.train import bench_runs
from mixlab.runners.train import engine
from mixlab.runners.train.engine import train_runs_batched
from mixlab.runners.train.speed import SPEEDS
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, schedule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-runs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--model", default="transformer")
    parser.add_argument("--speed", choices=SPEEDS, default="eager", help="how the stack steps (runners.train.speed)")
    parser.add_argument("--rows", type=int, default=25, help="kernels listed")
    parser.add_argument("--task", default="mad/in_context_recall")
    parser.add_argument("--model-params", type=json.loads, default={}, help="ModelConfig fields, JSON")
    parser.add_argument("--task-params", type=json.loads, default={}, help="task parameters, JSON")
    parser.add_argument("--num-test", type=int, default=128, help="test rows of the runs (evaluated once, unprofiled)")
    parser.add_argument("--skip", type=int, default=5, help="steps before the profiled window")
    args = parser.parse_args()
    if not 0 <= args.skip < args.steps:
        parser.error(f"--skip must be in [0, --steps={args.steps}), got {args.skip}")
    # one epoch longer than the steps, so the only evaluation is the final one, after the window
    runs = bench_runs(args.task, args.model, args.n_runs, args.steps, "cuda",
                      model_params=args.model_params, task_params=args.task_params,
                      num_train=128 * (args.steps + 1), num_test=args.num_test)
    train_runs_batched(runs, progress=False, speed=args.speed)
    torch.cuda.synchronize()
    window = args.steps - args.skip
    clock: list[float] = []
    step = engine._Stack.step

    def profiled_step(stack, *a, **kw):
        if len(clock) == 0 and prof.step_num == args.skip:  # the window opens with this step
            torch.cuda.synchronize()
            clock.append(time.perf_counter())
        step(stack, *a, **kw)
        prof.step()
        if prof.step_num == args.skip + window:  # and closes after it
            torch.cuda.synchronize()
            clock.append(time.perf_counter())

    recorder = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                       schedule=schedule(wait=args.skip, warmup=0, active=window, repeat=1))
    with recorder as prof, mock.patch.object(engine._Stack, "step", profiled_step):
        train_runs_batched(runs, progress=False, speed=args.speed)
    wall = clock[1] - clock[0]
    on_gpu = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    busy_s = busy_seconds([(e.time_range.start, e.time_range.end) for e in on_gpu])
    print(f"{args.n_runs} runs, steps {args.skip}-{args.steps} of {args.steps}, speed {args.speed}: "
          f"{wall / window * 1e3:.2f} ms a step, GPU busy {busy_s / window * 1e3:.2f} ms a step "
          f"({busy_s / wall:.0%} of the wall)")
    print()
    print(kernel_table(on_gpu, args.rows, window))
    print()
    host = [e for e in prof.key_averages() if e.device_type == DeviceType.CPU]
    host.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    print("| host op | self CPU ms a step | calls a step |")
    print("|---|---|---|")
    for e in host[: args.rows]:
        print(f"| `{e.key[:70]}` | {e.self_cpu_time_total / 1e3 / window:.3f} | {e.count / window:g} |")


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals given in microseconds, in seconds."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total / 1e6


def kernel_table(on_gpu: list, rows: int, steps: int) -> str:
    """Markdown: the GPU's kernels and copies by total time, per step of the ``steps`` profiled."""
    totals: dict[str, list[float]] = {}
    for e in on_gpu:
        entry = totals.setdefault(e.name, [0.0, 0])
        entry[0] += e.time_range.end - e.time_range.start
        entry[1] += 1
    whole = sum(t for t, _ in totals.values()) or 1.0
    lines = ["| kernel | us a step | share | calls a step | mean us |", "|---|---|---|---|---|"]
    for name, (t, n) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:rows]:
        lines.append(f"| `{name[:70]}` | {t / steps:.1f} | {t / whole:.1%} | {n / steps:g} | {t / n:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
