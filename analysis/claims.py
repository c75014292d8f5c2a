"""A paper's claims as data, and their verdicts on a folder's runs (docs/claims.md).

A claim is one sentence of the paper and the check that tests it, written in a sweep file's ``reference.claims``
(``runners.sweep.spec``) or, for the dynamic-conv paper's MAD table, built from ``analysis.tables.MAD_CLAIMS``
and ``REFERENCE`` (``mad_claims``)::

    - text: "Dynamic conv beats static conv at every width."   # the paper's sentence, kept beside the check
      difference: [dynamic_conv, static_conv]   # per seed: A - B; or `level: MODEL`, the model's own value
      op: ">"                                   # >, >=, <, <=, or = (then `tolerance` is required)
      value: 0                                  # what the effect is compared with (default 0)
      metric: acc_micro                         # default: the sweep's metric (MAD: its score, acc_macro)
      where: {task: mqar_varlen}                # labels that pick the cells: task, setting, model-grid fields
      each: [d_model]                           # one verdict per value of these labels
      solved_at: 0.99                           # level only: a seed is solved when the metric reaches this;
                                                # the claim is then about the solve fraction
      every: true                               # with solved_at, op ">=" and value 1: about every run of the
                                                # split (its cells pooled), counted: "17 of 18 runs"
      fails_by_design: [no_conv]                # models the claim expects not to learn the task (a one-layer
                                                # attention on MQAR): their failing is no missing test

The values compared are, per seed, those of the best training point (``aggregate.best_of_grid`` by the sweep's
metric), or a MAD task's score. A level claim tests the median over seeds, a difference claim the median of the
per-seed differences over the seeds both models have (seed s trains both on the same data), a ``solved_at``
claim the share of seeds solved, an ``every`` claim the runs that fall short. ``evaluate`` gives each a
``Verdict``: the effect, its 95% interval (``analysis.stats``), and reproduced (the interval wholly on the
claim's side), contradicted (wholly on the other), or inconclusive (it straddles the claim's value, or fewer
than MIN_SEEDS seeds), with the seeds that would likely decide it. Three rules read what separates the arms
rather than a median that cannot (docs/claims.md):

- **Not tested**: when most seeds of one of the claim's models did not train (``Observation.untrained``: its
  training loss fell by less than LOSS_FALL_MIN of its first evaluation's, or its micro accuracy sits within
  CHANCE_MARGIN of chance, ``ceilings.chance_accuracy``), the verdict is "not tested" and says which and why: a
  model at chance has not been compared with anything.
- **Steps to the threshold**: a one-sided difference claim (value 0) whose two models stopped early in every
  paired seed is judged on the steps each took to its early-stop threshold (the fewest over its training
  points that got there): "A beats B" reads "A got there in fewer steps".
- **Every run**: an ``every`` claim counts the runs at or above ``solved_at``; one that falls short contradicts
  it (the Wilson interval of k < n excludes 1), all of them reproduce it at that count.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
from mixlab.analysis import stats
from mixlab.analysis.aggregate import (
    GRID_CELL,
    METRIC_KEYS,
    MadScores,
    SweepData,
    best_of_grid,
    group_by,
    mad_scores,
)
from mixlab.analysis.ceilings import chance_accuracy
from mixlab.analysis.tables import MAD_CLAIMS, MAD_ROWS, MAD_TOLERANCE, REFERENCE, Table, reference_name
from mixlab.core.fields import NonNegativeFloat, check_dataclass, check_mapping, field_types, from_yaml

OPS = (">", ">=", "<", "<=", "=")
MIN_SEEDS = 3  # below this no verdict: 2 seeds on one side happen by chance one time in two
REPRODUCED, CONTRADICTED, INCONCLUSIVE, NO_DATA = "reproduced", "contradicted", "inconclusive", "no data"
NOT_TESTED = "not tested"
MAD_METRIC = "acc_macro"
# A run did not train when its training loss fell by less than this share of its first evaluation's: MQAR at a
# vocabulary of 8,192 starts near ln 4,096 = 8.3 once it predicts a value, and a run that retrieves nothing
# stays within a few tenths of it (GLA in baselines_mqar_mid: 8.4 -> 7.2-8.2).
LOSS_FALL_MIN = 0.2
# ... or when its micro accuracy is within this share of the way from chance (the best constant answer) to 1.
CHANCE_MARGIN = 0.05
METRIC, STEPS = "metric", "steps"  # what a verdict compared: the claim's metric, or the steps to the early stop
FLIPPED = {">": "<", ">=": "<=", "<": ">", "<=": ">="}  # "A beats B" on accuracy is "A needs fewer steps"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Claim:
    """One checkable claim (module docstring); built by ``parse_claim``, which refuses unknown keys."""

    text: str
    op: Literal[OPS]
    level: str | None = None
    difference: tuple[str, ...] | None = None
    metric: str | None = None
    value: float = 0.0
    tolerance: NonNegativeFloat | None = None
    where: dict[str, Any] = dataclasses.field(default_factory=dict)
    each: tuple[str, ...] = ()
    solved_at: float | None = None
    every: bool = False
    fails_by_design: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_dataclass(self, where="claim")
        if (self.level is None) == (self.difference is None):
            raise ValueError(f"claim {self.text!r}: give exactly one of level or difference")
        if self.difference is not None and len(self.difference) != 2:
            raise ValueError(f"claim {self.text!r}: difference names two models, got {list(self.difference)}")
        if (self.op == "=") != (self.tolerance is not None):
            raise ValueError(f"claim {self.text!r}: a tolerance goes with op '=' and only with it")
        if self.solved_at is not None and self.level is None:
            raise ValueError(f"claim {self.text!r}: solved_at goes with a level claim")
        if self.solved_at is not None and not 0 <= self.value <= 1:
            raise ValueError(f"claim {self.text!r}: a solve fraction is compared with a value in [0, 1], "
                             f"got {self.value!r}")
        if self.every and (self.solved_at is None or self.op != ">=" or self.value != 1):
            raise ValueError(f"claim {self.text!r}: every goes with solved_at, op '>=' and value 1 (every run "
                             "solved)")
        stray = [m for m in self.fails_by_design if m not in self.models]
        if stray:
            raise ValueError(f"claim {self.text!r}: fails_by_design names {stray}, not models of the claim")

    @property
    def models(self) -> tuple[str, ...]:
        return (self.level,) if self.level is not None else tuple(self.difference)

    def check_text(self, metric: str) -> str:
        """The check in a few words: ``dynamic_conv - static_conv > 0 (acc_micro)``."""
        subject = " - ".join(self.models)
        if self.every:
            return f"every run of {subject}: {self.metric or metric} >= {self.solved_at:g}"
        if self.solved_at is not None:
            subject = f"share of seeds with {self.metric or metric} >= {self.solved_at:g} for {subject}"
            return f"{subject} {self.op} {self.value:g}"
        band = f" ± {self.tolerance:g}" if self.tolerance is not None else ""
        return f"{subject} {self.op} {self.value:g}{band} ({self.metric or metric})"


def parse_claim(data: Any, where: str) -> Claim:
    """A claim from its mapping (a YAML entry); ValueError naming ``where`` and what is wrong."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} must be a mapping (text, level or difference, op, ...), got {data!r}")
    types = field_types(Claim)
    data = check_mapping(where, data, types, required={"text", "op"})
    values = {key: from_yaml(key, value, types[key], where=where) for key, value in data.items()}
    try:
        return Claim(**values)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


@dataclasses.dataclass(frozen=True)
class Names:
    """What the claims of one sweep may name: its models, metrics, and per label the values it takes."""

    models: Sequence[str]
    metrics: Sequence[str]
    labels: Mapping[str, Sequence[str]]

    def check(self, claim: Claim, where: str) -> None:
        """ValueError naming the first model, metric, label or label value of ``claim`` the sweep lacks."""
        for model in claim.models:
            if model not in self.models:
                raise ValueError(f"{where}: unknown model {model!r}; the sweep's: {', '.join(self.models)}")
        if claim.metric is not None and claim.metric not in self.metrics:
            raise ValueError(f"{where}: unknown metric {claim.metric!r}; known: {', '.join(self.metrics)}")
        for key in (*claim.where, *claim.each):
            if key not in self.labels:
                raise ValueError(f"{where}: unknown setting {key!r}; known: {', '.join(self.labels)}")
        for key, value in claim.where.items():
            if str(value) not in self.labels[key]:
                raise ValueError(f"{where}: {key} {value!r} is not in the sweep ({', '.join(self.labels[key])})")


def parse_claims(items: Any, names: Names, where: str = "reference.claims") -> list[Claim]:
    """Every claim of a list, each checked against ``names``."""
    if not isinstance(items, list):
        raise ValueError(f"{where} must be a list, got {items!r}")
    claims = []
    for i, item in enumerate(items):
        claim = parse_claim(item, f"{where}[{i}]")
        names.check(claim, f"{where}[{i}]")
        claims.append(claim)
    return claims


def claim_dict(claim: Claim) -> dict[str, Any]:
    """The mapping ``parse_claim`` reads back, without the fields left at their defaults (a manifest's form)."""
    defaults = {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                for f in dataclasses.fields(Claim)}
    return {key: list(value) if isinstance(value, tuple) else value
            for key, value in dataclasses.asdict(claim).items() if value != defaults[key]}


@dataclasses.dataclass(frozen=True)
class Observation:
    """One model's value of every metric in one cell (its labels) for one seed; for a grid's run also the step
    at which it reached its early-stop threshold (None if it did not), the share of its training loss gone from
    its first evaluation to its last (``aggregate.run_row``) and the chance accuracy of its test split (NaN:
    unknown, as for MAD scores, which are means over settings)."""

    model: str
    seed: int
    labels: Mapping[str, str]
    values: Mapping[str, float]
    stopped_at: int | None = None
    loss_fall: float = math.nan
    chance: float = math.nan

    def stalled(self) -> bool:
        """Its training loss fell by less than LOSS_FALL_MIN of its first evaluation's."""
        return self.loss_fall < LOSS_FALL_MIN

    def at_chance(self) -> bool:
        """Its micro accuracy is within CHANCE_MARGIN of the way from chance to 1."""
        return self.values.get("acc_micro", math.nan) <= self.chance + CHANCE_MARGIN * (1 - self.chance)

    def trained(self) -> bool:
        """Neither stalled nor at chance (as far as the observation knows: MAD scores carry neither)."""
        return not (self.stalled() or self.at_chance())


def grid_observations(data: SweepData) -> list[Observation]:
    """Per (cell, seed) of a grid sweep the best training point's metrics, the fewest steps at which one of its
    training points stopped early, its loss fall and its test split's chance; labels: task, setting and the
    fields of the model-grid point."""
    keys = (*GRID_CELL, "seed")
    best = best_of_grid(data.rows, keys, data.metric)
    stops = {key: [r["steps"] for r in group if r.get("stopped_early") and r.get("steps") is not None]
             for key, group in group_by(data.rows, keys).items()}
    out = []
    for row in best:
        stopped = stops[tuple(row[k] for k in keys)]
        chance = (math.nan if row.get("num_test") is None else
                  chance_accuracy(row["task"], row["task_params"], row["num_test"], row["data_seed"]))
        out.append(Observation(row["model"], row["seed"], {"task": row["task"], "setting": row["setting"],
                                                           **point_fields(row["model_grid"])},
                               {k: v for k, v in row.items() if k in METRIC_KEYS or k.startswith("acc_")},
                               stopped_at=min(stopped) if stopped else None,
                               loss_fall=row.get("train_loss_fall", math.nan), chance=chance))
    return out


def point_fields(label: str) -> dict[str, str]:
    """``"d_model=32 mlp_hidden=88"`` -> ``{"d_model": "32", "mlp_hidden": "88"}``; ``"default"`` -> {}."""
    return dict(part.split("=", 1) for part in label.split() if "=" in part)


def mad_observations(scores: Mapping[str, MadScores]) -> list[Observation]:
    """Per model (a ``tables.REFERENCE`` name), MAD task (reference-table name or Average) and seed its score."""
    return [Observation(model, seed, {"task": task}, {MAD_METRIC: score})
            for model, score_set in scores.items() for task, per_seed in score_set.per_seed.items()
            for seed, score in per_seed.items()]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A claim judged on one split (the values of its ``each`` labels): n seeds (runs, for an ``every`` claim),
    the effect (median, median difference, or solve fraction; in steps when ``basis`` is STEPS), its 95%
    interval, the one-sided sign test's p (None for '=' and solve claims), the verdict, the seeds that would
    likely decide an inconclusive one, and a note (why there is no interval)."""

    claim: Claim
    split: Mapping[str, str]
    metric: str
    n: int
    effect: float = math.nan
    interval: stats.Interval | None = None
    p: float | None = None
    verdict: str = NO_DATA
    seeds_needed: int | None = None
    solved: int | None = None
    note: str = ""
    basis: str = METRIC

    def effect_text(self) -> str:
        if not self.n:
            return "—"
        if self.claim.every:
            return f"{self.solved} of {self.n} runs >= {self.claim.solved_at:g}"
        if self.solved is not None:
            return f"{self.solved}/{self.n} solved"
        if self.basis == STEPS:
            return f"{self.effect:+,.0f} steps"
        return f"{self.effect:+.3f}" if self.claim.difference is not None else f"{self.effect:.3f}"

    def interval_text(self) -> str:
        if self.interval is None:
            return "—"
        if self.basis == STEPS:
            return f"[{self.interval.low:+,.0f}, {self.interval.high:+,.0f}]"
        return self.interval.text()

    def check_text(self) -> str:
        """The check as judged: the claim's (``Claim.check_text``), or its steps form."""
        if self.basis == STEPS:
            first, second = self.claim.models
            return f"steps to the early stop: {first} - {second} {FLIPPED[self.claim.op]} 0"
        return self.claim.check_text(self.metric)

    def verdict_text(self) -> str:
        """The verdict, with the reason where there is no interval (no runs, too few seeds, not tested)."""
        return f"{self.verdict} ({self.note})" if self.note and self.interval is None else self.verdict

    def needed_text(self) -> str:
        if self.verdict != INCONCLUSIVE:
            return ""
        return "no number" if self.seeds_needed is None else f"~{self.seeds_needed}"


def evaluate(claim: Claim, observations: Sequence[Observation], metric: str) -> list[Verdict]:
    """The claim's verdicts on ``observations``, one per split; ``metric``: the sweep's (the claim's default).
    ValueError when the claim leaves several cells per model and seed in a split (it must say where or each),
    unless it is about every run."""
    metric = claim.metric or metric
    chosen = [o for o in observations if all(o.labels.get(k) == str(v) for k, v in claim.where.items())]
    splits: dict[tuple, list[Observation]] = {}
    for obs in chosen:
        splits.setdefault(tuple(obs.labels.get(k, "—") for k in claim.each), []).append(obs)
    return [_judge(claim, dict(zip(claim.each, key)), metric, _paired(claim, group))
            for key, group in (splits or {(): []}).items()]


def _paired(claim: Claim, group: Sequence[Observation]) -> list[tuple[Observation, ...]]:
    """The claim's units: per seed the model's observation, or (A, B) over the seeds both have; for an ``every``
    claim each run of the model, whatever its cell."""
    per_model: dict[str, dict[Any, Observation]] = {m: {} for m in claim.models}
    for obs in group:
        if obs.model not in per_model:
            continue
        if claim.every:
            per_model[obs.model][(tuple(sorted(obs.labels.items())), obs.seed)] = obs
            continue
        seen = per_model[obs.model].get(obs.seed)
        if seen is not None:
            differ = sorted(k for k in obs.labels if obs.labels[k] != seen.labels.get(k))
            raise ValueError(f"claim {claim.text!r} matches several cells of {obs.model} for seed {obs.seed} "
                             f"(they differ in {', '.join(differ)}): give them in where or each")
        per_model[obs.model][obs.seed] = obs
    first = per_model[claim.models[0]]
    if claim.difference is None:
        return [(first[key],) for key in sorted(first)]
    second = per_model[claim.models[1]]
    return [(first[seed], second[seed]) for seed in sorted(set(first) & set(second))]


def _values(claim: Claim, units: Sequence[tuple[Observation, ...]], metric: str) -> list[float]:
    """Per unit the claim's quantity (the model's value, or A - B), NaN left out."""
    values = [u[0].values.get(metric, math.nan) - (u[1].values.get(metric, math.nan) if len(u) > 1 else 0.0)
              for u in units]
    return [v for v in values if not math.isnan(v)]


def untrained_note(claim: Claim, units: Sequence[tuple[Observation, ...]]) -> str:
    """Why the claim is not tested on ``units``: each of its models (but those it expects to fail) most of whose
    units did not train (``Observation.trained``), with how many and why; "" when none."""
    kind = "runs" if claim.every else "seeds"
    notes = []
    for i, model in enumerate(claim.models):
        failed = [u[i] for u in units if not u[i].trained()]
        if model in claim.fails_by_design or not 2 * len(failed) > len(units):
            continue
        why = []
        stalled = [o.loss_fall for o in failed if o.stalled()]
        if stalled:
            why.append(f"training loss down {_span(stalled, '.0%')} from its first evaluation")
        chance = [o for o in failed if o.at_chance()]
        if chance:
            why.append(f"acc_micro {_span([o.values['acc_micro'] for o in chance], '.3f')} against a chance of "
                       f"{_span([o.chance for o in chance], '.3f')}")
        notes.append(f"{model} did not train in {len(failed)} of {len(units)} {kind}: {', '.join(why)}")
    return "; ".join(notes)


def _span(values: Sequence[float], spec: str) -> str:
    """``0.002-0.006``, or one value when they are all the same in ``spec``."""
    low, high = format(min(values), spec), format(max(values), spec)
    return low if low == high else f"{low.rstrip('%')}-{high}"


def _judge(claim: Claim, split: Mapping[str, str], metric: str, units: list[tuple[Observation, ...]]) -> Verdict:
    values = _values(claim, units, metric)
    n = len(values)
    if n == 0:
        return Verdict(claim, split, metric, 0, note="no scored seeds of its models and settings")
    untested = untrained_note(claim, units)
    if claim.solved_at is not None:
        return _judge_solved(claim, split, metric, values, untested)
    steps = _steps(claim, units)
    basis = METRIC if steps is None else STEPS
    judged = claim if steps is None else dataclasses.replace(claim, op=FLIPPED[claim.op])
    values = values if steps is None else steps
    n, effect = len(values), float(np.median(values))
    p = None if claim.op == "=" else stats.sign_test(values, judged.value, above=judged.op.startswith(">"))
    if untested:
        return Verdict(claim, split, metric, n, effect, None, p, NOT_TESTED, note=untested, basis=basis)
    if n < MIN_SEEDS:
        return Verdict(claim, split, metric, n, effect, None, p, INCONCLUSIVE, MIN_SEEDS,
                       note=f"too few seeds ({n} < {MIN_SEEDS})", basis=basis)
    interval = stats.bootstrap_median(values)
    verdict = decide(judged, interval)
    needed = stats.seeds_for_median(n, effect, interval, _bounds(judged, effect)) if verdict == INCONCLUSIVE else None
    return Verdict(claim, split, metric, n, effect, interval, p, verdict, needed, basis=basis)


def _steps(claim: Claim, units: Sequence[tuple[Observation, ...]]) -> list[float] | None:
    """Per seed A's steps to its early stop minus B's, when the claim is a one-sided ordering (value 0) and both
    models stopped early in every paired seed; else None (the claim's metric decides)."""
    if claim.difference is None or claim.op == "=" or claim.value != 0 or not units:
        return None
    if any(a.stopped_at is None or b.stopped_at is None for a, b in units):
        return None
    return [float(a.stopped_at - b.stopped_at) for a, b in units]


def _judge_solved(claim: Claim, split: Mapping[str, str], metric: str, values: list[float], untested: str
                  ) -> Verdict:
    """A solve-fraction claim: the share of seeds at or above ``solved_at`` against its value by the Wilson
    interval; an ``every`` claim: reproduced when every run is, contradicted when one is not."""
    n = len(values)
    solved = sum(v >= claim.solved_at for v in values)
    if untested:
        return Verdict(claim, split, metric, n, solved / n, None, None, NOT_TESTED, solved=solved, note=untested)
    if n < MIN_SEEDS:  # as for a median: no interval, so one seed never shows a spread
        return Verdict(claim, split, metric, n, solved / n, None, None, INCONCLUSIVE, MIN_SEEDS, solved,
                       note=f"too few {'runs' if claim.every else 'seeds'} ({n} < {MIN_SEEDS})")
    interval = stats.wilson(solved, n)
    if claim.every:  # the Wilson interval of k < n lies below 1; of n of n it reaches 1
        return Verdict(claim, split, metric, n, solved / n, interval, None,
                       REPRODUCED if solved == n else CONTRADICTED, None, solved)
    verdict = decide(claim, interval)
    needed = None
    if verdict == INCONCLUSIVE:
        needed = stats.seeds_for_fraction(solved, n, lambda iv: decide(claim, iv) != INCONCLUSIVE)
    return Verdict(claim, split, metric, n, solved / n, interval, None, verdict, needed, solved)


def decide(claim: Claim, interval: stats.Interval) -> str:
    """Reproduced when the whole interval satisfies the claim, contradicted when none of it does, else
    inconclusive. For '=' the claim holds inside [value - tolerance, value + tolerance]."""
    low, high, value = interval.low, interval.high, claim.value
    if claim.op == "=":
        lo, hi = value - claim.tolerance, value + claim.tolerance
        holds, fails = lo <= low and high <= hi, high < lo or low > hi
    else:
        holds = {">": low > value, ">=": low >= value, "<": high < value, "<=": high <= value}[claim.op]
        fails = {">": high <= value, ">=": high < value, "<": low >= value, "<=": low > value}[claim.op]
    return REPRODUCED if holds else CONTRADICTED if fails else INCONCLUSIVE


def _bounds(claim: Claim, effect: float) -> list[float]:
    """The values an interval around ``effect`` must clear to decide the claim: its value, or for '=' both
    edges of the band when the effect is inside it (to reproduce), the nearer one when outside (to contradict)."""
    if claim.op != "=":
        return [claim.value]
    lo, hi = claim.value - claim.tolerance, claim.value + claim.tolerance
    if lo <= effect <= hi:
        return [lo, hi]
    return [lo if effect < lo else hi]


def split_text(split: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in split.items()) or "—"


def verdict_rows(verdicts: Iterable[Verdict]) -> list[list[str]]:
    """Table rows: claim, at (the split), check, effect, 95% interval, n, p (sign test), verdict, seeds to
    decide (VERDICT_HEADERS)."""
    return [[v.claim.text, split_text(v.split), v.check_text(), v.effect_text(), v.interval_text(), str(v.n),
             p_text(v), v.verdict_text(), v.needed_text()]
            for v in verdicts]


def p_text(verdict: Verdict) -> str:
    return "—" if verdict.p is None else f"{verdict.p:.3f}"


VERDICT_HEADERS = ["claim", "at", "check", "effect", "95% interval", "n", "p (sign)", "verdict", "seeds to decide"]
VERDICT_RULE = ("effect: the median over seeds of the value (level) or of the per-seed difference, the share "
                "of seeds solved, or for a claim about every run the runs that reach its level; 95% interval: "
                "percentile bootstrap of the median (10,000 resamples, seed 0; at n <= 5 seeds it is their "
                "range), Wilson for a share; p (sign): exact one-sided sign test of the claim's direction over "
                "the seeds; reproduced: the whole interval on the claim's side, contradicted: wholly on the "
                f"other, inconclusive: it straddles the claim (or n < {MIN_SEEDS}); every run: contradicted by "
                "one run short of the level, reproduced when all reach it; steps: where both models of an "
                "ordering stopped early in every seed, the claim is judged on the steps each took to its "
                "early-stop threshold (A beats B: A took fewer); not tested: most seeds of one of its models "
                f"did not train (training loss down less than {LOSS_FALL_MIN:.0%} from the first evaluation, or "
                f"micro accuracy within {CHANCE_MARGIN:.0%} of chance, the best constant answer); seeds to "
                "decide: the count at which an interval shrinking as 1/sqrt(n) would clear the claim's value "
                "(docs/claims.md).")


def sweep_claims(data: SweepData) -> tuple[list[Claim], list[str]]:
    """A grid sweep's claims (its manifest's ``reference.claims``) and the sentences among them that carry no
    check (a manifest written before claims were data)."""
    items = (data.spec.get("reference") or {}).get("claims") or []
    claims = [parse_claim(item, f"{data.path}: reference.claims[{i}]")
              for i, item in enumerate(items) if not isinstance(item, str)]
    return claims, [item for item in items if isinstance(item, str)]


def mad_claims() -> list[Claim]:
    """The dynamic-conv paper's MAD claims: ``tables.MAD_CLAIMS`` (its orderings) and, for every cell of its
    table, the model's score within ``tables.MAD_TOLERANCE`` of the paper's value."""
    names = Names(models=list(REFERENCE), metrics=[MAD_METRIC], labels={"task": MAD_ROWS})
    claims = parse_claims(list(MAD_CLAIMS), names, "MAD_CLAIMS")
    claims += [Claim(text=f"{model}: {task} {value:.3f}", level=model, where={"task": task}, op="=", value=value,
                     tolerance=MAD_TOLERANCE)
               for model, row in REFERENCE.items() for task, value in row.items()]
    return claims


def verdict_lines(verdicts: Sequence[Verdict]) -> list[str]:
    """Markdown for a report: the table of the verdicts with scored seeds, how many claims have none (a MAD
    profile run for some tasks only), and the rule (VERDICT_RULE)."""
    scored = [v for v in verdicts if v.n]
    lines = [Table(list(VERDICT_HEADERS), verdict_rows(scored)).markdown(), ""] if scored else []
    if len(scored) < len(verdicts):
        lines += [f"{len(verdicts) - len(scored)} claims have no scored seed here (no complete records of their "
                  "models and settings).", ""]
    return lines + [VERDICT_RULE, ""]


def grid_verdicts(data: SweepData) -> list[Verdict]:
    """Every verdict of a grid sweep's checkable claims."""
    checks, _ = sweep_claims(data)
    observations = grid_observations(data)
    return [v for claim in checks for v in evaluate(claim, observations, data.metric)]


def mad_judged(datas: Sequence[SweepData]) -> dict[str, dict[str, SweepData]]:
    """Per MAD profile (of the folders given), per model with a paper column (``tables.reference_name``), the
    folder its claims are judged on. Where several folders hold one model and profile (the protocol run again
    under changed rules, in a new folder), the one whose manifest was created last: a newer folder supersedes,
    never pools with, an older one."""
    judged: dict[str, dict[str, SweepData]] = {}  # profiles and models in the order of ``datas``
    for data in datas:
        name = reference_name(data)
        if data.kind != "mad" or name is None:
            continue
        models = judged.setdefault(data.spec.get("profile", {}).get("name", "?"), {})
        if name not in models or _created(data) >= _created(models[name]):
            models[name] = data
    return judged


def _created(data: SweepData) -> tuple[str, str]:
    """When a folder's sweep began (its manifest's ISO timestamp), then its path to break ties."""
    return (data.manifest or {}).get("created", ""), str(data.path)


def mad_verdicts(datas: Sequence[SweepData]) -> dict[str, list[Verdict]]:
    """Per MAD profile (of the folders given) the verdicts of ``mad_claims`` on the folders ``mad_judged``
    picks; a profile none of whose folders has a paper column is left out."""
    out = {}
    for profile, judged in mad_judged(datas).items():
        observations = mad_observations({name: mad_scores(data.rows, data.metric, data.planned)
                                         for name, data in judged.items()})
        out[profile] = [v for claim in mad_claims() for v in evaluate(claim, observations, MAD_METRIC)]
    return out
