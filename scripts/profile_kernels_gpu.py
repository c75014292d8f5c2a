"""Profile the Triton kernels on a CUDA GPU at their benchmark shapes, two ways.

    PYTHONPATH=scripts python3 scripts/profile_kernels_gpu.py ops [--kernels static,hs1,hs16,lowrank] [--calls 20]
    ncu --clock-control none --profile-from-start off --nvtx --section SpeedOfLight --section Occupancy \
        --section LaunchStats --csv python3 scripts/profile_kernels_gpu.py ncu [--ops shortconv,attention] > ncu.csv

``ops``: where an eager call of a short conv's public op spends its time. At ``mixlab bench shortconv``'s shape
(B=4, T=4096, D=2048, W=4 by default, bf16, residual; without and with ``--n-docs`` documents) each op's eager
forward+backward (``autograd.grad`` of the public op) is called ``--calls`` times under torch.profiler after a
warm-up. Per call: the wall time (synchronised at both ends of the window), the GPU's busy time (the union of its
kernels' and copies' intervals), the kernels and copies the GPU ran, split by launch, and the host's runtime calls
that wait for the device; then the host ops by self CPU time.

``ncu``: every kernel launched once for Nsight Compute, which says what bounds each (registers, achieved occupancy,
memory and compute throughput against the peaks) where timings cannot:
- shortconv: static, head-wise head sizes 1 and 16, low-rank R=16 (``bench shortconv``'s inputs), forward and
  backward through the public ops, without and with ``--n-docs`` documents.
- attention: the tiny-head kernels' launchers at a stack of MAD runs as the engine folds it (2,304 sequences, 16
  heads of 8, bf16, [B, T, H, hd] layout) at T=127 and T=1023, forward, then backward.
- rubiconv: the Triton backend at ``bench rubiconv``'s shape (one row of 65,536 tokens in 49 lognormal documents,
  D=1024), fp32 and bf16 activations at precision fp32 (tf32 dots), then bf16 activations at precision bf16,
  forward and forward+backward.
Every call runs twice unprofiled (compilation, caches), then once between ``cudaProfilerStart`` and
``cudaProfilerStop`` in an NVTX range named after it; the calls' order is printed first, so the CSV's kernels can
be told apart. Without ncu this is a dry run of the same launches.

Both need CUDA (exit 2 without).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import torch
from mixlab import kernels
from mixlab.kernels.attention import triton as attn
from mixlab.runners.bench.rubiconv import lognormal_layout
from mixlab.runners.bench.shortconv import DTYPES, KERNEL_KEYS, _doc_layout, _kernels
from mixlab.runners.bench.utils import fwd_bwd_call, fwd_call
from profile_engine_gpu import busy_seconds, kernel_table
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

ATTENTION = (18 * 128, 16, 8, (127, 1023))  # sequences, heads, head size, lengths: a stack of 18 MAD runs
# runtime calls that make the host wait for the device (or for the copy they start)
WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "cudaMemcpyAsync", "cudaEventSynchronize")


def shortconv_calls(args: argparse.Namespace, device: torch.device,
                    only: tuple[str, ...] = KERNEL_KEYS) -> list[tuple[str, Callable]]:
    """(label, eager forward+backward of the public op) of each kernel, without and with documents."""
    B, T, dtype = args.batch, args.seq_len, DTYPES[args.dtype]
    gen = torch.Generator(device=device).manual_seed(1)
    upstream = torch.randn(B, T, args.dim, generator=gen, device=device).to(dtype)
    cases = [(None, "no documents"), (_doc_layout(B, T, args.n_docs, device), f"{args.n_docs} documents")]
    return [(f"{k.name} | {label} | fwd+bwd",
             fwd_bwd_call(k.op, k.inputs, upstream, cu_seqlens=cu, residual=True, backend="triton"))
            for k in _kernels(B, T, args.dim, args.width, dtype, device) if k.key in only for cu, label in cases]


def attention_calls(device: torch.device) -> list[tuple[str, Callable]]:
    B, H, hd, lengths = ATTENTION
    gen = torch.Generator(device=device).manual_seed(2)
    scale = hd**-0.5
    calls = []
    for T in lengths:
        q, k, v, do = (torch.randn(B, T, H, hd, generator=gen, device=device).to(torch.bfloat16).transpose(1, 2)
                       for _ in range(4))
        o, lse = attn._attention_fwd(q, k, v, scale)
        calls.append((f"attention T={T} | fwd", lambda q=q, k=k, v=v: attn._attention_fwd(q, k, v, scale)))
        calls.append((f"attention T={T} | bwd",
                      lambda q=q, k=k, v=v, do=do, o=o, lse=lse: attn._attention_bwd(do, q, k, v, o, lse, scale)))
    return calls


def rubiconv_calls(device: torch.device) -> list[tuple[str, Callable]]:
    n_tokens, d = 65536, 1024
    cu = lognormal_layout(n_tokens, 0, device)
    gen = torch.Generator(device=device).manual_seed(3)
    x = torch.randn(1, n_tokens, d, generator=gen, device=device)
    h = torch.randn(d, n_tokens, generator=gen, device=device) / n_tokens**0.5
    upstream = torch.randn(1, n_tokens, d, generator=gen, device=device)
    calls = []
    for dtype, precision in ((torch.float32, "fp32"), (torch.bfloat16, "fp32"), (torch.bfloat16, "bf16")):
        inputs = {"x": x.to(dtype), "h": h.to(dtype)}
        name = f"rubiconv {str(dtype).removeprefix('torch.')} activations, precision {precision}"
        kwargs = {"cu_seqlens": cu, "backend": "triton", "precision": precision}
        calls.append((f"{name} | fwd", fwd_call(kernels.rubiconv, inputs, **kwargs)))
        calls.append((f"{name} | fwd+bwd", fwd_bwd_call(kernels.rubiconv, inputs, upstream.to(dtype), **kwargs)))
    return calls


def profile_calls(run: Callable, calls: int) -> tuple[float, list, list]:
    """(wall seconds, device events, host key averages) of ``calls`` calls of ``run`` after two unprofiled ones."""
    for _ in range(2):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    on_gpu = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    host = [e for e in prof.key_averages() if e.device_type == DeviceType.CPU]
    return wall, on_gpu, host


def ops(args: argparse.Namespace, device: torch.device) -> int:
    only = tuple(k.strip() for k in args.kernels.split(","))
    print(f"# {torch.cuda.get_device_name(device)}; torch {torch.__version__}; B={args.batch} T={args.seq_len} "
          f"D={args.dim} W={args.width} {args.dtype}, residual; {args.calls} calls of eager fwd+bwd")
    for label, run in shortconv_calls(args, device, only):
        wall, on_gpu, host = profile_calls(run, args.calls)
        busy = busy_seconds([(e.time_range.start, e.time_range.end) for e in on_gpu])
        waits = {e.key: e.count / args.calls for e in host if e.key in WAITS}
        print(f"\n## {label}: {wall / args.calls * 1e6:.1f} µs a call, GPU busy {busy / args.calls * 1e6:.1f} µs "
              f"({busy / wall:.0%}), {len(on_gpu) / args.calls:g} device events a call; waits a call: "
              f"{waits or 'none'}\n")
        print(kernel_table(on_gpu, args.rows, args.calls))
        host.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
        print("\n| host op | self CPU µs a call | calls a call |\n|---|---|---|")
        for e in host[: args.rows]:
            print(f"| `{e.key[:70]}` | {e.self_cpu_time_total / args.calls:.1f} | {e.count / args.calls:g} |")
    return 0


def ncu(args: argparse.Namespace, device: torch.device) -> int:
    groups = args.ops.split(",")
    unknown = sorted(set(groups) - {"shortconv", "attention", "rubiconv"})
    if unknown:
        print(f"unknown op group {unknown[0]!r}; choose from shortconv, attention, rubiconv", file=sys.stderr)
        return 2
    calls = ((shortconv_calls(args, device) if "shortconv" in groups else [])
             + (attention_calls(device) if "attention" in groups else [])
             + (rubiconv_calls(device) if "rubiconv" in groups else []))
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; short convs B={args.batch} "
          f"T={args.seq_len} D={args.dim} W={args.width} {args.dtype}; profiled calls in order:")
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["ops", "ncu"], help="torch.profiler of the short convs' eager ops, or a "
                        "run of every kernel once for Nsight Compute")
    parser.add_argument("--kernels", default=",".join(KERNEL_KEYS), help="ops: comma-separated short convs")
    parser.add_argument("--calls", type=int, default=20, help="ops: profiled calls of each op")
    parser.add_argument("--rows", type=int, default=12, help="ops: kernels and host ops listed")
    parser.add_argument("--ops", default="shortconv,attention", help="ncu: comma-separated: shortconv, attention, "
                        "rubiconv")
    parser.add_argument("--batch", type=int, default=4, help="short convs: rows")
    parser.add_argument("--seq-len", type=int, default=4096, help="short convs: tokens a row")
    parser.add_argument("--dim", type=int, default=2048, help="short convs: channels")
    parser.add_argument("--width", type=int, default=4, help="short convs: taps")
    parser.add_argument("--n-docs", type=int, default=64, help="short convs: documents of the packed case")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="short convs: activations")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    return {"ops": ops, "ncu": ncu}[args.mode](args, torch.device("cuda"))


if __name__ == "__main__":
    sys.exit(main())
