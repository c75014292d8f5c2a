"""Stacks that stay full (runners/train/engine.py): runs of one stack keep their own step plans, and a run that ends
hands its row to the next queued run. Every run still gets the record it gets alone, bitwise on the CPU (time
fields aside), and a stack stopped part-way goes on to the same records."""

import dataclasses
import json
import os
import signal

import mixlab.runners.train.engine as engine
import pytest
import torch
from mixlab.runners.train import resume
from mixlab.runners.train.config import RunConfig, TrainConfig
from mixlab.runners.train.engine import train_runs_batched
from mixlab.runners.train.resolved import resolve
from mixlab.runners.train.run import train_run

# vmap of CPU attention loops over the runs (no batching rule for the CPU flash kernel): slower, same numbers.
pytestmark = [pytest.mark.filterwarnings("ignore:There is a performance drop because we have not yet"),
              pytest.mark.usefixtures("one_torch_thread")]

TIME_FIELDS = ("wall_time_s", "train_time_s", "steps_per_s", "argv")
NEVER = 1e9  # checkpoint_every_s: only on an interrupt
MODEL = {"d_model": 16, "n_heads": 2, "n_layers": 1, "mlp_hidden": 32}


def run(name, **train):
    """A run of in-context recall in batches of 8 (an epoch's last batch holds what is left), tested on 20 rows."""
    fields = {"batch_size": 8, "num_test": 20, "eval_batch_size": 8, "device": "cpu", **train}
    config = RunConfig(task="mad/in_context_recall", task_params={"seq_len": 32}, model=MODEL,
                       train=TrainConfig(**fields))
    return name, config


# Six runs of one stack key, three at a time: epochs of 5 (last batch 4), 3, 3 (last batch 4), 5, 2 and 4 steps
# (last batch 4); whole epochs or a number of steps; evaluations every epoch or every 1, 3 or 4 steps; early stops
# at step 1 and 4; a warmup and a cosine per step. The last three wait in the queue.
RUNS = [
    run("long", num_train=36, epochs=3, lr=1e-2),
    run("stops-at-1", num_train=24, epochs=4, eval_every=1, early_stop_acc=1e-6, init_seed=1, data_seed=1),
    run("steps-7", num_train=20, epochs=None, steps=7, eval_every=3, schedule="cosine_step", warmup_steps=2,
        min_lr=1e-4, init_seed=2),
    run("stops-at-4", num_train=36, epochs=2, eval_every=4, early_stop_acc=1e-6, lr=5e-3, init_seed=3),
    run("queued-short", num_train=16, epochs=3, lr=5e-3, weight_decay=0.1, data_seed=1, init_seed=4),
    run("queued-long", num_train=28, epochs=2, eval_every=3, init_seed=5, data_seed=2),
]
NAMES = [name for name, _ in RUNS]
CONFIGS = [config for _, config in RUNS]


def stripped(record):
    return {k: v for k, v in record.items() if k not in TIME_FIELDS}


def files(folder, names=NAMES):
    return {name: stripped(json.loads((folder / f"{name}.json").read_text())) for name in names}


@pytest.fixture(scope="module")
def alone():
    """Each run's record trained alone by train_run, on one thread as the tests."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return [stripped(train_run(config, run_name=name, progress=False)) for name, config in RUNS]
    finally:
        torch.set_num_threads(threads)


def spy_loop(monkeypatch):
    """Before each stack step: (rows, queued runs, rows that step); and the rows of each evaluation."""
    steps, evaluations = [], []
    real_step, real_evaluate = engine._Loop._step, engine._Stack.evaluate

    def step(self):
        rows, queued = [r is not None for r in self.rows], len(self.queue)
        stepped = real_step(self)
        steps.append((rows, queued, stepped))
        return stepped

    def evaluate(self, run_tasks, rows, batch_size):
        evaluations.append(list(rows))
        return real_evaluate(self, run_tasks, rows, batch_size)

    monkeypatch.setattr(engine._Loop, "_step", step)
    monkeypatch.setattr(engine._Stack, "evaluate", evaluate)
    return steps, evaluations


def test_a_refilled_stack_gives_every_run_its_record_alone(monkeypatch, alone):
    steps, evaluations = spy_loop(monkeypatch)
    records = train_runs_batched(CONFIGS, run_names=NAMES, progress=False, max_stack=3)
    assert [stripped(r) for r in records] == alone
    assert [r["steps"] for r in records] == [15, 1, 7, 4, 6, 8]
    assert [r["stopped_early"] for r in records] == [False, True, False, True, False, False]
    queued = [(rows, stepped) for rows, waiting, stepped in steps if waiting]
    assert len(queued) > 1 and all(rows == [True] * 3 for rows, _ in queued), \
        "while runs wait, the stack is three rows wide and every row trains a run"
    assert min(len(rows) for rows, _, _ in steps) < 3, "with the queue empty, an eager stack drops its empty rows"
    assert any(len(stepped) < sum(rows) for rows, _, stepped in steps), "short last batches step on their own"
    assert any(len(rows) == 1 for rows in evaluations), "an evaluation serves the runs due only"
    assert sum(len(rows) for rows in evaluations) == sum(len(r["history"]) for r in records)


def test_a_queue_behind_a_stack_of_one_trains_its_runs_in_turn(monkeypatch, alone):
    steps, _ = spy_loop(monkeypatch)
    records = train_runs_batched(CONFIGS[:3], run_names=NAMES[:3], progress=False, max_stack=1)
    assert [stripped(r) for r in records] == alone[:3]
    assert {len(rows) for rows, _, _ in steps} == {1} and len(steps) == 15 + 1 + 7


def test_a_refilled_stack_under_bf16_autocast_gives_every_run_its_record_alone():
    configs = [dataclasses.replace(c, train=dataclasses.replace(c.train, precision="bf16")) for c in CONFIGS[1:5]]
    records = train_runs_batched(configs, run_names=NAMES[1:5], progress=False, max_stack=2)
    alone = [train_run(c, run_name=n, progress=False) for c, n in zip(configs, NAMES[1:5])]
    assert [stripped(r) for r in records] == [stripped(r) for r in alone]


def test_empty_rows_of_a_compiled_stack_idle_until_half_of_it_is_empty(monkeypatch, alone):
    """The compaction rule of compiled stacks, run eagerly: once the queue is empty, a row whose run ended stays
    (idle: its parameters untouched, nothing recorded) until at most half the stack still trains."""
    steps, _ = spy_loop(monkeypatch)
    records = engine._train_stack([resolve(c) for c in CONFIGS], NAMES, out_dir=None, progress=False,
                                  compile=False, cuda_graph=False, compact_at=0.5, width=3)
    assert [stripped(r) for r in records] == alone
    widths = [len(rows) for rows, _, _ in steps]
    assert widths == sorted(widths, reverse=True) and set(widths) == {3, 1}
    assert any(len(rows) == 3 and sum(rows) == 2 for rows, _, _ in steps), "an empty row idles beside two runs"


def interrupt_after_steps(monkeypatch, k):
    """SIGINT to this process after the k-th stack step, as Ctrl-C would send it."""
    real, seen = engine._Stack.step, []

    def step(self, *args):
        real(self, *args)
        seen.append(len(self))
        if len(seen) == k:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(engine._Stack, "step", step)
    return seen


# Stack steps 1-7 train "long", "stops-at-4" (from step 2: "stops-at-1" stopped at step 1) and "steps-7", step 3
# only "steps-7" (the short last batch of its first epoch); after step 7 "stops-at-4" and "steps-7" have ended and
# the last two runs have their rows; after step 15 only "long" is left, in a stack of one.
@pytest.mark.parametrize(("k", "queued", "width"), [(1, ["queued-short", "queued-long"], 3),
                                                    (3, ["queued-short", "queued-long"], 3), (7, [], 3), (15, [], 1)],
                         ids=["after-a-refill", "after-a-short-step", "after-two-refills-at-once",
                              "after-a-compaction"])
def test_a_refilled_stack_stopped_part_way_goes_on_to_the_same_records(tmp_path, monkeypatch, alone, k, queued,
                                                                       width):
    interrupt_after_steps(monkeypatch, k)
    options = {"out_dir": tmp_path, "run_names": NAMES, "progress": False, "max_stack": 3,
               "checkpoint_every_s": NEVER}
    with pytest.raises(KeyboardInterrupt):
        train_runs_batched(CONFIGS, **options)
    meta = json.loads(next((tmp_path / resume.PARTIAL).glob("*.json")).read_text())
    assert meta["step"] == k and meta["queue"] == queued and meta["format"] == resume.FORMAT
    saved = torch.load(tmp_path / resume.PARTIAL / meta["pt"], weights_only=True)
    assert len(saved["rows"]) == width and sorted(row["name"] for row in saved["rows"]) == sorted(meta["live"])
    written = sorted(p.stem for p in tmp_path.glob("*.json"))
    monkeypatch.undo()
    steps = interrupt_after_steps(monkeypatch, 0)
    records = train_runs_batched(CONFIGS, **options)
    assert files(tmp_path) == dict(zip(NAMES, alone))
    assert [stripped(r) for r in records] == alone
    assert len(steps) > 0 and not list((tmp_path / resume.PARTIAL).iterdir())
    assert set(written) <= set(NAMES) and len(written) == 6 - len(queued) - len(meta["live"])


def test_a_checkpoint_of_the_older_format_is_ignored_with_a_warning(tmp_path, monkeypatch, alone):
    interrupt_after_steps(monkeypatch, 3)
    options = {"out_dir": tmp_path, "run_names": NAMES, "progress": False, "max_stack": 3,
               "checkpoint_every_s": NEVER}
    with pytest.raises(KeyboardInterrupt):
        train_runs_batched(CONFIGS, **options)
    meta_path = next((tmp_path / resume.PARTIAL).glob("*.json"))
    meta = json.loads(meta_path.read_text())
    meta["format"] = 1
    del meta["queue"]
    meta_path.write_text(json.dumps(meta))
    monkeypatch.undo()
    steps = interrupt_after_steps(monkeypatch, 0)
    with pytest.warns(UserWarning, match=r"it is in checkpoint format 1, and this mixlab reads format 2 only; the "
                                         r"stack starts from step 0"):
        train_runs_batched(CONFIGS, **options)
    assert files(tmp_path) == dict(zip(NAMES, alone))
    assert len(steps) > 15, "trained from the start"


PACKED = ("packed/associative_retrieval", {"seq_len": 64, "min_doc_len": 8, "doc_len_median": 16, "max_doc_len": 32,
                                           "num_keys": 16, "keys_per_doc": 4, "num_values": 16, "query_share": 0.5})


def test_packed_runs_refill_a_stack(monkeypatch):
    """Packed runs of other training-set sizes and lengths share a stack and refill it: each row lays out its own
    documents (one slot count for every data set of the stack). Records equal train_run's up to the head's
    rounding at few scored positions (test_engine.py's packed cases)."""
    configs = [RunConfig(task=PACKED[0], task_params=PACKED[1], model={**MODEL, "mixer": "attention"},
                         train=TrainConfig(epochs=None, steps=steps, batch_size=4, num_train=num_train, num_test=8,
                                           eval_batch_size=4, eval_every=2, device="cpu", init_seed=seed,
                                           data_seed=seed, lr=1e-2))
               for seed, (num_train, steps) in enumerate([(12, 3), (8, 4), (10, 5)])]
    monkeypatch.setattr(engine, "train_run", None)  # nothing may train alone
    steps, _ = spy_loop(monkeypatch)
    batched = train_runs_batched(configs, progress=False, max_stack=2)
    monkeypatch.undo()
    solo = [train_run(c, progress=False) for c in configs]
    assert [r["steps"] for r in batched] == [3, 4, 5] and steps[0][1] == 1, "one run queued"
    for b, a in zip(batched, solo):
        assert [h["step"] for h in b["history"]] == [h["step"] for h in a["history"]]
        for hb, ha in zip(b["history"], a["history"]):
            assert hb["test_loss"] == pytest.approx(ha["test_loss"], rel=1e-5)
            assert (hb["acc_present"], hb["acc_absent"]) == (ha["acc_present"], ha["acc_absent"])


def test_a_compiled_stack_keeps_its_width_and_its_code_across_refills(monkeypatch):
    """A refill writes its row in place: nothing compiles again. torch.compile counts each graph it makes (a
    counting backend instead of Inductor, which takes minutes on this CPU); every (width, batch length) the
    step meets compiles once, and the queue is served at the full width."""
    from torch._dynamo.testing import CompileCounter

    counter, real_compile = CompileCounter(), torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: real_compile(fn, backend=counter, **kwargs))
    torch._dynamo.reset()
    compiled, real_step = [], engine._Stack._step  # per step: its (width, batch length), frames compiled after it

    def step(self, idx, scalars, cu_seqlens=None):
        real_step(self, idx, scalars, cu_seqlens)
        compiled.append((tuple(idx.shape), counter.frame_count))

    monkeypatch.setattr(engine._Stack, "_step", step)
    steps, _ = spy_loop(monkeypatch)
    small = {"d_model": 8, "n_heads": 2, "n_layers": 1, "mlp_hidden": 0}
    configs = [RunConfig(task="mad/in_context_recall", task_params={"seq_len": 16}, model=small,
                         train=TrainConfig(epochs=None, steps=steps, batch_size=4, num_train=num_train, num_test=4,
                                           eval_batch_size=4, eval_every=2, device="cpu", init_seed=seed))
               for seed, (num_train, steps) in enumerate([(8, 6), (8, 2), (6, 3), (8, 2), (6, 4)])]
    try:
        records = engine._train_stack([resolve(c) for c in configs], [None] * 5, out_dir=None, progress=False,
                                      compile=True, cuda_graph=False, compact_at=engine.COMPILED_COMPACTION, width=2)
    finally:
        torch._dynamo.reset()
    assert [r["steps"] for r in records] == [6, 2, 3, 2, 4]
    queued = [len(rows) for rows, waiting, _ in steps if waiting]
    assert len(queued) >= 3 and set(queued) == {2}, "three runs waited, and took their rows at the full width"
    assert {shape for shape, _ in compiled} == {(2, 4), (2, 2), (1, 4), (1, 2)}
    seen, before = set(), 0
    for shape, frames in compiled:
        assert (frames > before) == (shape not in seen), f"compiled again at {shape}" if shape in seen else shape
        seen.add(shape)
        before = frames


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("speed", ["cuda-graph", "compile+graph"])
def test_a_refilled_stack_on_cuda_graphs_matches_it_uncaptured(speed):
    """Refills write their rows in place under the captured steps and evaluations (one graph per batch length and
    per evaluation width): the records equal the eager stack's within rounding (compiled code reorders sums)."""
    configs = [dataclasses.replace(c, train=dataclasses.replace(c.train, device="cuda")) for c in CONFIGS]
    graphed, eager = (train_runs_batched(configs, run_names=NAMES, progress=False, max_stack=3, speed=mode)
                      for mode in (speed, "eager"))
    assert [r["steps"] for r in graphed] == [r["steps"] for r in eager] == [15, 1, 7, 4, 6, 8]
    for got, want in zip(graphed, eager):
        assert [h["step"] for h in got["history"]] == [h["step"] for h in want["history"]]
        for g, w in zip(got["history"], want["history"]):
            assert g["test_loss"] == pytest.approx(w["test_loss"], rel=1e-4)
