"""``mixlab leakage``: the leakage probes (docs/leakage.md) for one mixer or all of them, printed as a table.

Exit status 1 when a mixer that claims exact document blindness fails a probe; bad input is a ValueError
(status 2 through ``runners.cli.main.main``). The work happens in ``analysis.leakage``.
"""

from __future__ import annotations

from pathlib import Path

import torch
import typer
from mixlab import models
from mixlab.analysis import leakage
from mixlab.core.atomic import writable_folder
from mixlab.core.fields import PositiveInt, check


def leakage_command(
    mixer: str = typer.Option("all", help="Mixer name, attention+qkv_<conv> (static, dynamic_lowrank, "
                              "dynamic_headwise), an import path package.module:Factory, or all (the "
                              "built-ins, attention with each qkv conv, then every installed plugin)."),
    backend: str = typer.Option("auto", help="Kernel backend: auto, torch or triton (ops without a Triton "
                                "kernel run torch; on a CPU set TRITON_INTERPRET=1 for the run)."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    plot: str = typer.Option(None, help="Also plot leakage against the distance from the document start to "
                             "this file (.png, .pdf, .svg)."),
    model: bool = typer.Option(False, "--model", help="Probe a 2-block LM built with each mixer (token and "
                               "embedding inputs) instead of the bare mixer."),
    rows: int = typer.Option(4, help="Packed rows of the random layout."),
    seq_len: int = typer.Option(64, help="Tokens per row."),
    d_model: int = typer.Option(32, help="Model width (a multiple of 8)."),
    seed: int = typer.Option(0, help="Seed of the layout, inputs, probes and initialisation."),
    threads: int = typer.Option(1, help="CPU threads for torch; the probes' tensors are tiny, so one thread "
                                "is fastest (several are much slower on a busy machine)."),
) -> None:
    """Probe every mixer for leaks across packed documents: one row per mixer with the verdicts of the
    perturbation, NaN and gradient probes, the packing-invariance max difference and the leakage metric."""
    names = leakage.resolve_names(leakage.mixer_names() + plugin_names() if mixer == "all" else mixer)
    check("--threads", threads, PositiveInt)
    if plot:
        writable_folder(Path(plot).parent)  # before the probes, not after them
    settings = {"level": "model" if model else "mixer", "backend": backend, "device": device, "rows": rows,
                "seq_len": seq_len, "d_model": d_model, "seed": seed}
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        reports = leakage.probe_all(names, **settings)
        typer.echo(leakage.format_table(reports))
        if plot:
            profiles = {name: leakage.leakage_by_distance(name, **settings) for name in names}
            typer.echo(f"plot -> {leakage.plot_leakage_by_distance(profiles, plot)}")
    finally:
        torch.set_num_threads(previous_threads)  # in-process callers (tests) keep their setting
    failed = [r.name for r in reports if r.failed]
    if failed:
        typer.echo(f"leak in a mixer that claims exact document blindness: {', '.join(failed)}")
        raise typer.Exit(1)


def plugin_names() -> list[str]:
    """The installed plugin mixers (entry points of the group mixlab.mixers) that no built-in name hides."""
    return [name for name in models.mixer_origins() if name not in models.MIXERS]


def register(app: typer.Typer) -> None:
    """Add the ``leakage`` command to the main ``mixlab`` app."""
    app.command("leakage")(leakage_command)
