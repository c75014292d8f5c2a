"""The sweep runner's jobs: which runs share one call of the batched engine, and that batching, chunking and
resuming a half-done job change no record."""

import dataclasses
import json
import pickle

import pytest
import typer
from mixlab import tasks
from mixlab.runners.cli.sweep import register
from mixlab.runners.sweep import jobs as sweep_jobs
from mixlab.runners.sweep.jobs import Job, chunks, job_key, plan_jobs, run_job
from mixlab.runners.sweep.mad import LRS, WEIGHT_DECAYS, mad_plan
from mixlab.runners.sweep.plan import PlannedRun
from mixlab.runners.sweep.run import SweepOptions, run_sweep
from mixlab.runners.sweep.spec import SweepSpec
from mixlab.runners.train import engine
from mixlab.runners.train.config import RunConfig, TrainConfig
from mixlab.runners.train.resolved import resolve
from typer.testing import CliRunner

# vmap of CPU attention loops over the runs (no batching rule for the CPU flash kernel): slower, same numbers.
pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.filterwarnings("ignore:There is a performance drop because we have not yet")]

LAYER = {"mixer": "attention", "n_layers": 1, "n_heads": 2, "mlp_hidden": 0}
# 2 models x 2 widths x 2 learning rates x 2 seeds = 16 runs in 4 stackable groups (model x width) of 4.
GRID = {
    "name": "jobs",
    "tasks": [{"task": "mqar", "params": {"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2}}],
    "models": {"attn": LAYER, "conv": {**LAYER, "qkv_conv": "static"}},
    "model_grid": {"d_model": [8, 16]},
    "train": {"steps": 4, "epochs": None, "batch_size": 8, "num_train": 16, "num_test": 8, "eval_every": 2,
              "device": "cpu"},
    "train_grid": {"lr": [1e-3, 1e-2]},
    "seeds": 2,
}
# Fields that only say how long a run took.
TIME_FIELDS = ("wall_time_s", "train_time_s", "steps_per_s")


def grid(**changes):
    return SweepSpec.from_dict({**GRID, **changes}).plan()


def records(folder):
    """hash -> record without its time fields, for every record of a sweep folder."""
    return {p.stem: {k: v for k, v in json.loads(p.read_text()).items() if k not in TIME_FIELDS}
            for p in (folder / "runs").glob("*.json")}


LOSSES = ("train_loss", "test_loss", "test_ppl")


def assert_same_results(got, want):
    """Records equal but for the losses, which agree to float rounding: MQAR scores 2 of 16 positions, so the
    head runs at those only (runners.train.metrics), and its stacked (vmapped) matmul rounds differently on the CPU."""
    assert got.keys() == want.keys()
    for name, record in got.items():
        ref = want[name]
        assert {k: v for k, v in record.items() if k not in ("history", "final")} == \
               {k: v for k, v in ref.items() if k not in ("history", "final")}
        for entry, ref_entry in zip([*record["history"], record["final"]], [*ref["history"], ref["final"]]):
            assert {k: v for k, v in entry.items() if k not in LOSSES} == \
                   {k: v for k, v in ref_entry.items() if k not in LOSSES}
            for key in LOSSES:
                assert entry[key] == pytest.approx(ref_entry[key], rel=1e-5)


def planned(task, params, model, **train):
    config = RunConfig(task=task, task_params=params, model=model,
                       train=TrainConfig(**{**GRID["train"], **train}))
    return PlannedRun(resolve(config), {})


def test_runs_of_one_model_shape_share_a_job_in_plan_order():
    plan = grid()
    jobs = plan_jobs(plan.runs)
    assert [len(job) for job in jobs] == [4, 4, 4, 4]
    position = {run.hash: i for i, run in enumerate(plan.runs)}
    for job in jobs:
        models = {json.dumps(run.config.model, sort_keys=True) for run in job.runs}
        assert len(models) == 1, "one model config per job"
        assert {(run.config.train.lr, run.config.train.init_seed) for run in job.runs} == {
            (lr, seed) for lr in (1e-3, 1e-2) for seed in (0, 1)}, "learning rates and seeds stack"
        assert [position[h] for h in job.hashes] == sorted(position[h] for h in job.hashes)
    assert sorted(h for job in jobs for h in job.hashes) == sorted(position)
    firsts = [position[job.hashes[0]] for job in jobs]
    assert firsts == [0, 2, 4, 6], "jobs ordered by their first run (lr is the innermost grid)"
    assert {job.label for job in jobs} == {"mqar attention x4"} and {job.device for job in jobs} == {"cpu"}


@pytest.mark.parametrize(("max_stack", "job_stacks", "sizes", "width"),
                         [(1, 1, [1] * 16, 1), (3, 1, [2] * 8, 2), (1, 4, [4] * 4, 1), (3, 4, [4] * 4, 3),
                          (64, 4, [4] * 4, 4)],
                         ids=["one-run-per-job", "one-stack-per-job", "queue-of-one-wide-stacks", "queue-of-one",
                              "whole-groups"])
def test_jobs_hold_at_most_job_stacks_stacks_of_max_stack(max_stack, job_stacks, sizes, width):
    plan = grid()
    jobs = plan_jobs(plan.runs, max_stack, job_stacks=job_stacks)
    assert [len(job) for job in jobs] == sizes and {job.stack_width for job in jobs} == {width}
    assert sorted(h for job in jobs for h in job.hashes) == sorted(r.hash for r in plan.runs)
    if max_stack == job_stacks == 1:
        assert [job.hashes[0] for job in jobs] == [r.hash for r in plan.runs], "the plan's order, run by run"


@pytest.mark.parametrize(("n", "most", "sizes"), [
    (300, 256, [150, 150]), (91, 64, [46, 45]), (64, 64, [64]), (10, 3, [3, 3, 2, 2]), (5, 1, [1] * 5), (3, 64, [3]),
], ids=["300-at-256", "91-at-64", "exactly-one", "10-at-3", "one-each", "under-the-cap"])
def test_chunks_are_the_fewest_of_near_equal_size(n, most, sizes):
    members = list(range(100, 100 + n))
    stacks = chunks(members, most)
    assert [len(c) for c in stacks] == sizes
    assert [m for c in stacks for m in c] == members, "in order, every member once"


def test_mad_seeds_and_equal_shapes_share_a_stack():
    """``mad run --profile paper --seeds 3`` on in-context and noisy recall: each setting's 6 grid points and
    3 seeds make a job of 18; settings of equal step shapes share one job, stacked 64 at a time: in-context
    recall's baseline and training-set sizes (5 settings, 90 runs), and noisy recall's baseline, training-set sizes
    and frac_noise settings with in-context recall at V=32 (9 settings, 162 runs)."""
    plan = mad_plan("transformer", "paper", seeds=3, device="cpu")
    runs = [r for r in plan.runs if r.meta["task"] in ("mad/in_context_recall", "mad/noisy_recall")]
    meta = {r.hash: r.meta for r in runs}
    jobs = plan_jobs(runs)
    assert sorted((len(job), job.stack_width) for job in jobs) == [(18, 18)] * 11 + [(90, 64), (162, 64)]
    for job in jobs:
        settings = {(meta[h]["task"], meta[h]["setting"]) for h in job.hashes}
        assert {(meta[h]["seed"], meta[h]["train_grid"]["lr"], meta[h]["train_grid"]["weight_decay"],
                 meta[h]["task"], meta[h]["setting"]) for h in job.hashes} == {
            (s, lr, wd, *setting) for s in range(3) for lr in LRS for wd in WEIGHT_DECAYS for setting in settings}
        if len(job) == 18:
            assert len(settings) == 1
    sizes = [f"num_train={n}" for n in (800, 1600, 3200, 6400)]
    merged = sorted({(meta[h]["task"], meta[h]["setting"]) for h in job.hashes} for job in jobs if len(job) > 18)
    assert merged == sorted([
        {("mad/in_context_recall", s) for s in ("baseline", *sizes)},
        {("mad/in_context_recall", "vocab_size=32"), *(("mad/noisy_recall", s) for s in (
            "baseline", *sizes, *(f"frac_noise={f}" for f in (0.4, 0.6, 0.8))))}], key=len)


def test_unbatchable_runs_are_jobs_of_their_own():
    small, mqar = {**LAYER, "d_model": 8}, GRID["tasks"][0]["params"]
    rubiconv_triton = {"mixer": "rubiconv", "n_layers": 1, "d_model": 8, "mlp_hidden": 0, "kernel_backend": "triton"}
    conv_triton = {**small, "kernel_backend": "triton", "qkv_conv": "static"}  # short convs stack on Triton
    runs = [planned("mqar", mqar, rubiconv_triton, init_seed=s) for s in (0, 1)]
    runs += [planned("mqar", mqar, small, init_seed=s) for s in (0, 1)]
    runs += [planned("mqar", mqar, conv_triton, init_seed=s) for s in (0, 1)]
    runs += [planned("packed/noisy_recall", {"seq_len": 256}, small, init_seed=s) for s in (0, 1)]  # packed stack
    jobs = plan_jobs(runs)
    assert [job.hashes for job in jobs] == [[runs[0].hash], [runs[1].hash], [runs[2].hash, runs[3].hash],
                                            [runs[4].hash, runs[5].hash], [runs[6].hash, runs[7].hash]]


def test_a_sweep_resolves_each_run_once(monkeypatch):
    """Planning the MAD smoke profile, cutting it into jobs and handing each job to the engine builds each run's
    task at most once (``runners.train.resolved.resolve``; the plan shares one resolution among the training
    points of a task and model); the training itself is left out."""
    built = []
    get_task = tasks.get_task
    monkeypatch.setattr(tasks, "get_task", lambda name, **params: built.append(name) or get_task(name, **params))
    monkeypatch.setattr(engine, "_train_stack", lambda runs, names, **kwargs: [{"name": name} for name in names])
    plan = mad_plan("transformer", "smoke", seeds=2, device="cpu")
    jobs = plan_jobs(plan.runs)
    trained = [record["name"] for job in jobs for record in run_job(job, None)]
    assert sorted(trained) == sorted(r.hash for r in plan.runs)
    assert 0 < len(built) <= len(plan.runs)


def test_a_job_pickles_with_its_resolved_runs():
    """Jobs reach spawned workers and Ray tasks as pickles: a run of every task comes back with its config, hash,
    task (the same data), model config and stacking key."""
    runs = [resolve(RunConfig(task=name, model={"d_model": 16, "n_heads": 2}, train=TrainConfig(device="cpu")))
            for name in tasks.TASKS]
    job = pickle.loads(pickle.dumps(Job(tuple(runs))))
    for run, again in zip(runs, job.runs, strict=True):
        assert (again.config, again.hash, again.model_config, again.stack_key) == \
               (run.config, run.hash, run.model_config, run.stack_key)
        assert again.task.params == run.task.params and again.objective == run.objective
        assert again.task.generate(2, seed=1).inputs.equal(run.task.generate(2, seed=1).inputs)


def test_job_key_plans_cuda_runs_without_a_gpu():
    """A driver without a GPU plans a GPU sweep (engine.group_key would refuse device 'cuda' here)."""
    params = GRID["tasks"][0]["params"]
    runs = [planned("mqar", params, {**LAYER, "d_model": 8}, device=device, init_seed=seed)
            for device in ("cuda", "cpu", "auto") for seed in (0, 1)]
    keys = [job_key(run.resolved) for run in runs]
    assert keys[0] == keys[1] and len({keys[0], keys[2], keys[4]}) == 3
    assert [job.device for job in plan_jobs(runs)] == ["cuda", "cpu", "auto"]
    run = runs[0].resolved
    assert job_key(run.with_train(dataclasses.replace(run.config.train, precision="bf16"))) != keys[0]


def test_batched_sweep_equals_one_run_at_a_time(tmp_path, monkeypatch):
    calls = []

    def spy(name, function):
        def wrapped(configs, **kwargs):
            calls.append((name, len(configs), kwargs["max_stack"]) if name == "batched" else (name, 1))
            return function(configs, **kwargs)
        monkeypatch.setattr(sweep_jobs, function.__name__, wrapped)

    spy("batched", sweep_jobs.train_runs_batched)
    spy("alone", sweep_jobs.train_run)
    plan = grid()
    batched = run_sweep(plan, tmp_path / "batched", SweepOptions(progress=False))
    assert calls == [("batched", 4, 4)] * 4
    calls.clear()
    alone = run_sweep(plan, tmp_path / "alone", SweepOptions(progress=False, batch=False))
    assert calls == [("alone", 1)] * 16
    calls.clear()
    queued = run_sweep(plan, tmp_path / "queued", SweepOptions(progress=False, max_stack=3))
    assert calls == [("batched", 4, 3)] * 4, "a group of 4 at max_stack 3: a stack of 3, one run queued"
    assert batched.ran == alone.ran == queued.ran == 16
    reference = records(tmp_path / "alone")
    assert len(reference) == 16
    assert_same_results(records(tmp_path / "batched"), reference)
    assert_same_results(records(tmp_path / "queued"), reference)
    assert len({json.dumps(r["history"]) for r in reference.values()}) == 16


def test_a_job_skips_runs_that_have_records(tmp_path):
    plan = grid(seeds=1)
    (job,) = [j for j in plan_jobs(plan.runs) if j.hashes[0] == plan.runs[0].hash]
    runs_dir = tmp_path / "runs"
    first = run_job(Job(job.runs[:1]), runs_dir)
    assert [r["name"] for r in first] == job.hashes[:1]
    before = (runs_dir / f"{job.hashes[0]}.json").read_bytes()
    rest = run_job(job, runs_dir)
    assert [r["name"] for r in rest] == job.hashes[1:], "only the missing runs are trained"
    assert (runs_dir / f"{job.hashes[0]}.json").read_bytes() == before, "a finished record is never rewritten"
    assert run_job(job, runs_dir) == []
    assert sorted(p.stem for p in runs_dir.iterdir()) == sorted(job.hashes)
    assert run_job(job, None)[0]["name"] == job.hashes[0], "without a folder: train all, write nothing"
    assert sorted(p.stem for p in runs_dir.iterdir()) == sorted(job.hashes)


def test_resume_after_a_partial_job(tmp_path):
    plan = grid()
    folder = tmp_path / "resumed"
    first = run_sweep(plan, folder, SweepOptions(progress=False, limit=6))  # half of each of the first three jobs
    assert (first.ran, set(records(folder))) == (6, {r.hash for r in plan.runs[:6]})
    partial = records(folder)
    second = run_sweep(plan, folder, SweepOptions(progress=False))
    assert (second.skipped, second.ran) == (6, 10)
    resumed = records(folder)
    assert {h: resumed[h] for h in partial} == partial, "finished runs are not trained again"
    run_sweep(plan, tmp_path / "clean", SweepOptions(progress=False))
    assert resumed == records(tmp_path / "clean")


def test_progress_bar_counts_runs(tmp_path, capsys):
    run_sweep(grid(seeds=1), tmp_path, SweepOptions(limit=5, progress=True))
    bar = capsys.readouterr().err
    assert "5/8" in bar and "8/8" not in bar


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [({"max_stack": 0}, "max_stack"), ({"batch": False, "speed": "compile"}, "speed='compile'"),
     ({"backend": "slurm"}, "slurm"), ({"backend": "ray", "workers": 2}, "workers=2")],
    ids=["zero-max-stack", "compile-without-batch", "unknown-backend", "workers-with-ray"],
)
def test_bad_execution_options_name_the_value(tmp_path, kwargs, named):
    with pytest.raises(ValueError, match=named):
        run_sweep(grid(), tmp_path, SweepOptions(progress=False, **kwargs))
    assert not list(tmp_path.glob("runs/*.json"))


def cli():
    app = typer.Typer()
    register(app)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args))


def test_cli_passes_execution_options(tmp_path):
    spec = tmp_path / "jobs.yaml"
    spec.write_text(json.dumps({**GRID, "seeds": 1}))  # JSON is YAML
    invoke = cli()
    result = invoke("sweep", str(spec), "--out", str(tmp_path / "a"), "--max-stack", "3", "--limit", "4",
                    "--no-progress")
    assert result.exit_code == 0, result.output
    assert "8 runs: 0 already done, 4 run now" in result.output
    result = invoke("sweep", str(spec), "--out", str(tmp_path / "a"), "--no-batch", "--no-progress")
    assert "8 runs: 4 already done, 4 run now" in result.output
    for argv, named in [(["--max-stack", "0"], "max_stack"), (["--no-batch", "--compile"], "speed='compile'"),
                        (["--no-batch", "--speed", "auto"], "speed='auto'"), (["--speed", "fast"], "unknown speed"),
                        (["--speed", "eager", "--cuda-graph"], "contradicts"),
                        (["--address", "auto"], "--backend ray")]:
        result = invoke("sweep", str(spec), "--out", str(tmp_path / "b"), "--no-progress", *argv)
        assert isinstance(result.exception, ValueError) and named in str(result.exception), argv
    result = invoke("mad", "run", "--model", "transformer", "--profile", "smoke",
                    "--out", str(tmp_path / "c"), "--max-stack", "-1")
    assert isinstance(result.exception, ValueError) and "max_stack" in str(result.exception)
