"""The ``mixlab`` command line: parse, build a config, call a library function.

Every library error that comes from bad input is a ``ValueError`` with a one-line message; ``main`` prints it as
``mixlab: error: ...`` and exits with status 2 (set ``MIXLAB_DEBUG=1`` to see the traceback instead), and so
does an ``OSError`` (a file that cannot be read or written: the line names it). Ctrl-C exits with status 130;
for a sweep the line counts its records and gives the command that resumes it.
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
from mixlab.core import fields
from mixlab.runners.cli import bench, ceilings, check, leakage, sweep
from mixlab.runners.sweep.plan import TASK_FIXED_MODEL_FIELDS
from mixlab.runners.sweep.run import SweepInterrupted
from mixlab.runners.train.config import RunConfig, TrainConfig
from mixlab.runners.train.run import train_run
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

SET_HELP = "Task parameter, key=value (repeatable), e.g. --set seq_len=128 --set key_lengths=1,2,3."


def parse_assignments(items: list[str] | None) -> dict[str, str]:
    """``["a=1", "b=2,3"]`` -> ``{"a": "1", "b": "2,3"}``; a malformed item raises ValueError naming it."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects key=value, got {item!r}")
        out[key.strip()] = value
    return out


def build_task(name: str, assignments: list[str] | None) -> tasks.Task:
    if name not in tasks.TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(tasks.TASKS)}")
    params = tasks.TASKS[name].parse_params(parse_assignments(assignments))
    return tasks.get_task(name, **params)


@tasks_app.command("list")
def tasks_list() -> None:
    """Every registered task: name, what it tests, default parameters."""
    for name, cls in tasks.TASKS.items():
        defaults = " ".join(f"{k}={_fmt(v)}" for k, v in cls.defaults().items())
        typer.echo(f"{name}\n    {cls.description}\n    defaults: {defaults}")


@tasks_app.command("show")
def tasks_show(
    name: str = typer.Argument(..., help="Task name, see `mixlab tasks list`."),
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
    mixlab.mixers) with its origin and the first paragraph of its docstring. An import path
    package.module:Factory is accepted wherever a name is."""
    for name, origin in models.mixer_origins().items():
        try:
            doc = inspect.cleandoc(models.resolve_mixer(name).__doc__ or "")
            summary = " ".join(doc.split("\n\n")[0].split())
        except ValueError as exc:  # a broken plugin is listed, not fatal
            summary = f"cannot load: {exc}"
        typer.echo(f"{name:24s} {summary}  [{origin}]")


RUN_SET_HELP = (
    "key=value (repeatable) for a task parameter, a model field or a training field, e.g. --set seq_len=64 "
    "--set d_model=64 --set lr=1e-3; prefix task., model. or train. when a name is ambiguous."
)


def split_run_assignments(task_name: str, assignments: list[str] | None) -> tuple[dict, dict, dict]:
    """Route ``--set`` items to (task params, model fields, train fields), typed; ambiguity or unknown keys raise."""
    if task_name not in tasks.TASKS:
        raise ValueError(f"unknown task {task_name!r}; known tasks: {', '.join(tasks.TASKS)}")
    spaces = {
        "task": fields.field_types(tasks.TASKS[task_name].Params),
        # the task sets vocab_size and max_seq_len
        "model": {k: v for k, v in fields.field_types(models.ModelConfig).items() if k not in TASK_FIXED_MODEL_FIELDS},
        "train": fields.field_types(TrainConfig),
    }
    out: dict[str, dict] = {"task": {}, "model": {}, "train": {}}
    for key, text in parse_assignments(assignments).items():
        space, _, field = key.rpartition(".")
        if space:
            if space not in spaces or field not in spaces[space]:
                raise ValueError(f"unknown parameter {key!r}")
            owners = [space]
        else:
            owners = [name for name, names in spaces.items() if field in names]
            if not owners:
                raise ValueError(f"unknown parameter {key!r} (not a parameter of task {task_name!r}, "
                                 "a model field or a training field)")
            if len(owners) > 1:
                raise ValueError(f"parameter {key!r} is ambiguous: write " + " or ".join(f"{o}.{key}" for o in owners))
        out[owners[0]][field] = fields.parse(field, text, spaces[owners[0]][field], where=owners[0])
    return out["task"], out["model"], out["train"]


@app.command("run")
def run(
    task: str = typer.Argument(..., help="Task name, see `mixlab tasks list`."),
    mixer: str = typer.Option("attention", help="Mixer name (see `mixlab mixers list`), import path "
                              "package.module:Factory, or a hybrid stack's comma list cycled over the layers "
                              "(static_conv,attention)."),
    set_: list[str] = typer.Option(None, "--set", help=RUN_SET_HELP),
    seed: int = typer.Option(0, help="Initialisation seed (model init and shuffling)."),
    data_seed: int = typer.Option(0, help="Data seed (train and test sets)."),
    epochs: int = typer.Option(None, help="Epochs (default: the training config's, 200, the MAD protocol's). "
                               "With --progress a line on stderr says the epochs, steps and parameters before "
                               "training starts."),
    steps: int = typer.Option(None, help="Optimizer steps instead of epochs."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    out: str = typer.Option("runs", help="Folder for the run's JSON record."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
    save: bool = typer.Option(False, "--save", help="Also write the model to <out>/<name>.pt (weights of the "
                              "reported, lowest-perplexity evaluation; load with models.load)."),
) -> None:
    """Train one model on one task and write its record (config, versions, per-epoch and final metrics)."""
    task_params, model_fields, train_fields = split_run_assignments(task, set_)
    models.pattern_classes(mixer)  # an unknown name or a broken import path fails before any data is made
    train_fields.update(init_seed=seed, data_seed=data_seed, device=device)
    if steps is not None:
        train_fields.update(steps=steps, epochs=None)
    elif epochs is not None:
        train_fields["epochs"] = epochs
    config = RunConfig(task=task, task_params=task_params, model={"mixer": mixer, **model_fields},
                       train=TrainConfig(**train_fields))
    record = train_run(config, out_dir=out, progress=progress, save=save)
    final = record["final"]
    qkv = record["resolved"]["model"]["qkv_conv"]
    label = mixer if qkv == "none" else f"{mixer}+qkv_{qkv}"
    typer.echo(
        f"{task} {label}: acc {final['acc_micro']:.4f} (macro {final['acc_macro']:.4f}), test ppl "
        f"{final['test_ppl']:.4g} at epoch {final['best_epoch']}, {record['n_params']:,} params, "
        f"{record['steps']} steps in {record['wall_time_s']:.1f} s ({record['steps_per_s']:.1f} steps/s) "
        f"-> {out}/{record['name']}.json"
        + (f" and {out}/{record['checkpoint']}" if save else "")
        + "".join(f"; {k} {v:.4f}" for k, v in final.items()
                  if k.startswith("acc_") and k not in ("acc_micro", "acc_macro"))
    )


def _fmt(value) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


for _module in (bench, ceilings, check, leakage, sweep):
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
    except SweepInterrupted as exc:
        # running the same command again skips every run that has a record
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
