"""Which way of running attention under vmap trains a stack of runs fastest on the GPU, within the gate.

For each mode of ``runners.train.engine.VMAP_ATTENTION`` ("fold", "math", "native"), prints ``mixlab bench train``'s
table (one run at a time against the batched engine, eager and CUDA-graphed) for stacks of the given sizes.
A mode whose runs disagree with one-at-a-time training is marked FAILED by the table's gate. GPU only:

    PYTHONPATH=. python scripts/probe_vmap_attention.py --modes fold,math --runs 6,24 --steps 200
"""

from __future__ import annotations

import argparse

import mixlab.runners.train.engine as engine
from mixlab.runners.bench.train import bench_train
from mixlab.runners.bench.utils import error_line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="fold,math,native")
    parser.add_argument("--runs", default="6,24", help="stack sizes, comma-separated")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--compile", action="store_true", help="also the compiled rows")
    args = parser.parse_args()
    for mode in args.modes.split(","):
        engine.VMAP_ATTENTION = mode
        for n_runs in (int(n) for n in args.runs.split(",")):
            print(f"## VMAP_ATTENTION={mode!r}, {n_runs} runs\n", flush=True)
            try:
                speeds = ["cuda-graph", "compile", "compile+graph"] if args.compile else ["cuda-graph"]
                print(bench_train(n_runs=n_runs, steps=args.steps, device="cuda", speeds=speeds), flush=True)
            except Exception as exc:  # a mode that crashes is a result of the probe, not the end of it
                print(f"FAILED: {error_line(exc)}\n",
                      flush=True)


if __name__ == "__main__":
    main()
