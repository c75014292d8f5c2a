"""The ``mixlab`` command line: parse, build a config, call a library function.

Every library error that comes from bad input is a ``ValueError`` with a one-line message; ``main`` prints it as
``mixlab: error: ...`` and exits with status 2 (set ``MIXLAB_DEBUG=1`` to see the traceback instead), and so
does an ``OSError`` (a file that cannot be read or written: the line names it). Ctrl-C exits with status 130;
for a sweep the line counts its records, for ``mixlab run`` it says where its checkpoint is, and both give the
command that resumes it.
"""

from __future__ import annotations

import inspect
import os
import shlex
import signal
import sys
from importlib.metadata import version

import typer
from mixlab import models, tasks
from mixlab.analysis import tensorboard
from mixlab.runners.cli import bench, ceilings, check, compare, leakage, sweep
from mixlab.runners.cli.settings import (
    LOG_HELP,
    RUN_SET_HELP,
    SET_HELP,
    build_task,
    command_fields,
    read_run_file,
)
from mixlab.runners.sweep.run import SweepInterrupted
from mixlab.runners.train import resume
from mixlab.runners.train.config import RunConfig, TrainConfig
from mixlab.runners.train.resolved import resolve
from mixlab.runners.train.run import finished_record, train_run
from mixlab.tasks.show import render_example

app = typer.Typer(
    name="mixlab",
    help="A synthetic-task diagnostic lab for sequence mixers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
tasks_app = typer.Typer(help="List the task generators and show decoded examples.", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")
mixers_app = typer.Typer(help="List the sequence mixers.", no_args_is_help=True)
app.add_typer(mixers_app, name="mixers")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"mixlab {version('mixlab')}")
        raise typer.Exit()


@app.callback()
def _options(
    show_version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                      help="Print the installed mixlab version and exit."),
) -> None:
    """The options of ``mixlab`` itself, given before the command (typer reads them from this signature)."""


# typer >= 0.22 vendors its own click: take the exception classes from typer so both kinds are caught.
ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


class RunInterrupted(BaseException):
    """Ctrl-C stopped ``mixlab run``; its message says what was kept. Like KeyboardInterrupt, not an Exception."""


@tasks_app.command("list")
def tasks_list() -> None:
    """Every task reachable by name (the built-ins, then installed plugins of the entry point group
    mixlab.tasks): name, origin, what it tests, default parameters. An import path package.module:TaskClass is
    accepted wherever a name is."""
    for name, origin in tasks.task_origins().items():
        try:
            cls = tasks.task_class(name)
            lines = [cls.description, "defaults: " + " ".join(f"{k}={_fmt(v)}" for k, v in cls.defaults().items())]
        except ValueError as exc:  # a broken plugin is listed, not fatal
            lines = [f"cannot load: {exc}"]
        typer.echo(name + ("" if origin == tasks.BUILT_IN else f"  [{origin}]") + "".join(f"\n    {t}" for t in lines))


@tasks_app.command("show")
def tasks_show(
    name: str = typer.Argument(..., help="Task name (see `mixlab tasks list`) or import path "
                               "package.module:TaskClass."),
    set_: list[str] = typer.Option(None, "--set", help=SET_HELP),
    seed: int = typer.Option(0, help="Data seed."),
    split: str = typer.Option("test", help="train or test (they differ for MAD recall tasks)."),
    index: int = typer.Option(0, help="Which example of the generated batch to show."),
) -> None:
    """Print one decoded example: tokens by role, then every scored position with its target."""
    task = build_task(name, set_)
    data = task.generate(index + 1, seed=seed, split=split)
    typer.echo(render_example(task, data, index, header=f"seed {seed}, split {split}, example {index}"))


@mixers_app.command("list")
def mixers_list() -> None:
    """Every mixer reachable by name (the built-ins, then installed plugins of the entry point group
    mixlab.mixers) with its origin, the optional extra it needs, and the first paragraph of its docstring. An
    import path package.module:Factory is accepted wherever a name is."""
    for name, origin in models.mixer_origins().items():
        try:
            doc = inspect.cleandoc(models.resolve_mixer(name).__doc__ or "")
            summary = " ".join(doc.split("\n\n")[0].split())
        except ValueError as exc:  # a broken plugin is listed, not fatal
            summary = f"cannot load: {exc}"
        cls = models.MIXERS.get(name)
        if cls is not None and cls.extra is not None:
            origin += f", needs mixlab[{cls.extra}]" + ("" if cls.available() else ": not installed")
        typer.echo(f"{name:24s} {summary}  [{origin}]")


@app.command("run")
def run(
    task: str = typer.Argument(None, help="Task name (see `mixlab tasks list`) or import path "
                               "package.module:TaskClass; may come from --config."),
    config: str = typer.Option(None, "--config", help="A YAML file of the run's fields (task: NAME and any --set "
                               "key: value); the command line's values go over it. Saved whole in the record."),
    mixer: str = typer.Option(None, help="Mixer name (see `mixlab mixers list`), import path "
                              "package.module:Factory, or a hybrid stack's comma list cycled over the layers "
                              "(static_conv,attention). Default attention."),
    set_: list[str] = typer.Option(None, "--set", help=RUN_SET_HELP),
    seed: int = typer.Option(None, help="Initialisation seed (model init and shuffling); default 0."),
    data_seed: int = typer.Option(None, help="Data seed (train and test sets); default 0."),
    epochs: int = typer.Option(None, help="Epochs (default: the training config's, 200, the MAD protocol's). "
                               "With --progress a line on stderr says the epochs, steps and parameters before "
                               "training starts."),
    steps: int = typer.Option(None, help="Optimizer steps instead of epochs."),
    device: str = typer.Option(None, help="auto, cpu or cuda (default auto)."),
    out: str = typer.Option("runs", help="Folder for the run's JSON record. A run whose record is there is not "
                            "trained again; one stopped part-way goes on from its checkpoint (<out>/partial/)."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
    save: bool = typer.Option(False, "--save", help="Also write the model to <out>/<name>.pt (weights of the "
                              "reported, lowest-perplexity evaluation; load with models.load)."),
    checkpoint_every: float = typer.Option(resume.DEFAULT_EVERY_S, help="Seconds between checkpoints in "
                                           "mid-training (<out>/partial/; 0: at every evaluation; negative: "
                                           "none), also written on Ctrl-C or SIGTERM: the same command run "
                                           "again goes on from them to the same record."),
    log: tuple[str, str] | None = typer.Option(None, help=LOG_HELP, metavar="KIND DIR"),
) -> None:
    """Train one model on one task and write its record (config, versions, per-epoch and final metrics)."""
    run_file = None if config is None else read_run_file(config)
    fields = command_fields(task, set_, run_file, config)
    options = {"init_seed": seed, "data_seed": data_seed, "device": device}
    train = {**fields.train, **{k: v for k, v in options.items() if v is not None}}
    if steps is not None:
        train.update(steps=steps, epochs=None)
    elif epochs is not None:
        train["epochs"] = epochs
    model = {**fields.model, **({} if mixer is None else {"mixer": mixer})}
    if "mixer" in model:
        models.pattern_classes(model["mixer"])  # an unknown mixer fails before any data is made
    log_dir = tensorboard.log_target(log)
    resolved = resolve(RunConfig(task=fields.task, task_params=fields.task_params, model=model,
                                 train=TrainConfig(**train)))
    extra = None if run_file is None else {"config_file": {"path": config, "fields": run_file}}
    record = finished_record(resolved, out, save)
    done = record is not None
    if not done:
        try:
            record = train_run(resolved, out_dir=out, progress=progress, save=save, extra=extra,
                               checkpoint_every_s=checkpoint_every)
        except KeyboardInterrupt:
            kept = f"its state is in {out}/partial/" if checkpoint_every >= 0 else "nothing kept (no checkpoints)"
            raise RunInterrupted(kept) from None
    if log_dir is not None:
        tensorboard.log_records([record], log_dir)
    final = record["final"]
    qkv = record["resolved"]["model"]["qkv_conv"]
    label = resolved.model_config.mixer if qkv == "none" else f"{resolved.model_config.mixer}+qkv_{qkv}"
    typer.echo(
        f"{fields.task} {label}: acc {final['acc_micro']:.4f} (macro {final['acc_macro']:.4f}), test ppl "
        f"{final['test_ppl']:.4g} at epoch {final['best_epoch']}, {record['n_params']:,} params, "
        f"{record['steps']} steps in {record['wall_time_s']:.1f} s ({record['steps_per_s']:.1f} steps/s) "
        f"-> {out}/{record['name']}.json"
        + (f" and {out}/{record['checkpoint']}" if save else "")
        + "".join(f"; {k} {v:.4f}" for k, v in final.items()
                  if k.startswith("acc_") and k not in ("acc_micro", "acc_macro"))
        + ("; trained before: its record is kept (delete it to train again)" if done else "")
    )


def _fmt(value) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


for _module in (bench, ceilings, check, compare, leakage, sweep):
    _module.register(app)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one-line errors and exit status 2 for bad input, 130 for Ctrl-C."""
    debug = os.environ.get("MIXLAB_DEBUG") == "1"
    args = sys.argv[1:] if argv is None else list(argv)
    # SIGTERM (kill, timeout's default, batch schedulers) stops as Ctrl-C does: a stack writes its checkpoint, a
    # sweep ends its workers, which write theirs, and says how to resume. A shell without job control starts
    # background commands with SIGINT ignored, so there SIGTERM is the signal that can stop them cleanly.
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        # Without standalone mode click returns (not raises) the status of typer.Exit and of Ctrl-C (130).
        code = app(args=args, prog_name="mixlab", standalone_mode=False)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except ClickException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            print(exc.format_message(), file=sys.stderr)
        else:
            print(f"mixlab: error: {exc.format_message()}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print("mixlab: interrupted", file=sys.stderr)
        sys.exit(130)
    except (SweepInterrupted, RunInterrupted) as exc:
        # running the same command again skips every run that has a record and goes on from the checkpoints
        print(f"mixlab: interrupted: {exc}; resume with: mixlab {shlex.join(args)}", file=sys.stderr)
        sys.exit(130)
    except (ValueError, OSError) as exc:
        if debug:
            raise
        print(f"mixlab: error: {_error_line(exc)}", file=sys.stderr)
        sys.exit(2)
    if isinstance(code, int) and code != 0:
        if code == 130:
            print("mixlab: interrupted", file=sys.stderr)
        sys.exit(code)


def _error_line(exc: ValueError | OSError) -> str:
    """One line for an error: an OSError as ``<file>: <reason>``, else the message's first line."""
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


if __name__ == "__main__":
    main()
