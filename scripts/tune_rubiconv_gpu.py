"""Time candidate tile/warp/stage constants of RubiConv's three Triton kernels on a GPU (issue #25).

Usage, on the GPU box from the checkout (not yet run on a GPU: `--only` one group at a time keeps a call short):

    PYTHONPATH=. python scripts/tune_rubiconv_gpu.py --rounds 2
    PYTHONPATH=. python scripts/tune_rubiconv_gpu.py --only "spectrum" --set rubiconv.SAVE_SPECTRA=True

The row of ``mixlab bench rubiconv``: 65,536 tokens in lognormal documents (seed 0: 49 of them), D=1024, a
filter as long as the row, fp32 activations; one case per block k and precision (``--blocks``, ``--precisions``).
The candidates are groups of the module's constants, one group a kernel (``GROUPS``); the groups are tuned one
after the other, each at the best values of the groups before it (coordinate descent). A candidate's score is the
sum, over the cases, of the medians of its kernel's launches in one forward and backward, each launcher called
alone on inputs made once at the shipped constants (the other kernels' work is not timed again). Its error is
that of the whole op's y, dx and dh against the float64 torch backend, which must stay within the precision's
bound. Then the constants to set, and at the best constants every launch's time and the bytes it must move at
least (what it reads and writes once), as achieved bandwidth, beside the op's own fwd and fwd+bwd times.

``--device cpu`` (with ``TRITON_INTERPRET=1`` and tiny ``--tokens``/``--d``) runs the same steps in the
interpreter with wall-clock timings: a check of the script, not a measurement.
"""

import argparse
import math
import sys

import numpy as np
import torch
from mixlab import kernels
from mixlab.kernels.rubiconv import gemm
from mixlab.kernels.rubiconv import triton as rubi
from mixlab.kernels.rubiconv.naive import rubiconv_ref
from mixlab.runners.bench.rubiconv import BOUND, _grads, lognormal_layout
from mixlab.runners.bench.utils import median_time_ms, rel_rms
from tuning import set_constants, settle, use

# (group name, kernel it serves, constant names, candidate values); the first candidate of each group is what the
# repository ships. Every candidate compiled for sm_90a without spilling at k=64 and k=128, fp32 and bf16
# (scripts/kernel_resources.py, Triton 3.6, 2026-12-05; BENCHMARKS.md gives registers and shared memory).
GROUPS = [
    # [BC, BN] half columns x column values a program, BB document columns a dot
    ("block fwd", "_rubi_block_fwd_kernel", ("FWD_BC", "FWD_BB", "FWD_BN", "FWD_WARPS", "FWD_STAGES"),
     [(16, 16, 128, 4, 4), (32, 32, 128, 4, 3), (16, 32, 128, 4, 3), (32, 32, 64, 4, 3), (32, 16, 128, 4, 3),
      (32, 32, 128, 8, 3), (32, 32, 256, 8, 3), (64, 32, 128, 8, 3), (32, 32, 128, 4, 2)]),
    # frequency rows a chunk, inner dimension a dot, the inverse's accumulator cap, the filter's channels a
    # program, warps, stages; the last candidate takes all k rows in one chunk, so each program reads its column
    # of Z once instead of once a chunk (k / 16 times)
    ("spectrum", "_rubi_spectrum_kernel",
     ("SPECTRUM_ROWS", "SPECTRUM_INNER", "SPECTRUM_ACC", "SPECTRUM_WIDE", "SPECTRUM_WARPS", "SPECTRUM_STAGES"),
     [(16, 32, 4096, 128, 4, 3), (16, 32, 8192, 128, 8, 3), (16, 32, 4096, 128, 8, 3), (16, 16, 8192, 128, 8, 3),
      (32, 32, 8192, 128, 8, 3), (16, 32, 8192, 64, 8, 3), (16, 32, 8192, 128, 8, 2), (16, 64, 8192, 128, 8, 3),
      (16, 16, 4096, 128, 8, 2), (128, 32, 4096, 128, 8, 3)]),
    # the same stage's rows, accumulator cap and warps from block SPECTRUM_LARGE_K on (the group above then serves
    # the smaller blocks); at k=128 the last candidate takes all rows in one chunk
    ("spectrum large k", "_rubi_spectrum_kernel", ("SPECTRUM_LARGE_ROWS", "SPECTRUM_LARGE_ACC", "SPECTRUM_LARGE_WARPS"),
     [(32, 8192, 8), (16, 8192, 8), (16, 4096, 8), (16, 4096, 4), (128, 4096, 8)]),
    # [BB, BN] output columns x column values a program, BC half columns a dot
    ("block inv", "_rubi_block_inv_kernel", ("INV_BB", "INV_BC", "INV_BN", "INV_WARPS", "INV_STAGES"),
     [(32, 16, 128, 8, 3), (32, 32, 128, 8, 3), (32, 32, 128, 4, 3), (64, 32, 128, 8, 3), (32, 32, 256, 8, 3),
      (16, 32, 128, 4, 3), (32, 32, 64, 4, 3), (32, 32, 128, 8, 2)]),
]
MODULES = {"rubiconv": rubi, "gemm": gemm}


class _Case:
    """One block k and precision on the benchmark's row: every launch of a forward and backward as a closure on
    inputs made once, and the float64 reference of the whole op."""

    def __init__(self, tokens: int, d: int, block: int, precision: str, device: torch.device) -> None:
        gen = torch.Generator(device=device).manual_seed(0)
        self.name, self.precision = f"{precision} k={block}", precision
        self.cu = lognormal_layout(tokens, 0, device)
        self.block = block
        self.x = torch.randn(1, tokens, d, generator=gen, device=device)
        self.h = torch.randn(d, tokens, generator=gen, device=device) / math.sqrt(tokens)
        self.dy = torch.randn(1, tokens, d, generator=gen, device=device)
        self.want = _grads(lambda a, b: rubiconv_ref(a, b, cu_seqlens=self.cu), self.x.double(), self.h.double(),
                           self.dy.double())
        self.plan = plan = gemm.get_plan(self.cu, 1, tokens, tokens, block, device)
        self.t = t = rubi._tables(plan, precision)
        x, dy = self.x.view(-1, d), self.dy.view(-1, d)
        taps = self.h[:, : plan.max_taps].T.contiguous()
        saved = rubi.SAVE_SPECTRA
        zf = rubi._block_fwd(taps, plan, t, filters=True)
        hs = rubi._spectrum(rubi.MODE_SPECTRUM, zf, plan, t)
        zx, zg = rubi._block_fwd(x, plan, t, filters=False), rubi._block_fwd(dy, plan, t, filters=False)
        sx, sg = (torch.empty(zx.shape, dtype=torch.float32, device=device) if saved else None for _ in "xg")
        o = rubi._spectrum(rubi.MODE_CONV, zx, plan, t, hs=hs, s=sx)
        og = rubi._spectrum(rubi.MODE_CONV, zg, plan, t, hs=hs, conj_h=True, s=sg)
        corr = rubi._spectrum(rubi.MODE_CORRELATE, zg, plan, t, zx=sx if saved else zx, s=sg)
        y, dh = torch.empty_like(x), torch.empty(plan.max_taps, d, dtype=torch.float32, device=device)
        zb, xb = (2 if precision == "bf16" else 4), self.x.element_size()
        doc_half, filt_half = 2 * plan.n_cols * plan.k * d * zb, 2 * plan.n_filter_cols * plan.k * d * zb
        s_bytes = 2 * plan.n_cols * plan.k * d * 4 if saved else 0
        tokens_bytes, taps_bytes = tokens * d * xb, int(plan.group_taps.sum()) * d * xb
        # kernel -> [(launch, closure, bytes it reads and writes at least)]
        self.launches = {
            "_rubi_block_fwd_kernel": [
                ("filter taps -> Z", lambda: rubi._block_fwd(taps, plan, t, filters=True), taps_bytes + filt_half),
                ("x -> Z", lambda: rubi._block_fwd(x, plan, t, filters=False), tokens_bytes + doc_half),
                ("dy -> Z", lambda: rubi._block_fwd(dy, plan, t, filters=False), tokens_bytes + doc_half),
            ],
            "_rubi_spectrum_kernel": [
                ("filter spectra", lambda: rubi._spectrum(rubi.MODE_SPECTRUM, zf, plan, t), 2 * filt_half),
                ("x conv", lambda: rubi._spectrum(rubi.MODE_CONV, zx, plan, t, hs=hs, s=sx),
                 2 * doc_half + filt_half + s_bytes),
                ("dy conv (dx)", lambda: rubi._spectrum(rubi.MODE_CONV, zg, plan, t, hs=hs, conj_h=True, s=sg),
                 2 * doc_half + filt_half + s_bytes),
                ("correlation (dh)",
                 lambda: rubi._spectrum(rubi.MODE_CORRELATE, zg, plan, t, zx=sx if saved else zx, s=sg),
                 (2 * s_bytes if saved else 2 * doc_half) + filt_half),
            ],
            "_rubi_block_inv_kernel": [
                ("y", lambda: rubi._block_inv(o, plan, t, y, reduce=False), doc_half + tokens_bytes),
                ("dx", lambda: rubi._block_inv(og, plan, t, y, reduce=False), doc_half + tokens_bytes),
                ("dh", lambda: rubi._block_inv(corr, plan, t, dh, reduce=True), filt_half + dh.numel() * 4),
            ],
        }

    def op(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return kernels.rubiconv(a, b, cu_seqlens=self.cu, block=self.block, backend="triton",
                                precision=self.precision)

    def error(self) -> float:
        """Worst relative RMS of y, dx and dh of the whole op against the float64 reference."""
        got = _grads(self.op, self.x, self.h, self.dy)
        return max(rel_rms(a, b) for a, b in zip(got, self.want, strict=True))


def _time_candidate(cases: list[_Case], kernel: str, values: tuple, rep: int) -> tuple[float, float, str]:
    """(score ms, worst error as a share of its precision's bound, cells) of the candidate already set on the
    module."""
    score, worst, cells = 0.0, 0.0, []
    for case in cases:
        try:
            ms = sum(median_time_ms(fn, rep, case.x.device) for _, fn, _ in case.launches[kernel])
            err = case.error()
        except Exception as exc:  # noqa: BLE001 - a candidate that fails to compile is reported, not fatal
            print(f"  {values}: {case.name} FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
            ms, err = math.inf, math.inf
        score, worst = score + ms, max(worst, err / BOUND[case.precision])
        cells.append(f"{case.name} {ms:8.3f} ms (err {err:.1e})")
    return score, worst, "; ".join(cells)


def _tune(cases: list[_Case], groups: list, rep: int, rounds: int) -> list[str]:
    settings = []
    for group, kernel, consts, candidates in groups:
        print(f"\n## {group}: {', '.join(consts)}  (its launches in one forward and backward, ms"
              + (f"; median of {rounds} rounds, candidates interleaved" if rounds > 1 else "") + ")")
        timed = [[] for _ in range(rounds)]
        for r in range(rounds):
            for values in candidates:
                use(rubi, consts, values)
                timed[r].append(_time_candidate(cases, kernel, values, rep))
        results = []
        for i, values in enumerate(candidates):
            runs = [timed[r][i] for r in range(rounds)]
            score = float(np.median([run[0] for run in runs]))
            spread = "" if rounds == 1 else f" [{min(r[0] for r in runs):.3f}-{max(r[0] for r in runs):.3f}]"
            results.append((score, max(run[1] for run in runs), values, f"{score:8.3f} ms{spread}: {runs[-1][2]}"))
        settings.append(f"{rubi.__name__}: {settle(results, 1.0, rubi, consts)}")
    return settings


def _table(cases: list[_Case], rep: int) -> None:
    print("\n## at the best constants: every launch of one forward and backward")
    print("| case | kernel | launch | ms | bytes moved at least (MB) | GB/s |")
    print("|---|---|---|---|---|---|")
    for case in cases:
        total = 0.0
        for kernel, launches in case.launches.items():
            for label, fn, nbytes in launches:
                ms = median_time_ms(fn, rep, case.x.device)
                total += ms
                rate = nbytes / ms / 1e6
                print(f"| {case.name} | {kernel} | {label} | {ms:.3f} | {nbytes / 1e6:,.1f} | {rate:,.0f} |")
        print(f"| {case.name} | all | sum of the launches | {total:.3f} | | |")
    print("\n| case | op fwd ms | op fwd+bwd ms | err (y, dx, dh worst) |")
    print("|---|---|---|---|")
    for case in cases:
        def forward(case=case):
            with torch.no_grad():
                case.op(case.x, case.h)
        fwd = median_time_ms(forward, rep, case.x.device)
        total = median_time_ms(lambda case=case: _grads(case.op, case.x, case.h, case.dy), rep, case.x.device)
        print(f"| {case.name} | {fwd:.3f} | {total:.3f} | {case.error():.1e} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rep", type=int, default=100, help="do_bench's rep, ms of timed runs per measurement")
    parser.add_argument("--only", default="", help="comma-separated group names to tune (default: all)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time every candidate of a group this many times, interleaved; report medians")
    parser.add_argument("--blocks", default="64,128", help="comma-separated block sizes k, one case each")
    parser.add_argument("--precisions", default="fp32", help="comma-separated: fp32, bf16")
    parser.add_argument("--tokens", type=int, default=65536, help="tokens of the row")
    parser.add_argument("--d", type=int, default=1024, help="channels")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a check under TRITON_INTERPRET=1")
    parser.add_argument("--set", action="append", default=[], metavar="MODULE.CONSTANT=VALUE",
                        help="a setting to tune under (a Python literal), e.g. rubiconv.SAVE_SPECTRA=True; "
                             f"modules: {', '.join(MODULES)}")
    args = parser.parse_args(argv)
    error = set_constants(args.set, MODULES)
    if error:
        print(error, file=sys.stderr)
        return 2
    groups = GROUPS
    if args.only:
        wanted = args.only.split(",")
        unknown = sorted(set(wanted) - {g[0] for g in GROUPS})
        if unknown:
            print(f"unknown group {unknown[0]!r}; choose from {', '.join(g[0] for g in GROUPS)}", file=sys.stderr)
            return 2
        groups = [g for g in GROUPS if g[0] in wanted]
    bad = sorted(set(args.precisions.split(",")) - set(gemm.PRECISIONS))
    if bad:
        print(f"unknown precision {bad[0]!r}; choose from {', '.join(gemm.PRECISIONS)}", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print("needs a CUDA device (or --device cpu under TRITON_INTERPRET=1)", file=sys.stderr)
            return 2
        import triton

        print(f"# {torch.cuda.get_device_name(device)}; torch {torch.__version__}, Triton {triton.__version__}")
    if args.set:
        print(f"settings: {', '.join(args.set)}")
    cases = [_Case(args.tokens, args.d, int(k), p, device) for k in args.blocks.split(",")
             for p in args.precisions.split(",")]
    plan = cases[0].plan
    print(f"row of {args.tokens:,} tokens, {plan.n_docs} documents, D={args.d}, L_F={args.tokens:,}, fp32 "
          f"activations; cases: {', '.join(c.name for c in cases)}")
    settings = _tune(cases, groups, args.rep, args.rounds)
    print("\n## constants to set")
    for line in settings:
        print(line)
    _table(cases, args.rep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
