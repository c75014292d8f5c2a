"""Where a batched training step's GPU time goes: torch.profiler over the engine training a stack of runs.

    PYTHONPATH=. python scripts/profile_engine_gpu.py --n-runs 6 --steps 30 [--speed cuda-graph]
    PYTHONPATH=. python scripts/profile_engine_gpu.py --n-runs 18 --speed compile \
        --model-params '{"proj_bias": true, "init": "torch_linear"}'        # the MAD profile's model

Trains ``n_runs`` runs of ``mixlab bench train``'s setting (MAD in-context recall unless ``--task``, the 2-block
attention model, bf16 autocast; ``--model-params`` / ``--task-params`` as bench train's) once to warm up, then
again under the profiler. Prints the profiled wall time, the GPU's busy time (the union of its kernels' and
copies' intervals, so nothing is counted twice) and their ratio: well under 1, the host's launches bound the
step; then the kernels by total GPU time, and the host ops by self CPU time. The one evaluation inside the
profile (after the last step) is of ``--num-test`` rows.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from mixlab.runners.bench_train import bench_configs
from mixlab.runners.engine import train_runs_batched
from mixlab.runners.speed import SPEEDS
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-runs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--model", default="transformer")
    parser.add_argument("--speed", choices=SPEEDS, default="eager", help="how the stack steps (runners.speed)")
    parser.add_argument("--rows", type=int, default=25, help="kernels listed")
    parser.add_argument("--task", default="mad/in_context_recall")
    parser.add_argument("--model-params", type=json.loads, default={}, help="ModelConfig fields, JSON")
    parser.add_argument("--task-params", type=json.loads, default={}, help="task parameters, JSON")
    parser.add_argument("--num-test", type=int, default=128, help="rows of the evaluation inside the profile")
    args = parser.parse_args()
    # one epoch longer than the steps, so no evaluation but the final one falls inside the profile
    configs = bench_configs(args.task, args.model, args.n_runs, args.steps, "cuda",
                            model_params=args.model_params, task_params=args.task_params,
                            num_train=128 * (args.steps + 1), num_test=args.num_test)
    train_runs_batched(configs, progress=False, speed=args.speed)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        train_runs_batched(configs, progress=False, speed=args.speed)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    on_gpu = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    busy_s = busy_seconds([(e.time_range.start, e.time_range.end) for e in on_gpu])
    print(f"{args.n_runs} runs x {args.steps} steps, speed {args.speed}: wall {wall:.2f} s (profiled), "
          f"GPU busy {busy_s:.3f} s ({busy_s / wall:.0%} of the wall), {wall / args.steps * 1e3:.1f} ms a step")
    print()
    print(kernel_table(on_gpu, args.rows))
    print()
    host = [e for e in prof.key_averages() if e.device_type == DeviceType.CPU]
    host.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    print("| host op | self CPU ms | calls |")
    print("|---|---|---|")
    for e in host[: args.rows]:
        print(f"| `{e.key[:70]}` | {e.self_cpu_time_total / 1e3:.2f} | {e.count} |")


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals given in microseconds, in seconds."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total / 1e6


def kernel_table(on_gpu: list, rows: int) -> str:
    """Markdown: the GPU's kernels and copies by total time, with calls and mean duration."""
    totals: dict[str, list[float]] = {}
    for e in on_gpu:
        entry = totals.setdefault(e.name, [0.0, 0])
        entry[0] += e.time_range.end - e.time_range.start
        entry[1] += 1
    whole = sum(t for t, _ in totals.values()) or 1.0
    lines = ["| kernel | total ms | share | calls | mean us |", "|---|---|---|---|---|"]
    for name, (t, n) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:rows]:
        lines.append(f"| `{name[:70]}` | {t / 1e3:.2f} | {t / whole:.1%} | {n} | {t / n:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
