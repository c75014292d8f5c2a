"""Where a batched training step's GPU time goes: torch.profiler over the engine training a stack of runs.

    PYTHONPATH=. python scripts/profile_engine_gpu.py --n-runs 6 --steps 30 [--speed cuda-graph]
    PYTHONPATH=. python scripts/profile_engine_gpu.py --n-runs 18 --speed compile \
        --model-params '{"proj_bias": true, "init": "torch_linear"}'        # the MAD profile's model

Trains ``n_runs`` runs of ``mixlab bench train``'s setting (MAD in-context recall unless ``--task``, the 2-block
attention model, bf16 autocast; ``--model-params`` / ``--task-params`` as bench train's) once to warm up, then
again under the profiler; prints the kernels by total GPU time and the step's wall time split into GPU busy time
and the rest. The one evaluation inside the profile (after the last step) is of ``--num-test`` rows.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from mixlab.runners.bench_train import bench_configs
from mixlab.runners.engine import train_runs_batched
from mixlab.runners.speed import SPEEDS
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
    events = prof.key_averages()
    gpu_us = sum(e.self_device_time_total for e in events)
    print(f"{args.n_runs} runs x {args.steps} steps, speed {args.speed}: wall {wall:.2f} s "
          f"(profiled), GPU busy {gpu_us / 1e6:.2f} s, {wall / args.steps * 1e3:.1f} ms a step")
    print(events.table(sort_by="self_device_time_total", row_limit=args.rows, max_name_column_width=60))


if __name__ == "__main__":
    main()
