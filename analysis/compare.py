"""``mixlab compare``: mixers side by side on one task, from the folder of the sweep that trained them.

Per mixer (a model of the sweep, one run per seed, or the best training point per seed where the sweep varies
training settings): the metric's median and IQR over seeds, the share of seeds that solve the task (the metric
at least ``tables.SOLVED_AT``), the seeds, the parameters. Per pair of mixers (a, b): the median over seeds of the
per-seed difference a - b (seed s trains both on the same data) with its 95% interval, the sign test and the
seeds that would likely decide it, from the claims machinery (``analysis.claims``: the claim ``a - b > 0``), read
both ways: a is better when the whole interval lies above 0, b when it lies below, and with fewer than
``claims.MIN_SEEDS`` seeds there is no verdict. Written beside the runs: ``compare.md`` (both tables),
``compare.png`` (bars of the metric per mixer with a dot per seed) and ``compare_curves.png`` (learning curves).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

from mixlab.analysis import plots
from mixlab.analysis.aggregate import GRID_CELL, Stats, SweepData, best_of_grid
from mixlab.analysis.claims import (
    CONTRADICTED,
    MIN_SEEDS,
    NO_DATA,
    REPRODUCED,
    Claim,
    Verdict,
    evaluate,
    grid_observations,
)
from mixlab.analysis.tables import SOLVED_AT, Table, curve_rows, fmt_stats


@dataclasses.dataclass(frozen=True)
class Pair:
    """The comparison of mixers a and b: the claims machinery's verdict on ``a - b > 0``, read both ways."""

    a: str
    b: str
    verdict: Verdict

    @property
    def outcome(self) -> str:
        v = self.verdict
        if v.verdict == NO_DATA:
            return "no runs of both"
        if v.interval is None:
            return f"no verdict ({v.note})"
        if v.verdict == REPRODUCED:
            return f"{self.a} better"
        if v.interval.high < 0:
            return f"{self.b} better"
        if v.verdict == CONTRADICTED:  # the interval ends at 0: b is never worse, and not better on most seeds
            return f"{self.a} not better"
        return "no clear difference"


def best_per_seed(data: SweepData) -> list[dict]:
    """One row per (mixer, seed): the best training point of the seed (the only run where nothing else varies)."""
    return best_of_grid(data.rows, (*GRID_CELL, "seed"), data.metric)


def mixer_table(data: SweepData, mixers: list[str]) -> Table:
    """Per mixer: the metric's median [IQR] over seeds, the seeds solved (metric >= SOLVED_AT), n, parameters."""
    best = best_per_seed(data)
    rows = []
    for mixer in mixers:
        values = [r[data.metric] for r in best if r["model"] == mixer and not math.isnan(r[data.metric])]
        params = {r["n_params"] for r in best if r["model"] == mixer}
        solved = sum(v >= SOLVED_AT for v in values)
        rows.append([mixer, fmt_stats(Stats.of(values)), f"{solved}/{len(values)}" if values else "—", len(values),
                     ", ".join(f"{p:,}" for p in sorted(params)) or "—"])
    return Table(["mixer", f"{data.metric} median [IQR]", f"solved (>= {SOLVED_AT})", "n", "parameters"], rows)


def pairs(data: SweepData, mixers: list[str]) -> list[Pair]:
    """Every pair (a, b) of ``mixers`` in order, each judged on the seeds both have (``claims.evaluate``)."""
    observations = grid_observations(data)
    out = []
    for a, b in itertools.combinations(mixers, 2):
        claim = Claim(text=f"{a} - {b}", difference=(a, b), op=">")
        (verdict,) = evaluate(claim, observations, data.metric)
        out.append(Pair(a, b, verdict))
    return out


def pair_table(found: list[Pair]) -> Table:
    rows = [[f"{p.a} - {p.b}", p.verdict.effect_text(), p.verdict.interval.text() if p.verdict.interval else "—",
             p.verdict.n, "—" if p.verdict.p is None else f"{p.verdict.p:.3f}", p.outcome,
             p.verdict.needed_text()] for p in found]
    return Table(["pair", "median difference", "95% interval", "n", "p (sign)", "verdict", "seeds to decide"], rows)


RULE = ("median difference: the median over the seeds both have of the per-seed difference; 95% interval: "
        "percentile bootstrap of that median (at n <= 5 seeds, their range); p (sign): exact one-sided sign test that "
        "the first is better; verdict: the first (second) is better when the whole interval lies above (below) 0, "
        f"no verdict under {MIN_SEEDS} seeds; seeds to decide: the count at which an interval shrinking as "
        "1/sqrt(n) would clear 0 (docs/claims.md).")


def write_comparison(data: SweepData, mixers: list[str], out: str | Path, task: str) -> tuple[str, list[Path]]:
    """The comparison's text (both tables and the rule) and the files written into ``out``: compare.md,
    compare.png and compare_curves.png."""
    out = Path(out)
    text = "\n".join([f"# {', '.join(mixers)} on {task}", "", mixer_table(data, mixers).markdown(), "",
                      pair_table(pairs(data, mixers)).markdown(), "", RULE])
    best = best_per_seed(data)
    markdown = out / "compare.md"
    markdown.write_text(text + "\n\n![per mixer](compare.png)\n\n![learning curves](compare_curves.png)\n")
    bars = plots.grid_bars(best, [data.metric], out / "compare.png")  # its panel is titled by the task
    picks = [(r["hash"], task, r["model"]) for r in best]
    curves = plots.learning_curves(curve_rows(data.records, picks, data.metric), data.metric,
                                   out / "compare_curves.png")
    return text, [markdown, bars, curves]
