"""Where an eager call of a short-conv public op spends its time: torch.profiler over repeated forward+backward calls.

    PYTHONPATH=scripts python3 scripts/profile_shortconv_op_gpu.py [--kernels static,hs1,hs16,lowrank] [--calls 20]

`scripts/tune_shortconv_gpu.py`'s table shows the public ops' eager forward+backward far above their raw launchers
(static 577 against 49 + 140 µs on the H200, 2026-12-04). This says why: at the tune script's shape (B=4, T=4096,
D=2048, W=4, bf16, residual; without and with 64 documents) each op's eager forward+backward (``autograd.grad``
of the public op, as the tune script times it) is called ``--calls`` times under the profiler after a warm-up.
Per call it prints the wall time (synchronised at both ends of the window), the GPU's busy time (the union of its
kernels' and copies' intervals), the kernels and copies the GPU ran, and the host's runtime calls that wait for the
device (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, ``cudaMemcpy`` and ``cudaMemcpyAsync``: a device to
host read waits for the work queued before it); then the host ops by self CPU time. With ``--device cpu`` (Triton
interpreter, ``--small``) it runs the same code on CPU tensors, the GPU columns empty: a check of the script only.
"""

from __future__ import annotations

import argparse
import time

import torch
import tune_shortconv_gpu as tune
from profile_engine_gpu import busy_seconds, kernel_table
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

# runtime calls that make the host wait for the device (or for the copy they start)
WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "cudaMemcpyAsync", "cudaEventSynchronize")


def profile_calls(run, calls: int, device: torch.device) -> tuple[float, list, list]:
    """(wall seconds, device events, host key averages) of ``calls`` calls of ``run`` after two unprofiled ones."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(2):
        run()
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            run()
        sync()
        wall = time.perf_counter() - start
    on_gpu = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    host = [e for e in prof.key_averages() if e.device_type == DeviceType.CPU]
    return wall, on_gpu, host


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default="static,hs1,hs16,lowrank", help="comma-separated: static, hs<N>, lowrank")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--rows", type=int, default=12, help="kernels and host ops listed")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="B=1, T=64, D=32, 4 documents: a CPU check")
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.small:
        tune.B, tune.T, tune.D, tune.R, tune.N_DOCS = 1, 64, 32, 4, 4
    names = [n.strip() for n in args.kernels.split(",")]
    print(f"# {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}; torch {torch.__version__}; "
          f"B={tune.B} T={tune.T} D={tune.D} W={tune.W} bf16, residual; {args.calls} calls of eager fwd+bwd")
    for name in names:
        case = tune._Case(name, device)
        for cu, label in ((None, "no documents"), (case.cu, f"{tune.N_DOCS} documents")):
            wall, on_gpu, host = profile_calls(case.public(cu, True), args.calls, device)
            busy = busy_seconds([(e.time_range.start, e.time_range.end) for e in on_gpu])
            waits = {e.key: e.count / args.calls for e in host if e.key in WAITS}
            print(f"\n## {name}, {label}: {wall / args.calls * 1e6:.1f} µs a call, GPU busy "
                  f"{busy / args.calls * 1e6:.1f} µs ({busy / wall:.0%}), {len(on_gpu) / args.calls:g} device "
                  f"events a call; waits a call: {waits or 'none'}")
            if on_gpu:
                print()
                print(kernel_table(on_gpu, args.rows, args.calls))
            host.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
            print("\n| host op | self CPU µs a call | calls a call |\n|---|---|---|")
            for e in host[: args.rows]:
                print(f"| `{e.key[:70]}` | {e.self_cpu_time_total / args.calls:.1f} | {e.count / args.calls:g} |")


if __name__ == "__main__":
    main()
