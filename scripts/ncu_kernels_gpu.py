"""Launch the Triton kernels once each, at their benchmark shapes, for Nsight Compute to profile.

    ncu --clock-control none --profile-from-start off --nvtx --section SpeedOfLight --section Occupancy \
        --section LaunchStats --csv python3 scripts/ncu_kernels_gpu.py [--ops shortconv,attention] > ncu.csv

What bounds each kernel (registers, achieved occupancy, achieved memory and compute throughput against the
peaks) is what the timings of ``mixlab bench shortconv`` and ``scripts/tune_attention_gpu.py`` cannot say.

- shortconv: static, head-wise head sizes 1 and 16, low-rank R=16 (``mixlab bench shortconv``'s inputs, B=4,
  T=4096, D=2048, W=4 by default), forward and backward through the public ops, without and with ``--n-docs``
  documents.
- attention: the tiny-head kernels' launchers at a stack of MAD runs as the engine folds it (2,304 sequences,
  16 heads of 8, bf16, [B, T, H, hd] layout) at T=127 and T=1023, forward, then backward with the shipped
  ``BWD_PASSES``.
- rubiconv: the Triton backend at ``mixlab bench rubiconv``'s shape (one row of 65,536 tokens in 49 lognormal
  documents, D=1024), fp32 and bf16 activations at precision fp32 (tf32 dots), then bf16 activations at
  precision bf16 (``bench rubiconv``'s "triton bf16" rows), forward and forward+backward.

Every call runs twice unprofiled (compilation, caches), then once between ``cudaProfilerStart`` and
``cudaProfilerStop`` in an NVTX range named after it (``ncu --nvtx`` prints the range); the calls' order is
printed first, so the CSV's kernels can be told apart. Without ncu the script is a dry run of the same
launches (exit 0). Needs CUDA (exit 2 without).
"""

import argparse
import sys
from collections.abc import Callable

import torch
from mixlab import kernels
from mixlab.kernels.attention import triton as attn
from mixlab.runners.bench.rubiconv import lognormal_layout
from mixlab.runners.bench.shortconv import DTYPES, _doc_layout, _kernels
from mixlab.runners.bench.utils import fwd_bwd_call, fwd_call

ATTENTION = (18 * 128, 16, 8, (127, 1023))  # sequences, heads, head size, lengths: a stack of 18 MAD runs


def shortconv_calls(args: argparse.Namespace, device: torch.device) -> list[tuple[str, Callable]]:
    B, T, dtype = args.batch, args.seq_len, DTYPES[args.dtype]
    gen = torch.Generator(device=device).manual_seed(1)
    upstream = torch.randn(B, T, args.dim, generator=gen, device=device).to(dtype)
    cases = [(None, "no documents"), (_doc_layout(B, T, args.n_docs, device), f"{args.n_docs} documents")]
    return [(f"{k.name} | {label} | fwd+bwd",
             fwd_bwd_call(k.op, k.inputs, upstream, cu_seqlens=cu, residual=True, backend="triton"))
            for k in _kernels(B, T, args.dim, args.width, dtype, device) for cu, label in cases]


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
        calls.append((f"attention T={T} | bwd, {attn.BWD_PASSES} pass(es)",
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="shortconv,attention", help="comma-separated: shortconv, attention, rubiconv")
    parser.add_argument("--batch", type=int, default=4, help="short convs: rows")
    parser.add_argument("--seq-len", type=int, default=4096, help="short convs: tokens a row")
    parser.add_argument("--dim", type=int, default=2048, help="short convs: channels")
    parser.add_argument("--width", type=int, default=4, help="short convs: taps")
    parser.add_argument("--n-docs", type=int, default=64, help="short convs: documents of the packed case")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="short convs: activations")
    args = parser.parse_args()
    ops = args.ops.split(",")
    unknown = sorted(set(ops) - {"shortconv", "attention", "rubiconv"})
    if unknown:
        print(f"unknown op group {unknown[0]!r}; choose from shortconv, attention, rubiconv", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    calls = ((shortconv_calls(args, device) if "shortconv" in ops else [])
             + (attention_calls(device) if "attention" in ops else [])
             + (rubiconv_calls(device) if "rubiconv" in ops else []))
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


if __name__ == "__main__":
    sys.exit(main())
