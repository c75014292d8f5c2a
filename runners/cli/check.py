"""``mixlab check-mixer``: audit one mixer against the mixer contract and time it beside attention and
dynamic_conv; ``mixlab check-task``: audit one task against the task contract (``runners.check``). Exit status 1
when a check fails (the failed checks are named on the last line); an unknown name or an import path that does
not import is bad input (status 2 through ``runners.cli.main.main``)."""

from __future__ import annotations

import torch
import typer
from mixlab import tasks
from mixlab.core.fields import PositiveInt, check
from mixlab.runners.check import check_mixer, check_task
from mixlab.runners.cli.bench import parse_shape
from mixlab.runners.cli.settings import SET_HELP, parse_assignments


def check_mixer_command(
    mixer: str = typer.Argument(..., help="A mixer name (see `mixlab mixers list`) or an import path "
                                "package.module:Factory."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    d_model: int = typer.Option(32, help="Width of the checks (a multiple of 8)."),
    shape: str = typer.Option(None, help="Benchmark shape B,T,D (D a multiple of 8); default 4,512,64 on the "
                              "CPU, 4,2048,1024 on CUDA."),
    bench: bool = typer.Option(True, help="Time the mixer beside attention and dynamic_conv (only when every "
                               "check passes)."),
    seed: int = typer.Option(0, help="Seed of the initialisation, inputs, layout and probes."),
    threads: int = typer.Option(1, help="CPU threads for torch (the checks' tensors are tiny)."),
) -> None:
    """Check that a mixer keeps the contract (shape, dtype, finite outputs, causality, finite gradients,
    determinism, and the five leakage probes when it claims document blindness), then benchmark it."""
    bench_shape = parse_shape(shape, 3, "B,T,D") if shape else None
    check("--threads", threads, PositiveInt)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        report = check_mixer(mixer, device=device, d_model=d_model, seed=seed, bench=bench,
                             bench_shape=bench_shape)
    finally:
        torch.set_num_threads(previous_threads)  # in-process callers (tests) keep their setting
    typer.echo(report.format())
    if not report.passed:
        raise typer.Exit(1)


def check_task_command(
    task: str = typer.Argument(..., help="A task name (see `mixlab tasks list`) or an import path "
                               "package.module:TaskClass."),
    set_: list[str] = typer.Option(None, "--set", help=SET_HELP),
    seed: int = typer.Option(0, help="Data seed of the checks (they also draw seed + 1)."),
) -> None:
    """Check that a task keeps the contract the runners rely on: its parameters, seeded bytes, an untouched global
    random state, distinct splits, roles, vocabulary, one row length, documents and score groups."""
    params = tasks.task_class(task).parse_params(parse_assignments(set_))
    report = check_task(task, params, seed=seed)
    typer.echo(report.format())
    if not report.passed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the ``check-mixer`` and ``check-task`` commands to the main ``mixlab`` app."""
    app.command("check-mixer")(check_mixer_command)
    app.command("check-task")(check_task_command)
