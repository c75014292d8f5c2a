"""Launch every short-conv Triton kernel once, at the benchmark's shape, for Nsight Compute to profile.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section LaunchStats --csv python3 scripts/ncu_shortconv_gpu.py > ncu_shortconv.csv

What bounds each kernel (registers, achieved occupancy, achieved memory throughput against the peak) is what the
timings of ``mixlab bench shortconv`` cannot say. The ops (static, head-wise head sizes 1 and 16, low-rank R=16,
``mixlab bench shortconv``'s inputs) run forward and backward twice unprofiled (compilation, caches), then once
between ``cudaProfilerStart`` and ``cudaProfilerStop``, without and with ``--n-docs`` documents. Each profiled
call sits in an NVTX range named ``<op> | <docs> | fwd+bwd`` (``ncu --nvtx`` prints it) and the order of the
calls is printed first, so the CSV's kernels can be told apart. Without ncu it runs as a plain script (exit 0):
a dry run of the same launches. Needs CUDA (exit 2 without).
"""

import argparse
import sys

import torch
from mixlab.runners.bench_shortconv import DTYPES, _doc_layout, _kernels
from mixlab.runners.bench_utils import fwd_bwd_call


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=2048)
    parser.add_argument("--width", type=int, default=4)
    parser.add_argument("--n-docs", type=int, default=64)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    B, T = args.batch, args.seq_len
    gen = torch.Generator(device=device).manual_seed(1)
    upstream = torch.randn(B, T, args.dim, generator=gen, device=device).to(DTYPES[args.dtype])
    cases = [(None, "no documents"), (_doc_layout(B, T, args.n_docs, device), f"{args.n_docs} documents")]
    calls = [(f"{k.name} | {label} | fwd+bwd",
              fwd_bwd_call(k.op, k.inputs, upstream, cu_seqlens=cu, residual=True, backend="triton"))
             for k in _kernels(B, T, args.dim, args.width, DTYPES[args.dtype], device) for cu, label in cases]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; B={B} T={T} D={args.dim} W={args.width} "
          f"{args.dtype}; profiled calls in order:")
    for name, _ in calls:
        print(f"#   {name}")
    for _, call in calls:  # compile every kernel and fill the caches before profiling
        call()
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, call in calls:
        torch.cuda.nvtx.range_push(name)
        call()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
