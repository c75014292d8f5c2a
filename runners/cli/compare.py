"""``mixlab compare TASK --mixers a,b,c``: mixers side by side on one task. A thin command: the runs are a sweep
(``runners.sweep.spec.compare_spec``) into an output folder, so the same command resumes it; the table, the
verdict of each pair and the figures come from ``analysis.compare``. ``register(app)`` adds it to the app."""

from __future__ import annotations

from pathlib import Path

import typer
from mixlab.analysis.aggregate import load_sweep
from mixlab.runners.cli.settings import LOG_HELP, RUN_SET_HELP, split_run_assignments
from mixlab.runners.cli.sweep import DEVICE_HELP, comma_names, echo_result, run_in_folder, with_sweep_options
from mixlab.runners.sweep.manifest import plan_for_folder
from mixlab.runners.sweep.run import SweepOptions
from mixlab.runners.sweep.spec import compare_spec


@with_sweep_options(omit=("tasks", "models", "settings"))
def compare(
    task: str = typer.Argument(..., help="Task name (see `mixlab tasks list`) or import path "
                               "package.module:TaskClass."),
    mixers: str = typer.Option(..., help="Comma-separated mixers to compare (names or import paths), e.g. "
                               "attention,static_conv,hyena."),
    seeds: int = typer.Option(5, help="Seeds 0..N-1: each trains every mixer on the same data (at least 3 for a "
                              "verdict)."),
    set_: list[str] = typer.Option(None, "--set", help=RUN_SET_HELP),
    epochs: int = typer.Option(None, help="Epochs (default: the training config's, 200)."),
    steps: int = typer.Option(None, help="Optimizer steps instead of epochs."),
    device: str = typer.Option(None, help=DEVICE_HELP),
    out: str = typer.Option(None, help="Output folder (default runs/compare/<task>-<mixers>)."),
    log: tuple[str, str] | None = typer.Option(None, help=LOG_HELP, metavar="KIND DIR"),
    *,
    options: SweepOptions,
) -> None:
    """Train each mixer on TASK for every seed (a sweep: the same command resumes it), then print per mixer the
    median and spread over seeds and the share of seeds solved, and per pair the median difference with its 95%
    interval and verdict; compare.md and figures go into the folder."""
    from mixlab.analysis.compare import write_comparison  # imported here, as report's: seaborn is slow

    names = comma_names(mixers) or []
    fields = split_run_assignments(task, set_)
    train = dict(fields.train)
    if steps is not None:
        train.update(steps=steps, epochs=None)
    elif epochs is not None:
        train["epochs"] = epochs
    spec = compare_spec(task, names, task_params=fields.task_params, model=fields.model, train=train, seeds=seeds)
    folder = Path(out) if out else Path("runs") / "compare" / f"{spec.name.removeprefix('compare-')}-{'-'.join(names)}"
    plan = plan_for_folder(lambda d: spec.plan(device=d), folder, device)
    echo_result(run_in_folder(plan, folder, options, log))
    text, written = write_comparison(load_sweep(folder), names, folder, task)
    typer.echo(text)
    typer.echo(f"wrote {', '.join(p.name for p in written)} to {folder}")


def register(app: typer.Typer) -> None:
    """Add ``compare`` to ``app``."""
    app.command("compare")(compare)
