"""Time candidate tile/warp/stage/pair constants of the tiny-head attention kernels on a GPU (issue #22).

Usage, on the GPU box from the checkout: ``PYTHONPATH=. python scripts/tune_attention_gpu.py`` (about 3 minutes
on an H200). The shapes are a stack of MAD runs as the engine folds it: 18 runs x 128 rows = 2,304 sequences,
16 heads of 8 dims (36,864 pairs), bf16, at T=127 and T=1023, q, k, v in the mixers' [B, T, H, hd] layout.

The candidates are groups of module-level constants of ``kernels.attention.triton`` (``GROUPS``), tuned one
after the other (forward, then backward in two passes or one), each candidate timed by calling the launcher
directly (no autograd, no custom op) with ``triton.testing.do_bench`` (median), and checked against the fp32 torch
reference on the first 8 sequences (relative RMS of o, or of dq, dk, dv). The score is the time per token summed
over the two lengths. One line per candidate with its achieved bandwidth over the bytes the launcher must move, the best
marked ``*``; then the constants to set.
"""

import argparse
import math

import torch
from mixlab.kernels.attention import triton as attn
from mixlab.kernels.attention.naive import causal_attention_ref
from mixlab.runners.bench.utils import error_line, rel_rms
from tuning import gpu, settle, us, use

B, H, HD, LENGTHS = 18 * 128, 16, 8, (127, 1023)
DTYPE = torch.bfloat16
CHECKED = 8  # sequences checked against the reference (its [T, T] scores would not fit for all of them)
RMS_BOUND = 2e-2  # the bf16 bound of the kernel tests

# (group, constant names, candidates); the first candidate of each group is what the repository ships.
GROUPS = [
    ("fwd", ("FWD_BT", "FWD_WARPS", "FWD_STAGES", "FWD_PAIR_ROWS"),
     [(64, 4, 2, 128), (64, 4, 2, 512), (128, 4, 2, 128), (32, 2, 2, 256), (64, 2, 2, 512)]),
    # timed on 2026-12-02 (BENCHMARKS.md): the one pass at 128-row pairs (shipped) won at both lengths; its 256-
    # and 64-row pairs are not timed yet; the best two-pass setting and two more one-pass ones, for comparison
    ("bwd", ("BWD_PASSES", "BWD_BT", "BWD_WARPS", "BWD_STAGES", "BWD_PAIR_ROWS"),
     [(1, 64, 4, 1, 128), (1, 64, 4, 1, 256), (1, 64, 4, 1, 64), (2, 64, 4, 1, 512), (1, 64, 4, 1, 512),
      (1, 128, 4, 1, 512)]),
]


class _Case:
    """One length: inputs in the mixers' layout, upstream gradient, the fp32 reference on CHECKED sequences."""

    def __init__(self, T: int, device: torch.device) -> None:
        gen = torch.Generator(device=device).manual_seed(T)
        self.T = T
        self.q, self.k, self.v, self.do = (
            torch.randn(B, T, H, HD, generator=gen, device=device).to(DTYPE).transpose(1, 2) for _ in range(4))
        self.scale = HD**-0.5
        self.o, self.lse = attn._attention_fwd(self.q, self.k, self.v, self.scale)
        leaves = [t[:CHECKED].float().requires_grad_() for t in (self.q, self.k, self.v)]
        o = causal_attention_ref(*leaves, self.scale)
        self.want_fwd = o.detach()
        self.want_bwd = torch.autograd.grad(o, leaves, self.do[:CHECKED].float())

    def run(self, backward: bool):
        if backward:
            return lambda: attn._attention_bwd(self.do, self.q, self.k, self.v, self.o, self.lse, self.scale)
        return lambda: attn._attention_fwd(self.q, self.k, self.v, self.scale)

    def error(self, backward: bool) -> float:
        if backward:
            o, lse = attn._attention_fwd(self.q, self.k, self.v, self.scale)
            got = attn._attention_bwd(self.do, self.q, self.k, self.v, o, lse, self.scale)
            return max(rel_rms(g[:CHECKED], w) for g, w in zip(got, self.want_bwd, strict=True))
        return rel_rms(attn._attention_fwd(self.q, self.k, self.v, self.scale)[0][:CHECKED], self.want_fwd)

    def bytes_moved(self, backward: bool) -> int:
        """The launcher's floor: bf16 [B, H, T, hd] tensors read and written once, fp32 [B, H, T] rows."""
        tensor, rows = B * H * self.T * HD * 2, B * H * self.T * 4
        return 8 * tensor + 2 * rows if backward else 4 * tensor + rows  # bwd: q k v o do in, dq dk dv out




def _candidate(cases: list[_Case], backward: bool, rep: int) -> tuple[float, float, str]:
    """(time per token summed over the lengths, worst error, line) of the constants set now."""
    cells, score, worst = [], 0.0, 0.0
    for case in cases:
        try:
            took = us(case.run(backward), rep)
            err = case.error(backward)
        except Exception as exc:  # noqa: BLE001 - a candidate that fails to compile is reported, not fatal
            print(f"  T={case.T} FAILED {error_line(exc, 100)}")
            took = err = math.inf
        gbs = case.bytes_moved(backward) / (took * 1e-6) / 1e9
        cells.append(f"T={case.T} {took:8.1f} us {gbs:6.0f} GB/s (err {err:.1e})")
        score += took / (B * case.T)
        worst = max(worst, err)
    return score, worst, "; ".join(cells)


def _tune(cases: list[_Case], rep: int) -> list[str]:
    """Each group in turn: every candidate timed and checked, the best kept (``tuning.settle``)."""
    settings = []
    for group, consts, candidates in GROUPS:
        print(f"\n## {group}: {', '.join(consts)}  (raw launcher, µs; GB/s over the bytes it must move)")
        results = []
        for values in candidates:
            use(attn, consts, values)
            score, worst, line = _candidate(cases, group == "bwd", rep)
            results.append((score, worst, values, line))
        settings.append(settle(results, RMS_BOUND, attn, consts))
    return settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rep", type=int, default=100, help="do_bench's rep, ms of timed runs per measurement")
    args = parser.parse_args()
    device = gpu()
    print(f"shape B={B}, H={H}, hd={HD}, T in {LENGTHS}, bf16, [B, T, H, hd] layout")
    cases = [_Case(T, device) for T in LENGTHS]
    settings = _tune(cases, args.rep)
    print("\n## set in kernels/attention/triton.py")
    for line in settings:
        print(line)


if __name__ == "__main__":
    main()
