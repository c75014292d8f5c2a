"""How fast a run of a sweep trains alone on the GPU, and where its step's time goes.

    PYTHONPATH=. python scripts/profile_packed_gpu.py [--preset packed_rubiconv] [--steps 200] [--profile-steps 20]
    python scripts/profile_packed_gpu.py --preset packed_small --steps 5 --profile-steps 2 --device cpu  # a check

For each model of the preset (on its first task, seed 0), trains the preset's run for ``steps`` steps (one
evaluation, at the end) with ``runners.train.run.train_run`` as the sweep does, and prints its training steps per
second; then trains ``profile-steps`` more under torch.profiler and prints the step's wall time against the GPU's
busy time (a step far longer than its GPU time waits on the host: launches, host syncs) and the kernels by GPU
time. Only the length of training and the training-set size (``steps`` x batch rows, so data generation stays
short) differ from the preset's run.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch
from mixlab.runners.sweep.spec import load_spec
from mixlab.runners.train.config import RunConfig
from mixlab.runners.train.run import train_run
from torch.profiler import ProfilerActivity, profile


def shortened(config: RunConfig, steps: int) -> RunConfig:
    """The run with ``steps`` steps, one evaluation at the end, and just enough training rows."""
    train = dataclasses.replace(config.train, steps=steps, epochs=None, eval_every=steps, early_stop_acc=None,
                                num_train=steps * config.train.batch_size)
    return dataclasses.replace(config, train=train)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="packed_rubiconv")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--profile-steps", type=int, default=20)
    parser.add_argument("--rows", type=int, default=15, help="kernels listed per model")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu to check the script itself")
    args = parser.parse_args()
    plan = load_spec(args.preset).plan(device=args.device)
    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    first_task = plan.runs[0].meta["task"]
    chosen = {}
    for run in plan.runs:  # the first run of each model on the first task, seed 0
        if run.meta["task"] == first_task and run.meta["seed"] == 0:
            chosen.setdefault(run.meta["model"], run)
    where = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"{where}; torch {torch.__version__}; preset {args.preset}, task {first_task}")
    for name, run in chosen.items():
        record = train_run(shortened(run.config, args.steps), progress=False)
        config = shortened(run.config, args.profile_steps)
        sync()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            train_run(config, progress=False)
            sync()
            wall = time.perf_counter() - start
        events = prof.key_averages()
        gpu_s = sum(e.self_device_time_total for e in events) / 1e6
        print(f"\n## {name}: {record['steps_per_s']:.1f} steps/s alone ({args.steps} steps, "
              f"{1e3 / record['steps_per_s']:.1f} ms a step); profiled {args.profile_steps} steps with data and "
              f"one evaluation: wall {wall:.2f} s, GPU busy {gpu_s:.2f} s")
        order = "self_device_time_total" if cuda else "self_cpu_time_total"
        print(events.table(sort_by=order, row_limit=args.rows, max_name_column_width=60))


if __name__ == "__main__":
    main()
