"""Checkpoints of a stack in mid-training (runners/train/resume.py): a stack stopped part-way and trained again ends
with the records of a stack never stopped, bitwise on the CPU (time fields aside)."""

import dataclasses
import json
import os
import shutil
import signal

import mixlab.runners.train.engine as engine
import pytest
import torch
import yaml
from mixlab.core.records import finished_hashes
from mixlab.runners.cli.main import main
from mixlab.runners.sweep import local_backend
from mixlab.runners.sweep.jobs import Job, plan_jobs
from mixlab.runners.sweep.run import SweepInterrupted, SweepOptions, run_sweep
from mixlab.runners.sweep.spec import SweepSpec
from mixlab.runners.train import resume
from mixlab.runners.train import run as train_module
from mixlab.runners.train.config import RunConfig, TrainConfig
from mixlab.runners.train.engine import train_runs_batched
from mixlab.runners.train.resolved import resolve
from mixlab.runners.train.run import train_run

# vmap of CPU attention loops over the runs (no batching rule for the CPU flash kernel): slower, same numbers.
pytestmark = [pytest.mark.filterwarnings("ignore:There is a performance drop because we have not yet"),
              pytest.mark.usefixtures("one_torch_thread")]

TIME_FIELDS = ("wall_time_s", "train_time_s", "steps_per_s", "argv")
NAMES = ["a", "early", "c"]
NEVER = 1e9  # checkpoint_every_s: only on an interrupt


def tiny(**train):
    """36 training rows in batches of 8: five steps an epoch (the last of 4 rows), 15 steps, evaluations after
    every second step and the last, so some fall inside an epoch."""
    fields = {"epochs": 3, "batch_size": 8, "num_train": 36, "num_test": 20, "eval_batch_size": 8, "eval_every": 2,
              "device": "cpu", **train}
    return RunConfig(task="mad/in_context_recall", task_params={"seq_len": 32},
                     model={"d_model": 16, "n_heads": 2, "n_layers": 1, "mlp_hidden": 32}, train=TrainConfig(**fields))


def stack(early_stop=None, precision="fp32"):
    """Three runs of one stack; the second stops at its first evaluation (step 2) when ``early_stop``."""
    train = {"precision": precision}
    return [tiny(lr=1e-2, **train), tiny(lr=5e-3, init_seed=1, data_seed=1, early_stop_acc=early_stop, **train),
            tiny(lr=2e-3, init_seed=2, schedule="cosine_step", warmup_steps=2, min_lr=1e-4, **train)]


def stripped(record):
    return {k: v for k, v in record.items() if k not in TIME_FIELDS}


def files(folder, names=NAMES):
    return {name: stripped(json.loads((folder / f"{name}.json").read_text())) for name in names}


def partial(folder):
    return sorted(p.name for p in (folder / resume.PARTIAL).iterdir()) if (folder / resume.PARTIAL).exists() else []


def interrupt_after(monkeypatch, method, k):
    """SIGINT to this process after the k-th call of ``engine._Stack.<method>``, as Ctrl-C or ``timeout -s INT``
    would send it; calls ``seen`` counts them."""
    real = getattr(engine._Stack, method)
    seen = []

    def spy(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        seen.append(len(self))
        if len(seen) == k:
            os.kill(os.getpid(), signal.SIGINT)
        return out

    monkeypatch.setattr(engine._Stack, method, spy)
    return seen


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The records of the uninterrupted stacks, by (precision, early stop), on one thread as the tests (the
    thread count changes the last bits)."""
    folders, threads = {}, torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for key in [("fp32", None), ("bf16", None), ("fp32", 1e-6)]:
            folder = tmp_path_factory.mktemp("reference")
            train_runs_batched(stack(key[1], key[0]), out_dir=folder, run_names=NAMES, progress=False)
            folders[key] = folder
    finally:
        torch.set_num_threads(threads)
    return folders


@pytest.mark.parametrize(("precision", "k"), [("fp32", 7), ("fp32", 10), ("bf16", 3)],
                         ids=["fp32-inside-an-epoch", "fp32-at-an-epoch-end", "bf16-between-evaluations"])
def test_a_stack_stopped_by_sigint_goes_on_to_the_same_records(tmp_path, monkeypatch, reference, precision, k):
    configs = stack(precision=precision)
    interrupt_after(monkeypatch, "step", k)
    with pytest.raises(KeyboardInterrupt):
        train_runs_batched(configs, out_dir=tmp_path, run_names=NAMES, progress=False, checkpoint_every_s=NEVER)
    names = partial(tmp_path)
    assert len(names) == 2 and {n.rsplit(".", 1)[1] for n in names} == {"json", "pt"}
    meta_path = next((tmp_path / resume.PARTIAL).glob("*.json"))
    meta = json.loads(meta_path.read_text())
    assert meta["step"] == k and sorted(meta["live"]) == sorted(NAMES) and meta["pt"] in names
    saved = torch.load(tmp_path / resume.PARTIAL / meta["pt"], weights_only=True)
    assert saved["step"] == k and [row["step"] for row in saved["rows"]] == [k] * 3
    assert [row["loss_count"] for row in saved["rows"]] == [k % 2] * 3 and saved["queue"] == []
    assert not list(tmp_path.glob("*.json")), "no run had ended"

    monkeypatch.undo()
    steps = interrupt_after(monkeypatch, "step", 0)
    records = train_runs_batched(configs, out_dir=tmp_path, run_names=NAMES, progress=False,
                                 checkpoint_every_s=NEVER)
    assert len(steps) == 15 - k, "went on from the checkpoint"
    expected = files(reference[(precision, None)])
    assert files(tmp_path) == expected
    assert [stripped(r) for r in records] == [expected[n] for n in NAMES]
    assert partial(tmp_path) == [], "the checkpoint is removed when the stack ends"


def test_checkpoints_at_every_evaluation_survive_a_crash(tmp_path, monkeypatch, reference):
    """checkpoint_every_s=0 writes one at every evaluation: a crash inside the fourth (no checkpoint then, the
    state may be torn) goes on from the third's, at step 6."""
    real, calls = engine._Stack.evaluate, []

    def crash(self, *args):
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("killed")
        return real(self, *args)

    monkeypatch.setattr(engine._Stack, "evaluate", crash)
    with pytest.raises(RuntimeError, match="killed"):
        train_runs_batched(stack(), out_dir=tmp_path, run_names=NAMES, progress=False, checkpoint_every_s=0)
    assert json.loads(next((tmp_path / resume.PARTIAL).glob("*.json")).read_text())["step"] == 6
    monkeypatch.undo()
    train_runs_batched(stack(), out_dir=tmp_path, run_names=NAMES, progress=False, checkpoint_every_s=0)
    assert files(tmp_path) == files(reference[("fp32", None)]) and partial(tmp_path) == []


def test_a_process_killed_between_the_pt_and_the_json_goes_on_from_the_previous_pair(tmp_path, monkeypatch,
                                                                                     reference):
    """The third checkpoint's .pt lands but its .json never does (a worker killed past the pool's grace): the
    second pair is still whole and names its own .pt, so the stack goes on from step 4, and the orphan .pt goes
    when the stack ends."""
    real, calls = resume.write_json_atomic, []

    def killed(path, payload):
        calls.append(payload["step"])
        if len(calls) == 3:
            raise RuntimeError("killed")
        return real(path, payload)

    monkeypatch.setattr(resume, "write_json_atomic", killed)
    with pytest.raises(RuntimeError, match="killed"):
        train_runs_batched(stack(), out_dir=tmp_path, run_names=NAMES, progress=False, checkpoint_every_s=0)
    meta = json.loads(next((tmp_path / resume.PARTIAL).glob("*.json")).read_text())
    assert calls == [2, 4, 6] and meta["step"] == 4
    assert len([n for n in partial(tmp_path) if n.endswith(".pt")]) == 2, "the orphan beside the named one"
    monkeypatch.undo()
    steps = interrupt_after(monkeypatch, "step", 0)
    train_runs_batched(stack(), out_dir=tmp_path, run_names=NAMES, progress=False, checkpoint_every_s=0)
    assert len(steps) == 15 - 4, "went on from the second checkpoint"
    assert files(tmp_path) == files(reference[("fp32", None)]) and partial(tmp_path) == []


@pytest.mark.parametrize("compact_at", [1.0, 0.5], ids=["dropped-at-once", "frozen-row"])
def test_a_run_that_stopped_early_before_the_interrupt_is_neither_trained_nor_written_again(
        tmp_path, monkeypatch, reference, compact_at):
    """Run "early" stops at step 2 and is written; the stack is interrupted at step 7. Trained again with all
    three configs, the stack goes on with the other two (with the compiled stacks' compaction, 0.5, "early" stays
    a frozen row of the stack until the end, as it would have) and returns "early"'s record from its file."""
    configs = stack(early_stop=1e-6)
    options = {"out_dir": tmp_path, "progress": False, "compile": False, "cuda_graph": False,
               "compact_at": compact_at, "checkpoint_every_s": NEVER}
    interrupt_after(monkeypatch, "step", 7)
    with pytest.raises(KeyboardInterrupt):
        engine._train_stack([resolve(c) for c in configs], NAMES, **options)
    assert [p.name for p in tmp_path.glob("*.json")] == ["early.json"]
    early = (tmp_path / "early.json").stat()

    monkeypatch.undo()
    sizes = interrupt_after(monkeypatch, "step", 0)
    records = engine._train_stack([resolve(c) for c in configs], NAMES, **options)
    assert sizes == [3 if compact_at == 0.5 else 2] * 8
    assert (tmp_path / "early.json").stat().st_mtime_ns == early.st_mtime_ns, "not written again"
    expected = files(reference[("fp32", 1e-6)])
    assert files(tmp_path) == expected and [stripped(r) for r in records] == [expected[n] for n in NAMES]
    assert partial(tmp_path) == []


def test_a_run_that_ended_after_the_checkpoint_is_dropped_when_it_is_not_asked_for(tmp_path, monkeypatch,
                                                                                    reference):
    """A sweep stopped after a run's record but before the next checkpoint asks again only for the others: the
    checkpoint still fits (its extra run has a record) and that run leaves the stack."""
    interrupt_after(monkeypatch, "step", 7)
    with pytest.raises(KeyboardInterrupt):
        train_runs_batched(stack(), out_dir=tmp_path, run_names=NAMES, progress=False, checkpoint_every_s=NEVER)
    shutil.copy(reference[("fp32", None)] / "c.json", tmp_path / "c.json")
    monkeypatch.undo()
    sizes = interrupt_after(monkeypatch, "step", 0)
    configs = stack()
    train_runs_batched([configs[0], configs[1]], out_dir=tmp_path, run_names=NAMES[:2], progress=False,
                       checkpoint_every_s=NEVER)
    assert sizes == [2] * 8
    assert files(tmp_path) == files(reference[("fp32", None)]) and partial(tmp_path) == []


@pytest.mark.parametrize("case", ["changed-config", "run-left-out", "cut-short"])
def test_a_checkpoint_that_does_not_fit_is_ignored_with_a_warning(tmp_path, monkeypatch, case):
    interrupt_after(monkeypatch, "step", 7)
    with pytest.raises(KeyboardInterrupt):
        train_runs_batched(stack(), out_dir=tmp_path, run_names=NAMES, progress=False, checkpoint_every_s=NEVER)
    stale = partial(tmp_path)
    monkeypatch.undo()
    configs, names = stack(), NAMES
    if case == "changed-config":
        configs[1] = tiny(lr=1e-3, init_seed=1, data_seed=1)
        why = "run 'early' has another config there"
    elif case == "run-left-out":
        configs, names = configs[:1], NAMES[:1]
        why = "its run 'c' is still training there but is not asked for now"
    else:
        pt = tmp_path / resume.PARTIAL / next(name for name in stale if name.endswith(".pt"))
        pt.write_bytes(pt.read_bytes()[:1000])
        why = "its .pt cannot be read"
    steps = interrupt_after(monkeypatch, "step", 0)
    with pytest.warns(UserWarning, match=f"ignoring the checkpoint .*: {why}.*; the stack starts from step 0"):
        records = train_runs_batched(configs, out_dir=tmp_path, run_names=names, progress=False,
                                     checkpoint_every_s=NEVER)
    assert len(steps) == 15 and all(r["history"][0]["step"] == 2 for r in records)
    # the same runs under the same names: the new stack's checkpoint replaced the stale one, then ended
    assert partial(tmp_path) == (stale if case == "run-left-out" else [])


def test_a_run_trained_alone_does_not_take_a_stacks_checkpoint(tmp_path, monkeypatch, reference):
    """A stack's checkpoint holds stacked tensors, not a model's: train_run ignores it, even where it would fit
    (the stack's other runs have records), and its record is the stack's all the same."""
    interrupt_after(monkeypatch, "step", 7)
    with pytest.raises(KeyboardInterrupt):
        train_runs_batched(stack(), out_dir=tmp_path, run_names=NAMES, progress=False, checkpoint_every_s=NEVER)
    monkeypatch.undo()
    stale = partial(tmp_path)
    for name in NAMES[1:]:
        shutil.copy(reference[("fp32", None)] / f"{name}.json", tmp_path / f"{name}.json")
    with pytest.warns(UserWarning, match="it was written for loop stack, .* not for loop run"):
        train_run(stack()[0], out_dir=tmp_path, run_name="a", progress=False, checkpoint_every_s=NEVER)
    assert files(tmp_path) == files(reference[("fp32", None)]) and partial(tmp_path) == stale


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compile and CUDA graphs are measured on a GPU")
@pytest.mark.parametrize("mode", ["compile", "cuda-graph", "compile+graph"])
def test_compiled_and_graphed_stacks_resume_on_a_gpu(tmp_path, monkeypatch, mode):
    """Compiled code and captured graphs are made again after the load; the stack with the early-stopped run
    (a frozen row under compile) ends as the uninterrupted one, within rounding (GPU kernels need not repeat
    their bits)."""
    configs = [dataclasses.replace(c, train=dataclasses.replace(c.train, device="cuda")) for c in stack(1e-6)]
    options = {"run_names": NAMES, "progress": False, "speed": mode}
    train_runs_batched(configs, out_dir=tmp_path / "reference", **options)
    interrupt_after(monkeypatch, "step", 7)
    with pytest.raises(KeyboardInterrupt):
        train_runs_batched(configs, out_dir=tmp_path / "resumed", checkpoint_every_s=NEVER, **options)
    monkeypatch.undo()
    train_runs_batched(configs, out_dir=tmp_path / "resumed", checkpoint_every_s=NEVER, **options)
    resumed, expected = files(tmp_path / "resumed"), files(tmp_path / "reference")
    for name in NAMES:
        assert [h["step"] for h in resumed[name]["history"]] == [h["step"] for h in expected[name]["history"]]
        for got, want in zip(resumed[name]["history"], expected[name]["history"]):
            assert got["test_loss"] == pytest.approx(want["test_loss"], rel=1e-4)
    assert partial(tmp_path / "resumed") == []


@pytest.mark.parametrize("k", [3, 5], ids=["inside-an-epoch", "at-an-epoch-end"])
def test_a_run_trained_alone_goes_on_to_the_same_record_and_model(tmp_path, monkeypatch, k):
    """train_run checkpoints as a stack does: interrupted after its k-th evaluation (step 6, inside the second
    epoch, or step 10, the end of it), trained again it ends with the record and saved best weights of a run
    never stopped."""
    config = stack()[2]
    train_run(config, out_dir=tmp_path / "reference", run_name="c", progress=False, save=True)
    real, calls = train_module.evaluate, []

    def evaluate(*args):
        calls.append(1)
        if len(calls) == k:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args)

    monkeypatch.setattr(train_module, "evaluate", evaluate)
    options = {"out_dir": tmp_path / "resumed", "run_name": "c", "progress": False, "save": True,
               "checkpoint_every_s": NEVER}
    with pytest.raises(KeyboardInterrupt):
        train_run(config, **options)
    assert json.loads(next((tmp_path / "resumed" / resume.PARTIAL).glob("*.json")).read_text())["step"] == 2 * k
    monkeypatch.undo()
    train_run(config, **options)
    assert files(tmp_path / "resumed", ["c"]) == files(tmp_path / "reference", ["c"])
    weights = [torch.load(tmp_path / folder / "c.pt", weights_only=True)["state_dict"]
               for folder in ("reference", "resumed")]
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])
    assert partial(tmp_path / "resumed") == []


def test_a_second_signal_stops_at_once_without_a_checkpoint():
    interrupts = resume.Interrupts()
    with pytest.raises(KeyboardInterrupt), interrupts.held():
        os.kill(os.getpid(), signal.SIGINT)
        assert interrupts.pending, "the first signal is held back"
        os.kill(os.getpid(), signal.SIGINT)
        pytest.fail("the second signal raises")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_sweep_worker_checkpoints_its_stack_when_the_pool_ends_it(tmp_path, monkeypatch, reference):
    """The pool ends its workers with SIGTERM: a worker in a job finishes the step, checkpoints and exits."""
    class Exited(Exception):
        pass

    def exit_(code):
        raise Exited(code)

    monkeypatch.setattr(os, "_exit", exit_)
    real = engine._Stack.step
    seen = []

    def step(self, *args):
        real(self, *args)
        seen.append(1)
        if len(seen) == 7:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(engine._Stack, "step", step)
    job = Job(tuple(resolve(config) for config in stack()))
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Exited):
        local_backend.run_in_worker(job, str(tmp_path), {"checkpoint_every_s": NEVER})
    assert signal.getsignal(signal.SIGTERM) is before
    assert json.loads(next((tmp_path / resume.PARTIAL).glob("*.json")).read_text())["step"] == 7
    monkeypatch.undo()
    assert local_backend.run_in_worker(job, str(tmp_path), {"checkpoint_every_s": NEVER}) == 3
    # the job names its records by hash; the reference by NAMES
    named = {name: {**record, "name": name} for name, record in zip(NAMES, files(tmp_path, job.hashes).values())}
    assert named == files(reference[("fp32", None)])


# Six runs of one stack: those with early_stop_acc 1e-6 stop at their first evaluation (step 1).
SWEEP = {
    "name": "resume",
    "tasks": [{"task": "mqar", "params": {"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2}}],
    "models": {"attn": {"mixer": "attention", "d_model": 16, "n_layers": 1, "n_heads": 2, "mlp_hidden": 0}},
    "train": {"steps": 12, "epochs": None, "batch_size": 8, "num_train": 16, "num_test": 8, "eval_every": 2,
              "device": "cpu"},
    "train_grid": {"lr": [1e-3, 3e-3, 1e-2], "early_stop_acc": [1e-6, 0.9999]},
    "seeds": 1,
}


def sweep_records(folder):
    return {p.stem: stripped(json.loads(p.read_text())) for p in (folder / "runs").glob("*.json")}


def test_a_sweep_run_again_finds_the_checkpoint_of_a_stack_whose_other_runs_finished(tmp_path, monkeypatch):
    """Of a stack of 6, 3 runs stop early and are written; the sweep is interrupted. Run again, it plans only the
    3 unfinished runs, as one job, whose stack goes on from its checkpoint."""
    plan = SweepSpec.from_dict(SWEEP).plan()
    folder, clean = tmp_path / "stopped", tmp_path / "clean"
    options = SweepOptions(progress=False, checkpoint_every=NEVER)
    interrupt_after(monkeypatch, "step", 5)
    with pytest.raises(SweepInterrupted, match="3 of 6 runs have records"):
        run_sweep(plan, folder, options)
    assert len(partial(folder / "runs")) == 2
    monkeypatch.undo()
    sizes = interrupt_after(monkeypatch, "step", 0)
    result = run_sweep(plan, folder, options)
    assert (result.skipped, result.ran) == (3, 3) and sizes == [3] * 7
    assert partial(folder / "runs") == []
    monkeypatch.undo()
    run_sweep(plan, clean, SweepOptions(progress=False))
    assert sweep_records(folder) == sweep_records(clean)


def test_jobs_keep_their_runs_and_widths_when_some_have_finished():
    """Jobs are cut from every run, finished or not, so a key split into several jobs is formed again as it was, each
    job at its width."""
    plan = SweepSpec.from_dict({**SWEEP, "seeds": 2}).plan()
    hashes = [r.hash for r in plan.runs]
    first = plan_jobs(plan.runs, 2, job_stacks=2)
    # 12 runs, stacks of 2, at most 2 stacks' worth a job: three jobs of 4
    assert [(len(job), job.stack_width) for job in first] == [(4, 2)] * 3
    todo = set(hashes) - set(first[0].hashes[:3]) - set(first[1].hashes)
    again = plan_jobs(plan.runs, 2, todo=todo, job_stacks=2)
    assert [job.hashes for job in again] == [first[0].hashes[3:], first[2].hashes]
    assert [job.width for job in again] == [2, 2]


def test_the_cli_resumes_a_sweep_stopped_by_sigint(tmp_path, monkeypatch, capsys):
    spec = tmp_path / "resume.yaml"
    spec.write_text(yaml.safe_dump(SWEEP))
    argv = ["sweep", str(spec), "--out", str(tmp_path / "out"), "--no-progress", "--checkpoint-every", "0"]
    interrupt_after(monkeypatch, "step", 5)
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 130 and "resume with: mixlab sweep" in capsys.readouterr().err
    monkeypatch.undo()
    sizes = interrupt_after(monkeypatch, "step", 0)
    main(argv)
    assert "6 runs: 3 already done, 3 run now" in capsys.readouterr().out
    assert len(sizes) == 7 and len(finished_hashes(tmp_path / "out")) == 6
