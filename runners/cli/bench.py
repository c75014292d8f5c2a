"""``mixlab bench ...``: kernel and training benchmarks, and ``bench profile``'s profiles (each prints markdown; the
GPU name and versions on top)."""

from __future__ import annotations

import typer
from mixlab.runners.bench.train import WARMUP_STEPS
from mixlab.runners.sweep.jobs import DEFAULT_MAX_STACK
from mixlab.runners.train.speed import SPEED_HELP, from_flags

bench_app = typer.Typer(help="Benchmarks and profiles: kernels and training throughput (tables for BENCHMARKS.md).",
                        no_args_is_help=True)


def parse_shape(text: str, n: int | None, what: str, option: str = "--shape") -> tuple[int, ...]:
    """``"4,4096,2048,4"`` -> (4, 4096, 2048, 4): ``n`` positive integers (None: any number); anything else raises
    ValueError naming ``option`` and the text."""
    try:
        shape = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"{option} expects {what}, got {text!r}") from None
    if (n is not None and len(shape) != n) or min(shape) < 1:
        raise ValueError(f"{option} expects {what} (positive integers), got {text!r}")
    return shape


# Options several benchmarks share.
_REPEATS = typer.Option(100, help="Milliseconds of timed runs per measurement (do_bench rep).")
_SEQ_LENS = typer.Option("128,256,512,1024", help="Row lengths T, one table each.")
_HEADS = typer.Option(16, help="Heads H.")
_TOKENS = typer.Option(18 * 128 * 128, help="Tokens a call; B = tokens // T rows.")


def _train_fields(task: str, set_: list[str] | None, command: str, options: str):
    """``--set`` of a training benchmark: task parameters and model fields; training fields are its options."""
    from mixlab.runners.cli.settings import split_run_assignments

    fields = split_run_assignments(task, set_)
    if fields.train:
        raise ValueError(f"{command} sets training fields with its own options ({options}), not --set "
                         f"{next(iter(fields.train))}")
    return fields


@bench_app.command("shortconv")
def bench_shortconv_cmd(
    shape: str = typer.Option("4,4096,2048,4", help="B,T,D,W."),
    dtype: str = typer.Option("bf16", help="fp32, bf16 or fp16."),
    n_docs: int = typer.Option(64, help="Documents in the packed variant."),
    repeats: int = _REPEATS,
    only: str = typer.Option("static,hs1,hs16,lowrank", "--kernels",
                             help="Comma-separated kernels to time: static, hs1, hs16 (head-wise at head size 1, 16), "
                                  "lowrank."),
) -> None:
    """Static, head-wise and low-rank short convs: fwd and fwd+bwd medians, bandwidth, byte floor, vs torch."""
    from mixlab.runners.bench.shortconv import bench_shortconv

    typer.echo(bench_shortconv(parse_shape(shape, 4, "B,T,D,W"), dtype=dtype, n_docs=n_docs, repeats=repeats,
                               progress=True, only=tuple(k.strip() for k in only.split(",") if k.strip())))


@bench_app.command("rubiconv")
def bench_rubiconv_cmd(
    n_tokens: int = typer.Option(65536, help="Tokens in the packed row (lognormal document lengths)."),
    d: int = typer.Option(1024, help="Channels D."),
    dtype: str = typer.Option("fp32", help="fp32 or bf16 activations and filter."),
    blocks: str = typer.Option("", help="Extra block sizes k for the gemm and triton rows, e.g. 64,256."),
    seed: int = typer.Option(0, help="Seed of the document lengths and data."),
    repeats: int = _REPEATS,
    median_length: int | None = typer.Option(None, help="Median document length (default about 812 tokens)."),
) -> None:
    """RubiConv backends against a leaky single FFT, a per-document loop, pad-to-longest and pow2 buckets."""
    from mixlab.runners.bench.rubiconv import bench_rubiconv

    extra = parse_shape(blocks, None, "block sizes, e.g. 64,256", "--blocks") if blocks else ()
    typer.echo(bench_rubiconv(n_tokens=n_tokens, d=d, dtype=dtype, repeats=repeats, blocks=extra, seed=seed,
                              median_length=median_length))


@bench_app.command("attention")
def bench_attention_cmd(
    seq_lens: str = _SEQ_LENS,
    heads: int = _HEADS,
    head_dim: int = typer.Option(8, help="Head size hd."),
    tokens: int = _TOKENS,
    dtype: str = typer.Option("bf16", help="fp32, bf16 or fp16."),
    repeats: int = _REPEATS,
) -> None:
    """Triton causal attention against SDPA with each backend forced: fwd and fwd+bwd, tokens/s, byte floor."""
    from mixlab.runners.bench.attention import bench_attention

    lens = parse_shape(seq_lens, None, "row lengths, e.g. 128,1024", "--seq-lens")
    typer.echo(bench_attention(lens, n_heads=heads, head_dim=head_dim, tokens=tokens, dtype=dtype, repeats=repeats))


@bench_app.command("fla")
def bench_fla_cmd(
    seq_lens: str = _SEQ_LENS,
    ops: str = typer.Option("gla,simple_gla,retention", help="fla ops with both kernel forms, comma-separated."),
    heads: int = _HEADS,
    head_dim: int = typer.Option(8, help="Key size per head."),
    value_dim: int = typer.Option(16, help="Value size per head."),
    tokens: int = _TOKENS,
    dtype: str = typer.Option("bf16", help="fp32, bf16 or fp16 (q, k, v; gates fp32)."),
    repeats: int = _REPEATS,
) -> None:
    """fla's chunked against its fused recurrent kernels (GLA, simple_gla, retention): fwd and fwd+bwd."""
    from mixlab.runners.bench.fla import bench_fla

    lens = parse_shape(seq_lens, None, "row lengths, e.g. 128,1024", "--seq-lens")
    typer.echo(bench_fla(lens, ops=tuple(o.strip() for o in ops.split(",") if o.strip()), n_heads=heads,
                         head_dim=head_dim, value_dim=value_dim, tokens=tokens, dtype=dtype, repeats=repeats))


@bench_app.command("tune")
def bench_tune_cmd(
    op: str = typer.Argument(..., help="shortconv, attention or rubiconv: whose table of launch settings."),
    group: list[str] = typer.Option(None, "--group", help="Only this tune group (repeatable; default: all)."),
    repeats: int = _REPEATS,
    rounds: int = typer.Option(1, help="Time every candidate of a group this many times, interleaved."),
    smoke: bool = typer.Option(False, "--smoke", help="Tiny shapes: a check of the code path, not a measurement."),
) -> None:
    """Time candidate launch settings (the table's row, then variants of it) of a kernel module; print the winners."""
    from mixlab.runners.bench.tune import tune

    tune(op, group or None, rep=repeats, rounds=rounds, smoke=smoke, out=typer.echo)


@bench_app.command("train")
def bench_train_cmd(
    task: str = typer.Option("mad/in_context_recall", help="Task (its defaults: the MAD baseline)."),
    model: str = typer.Option("transformer", help="A preset (transformer, static_conv_qkv, ...) or a mixer name."),
    n_runs: int = typer.Option(6, help="Runs trained together (e.g. the MAD lr x wd grid)."),
    steps: int = typer.Option(200, help="Timed optimizer steps per run."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    speed: str = typer.Option(None, help="Comma-separated speed modes, a batched row each after the eager one: "
                              "compile, cuda-graph, compile+graph, auto (auto's row names the mode it picked)."),
    compile: bool = typer.Option(False, "--compile", help="Add a torch.compile row (as --speed compile)."),
    cuda_graph: bool = typer.Option(False, "--cuda-graph", help="Add a CUDA-graph row (as --speed cuda-graph; "
                                    "with --compile also a compile+graph row)."),
    progress: bool = typer.Option(True, help="Show the runs' progress bars on stderr (on the CPU the benchmark "
                                  "takes minutes)."),
    set_: list[str] = typer.Option(None, "--set", help="key=value (repeatable) for a task parameter or a model "
                                   "field over the model's, e.g. --set query_share=0.5 --set n_heads=8; prefix task. "
                                   "or model. when a name is ambiguous (training fields: the options here)."),
    batch_size: int = typer.Option(128, help="Rows per step."),
    num_train: int = typer.Option(12800, help="Training rows (generated once per data seed)."),
    num_test: int = typer.Option(1280, help="Test rows."),
) -> None:
    """Tokens per second and runs per hour: one run at a time against many runs batched on one device."""
    from mixlab.runners.bench.train import bench_train
    from mixlab.runners.cli.sweep import comma_names

    fields = _train_fields(task, set_, "bench train", "--steps, --batch-size, --num-train, --num-test, --device")
    flagged = [m for m, on in (("compile", compile), ("cuda-graph", cuda_graph),
                               ("compile+graph", compile and cuda_graph)) if on]
    typer.echo(bench_train(task=task, model=model, n_runs=n_runs, steps=steps, device=device,
                           speeds=[*flagged, *(comma_names(speed) or [])], progress=progress,
                           task_params=fields.task_params, model_params=fields.model,
                           batch_size=batch_size, num_train=num_train, num_test=num_test))


@bench_app.command("mad")
def bench_mad_cmd(
    model: str = typer.Option("transformer", help="A preset (transformer, static_conv_qkv, ...) or a mixer name."),
    profile: str = typer.Option("paper", help="MAD profile: paper, quick or smoke."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    seeds: int = typer.Option(None, help="Seeds planned (default: the profile's, as `mad run`); a setting's stack "
                              "holds its grid times the seeds, as the sweep stacks them."),
    steps: int = typer.Option(30, help="Timed optimizer steps per step shape."),
    warmup_steps: int = typer.Option(WARMUP_STEPS, help="Steps of the untimed call before each timing "
                                     "(compilation, graph capture)."),
    tasks: str = typer.Option(None, help="Only these MAD tasks, comma-separated (e.g. mad/fuzzy_recall)."),
    settings: str = typer.Option(None, help="Only the step shapes holding one of these settings, comma-separated "
                                 "(e.g. baseline,seq_len=512)."),
    max_stack: int = typer.Option(DEFAULT_MAX_STACK, help="Runs a stack trains at once, as the sweep's --max-stack."),
    speed: str = typer.Option(None, help=SPEED_HELP),
    compile: bool = typer.Option(False, "--compile", help="Stacks under torch.compile (as --speed compile)."),
    cuda_graph: bool = typer.Option(False, "--cuda-graph", help="Stacks as CUDA graphs (as --speed cuda-graph)."),
    alone: bool = typer.Option(True, "--alone/--no-alone", help="Also time one run at a time in the plain loop."),
    stop_after: float = typer.Option(None, help="Seconds after which no step shape starts timing; the totals name "
                                     "the shapes not timed and leave them out (fit a time limit)."),
    heaviest_first: bool = typer.Option(False, "--heaviest-first", help="Time the shapes with the most protocol "
                                        "tokens first (with --stop-after: cover most of the protocol)."),
    precompile: int = typer.Option(0, help="Processes that first compile the compiled shapes into torch's on-disk "
                                   "caches, in parallel, so each timing's warm-up loads its code (0: compile as "
                                   "each shape is timed)."),
    sweep_epochs: int = typer.Option(0, help="Then run a real sweep of the same runs cut to this many epochs and "
                                              "compare its tokens/s with the benchmark's (0: skip)."),
    workers: int = typer.Option(1, help="Jobs at a time in that sweep (as mad run --workers)."),
) -> None:
    """The MAD protocol's train tokens/s per step shape, stacked as a sweep stacks it, and its GPU-minutes; each
    row goes to stderr as soon as it is timed."""
    from mixlab.runners.bench.mad import BenchMadOptions, bench_mad
    from mixlab.runners.cli.sweep import comma_names

    options = BenchMadOptions(device=device, seeds=seeds, steps=steps, warmup_steps=warmup_steps,
                              tasks=comma_names(tasks), settings=comma_names(settings), max_stack=max_stack,
                              speed=from_flags(speed, compile, cuda_graph), alone=alone, stop_after=stop_after,
                              heaviest_first=heaviest_first, precompile=precompile,
                              sweep_epochs=sweep_epochs or None, workers=workers)
    typer.echo(bench_mad(model, profile, options))


profile_app = typer.Typer(help="Where the time goes: the short convs' eager ops, Nsight Compute launches, a stack's "
                          "steps, the same by row length, one run alone, the eager ops' host time (markdown; device "
                          "and versions on top).",
                          no_args_is_help=True)
bench_app.add_typer(profile_app, name="profile")
KERNELS_HELP = "Comma-separated short convs: static, hs1, hs16 (head-wise at head size 1, 16), lowrank."


def _conv_inputs(shape: str, dtype: str, n_docs: int):
    from mixlab.runners.bench.profile import ConvInputs

    return ConvInputs(shape=parse_shape(shape, 4, "B,T,D,W"), dtype=dtype, n_docs=n_docs)


@profile_app.command("ops")
def profile_ops_cmd(
    shape: str = typer.Option("4,4096,2048,4", help="B,T,D,W of the short convs."),
    dtype: str = typer.Option("bf16", help="fp32, bf16 or fp16 activations."),
    n_docs: int = typer.Option(64, help="Documents of the packed case."),
    only: str = typer.Option("static,hs1,hs16,lowrank", "--kernels", help=KERNELS_HELP),
    calls: int = typer.Option(20, help="Profiled calls of each op."),
    rows: int = typer.Option(12, help="Kernels and host ops listed."),
) -> None:
    """torch.profiler of each short conv's eager fwd+bwd: wall and GPU busy time a call, kernels by launch, host
    ops (CUDA)."""
    from mixlab.runners.bench.profile import profile_ops
    from mixlab.runners.cli.sweep import comma_names

    typer.echo(profile_ops(_conv_inputs(shape, dtype, n_docs), only=comma_names(only), calls=calls, rows=rows))


@profile_app.command("ncu")
def profile_ncu_cmd(
    ops: str = typer.Option("shortconv,attention", help="Comma-separated groups: shortconv, attention, rubiconv."),
    shape: str = typer.Option("4,4096,2048,4", help="B,T,D,W of the short convs."),
    dtype: str = typer.Option("bf16", help="fp32, bf16 or fp16 activations of the short convs."),
    n_docs: int = typer.Option(64, help="Documents of the short convs' packed case."),
) -> None:
    """Every kernel launched once in an NVTX range, for ncu --profile-from-start off --nvtx (CUDA); prints the
    launches in order."""
    from mixlab.runners.bench.profile import profile_ncu
    from mixlab.runners.cli.sweep import comma_names

    typer.echo(profile_ncu(comma_names(ops), _conv_inputs(shape, dtype, n_docs)))


# The options ``profile train`` and ``profile rows`` share.
_STACK_TASK = typer.Option("mad/in_context_recall", help="Task (its defaults: the MAD baseline).")
_STACK_MODEL = typer.Option("transformer", help="A preset (transformer, static_conv_qkv, ...) or a mixer name.")
_STACK_SKIP = typer.Option(5, help="Steps before the profiled window (at least 1).")
_STACK_NUM_TEST = typer.Option(128, help="Test rows (evaluated once, after the window).")
_STACK_SET = typer.Option(None, "--set", help="key=value (repeatable) for a task parameter or a model field over "
                          "the model's, e.g. --set proj_bias=true --set seq_len=1024; prefix task. or model. when a "
                          "name is ambiguous.")
_SPEEDS = "eager, compile, cuda-graph, compile+graph, auto"


@profile_app.command("train")
def profile_train_cmd(
    task: str = _STACK_TASK,
    model: str = _STACK_MODEL,
    n_runs: int = typer.Option(6, help="Runs in the stack."),
    steps: int = typer.Option(30, help="Steps of each run; the window ends with the last."),
    skip: int = _STACK_SKIP,
    speed: str = typer.Option("eager", help=f"How the stack steps: {_SPEEDS}."),
    rows: int = typer.Option(25, help="Kernels and host ops listed."),
    num_test: int = _STACK_NUM_TEST,
    set_: list[str] = _STACK_SET,
) -> None:
    """torch.profiler over the steady steps of a stack of bench train's runs: wall and GPU busy time a step,
    kernels, host ops (CUDA)."""
    from mixlab.runners.bench.profile import TrainProfile, profile_train

    fields = _train_fields(task, set_, "bench profile train", "--steps, --num-test")
    options = TrainProfile(n_runs=n_runs, steps=steps, skip=skip, speed=speed, num_test=num_test, rows=rows)
    typer.echo(profile_train(task, model, options, task_params=fields.task_params, model_params=fields.model))


@profile_app.command("rows")
def profile_rows_cmd(
    task: str = _STACK_TASK,
    model: str = _STACK_MODEL,
    lengths: str = typer.Option("128,256,512,1024", help="Comma-separated seq_len values, one stack each."),
    n_runs: int = typer.Option(18, help="Runs in each stack (a MAD seed's stacks hold 18 at the paper profile)."),
    steps: int = typer.Option(20, help="Steps of each run; its last closes the window."),
    skip: int = _STACK_SKIP,
    speed: str = typer.Option("auto", help=f"How the stacks step: {_SPEEDS}."),
    num_test: int = _STACK_NUM_TEST,
    device: str = typer.Option("cuda", help="cuda, or cpu to check the path."),
    set_: list[str] = _STACK_SET,
) -> None:
    """Where a stack's step goes as its rows grow: per row length, ms a step, tokens/s and kernel time by group."""
    from mixlab.runners.bench.profile import TrainProfile, profile_rows

    seq_lens = parse_shape(lengths, None, "seq_len values, e.g. 128,1024", "--lengths")
    fields = _train_fields(task, set_, "bench profile rows", "--steps, --num-test")
    options = TrainProfile(n_runs=n_runs, steps=steps, skip=skip, speed=speed, num_test=num_test)
    typer.echo(profile_rows(task, model, seq_lens, options, device=device, task_params=fields.task_params,
                            model_params=fields.model))


@profile_app.command("run")
def profile_run_cmd(
    preset: str = typer.Option("packed_rubiconv", help="A sweep preset (see `mixlab sweeps`) or a YAML grid file."),
    steps: int = typer.Option(200, help="Steps of the timed run alone."),
    profile_steps: int = typer.Option(20, help="Steps of the profiled run."),
    rows: int = typer.Option(15, help="Kernels and host ops listed per model."),
    device: str = typer.Option("cuda", help="cuda, or cpu to check the path."),
) -> None:
    """Each model of a preset (first task, seed 0) trained alone as the sweep does: its steps/s, then a profile of
    a short run of it."""
    from mixlab.runners.bench.profile import profile_preset

    typer.echo(profile_preset(preset, steps=steps, profiled=profile_steps, rows=rows, device=device))


@profile_app.command("host")
def profile_host_cmd(
    repeats: int = typer.Option(15, help="Blocks timed; the median is printed."),
    calls: int = typer.Option(200, help="Calls per block."),
    device: str = typer.Option("cpu", help="cpu: launches skipped (run with TRITON_INTERPRET=1); cuda: launches "
                               "made."),
) -> None:
    """Host µs a call of the short convs' public ops, the autograd floor, and each op's pieces."""
    from mixlab.runners.bench.profile_host import host_overhead

    typer.echo(host_overhead(device, repeats=repeats, calls=calls))


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
