"""Host time of the short convs' public ops, kernels not launched: what a call costs the CPU before the GPU works.

    python scripts/host_overhead.py [--repeats 15] [--calls 200]

Each op (static, head-wise head sizes 1 and 16, low-rank R=16) is called through ``mixlab.kernels`` with
``backend="triton"``, forward under no_grad and forward+backward through autograd (``runners.bench_utils``), on
small CPU tensors (B=1, T=64, D=64, W=4, fp32) with every Triton launch replaced by a no-op: input checks, backend
choice, the autograd Function, allocations, launch-size arithmetic and the autograd engine remain. On the GPU
these microseconds are paid per call on the host, so a kernel shorter than them leaves the GPU idle in eager code
(compiled graphs and CUDA graphs do not pay them). Medians over ``repeats`` blocks of ``calls`` calls.
"""

import argparse
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # on a CPU the ops need the interpreter's kernels to dispatch

import torch  # noqa: E402
import triton  # noqa: E402
from mixlab.runners.bench_shortconv import _kernels  # noqa: E402
from mixlab.runners.bench_utils import fwd_bwd_call, fwd_call  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402


def _median_us(call, repeats: int, calls: int) -> float:
    for _ in range(20):  # warm caches
        call()
    blocks = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        blocks.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(blocks)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15, help="blocks timed; the median is printed")
    parser.add_argument("--calls", type=int, default=200, help="calls per block")
    args = parser.parse_args()
    JITFunction.run = InterpretedFunction.run = lambda self, *a, **k: None  # every launch a no-op
    print(f"# host time per call, launches skipped; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}, "
          f"Triton {triton.__version__}")
    print(f"# B=1 T=64 D=64 W=4 fp32 CPU tensors, residual on; median of {args.repeats} blocks of {args.calls}")
    print("| op | fwd µs | fwd+bwd µs |")
    print("|---|---|---|")
    # bench shortconv's ops and inputs, at a size where the kernels' own cost would not matter anyway
    for k in _kernels(1, 64, 64, 4, torch.float32, torch.device("cpu")):
        dy = torch.randn_like(k.inputs["x"])
        fwd = _median_us(fwd_call(k.op, k.inputs, residual=True, backend="triton"), args.repeats, args.calls)
        total = _median_us(fwd_bwd_call(k.op, k.inputs, dy, residual=True, backend="triton"), args.repeats,
                           args.calls)
        print(f"| {k.name} | {fwd:.1f} | {total:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
