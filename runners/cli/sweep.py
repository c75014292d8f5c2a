"""``mixlab sweep|sweeps``, ``mixlab mad run|table|profiles``, ``mixlab report`` and ``mixlab claims``: thin
commands over runners.sweep.run, runners.sweep.spec, runners.sweep.mad and analysis. ``register(app)`` adds them to the
typer app of runners/cli/main.py."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path

import typer
from mixlab.analysis import tensorboard
from mixlab.analysis.aggregate import load_sweep
from mixlab.analysis.tables import mad_entry, mad_task_rows, mad_text, write_csv
from mixlab.runners.cli.settings import LOG_HELP
from mixlab.runners.sweep import local_backend, mad
from mixlab.runners.sweep.jobs import DEFAULT_MAX_STACK
from mixlab.runners.sweep.manifest import check_devices, plan_for_folder
from mixlab.runners.sweep.plan import SweepPlan
from mixlab.runners.sweep.ray_backend import RayOptions
from mixlab.runners.sweep.run import BACKENDS, SweepOptions, SweepResult, run_sweep
from mixlab.runners.sweep.spec import load_spec, preset_names, reference_claims
from mixlab.runners.train import resume
from mixlab.runners.train.speed import SPEED_HELP, from_flags

WORKERS_HELP = "Local backend: jobs at once, each in its own process (on a GPU they share it)."
LIMIT_HELP = "Run at most this many of the missing runs, then stop (run again to continue)."
TASKS_HELP = "Comma-separated tasks: train only their missing runs now (the others stay missing)."
MODELS_HELP = "Comma-separated model names of the spec: train only their missing runs now."
SETTINGS_HELP = ("Comma-separated settings (the report's labels, e.g. baseline,seq_len=512): train only their "
                 "missing runs now.")
STOP_AFTER_HELP = ("Seconds after which no new job starts; jobs in flight finish (fit a hard time limit: the limit "
                   "minus the longest job).")
MAX_STACK_HELP = ("Most runs a stack of the batched engine trains at once; a job queues more of equal step shape, "
                  "each taking the row of a run that ended.")
BATCH_HELP = "Train the runs of a job stacked (the batched engine); --no-batch: one at a time (train_run)."
COMPILE_HELP = "torch.compile the batched step (results match to rounding, not bitwise); as --speed compile."
CUDA_GRAPH_HELP = ("Replay the batched step as a CUDA graph (CUDA only); as --speed cuda-graph, with --compile as "
                   "--speed compile+graph.")
BACKEND_HELP = f"Where jobs run: {' or '.join(BACKENDS)} (each job a Ray task; pip install 'mixlab[ray]')."
ADDRESS_HELP = ("Ray cluster: auto, HOST:PORT or ray://HOST:PORT (default: RAY_ADDRESS, else a cluster started "
                "here by `ray start`, else a new local Ray).")
CPUS_HELP = "Ray: CPUs each job asks for (its torch threads)."
GPUS_HELP = "Ray: GPUs each job on CUDA asks for; a fraction shares a GPU (0.25: four jobs per GPU)."
RETRIES_HELP = "Ray: times a job whose worker died is run again."
RATE_HELP = ("Training rate MODEL=TOKENS_PER_S (e.g. the token-weighted figure of `mixlab bench mad`), "
             "repeatable; a bare number for every model.")
CHECKPOINT_EVERY_HELP = ("Seconds between checkpoints of a stack in mid-training (<out>/runs/partial/; 0: at every "
                         "evaluation; negative: none), also written on Ctrl-C, SIGINT or SIGTERM (timeout, kill): the "
                         "same command run again goes on from them to the same records.")
DEVICE_HELP = ("Where the runs train: auto, cpu or cuda (default: the spec's, else auto). A folder's runs keep "
               "their names on any device (docs/sweeps.md).")
CUDA_DEVICES_HELP = ("Comma-separated CUDA device indices, e.g. 0,1,2,3, or all (every visible device): the workers "
                     "go round-robin to them, each seeing only its own (at least one worker per device), and take "
                     "the longest jobs first.")


# The options of `sweep` and `mad run` that say how the runs train: (name, type, default, help), declared once;
# ``with_sweep_options`` adds them to a command, which gets them as one SweepOptions.
SWEEP_OPTIONS = (
    ("workers", int, 1, WORKERS_HELP),
    ("limit", int, None, LIMIT_HELP),
    ("tasks", str, None, TASKS_HELP),
    ("models", str, None, MODELS_HELP),
    ("settings", str, None, SETTINGS_HELP),
    ("stop_after", float, None, STOP_AFTER_HELP),
    ("progress", bool, True, "Show progress bars."),
    ("max_stack", int, DEFAULT_MAX_STACK, MAX_STACK_HELP),
    ("batch", bool, True, BATCH_HELP),
    ("speed", str, None, SPEED_HELP),
    ("compile", bool, False, COMPILE_HELP),
    ("cuda_graph", bool, False, CUDA_GRAPH_HELP),
    ("backend", str, "local", BACKEND_HELP),
    ("address", str, None, ADDRESS_HELP),
    ("cpus_per_job", int, 1, CPUS_HELP),
    ("gpus_per_job", float, 1.0, GPUS_HELP),
    ("max_retries", int, 3, RETRIES_HELP),
    ("cuda_devices", str, None, CUDA_DEVICES_HELP),
    ("checkpoint_every", float, resume.DEFAULT_EVERY_S, CHECKPOINT_EVERY_HELP),
)


def with_sweep_options(*, omit: Sequence[str] = ()) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command the options of SWEEP_OPTIONS but ``omit``, after its own: typer reads them from the
    signature, and the command gets their values as one ``options: SweepOptions`` (``_sweep_options``)."""
    shared = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=typer.Option(default, help=text),
                                annotation=kind)
              for name, kind, default, text in SWEEP_OPTIONS if name not in omit]

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "options"]

        @functools.wraps(command)
        def with_options(**values: object) -> None:
            options = _sweep_options(**{p.name: values.pop(p.name) for p in shared})
            command(**values, options=options)

        with_options.__signature__ = inspect.Signature([*own, *shared])
        return with_options

    return decorate


def _sweep_options(*, tasks: str | None = None, models: str | None = None, settings: str | None = None,
                   cuda_devices: str | None, address: str | None, cpus_per_job: int, gpus_per_job: float,
                   max_retries: int, speed: str | None, compile: bool, cuda_graph: bool,
                   **fields: object) -> SweepOptions:
    """SweepOptions from the values of SWEEP_OPTIONS: comma-separated lists split, Ray's options gathered, the
    speed flags folded into one mode (``runners.train.speed.from_flags``)."""
    return SweepOptions(**fields, tasks=comma_names(tasks), models=comma_names(models), settings=comma_names(settings),
                        cuda_devices=_indices(cuda_devices),
                        ray=_ray_options(fields["backend"], address, cpus_per_job, gpus_per_job, max_retries),
                        speed=from_flags(speed, compile, cuda_graph))


@with_sweep_options()
def sweep(
    spec: str = typer.Argument(..., help="A preset name (see `mixlab sweeps`) or a YAML grid file."),
    out: str = typer.Option(None, help="Output folder (default runs/sweeps/<name>)."),
    device: str = typer.Option(None, help=DEVICE_HELP),
    seeds: int = typer.Option(None, help="Seeds 0..N-1 instead of the spec's."),
    log: tuple[str, str] | None = typer.Option(None, help=LOG_HELP, metavar="KIND DIR"),
    *,
    options: SweepOptions,
) -> None:
    """Run a grid of runs; finished runs are skipped and stacks stopped part-way go on from their checkpoints, so
    the same command resumes a stopped sweep, on any device."""
    grid = load_spec(spec)
    folder = Path(out) if out else Path("runs") / "sweeps" / grid.name
    plan = plan_for_folder(lambda d: grid.plan(device=d, seeds=None if seeds is None else list(range(seeds))),
                           folder, device)
    echo_result(run_in_folder(plan, folder, options, log))


def run_in_folder(plan: SweepPlan, folder: Path, options: SweepOptions,
                  log: tuple[str, str] | None = None) -> SweepResult:
    """``run_sweep``, after checking here that the devices its runs train on exist (Ray checks its cluster's) and
    that ``--log`` can write, logging its records as they appear."""
    log_dir = tensorboard.log_target(log)
    if options.backend == "local":
        check_devices(plan, folder)
    with tensorboard.logging_sweep(folder, log_dir):
        return run_sweep(plan, folder, options)


def _indices(text: str | None) -> list[int] | None:
    """``--cuda-devices 0,1`` as [0, 1], ``all`` as every visible device's index (None when not given); a
    non-integer raises ValueError naming it."""
    names = comma_names(text)
    if names is None:
        return None
    if names == ["all"]:
        return local_backend.every_device()
    bad = [n for n in names if not n.isdigit()]
    if bad:
        raise ValueError(f"--cuda-devices expects comma-separated device indices, got {bad[0]!r}")
    return [int(n) for n in names]


def comma_names(text: str | None) -> list[str] | None:
    """A comma-separated option as a list of names (None when not given)."""
    return None if text is None else [t.strip() for t in text.split(",") if t.strip()]


def sweep_cost(
    spec: str = typer.Argument(..., help="A preset name (see `mixlab sweeps`) or a YAML grid file."),
    out: str = typer.Option(None, help="Its output folder: runs with records there are done (default: none)."),
    device: str = typer.Option(None, help=DEVICE_HELP),
    seeds: int = typer.Option(None, help="Seeds 0..N-1 instead of the spec's."),
    rate: list[str] = typer.Option(None, help=RATE_HELP),
) -> None:
    """What a grid sweep costs before it runs, or what is left of it: runs per model and task, their steps and
    tokens if none stops early, and device-minutes at the given rates. Trains nothing."""
    from mixlab.runners.sweep.cost import parse_rates, remaining_table, sweep_costs

    rates = parse_rates(rate)
    typer.echo(remaining_table(sweep_costs(spec, out, device=device, seeds=seeds), rates))


def sweep_presets() -> None:
    """List the packaged sweep presets."""
    for name in preset_names():
        typer.echo(f"{name:20s} {load_spec(name).description}")


@with_sweep_options(omit=("models",))
def mad_run(
    model: str = typer.Option(..., help="A preset of models.PRESETS, a mixer of models.MIXERS or a hybrid "
                              "stack's per-layer pattern (static_conv,attention)."),
    profile: str = typer.Option(..., help="smoke, quick or paper (see `mixlab mad profiles`)."),
    seeds: int = typer.Option(None, help="Seeds 0..N-1 (default: the profile's)."),
    out: str = typer.Option(None, help="Output folder (default runs/mad/<model>-<profile>)."),
    device: str = typer.Option(None, help="Where the runs train: auto, cpu or cuda (default auto). A folder's runs "
                               "keep their names on any device (docs/sweeps.md)."),
    log: tuple[str, str] | None = typer.Option(None, help=LOG_HELP, metavar="KIND DIR"),
    *,
    options: SweepOptions,
) -> None:
    """Run the MAD protocol for one model (resumable on any device), then print its MAD table."""
    folder = Path(out) if out else mad.default_out(model, profile)
    plan = plan_for_folder(lambda d: mad.mad_plan(model, profile, seeds=seeds, device=d or "auto"), folder, device)
    typer.echo(plan.spec["profile_text"])
    result = run_in_folder(plan, folder, options, log)
    echo_result(result)
    if result.skipped + result.ran > 0:
        typer.echo(mad_text([mad_entry(load_sweep(folder))]))


def mad_table(
    folders: list[str] = typer.Argument(..., help="MAD output folders, one per model."),
    md: str = typer.Option(None, help="Also write the table as markdown to this file."),
    csv: str = typer.Option(None, help="Also write the table (long form) as CSV to this file."),
) -> None:
    """Print the MAD table: per task median [IQR] over seeds, the paper's value and the difference."""
    entries = [mad_entry(load_sweep(f)) for f in folders]
    text = mad_text(entries)
    typer.echo(text)
    if md:
        Path(md).write_text(text + "\n")
    if csv:
        write_csv(csv, mad_task_rows(entries))


def mad_remaining(
    folders: list[str] = typer.Argument(..., help="MAD output folders (`mixlab mad run --out`), one per model."),
    seeds: int = typer.Option(..., help="Count seeds 0..N-1 (those not started too)."),
    rate: list[str] = typer.Option(None, help=RATE_HELP),
) -> None:
    """What each folder still lacks for N seeds: missing runs per task and seed, their steps and tokens if none
    stops early, the share of budget the task's finished runs trained, and device-minutes at the given rates."""
    from mixlab.runners.sweep.cost import parse_rates, remaining, remaining_table

    rates = parse_rates(rate)
    typer.echo(remaining_table([c for f in folders for c in remaining(f, seeds)], rates))


def mad_profiles() -> None:
    """What each profile runs (the reductions are described in runners/sweep/mad.py)."""
    for profile in mad.PROFILES.values():
        typer.echo(profile.describe())


def report(
    folders: list[str] = typer.Argument(..., help="Sweep or MAD output folders, folders of `mixlab run` records, "
                                        "or folders holding them."),
    out: str = typer.Option(None, help="Report folder (default: the one folder given)."),
) -> None:
    """Write report.md, CSV tables and PNG figures for sweep folders and folders of single runs; name every record
    that could not be read."""
    # imported here: seaborn takes a second or two to import and only the report draws
    from mixlab.analysis.report import read_folders, render_report, report_folder, unreadable_lines

    target = report_folder(folders, out)
    datas = read_folders(folders)
    written = render_report(datas, target)
    typer.echo(f"wrote {len(written)} files to {written[0].parent}: " + ", ".join(p.name for p in written))
    for line in unreadable_lines(datas):
        typer.echo(line)


def archive(
    folders: list[str] = typer.Argument(..., help="Sweep output folders, or folders holding them (e.g. "
                                        "reproductions/mad)."),
) -> None:
    """Pack each sweep's finished records (runs/<hash>.json) into runs/records.jsonl.xz, which every command reads
    as it reads the files: committed reproductions stay small. A sweep goes on over an archived folder."""
    from mixlab.core.records import RUNS, archive_records

    for folder in folders:
        root = Path(folder)
        if not root.is_dir():
            raise ValueError(f"no folder {folder!r}")
        sweeps = [root] if (root / RUNS).is_dir() else sorted(p.parent for p in root.rglob(RUNS) if p.is_dir())
        if not sweeps:
            raise ValueError(f"{folder!r} holds no sweep folder (none with a {RUNS}/ folder)")
        for sweep_dir in sweeps:
            moved, total = archive_records(sweep_dir)
            typer.echo(f"{sweep_dir}: {moved} records archived, {total} in {RUNS}/records.jsonl.xz")


def claims_command(
    folders: list[str] = typer.Argument(..., help="Folders of run records, or folders holding them (e.g. "
                                        "reproductions/)."),
    out: str = typer.Option(None, help="Write the ledger (markdown) to this file instead of printing it."),
) -> None:
    """The claims ledger: every claim of the reproduced papers with its verdict on the records of FOLDERS, the
    evidence and the deviations from the paper's protocol (docs/claims.md)."""
    from mixlab.analysis.ledger import PRESET_SWEEPS, write_ledger  # imported here, as report's: seaborn is slow

    text = write_ledger(folders, reference_claims(PRESET_SWEEPS), out)
    typer.echo(f"wrote {out}" if out else text)


def _ray_options(backend: str, address: str | None, cpus_per_job: int, gpus_per_job: float,
                 max_retries: int) -> RayOptions | None:
    """The Ray options of a command line; None for the local backend, where --address would be a mistake."""
    if backend != "ray":
        if address is not None:
            raise ValueError(f"--address {address} needs --backend ray")
        return None
    return RayOptions(address=address, cpus_per_job=cpus_per_job, gpus_per_job=gpus_per_job,
                      max_retries=max_retries)


def echo_result(result: SweepResult) -> None:
    typer.echo(f"{result.total} runs: {result.skipped} already done, {result.ran} run now "
               f"-> {result.out_dir}")
    if result.not_started:
        typer.echo(f"stopped starting jobs (--stop-after): {result.not_started} runs left; run again to continue")


def register(app: typer.Typer) -> None:
    """Add ``sweep``, ``sweeps``, ``mad run|table|profiles``, ``report``, ``claims`` and ``archive`` to ``app``."""
    app.command("sweep")(sweep)
    app.command("sweeps")(sweep_presets)
    app.command("sweep-cost")(sweep_cost)
    mad_app = typer.Typer(help="The MAD benchmark (docs/mad.md): run the protocol, print the table.",
                          no_args_is_help=True)
    mad_app.command("run")(mad_run)
    mad_app.command("remaining")(mad_remaining)
    mad_app.command("table")(mad_table)
    mad_app.command("profiles")(mad_profiles)
    app.add_typer(mad_app, name="mad")
    app.command("report")(report)
    app.command("claims")(claims_command)
    app.command("archive")(archive)
