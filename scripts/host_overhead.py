"""Host time of the short convs' public ops: what a call costs the CPU before (or while) the GPU works.

    python scripts/host_overhead.py [--repeats 15] [--calls 200]                  # CPU, launches skipped
    python scripts/host_overhead.py --device cuda [--repeats 15] [--calls 200]    # GPU, launches made

Each op (static, head-wise head sizes 1 and 16, low-rank R=16) is called through ``mixlab.kernels`` with
``backend="triton"``, forward under no_grad and forward+backward through autograd (``runners.bench.utils``), on
small tensors (B=1, T=64, D=64, W=4, fp32). On the CPU every Triton launch is replaced by a no-op: input checks,
backend choice, the autograd Function, allocations, launch-size arithmetic and the autograd engine remain. On
CUDA the launches are made: the kernels take a few microseconds at this size, so a block of calls is bound by the
host and its time per call is the host's. A last row times the same calls through an autograd Function that only
allocates its outputs: the floor that autograd itself sets under any eager op. A last column chains 8 calls in
one graph and gives the time per call: autograd starts a backward (on CUDA, hands it to its device thread) once
per graph, so that column is what an op costs inside a model's backward. Every op is then taken apart: its
raw forward and backward launchers (``TritonOp.fwd`` and ``.bwd``: argument handling, allocations, launches, no
autograd), its autograd Function called without the public op's checks, and for the static op one bare launch of
its forward kernel through Triton's launcher and the sum of dw's partials. Together they split an op's host time
into autograd's, the lab's Python and Triton's (on the CPU the launches in those pieces are no-ops too). On the
GPU these microseconds are paid per eager call, so a kernel shorter than them leaves the GPU idle (compiled
graphs and CUDA graphs do not pay them). Medians over ``repeats`` blocks of ``calls`` calls (each CUDA block
ends with a synchronize).
"""

import argparse
import os
import platform
import statistics
import sys
import time


def _device_arg(argv: list[str]) -> str:
    """--device's value before argparse runs: the interpreter must be chosen before Triton is imported."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--device", default="cpu")
    return parser.parse_known_args(argv)[0].device


if _device_arg(sys.argv[1:]) == "cpu":  # on a CPU the ops need the interpreter's kernels to dispatch
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402
from mixlab.kernels import triton_utils as tu  # noqa: E402
from mixlab.kernels.dynamic_conv.triton_headwise import headwise_triton  # noqa: E402
from mixlab.kernels.dynamic_conv.triton_lowrank import lowrank_triton  # noqa: E402
from mixlab.kernels.short_conv import triton as short_triton  # noqa: E402
from mixlab.runners.bench.shortconv import _kernels  # noqa: E402
from mixlab.runners.bench.utils import fwd_bwd_call, fwd_call  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

B, T, D, W = 1, 64, 64, 4
CHAIN = 8  # ops in one graph for the per-op column


def _median_us(call, repeats: int, calls: int, device: torch.device) -> float:
    for _ in range(20):  # warm caches (and compile, on CUDA)
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


def _floor_op(x: torch.Tensor, weight: torch.Tensor, **_kwargs) -> torch.Tensor:
    return _Floor.apply(x, weight)


def _chained(op, n: int):
    """op applied n times in a row, each call's output the next one's x: one graph of n nodes, whose backward
    autograd starts (and, on CUDA, hands to its device thread) once. Against one call, what an op adds inside a
    model's backward, where that start is shared by every layer."""

    def run(x: torch.Tensor, **inputs) -> torch.Tensor:
        for _ in range(n):
            x = op(x, **inputs)
        return x

    return run


# each bench kernel's TritonOp: its raw launchers, below the public op's checks and autograd
_OPS = {"static": short_triton.short_conv_triton, "headwise": headwise_triton, "lowrank": lowrank_triton}
# launches each raw launcher makes with a static weight: the backward's kernels, then one sum of fp32 partials per
# weight gradient (low-rank: dx and dz, dU, then the sums of dz, dU and dstatic_w)
_LAUNCHES = {"static": (1, 2), "headwise": (1, 2), "lowrank": (1, 5)}


def _parts(kernels: list) -> dict:
    """Each op's pieces below the public op, and the static op's below its launchers: name -> a call."""
    parts = {}
    for k in kernels:
        op, args = _OPS[k.kind], tuple(k.inputs.values())
        dy = torch.randn_like(k.inputs["x"])
        n_fwd, n_bwd = _LAUNCHES[k.kind]
        parts[f"{k.name}: raw forward launcher ({n_fwd} launch)"] = lambda op=op, a=args: op.fwd(*a, None, True)
        parts[f"{k.name}: raw backward launcher ({n_bwd} launches)"] = (
            lambda op=op, a=args, dy=dy: op.bwd(dy, *a, None, True))
        # the op's autograd Function called directly (no input checks, no backend choice): against the public
        # op's row it prices those; against the floor plus the two launchers, what autograd adds around them
        # (on CUDA the backward runs on autograd's device thread, the floor's too)
        direct = lambda op=op, **inputs: op.function.apply(*inputs.values(), None, True)  # noqa: E731
        parts[f"{k.name}: its autograd Function alone, fwd+bwd"] = fwd_bwd_call(direct, k.inputs, dy)
    x, weight = kernels[0].inputs["x"], kernels[0].inputs["weight"]  # the static op's
    tiled = short_triton.CONFIGS["fwd", "tiled"]
    BT, BD = tu.tiles(T, D, tiled.BT, tiled.BD)
    y = torch.empty_like(x)
    grid = (tu.cdiv(T, BT), tu.cdiv(D, BD), B)
    partial = torch.zeros(8, W, D, device=x.device)

    # Triton's launcher alone (arguments bound, the compiled kernel found and launched), on the tiled forward
    # kernel: its cost is the launcher's, whichever form the op runs
    def bare_launch():
        short_triton._short_conv_fwd_kernel[grid](
            x, weight, y, None, T, D, B, 0, 0, W=W, BT=BT, BD=BD, HAS_CU=False, RESIDUAL=True,
            num_warps=tiled.warps,
        )

    parts["static: one bare launch of the tiled forward kernel"] = bare_launch
    parts["static: sum of dw's partials (one launch)"] = lambda: tu.sum_partials(partial, weight.dtype)
    return parts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15, help="blocks timed; the median is printed")
    parser.add_argument("--calls", type=int, default=200, help="calls per block")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: launches skipped (the interpreter's kernels); cuda: launches made")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("host_overhead: --device cuda needs a CUDA device", file=sys.stderr)
        return 2
    if device.type == "cpu":
        JITFunction.run = InterpretedFunction.run = lambda self, *a, **k: None  # every launch a no-op
    machine = torch.cuda.get_device_name() if device.type == "cuda" else "launches skipped"
    print(f"# host time per call; {machine}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, torch {torch.__version__}, Triton {triton.__version__}")
    print(f"# B={B} T={T} D={D} W={W} fp32 {device.type} tensors, residual on; median of {args.repeats} blocks "
          f"of {args.calls}")
    print(f"| op | fwd µs | fwd+bwd µs | fwd+bwd µs an op, {CHAIN} chained |")
    print("|---|---|---|---|")
    # bench shortconv's ops and inputs, at a size where the kernels' own cost would not matter anyway
    kernels = _kernels(B, T, D, W, torch.float32, device)
    # the same calls through an autograd Function that launches nothing and checks nothing: the floor under them
    static = next(k for k in kernels if k.key == "static")
    floor = (_floor_op, {"x": static.inputs["x"], "weight": static.inputs["weight"]}, {},
             "floor: an autograd Function that only allocates its outputs")
    for op, inputs, kwargs, name in [(k.op, k.inputs, {"residual": True, "backend": "triton"}, k.name)
                                     for k in kernels] + [floor]:
        dy = torch.randn_like(inputs["x"])
        fwd = _median_us(fwd_call(op, inputs, **kwargs), args.repeats, args.calls, device)
        total = _median_us(fwd_bwd_call(op, inputs, dy, **kwargs), args.repeats, args.calls, device)
        chain = _median_us(fwd_bwd_call(_chained(op, CHAIN), inputs, dy, **kwargs), args.repeats,
                           max(1, args.calls // CHAIN), device)
        print(f"| {name} | {fwd:.1f} | {total:.1f} | {chain / CHAIN:.1f} |")
    print("\n| piece | µs a call |")
    print("|---|---|")
    for name, call in _parts(kernels).items():
        print(f"| {name} | {_median_us(call, args.repeats, args.calls, device):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
