"""What a sweep still needs, and what it would cost: ``mixlab mad remaining`` and ``mixlab sweep-cost``.

A sweep's runs are planned (a MAD folder's again from its manifest: model, profile, device; a grid from its spec)
for the seeds asked, so the runs of seeds not yet started count too; a run is done when the output folder holds
its record. Per model and task: the runs still missing (by seed), the optimizer steps and training tokens they
take if none stops early, and the share of its budget that the model's finished runs of the task actually
trained (early stops), which turns the upper bound into an expected cost. Given a training rate in tokens per
second (for example the token-weighted figure of ``mixlab bench mad`` for that model), both become
device-minutes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from mixlab.analysis.aggregate import load_sweep
from mixlab.core.records import RUNS
from mixlab.runners.sweep.mad import mad_plan
from mixlab.runners.sweep.manifest import plan_for_folder
from mixlab.runners.sweep.plan import SweepPlan
from mixlab.runners.sweep.spec import load_spec
from mixlab.runners.train.config import RunConfig
from mixlab.runners.train.schedule import StepPlan


@dataclasses.dataclass
class TaskCost:
    """One model's runs of one task in one sweep."""

    sweep: str  # the output folder, or the spec's name
    model: str
    task: str
    missing: dict[int, int]  # seed -> runs without a record
    planned: dict[int, int]  # seed -> runs planned
    steps: int  # optimizer steps of the missing runs if none stops early
    tokens: int  # training tokens of those steps (an epoch's last batch may be short)
    trained_share: float | None  # steps trained / steps budgeted over the task's finished runs; None if none


def _budget(config: RunConfig) -> tuple[int, int]:
    """(optimizer steps, training rows) of a run that never stops early."""
    plan = StepPlan.of(config.train)
    epochs, steps = divmod(plan.total_steps, plan.steps_per_epoch)
    return plan.total_steps, epochs * config.train.num_train + min(steps * plan.batch_size, config.train.num_train)


def plan_costs(plan: SweepPlan, records: Mapping[str, dict], sweep: str) -> list[TaskCost]:
    """The cost of the runs of ``plan`` without a record in ``records`` (name -> record), one entry per model and
    task in plan order."""
    costs: dict[tuple[str, str], TaskCost] = {}
    budgets: dict[tuple[str, str], list[int]] = {}  # -> [steps trained, steps budgeted] over finished runs
    for run in plan.runs:
        config = run.config
        key = (run.meta["model"], run.meta["task"])
        seed = run.meta["seed"]
        cost = costs.setdefault(key, TaskCost(sweep, *key, {}, {}, 0, 0, None))
        cost.planned[seed] = cost.planned.get(seed, 0) + 1
        budget, rows = _budget(config)
        record = records.get(run.hash)
        if record is not None:
            share = budgets.setdefault(key, [0, 0])
            share[0] += record["steps"]
            share[1] += budget
            continue
        cost.missing[seed] = cost.missing.get(seed, 0) + 1
        cost.steps += budget
        cost.tokens += rows * run.resolved.row_tokens
    for key, (trained, budgeted) in budgets.items():
        costs[key].trained_share = trained / budgeted
    return list(costs.values())


def _records(folder: Path) -> dict[str, dict]:
    """The records of a sweep folder by run name; none when it holds none yet."""
    if not (folder / RUNS).is_dir():
        return {}
    try:
        return {r["name"]: r for r in load_sweep(folder).records}
    except ValueError:
        if any((folder / RUNS).iterdir()):
            raise
        return {}


def remaining(folder: str | Path, seeds: int) -> list[TaskCost]:
    """The cost of what ``folder`` (a ``mixlab mad run`` output) lacks for seeds 0..seeds-1, one entry per task
    in protocol order. Raises ValueError if the folder is not a MAD sweep."""
    data = load_sweep(folder)
    spec = data.spec
    if data.kind != "mad" or "profile" not in spec:
        raise ValueError(f"{str(folder)!r} is not a MAD output folder (no MAD manifest)")
    plan = mad_plan(spec["model"], spec["profile"]["name"], seeds=seeds, device=spec.get("device", "auto"))
    return plan_costs(plan, {r["name"]: r for r in data.records}, str(folder))


def sweep_costs(spec: str, out: str | Path | None, *, device: str | None = None,
                seeds: int | None = None) -> list[TaskCost]:
    """The cost of a grid sweep (a preset name or YAML file, as ``mixlab sweep`` takes it) less the runs whose
    records ``out`` holds (none when ``out`` is None or holds no records yet)."""
    grid = load_spec(spec)
    seed_list = None if seeds is None else list(range(seeds))
    if out is None:
        return plan_costs(grid.plan(device=device, seeds=seed_list), {}, grid.name)
    # the runs named as the folder names them (runners.sweep.manifest)
    plan = plan_for_folder(lambda d: grid.plan(device=d, seeds=seed_list), out, device)
    return plan_costs(plan, _records(Path(out)), grid.name)


def parse_rates(values: Sequence[str] | None) -> dict[str, float]:
    """``--rate MODEL=TOKENS_PER_S`` options as {model: rate}; a bare number is every model's (key "")."""
    rates = {}
    for value in values or ():
        model, _, number = value.rpartition("=")
        try:
            rate = float(number)
        except ValueError:
            rate = math.nan
        if not rate > 0:
            raise ValueError(f"--rate expects MODEL=TOKENS_PER_S or TOKENS_PER_S with a positive rate, got {value!r}")
        rates[model] = rate
    return rates


def _min(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def _sum(values: Sequence[float | None]) -> float | None:
    return None if None in values else sum(values)


def remaining_table(costs: Sequence[TaskCost], rates: Mapping[str, float]) -> str:
    """Markdown: one row per sweep, model and task with missing runs, then each model's total in each sweep and
    the grand total. ``rates``: tokens per second by model name ("" for every model); minutes are "—" without
    one."""
    lines = ["| sweep | model | task | runs missing (by seed) | steps, at most | tokens (M), at most | share trained "
             "by finished runs | device-min, at most | device-min, expected |",
             "|---|---|---|---|---|---|---|---|---|"]
    every: list[tuple[float, float | None, float | None]] = []  # (tokens, minutes at most, minutes expected)
    groups: dict[tuple[str, str], list[TaskCost]] = {}
    for cost in costs:
        groups.setdefault((cost.sweep, cost.model), []).append(cost)
    for (sweep, model), group in groups.items():
        rate = rates.get(model, rates.get(""))
        rows = []
        name = Path(sweep).name
        for c in group:
            if not c.missing:
                continue
            # a task with no finished run to learn from is expected to train its whole budget
            expected = c.tokens * (1.0 if c.trained_share is None else c.trained_share)
            rows.append((c.tokens, None if rate is None else c.tokens / rate / 60,
                         None if rate is None else expected / rate / 60))
            seeds = ", ".join(f"{s}: {n}/{c.planned[s]}" for s, n in sorted(c.missing.items()))
            share = "—" if c.trained_share is None else f"{c.trained_share:.2f}"
            lines.append(f"| {name} | {model} | {c.task} | {seeds} | {c.steps:,} | {c.tokens / 1e6:,.1f} | {share} | "
                         f"{_min(rows[-1][1])} | {_min(rows[-1][2])} |")
        if len(rows) > 1:
            tokens, most, expected = sum(r[0] for r in rows), _sum([r[1] for r in rows]), _sum([r[2] for r in rows])
            lines.append(f"| {name} | {model} | **all tasks** | | | {tokens / 1e6:,.1f} | | {_min(most)} | "
                         f"{_min(expected)} |")
        every += rows
    if not every:
        return "nothing missing: every planned run has its record"
    tokens, most, expected = sum(r[0] for r in every), _sum([r[1] for r in every]), _sum([r[2] for r in every])
    lines.append(f"| **all** | | | | | {tokens / 1e6:,.1f} | | {_min(most)} | {_min(expected)} |")
    return "\n".join(lines)
