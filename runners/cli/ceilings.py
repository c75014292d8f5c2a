"""``mixlab ceilings``: the accuracy ceilings that variable-length-key MQAR data sets for one attention layer with
a width-W conv on its keys (``analysis.ceilings``), for the task settings of a sweep preset or for a saved run."""

from __future__ import annotations

import typer
from mixlab.analysis import ceilings
from mixlab.runners.sweep.spec import load_spec


def ceilings_command(
    preset: str = typer.Option("mqar_varlen_fig2", help="A sweep preset (or YAML grid file) whose tasks are "
                               "mqar_varlen."),
    windows: str = typer.Option("2,3,4,5", help="Comma-separated conv widths."),
    rows: int = typer.Option(3000, help="Test rows drawn per seed."),
    seeds: int = typer.Option(3, help="Data seeds 0..N-1 of the test rows."),
    checkpoint: str = typer.Option(None, help="A run saved by `mixlab run --save`: its test accuracy split by m, "
                                   "at the first of --windows, on its own test set."),
) -> None:
    """Print the best accuracy a one-layer model with a width-W key conv can reach on mqar_varlen data, per task
    setting of a preset and width, or a saved run's test accuracy split by how many pairs look alike (m)."""
    widths = [int(w) for w in windows.split(",")]
    if checkpoint:
        typer.echo(ceilings.multiplicity_table(checkpoint, widths[0]))
        return
    spec = load_spec(preset)
    settings = [{**entry.params, **point} for entry in spec.tasks if entry.task == "mqar_varlen"
                for point in entry.grid]
    typer.echo(ceilings.ceiling_table(preset, settings, widths, rows, seeds))


def register(app: typer.Typer) -> None:
    """Add the ``ceilings`` command to the main ``mixlab`` app."""
    app.command("ceilings")(ceilings_command)
