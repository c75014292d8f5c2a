import json
import math

import mixlab.runners.train.engine as engine
import pytest
import torch
from mixlab import models
from mixlab.runners.bench.train import bench_train
from mixlab.runners.train import run as train_module
from mixlab.runners.train.config import RunConfig, TrainConfig, config_hash
from mixlab.runners.train.engine import _adamw_update, group_key, train_runs_batched
from mixlab.runners.train.resolved import resolve
from mixlab.runners.train.run import train_run

# vmap of CPU attention loops over the runs (no batching rule for the CPU flash kernel): slower, same numbers.
pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop because we have not yet")

TINY_MODEL = {"d_model": 16, "n_heads": 2, "n_layers": 1, "mlp_hidden": 32}
ICR = ("mad/in_context_recall", {"seq_len": 32})
# Fields that only say how long a run took, or where it ran from.
TIME_FIELDS = ("wall_time_s", "train_time_s", "steps_per_s", "argv")


def tiny(task=ICR, model=None, **train):
    """36 training rows in batches of 8: five steps an epoch, the last of 4 rows; 20 test rows in 8s."""
    fields = {"epochs": 3, "batch_size": 8, "num_train": 36, "num_test": 20, "eval_batch_size": 8,
              "device": "cpu", **train}
    return RunConfig(task=task[0], task_params=dict(task[1]), model={**TINY_MODEL, **(model or {})},
                     train=TrainConfig(**fields))


def solo(configs):
    return [train_run(config, progress=False) for config in configs]


def assert_same_records(batched, alone, exact=True, rel=1e-5):
    """Every field but time: bitwise when exact, else losses within rel and accuracies equal."""
    assert len(batched) == len(alone)
    for b, a in zip(batched, alone):
        assert sorted(b) == sorted(a)
        if exact:
            assert {k: v for k, v in b.items() if k not in TIME_FIELDS} == \
                   {k: v for k, v in a.items() if k not in TIME_FIELDS}
            continue
        assert [h["step"] for h in b["history"]] == [h["step"] for h in a["history"]]
        for hb, ha in zip(b["history"], a["history"]):
            for key in ("train_loss", "test_loss"):
                assert hb[key] == pytest.approx(ha[key], rel=rel)
            assert hb["acc_macro"] == ha["acc_macro"] and hb["acc_micro"] == ha["acc_micro"]


def test_batched_records_equal_one_at_a_time():
    configs = [
        tiny(lr=1e-2),
        tiny(lr=5e-3, weight_decay=0.1, init_seed=1, data_seed=1),
        tiny(lr=2e-3, weight_decay=0.1, init_seed=2, schedule="cosine_step", warmup_steps=2, min_lr=1e-4),
    ]
    batched = train_runs_batched(configs, progress=False)
    assert_same_records(batched, solo(configs))
    histories = [r["history"] for r in batched]
    assert histories[0] != histories[1] != histories[2] != histories[0]
    assert all(r["steps"] == 15 and not r["stopped_early"] and r["train_time_s"] > 0 for r in batched)


def test_mad_lab_init_and_biases_batch_bitwise():
    model = {"init": "torch_linear", "proj_bias": True}
    configs = [tiny(epochs=1, lr=1e-2, model=model), tiny(epochs=1, weight_decay=0.1, init_seed=1, model=model)]
    batched = train_runs_batched(configs, progress=False)
    assert_same_records(batched, solo(configs))
    assert batched[0]["history"] != train_run(tiny(epochs=1, lr=1e-2), progress=False)["history"]


@pytest.mark.parametrize("fold", [True, False], ids=["folded", "looped"])
def test_attention_with_runs_folded_or_looped_matches_one_at_a_time(monkeypatch, fold):
    """Folded runs are CUDA's way (fused kernels outside vmap), here on the CPU, where the folded batch changes the
    last bits; the CPU's own way, torch's batch rules looping over the runs, is bitwise."""
    monkeypatch.setattr(engine, "folds_runs", lambda device: fold)
    built, build = [], models.build_model

    def build_model(config, *, fold_runs=False):
        built.append(fold_runs)
        return build(config, fold_runs=fold_runs)

    monkeypatch.setattr(models, "build_model", build_model)
    engine._template.cache_clear()
    configs = [tiny(lr=1e-2), tiny(lr=5e-3, weight_decay=0.1, init_seed=1, data_seed=1)]
    assert_same_records(train_runs_batched(configs, progress=False), solo(configs), exact=not fold)
    assert fold in built, "the stack's template model is built with the fold asked for"


def test_bf16_autocast_batches_bitwise_on_cpu():
    configs = [tiny(epochs=1, precision="bf16"), tiny(epochs=1, precision="bf16", init_seed=1, lr=1e-2)]
    assert_same_records(train_runs_batched(configs, progress=False), solo(configs))


def test_bf16_autocast_with_biases_batches_bitwise_on_cpu():
    # the MAD model's biased projections: under vmap a biased nn.Linear returned fp32 from bf16 inputs
    model = {"init": "torch_linear", "proj_bias": True, "qkv_conv": "dynamic_lowrank"}
    configs = [tiny(epochs=1, precision="bf16", model=model),
               tiny(epochs=1, precision="bf16", init_seed=1, lr=1e-2, model=model)]
    assert_same_records(train_runs_batched(configs, progress=False), solo(configs))


def test_tasks_of_equal_shapes_stack_and_keep_their_own_data():
    configs = [tiny(task=("mad/noisy_recall", {"seq_len": 32, "frac_noise": p})) for p in (0.2, 0.6)]
    assert group_key(resolve(configs[0])) == group_key(resolve(configs[1]))
    batched = train_runs_batched(configs, progress=False)
    assert_same_records(batched, solo(configs))


@pytest.mark.parametrize(("field", "value", "stacks"), [
    ("lr", 1e-3, True), ("weight_decay", 0.1, True), ("init_seed", 3, True), ("data_seed", 3, True),
    ("early_stop_acc", 0.5, True), ("schedule", "constant", True), ("warmup_steps", 3, True),
    ("num_train", 40, True), ("epochs", 4, True), ("eval_every", 2, True),
    ("batch_size", 4, False), ("num_test", 16, False), ("eval_batch_size", 4, False), ("beta2", 0.99, False),
    ("precision", "bf16", False),
], ids=lambda x: str(x))
def test_group_key_train_fields(field, value, stacks):
    assert (group_key(resolve(tiny())) == group_key(resolve(tiny(**{field: value})))) == stacks


@pytest.mark.parametrize(("task_params", "model"), [
    ({"seq_len": 64}, {}),
    ({"seq_len": 32, "vocab_size": 32}, {}),
    ({"seq_len": 32}, {"d_model": 32}),
    ({"seq_len": 32}, {"qkv_conv": "static"}),
], ids=["seq_len", "vocab_size", "d_model", "qkv_conv"])
def test_group_key_shapes_and_model(task_params, model):
    assert group_key(resolve(tiny())) != group_key(resolve(tiny(task=(ICR[0], task_params), model=model)))


def test_early_stopped_run_drops_out_and_is_written_first(tmp_path, monkeypatch):
    # eval_every=2 stops run 1 mid-epoch (after step 2 of 5): the epoch's order and schedule are compacted too
    configs = [tiny(lr=1e-2, eval_every=2), tiny(lr=1e-2, init_seed=1, eval_every=2, early_stop_acc=1e-6),
               tiny(lr=5e-3, init_seed=2, eval_every=2)]
    stack_sizes, writes = [], []
    step, write = engine._Stack._step, engine.write_record

    def spy_step(self, *args, **kwargs):
        stack_sizes.append(len(self))
        step(self, *args, **kwargs)

    def spy_write(out_dir, record):
        writes.append((f"{record['name']}.json", len(list(tmp_path.glob("*.json")))))
        write(out_dir, record)

    monkeypatch.setattr(engine._Stack, "_step", spy_step)
    monkeypatch.setattr(engine, "write_record", spy_write)
    names = ["a", "early", "c"]
    batched = train_runs_batched(configs, out_dir=tmp_path, run_names=names, progress=False)
    alone = [train_run(c, progress=False, run_name=n) for c, n in zip(configs, names)]
    assert_same_records(batched, alone)
    assert [r["stopped_early"] for r in batched] == [False, True, False]
    assert [r["steps"] for r in batched] == [15, 2, 15]
    assert stack_sizes == [3, 3] + [2] * 13
    assert writes[0] == ("early.json", 0) and sorted(w[0] for w in writes[1:]) == ["a.json", "c.json"]
    for name, record in zip(names, batched):
        assert json.loads((tmp_path / f"{name}.json").read_text()) == json.loads(json.dumps(record))


def test_finished_runs_stay_frozen_until_half_the_stack_is_done(monkeypatch):
    # the compaction policy of compiled stacks, run eagerly: run 1 stops at step 2, when 2 of 3 rows still
    # train (more than half), so it stays in the stack, trained on but no longer evaluated or reported
    configs = [tiny(lr=1e-2, eval_every=2), tiny(init_seed=1, eval_every=2, early_stop_acc=1e-6),
               tiny(init_seed=2, eval_every=2)]
    stack_sizes = []
    step = engine._Stack._step

    def spy_step(self, *args, **kwargs):
        stack_sizes.append(len(self))
        step(self, *args, **kwargs)

    monkeypatch.setattr(engine._Stack, "_step", spy_step)
    batched = engine._train_stack([resolve(c) for c in configs], [None] * 3, out_dir=None, progress=False,
                                  compile=False, cuda_graph=False, compact_at=0.5)
    assert_same_records(batched, solo(configs))
    assert [r["steps"] for r in batched] == [15, 2, 15]
    assert stack_sizes == [3] * 15


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("model", [{}, {"qkv_conv": "dynamic_lowrank"}], ids=["attention", "dynamic_qkv"])
@pytest.mark.parametrize("compact_at", [1.0, 0.5], ids=["drop_at_once", "frozen_rows"])
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_cuda_graph_step_and_evaluation_match_uncaptured(compact_at, model, compile):
    # run 1 stops at step 2: the live rows change, so the evaluation graph is captured again (after a
    # compaction, or for the frozen stack's remaining rows); the last test batch is short (20 rows in 8s).
    # dynamic_qkv: the conv's Triton kernels, the runs folded into one launch (their vmap rule), inside the graphs.
    # compiled: the compiled step captured (compile+graph, as auto runs short rows on CUDA) against it uncaptured;
    # the two arms are two compilations (the autocast cache flag differs), whose reductions Inductor tunes
    # separately: on the H200 their losses parted by 1.6e-5 to 3.6e-5 relative within the 15 steps, so 1e-4
    configs = [tiny(model=model, lr=1e-2, eval_every=2, device="cuda"),
               tiny(model=model, init_seed=1, eval_every=2, early_stop_acc=1e-6, device="cuda"),
               tiny(model=model, init_seed=2, eval_every=2, device="cuda")]
    records = {graph: engine._train_stack([resolve(c) for c in configs], [None] * 3, out_dir=None, progress=False,
                                          compile=compile, cuda_graph=graph, compact_at=compact_at)
               for graph in (False, True)}
    assert [r["steps"] for r in records[True]] == [15, 2, 15]
    assert_same_records(records[True], records[False], exact=False, rel=1e-4 if compile else 1e-5)


def test_records_get_train_runs_default_names(tmp_path):
    configs = [tiny(epochs=1), tiny(epochs=1, init_seed=1)]
    batched = train_runs_batched(configs, out_dir=tmp_path, progress=False)
    expected = [f"mad-in_context_recall_attention_{config_hash(c)}" for c in configs]
    assert [r["name"] for r in batched] == expected
    assert sorted(p.stem for p in tmp_path.glob("*.json")) == sorted(expected)


BATCHED_CASES = [(mixer, ICR, {"mixer": mixer}) for mixer in sorted(models.MIXERS)] + [
    ("attention+dynamic_lowrank", ICR, {"qkv_conv": "dynamic_lowrank"}),
    ("compression", ("mad/compression", {"seq_len": 16}), {}),
]


@pytest.mark.parametrize(("label", "task", "model"), BATCHED_CASES, ids=[c[0] for c in BATCHED_CASES])
def test_every_mixer_batches(label, task, model):
    configs = [tiny(task=task, model=model, epochs=1),
               tiny(task=task, model=model, epochs=1, init_seed=1, lr=1e-3)]
    assert resolve(configs[0]).unbatchable_reason is None
    # batched FFTs (rubiconv, fft_conv_leaky, hyena, hyena_leaky) round differently from one-row FFTs; so does
    # the head-wise generator's batched matmul (test logits differ in the last bits, which the loss sum may or
    # may not show), and the chunked delta rule its batched matmuls and triangular solves
    exact = model.get("mixer") not in ("rubiconv", "fft_conv_leaky", "hyena", "hyena_leaky", "dynamic_conv_headwise",
                                       "gated_delta_net")
    assert_same_records(train_runs_batched(configs, progress=False), solo(configs), exact=exact)


# (label, model): head size 1 has a backward kernel of its own
TRITON_CASES = [("static", {"qkv_conv": "static"}), ("dynamic_lowrank", {"qkv_conv": "dynamic_lowrank"}),
                ("dynamic_headwise", {"mixer": "dynamic_conv_headwise"}),
                ("dynamic_headwise_hs1", {"mixer": "dynamic_conv_headwise", "conv_head_size": 1})]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU runs need the Triton interpreter, set only without "
                    "CUDA; on a GPU test_cuda_graph_step_and_evaluation_match_eager[dynamic_qkv] stacks the kernels")
@pytest.mark.parametrize(("label", "model"), TRITON_CASES, ids=[c[0] for c in TRITON_CASES])
def test_short_convs_stack_on_their_triton_kernels(label, model):
    # the ops' vmap rules fold the runs into one launch of the kernels (on the CPU in the Triton interpreter),
    # each run's rows as a run alone computes them; rubiconv's Triton path has no rule and trains alone. The
    # interpreter's time grows with the rows of every launch: two steps of 4 rows and one evaluation batch of 4
    sizes = {"epochs": 1, "num_train": 8, "batch_size": 4, "num_test": 4, "eval_batch_size": 4}
    configs = [tiny(model={**model, "kernel_backend": "triton"}, **sizes),
               tiny(model={**model, "kernel_backend": "triton"}, init_seed=1, **sizes)]
    assert resolve(configs[0]).unbatchable_reason is None
    exact = not label.startswith("dynamic_headwise")  # its generator's batched matmul rounds differently (above)
    assert_same_records(train_runs_batched(configs, progress=False), solo(configs), exact=exact)
    for long_conv in ("rubiconv", "hyena"):
        run = resolve(tiny(model={"mixer": long_conv, "kernel_backend": "triton"}))
        assert "has no vmap rule" in run.unbatchable_reason


PACKED = ("packed/associative_retrieval", {"seq_len": 64, "min_doc_len": 8, "doc_len_median": 16, "max_doc_len": 32,
                                           "num_keys": 16, "keys_per_doc": 4, "num_values": 16, "query_share": 0.5})
PACKED_CASES = [("attention", {"mixer": "attention"}), ("rubiconv", {"mixer": "rubiconv"}),
                ("hyena", {"mixer": "hyena"}), ("fft_conv_leaky", {"mixer": "fft_conv_leaky"})]


def packed_pair(model):
    """Two packed runs with their own data (so their layouts and slot counts differ)."""
    return [tiny(task=PACKED, model=model, steps=3, epochs=None, num_train=16, num_test=8, init_seed=s, data_seed=s,
                 lr=1e-2 * (s + 1)) for s in (0, 1)]


@pytest.mark.parametrize(("label", "model"), PACKED_CASES, ids=[c[0] for c in PACKED_CASES])
def test_packed_runs_stack(monkeypatch, label, model):
    """Each run of a packed stack gets its own layouts (static slots, engine.layout); records equal train_run's
    up to the head's rounding at few scored positions (module docstring of runners.train.engine; the mixers' outputs
    per run: tests/models/test_mixers.py)."""
    configs = packed_pair(model)
    assert resolve(configs[0]).unbatchable_reason is None
    monkeypatch.setattr(engine, "train_run", None)  # nothing may train alone
    batched = train_runs_batched(configs, progress=False)
    monkeypatch.undo()
    assert_same_records(batched, solo(configs), exact=False)


def test_packed_runs_refuse_compile_and_graphs(monkeypatch):
    for speed in ("compile", "cuda-graph", "compile+graph"):
        with pytest.raises(ValueError, match="packed task"):
            train_runs_batched(packed_pair({"mixer": "rubiconv"}), progress=False, speed=speed)
    modes = []
    monkeypatch.setattr(engine, "_train_stack", lambda runs, names, **kw: modes.append(kw) or [{}] * len(runs))
    monkeypatch.setattr(engine, "pick_device", lambda name: torch.device("cuda"))  # where auto would graph
    train_runs_batched(packed_pair({"mixer": "rubiconv"}), progress=False, speed="auto")
    assert [(m["compile"], m["cuda_graph"]) for m in modes] == [(False, False)]  # auto: eager


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("mixer", ["attention", "rubiconv", "hyena"])
def test_packed_stack_steps_never_wait_for_the_device(monkeypatch, mixer):
    """After the first step (lazy initialisations), laying out a step's documents and the step itself (forward,
    backward, AdamW) make no device sync: the ops read the layouts' host copies (kernels.utils.host_offsets)."""
    steps = []

    def strict(real):
        def call(self, *args):
            if not steps:  # before the first step is done
                return real(self, *args)
            torch.cuda.set_sync_debug_mode("error")
            try:
                return real(self, *args)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return call

    monkeypatch.setattr(engine._Stack, "layout", strict(engine._Stack.layout))
    step = strict(engine._Stack.step)
    monkeypatch.setattr(engine._Stack, "step", lambda self, *args: (step(self, *args), steps.append(1)))
    configs = [tiny(task=PACKED, model={"mixer": mixer}, steps=4, epochs=None, num_train=16, num_test=8,
                    init_seed=seed, data_seed=seed, device="cuda") for seed in (0, 1)]
    records = train_runs_batched(configs, progress=False)
    assert len(steps) == 4 and all(r["steps"] == 4 for r in records)


@pytest.mark.skipif(not models.MIXERS["gla"].available(), reason="needs fla-core")
def test_packed_fla_baselines_are_trained_one_at_a_time(monkeypatch):
    configs = packed_pair({"mixer": "gla"})
    assert "layout on the host" in resolve(configs[0]).unbatchable_reason
    assert resolve(tiny(model={"mixer": "gla"})).unbatchable_reason is None  # without documents it stacks
    calls = []

    def spy(run, **kwargs):
        calls.append(run.config)
        return train_run(run, **kwargs)

    monkeypatch.setattr(engine, "train_run", spy)
    train_runs_batched(configs, progress=False)
    assert calls == configs


def test_on_step_is_called_after_every_stack_step_with_its_count_before_the_evaluation(monkeypatch):
    """36 and 40 training rows: four full batches together, then the first run's short last batch in a step of its
    own (it ends and is evaluated), then the second run's fifth full batch: six stack steps for two 5-step runs."""
    configs = [tiny(epochs=1), tiny(epochs=1, num_train=40, init_seed=1)]
    events = []
    evaluate = engine._Stack.evaluate

    def spy_evaluate(self, run_tasks, rows, batch_size):
        events.append(f"evaluate {rows}")
        return evaluate(self, run_tasks, rows, batch_size)

    monkeypatch.setattr(engine._Stack, "evaluate", spy_evaluate)
    batched = train_runs_batched(configs, progress=False, on_step=events.append)
    assert events == [1, 2, 3, 4, 5, "evaluate [0]", 6, "evaluate [0]"]
    assert [r["steps"] for r in batched] == [5, 5]
    assert_same_records(batched, solo(configs))


def test_max_stack_is_the_stacks_width_and_the_other_runs_queue(monkeypatch):
    configs = [tiny(epochs=1, init_seed=0), tiny(epochs=1, batch_size=4), tiny(epochs=1, init_seed=1),
               tiny(epochs=1, init_seed=2)]
    stacks = []
    stack = engine._train_stack

    def spy(runs, *args, **kwargs):
        stacks.append((len(runs), kwargs["width"]))
        return stack(runs, *args, **kwargs)

    monkeypatch.setattr(engine, "_train_stack", spy)
    batched = train_runs_batched(configs, progress=False, max_stack=2)
    assert stacks == [(3, 2), (1, 1)]
    assert_same_records(batched, solo(configs))


def test_adamw_update_matches_torch_adamw():
    """Rows that step get torch.optim.AdamW's bits at their own step counts; rows that idle keep theirs."""
    shapes = [(17, 33), (5,), (128, 352)]
    lrs, wds = [1e-3, 5e-4, 1e-4], [0.0, 0.1, 0.3]
    stepping = [[1, 1, 0], [1, 0, 1], [1, 1, 1], [0, 1, 1], [1, 1, 1]]  # per stack step, per row
    gen = torch.Generator().manual_seed(0)
    start = [[torch.randn(s, generator=gen) for s in shapes] for _ in lrs]
    params = [[p.clone().requires_grad_() for p in run] for run in start]
    optimizers = [torch.optim.AdamW(p, lr=lr, weight_decay=wd, foreach=False)
                  for p, lr, wd in zip(params, lrs, wds)]
    flat = torch.stack([torch.cat([p.flatten() for p in run]) for run in start])  # [N, P]
    exp_avg, exp_avg_sq = torch.zeros_like(flat), torch.zeros_like(flat)
    sizes = [math.prod(s) for s in shapes]
    counts = [0] * len(lrs)  # each row's AdamW steps
    for steps in stepping:
        grads = torch.randn(flat.shape, generator=gen)
        for n, (run, opt) in enumerate(zip(params, optimizers)):
            if steps[n]:
                for p, g in zip(run, grads[n].split([p.numel() for p in run])):
                    p.grad = g.view(p.shape).clone()
                opt.step()
                counts[n] += 1
        t = [max(c, 1) for c in counts]  # an idle row's scalars are never read
        scalars = torch.tensor([[1 - lr * wd for lr, wd in zip(lrs, wds)],
                                [-(lr / (1 - 0.9**k)) for lr, k in zip(lrs, t)],
                                [(1 - 0.999**k) ** 0.5 for k in t], steps], dtype=torch.float32)
        per_param = [g.unflatten(1, shape) for g, shape in zip(grads.split(sizes, dim=1), shapes)]  # [N, *shape]
        _adamw_update(flat, per_param, exp_avg, exp_avg_sq, scalars, 0.9, 0.999)
        for n, run in enumerate(params):
            assert torch.equal(flat[n], torch.cat([p.detach().flatten() for p in run]))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"run_names": ["a"]}, "run_names"),
    ({"max_stack": 0}, "max_stack"),
    ({"speed": "cuda-graph"}, "speed='cuda-graph' needs runs on a CUDA device"),
    ({"speed": "fast"}, "unknown speed 'fast'"),
], ids=["run_names_length", "max_stack_zero", "cuda_graph_on_cpu", "unknown_speed"])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        train_runs_batched([tiny(epochs=1), tiny(epochs=1, init_seed=1)], progress=False, **kwargs)


def test_global_rng_untouched():
    state = torch.get_rng_state()
    train_runs_batched([tiny(epochs=1), tiny(epochs=1, init_seed=1)], progress=False)
    assert torch.equal(state, torch.get_rng_state())


def test_bench_train_reports_a_gated_table():
    report = bench_train(n_runs=2, steps=2, device="cpu", task_params={"seq_len": 16}, num_train=16,
                         num_test=8, batch_size=8)
    rows = [line for line in report.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| mode |") and rows[1].startswith("| one at a time | 1 |")
    assert rows[2].startswith("| batched | 2 |") and rows[2].endswith("| bitwise |")
    rate = float(rows[2].split("|")[6])
    assert math.isfinite(rate) and rate > 0
    assert "precision fp32, kernels auto" in report


def test_bench_train_names_the_kernel_backend_it_ran(monkeypatch):
    monkeypatch.setenv("MIXLAB_BACKEND", "torch")
    report = bench_train(n_runs=1, steps=1, device="cpu", task_params={"seq_len": 16}, num_train=8, num_test=8,
                         batch_size=8)
    assert "kernels torch" in report


def test_bench_train_rejects_unknown_model():
    with pytest.raises(ValueError, match="unknown model 'transformr'"):
        bench_train(model="transformr", n_runs=1, steps=1, device="cpu")


# Scripted test metrics: micro accuracy above the MAD threshold from the start; macro at 0.5, then exactly at the
# threshold (no stop: the rule is strictly above), then just above it.
SCRIPTED = [{"acc_micro": 1.0, "acc_macro": 0.5}, {"acc_micro": 1.0, "acc_macro": 0.999},
            {"acc_micro": 0.9, "acc_macro": 0.9991}]


def _scripted(real_metrics: dict, count: int) -> dict:
    return {**real_metrics, **SCRIPTED[min(count, len(SCRIPTED) - 1)]}


def test_early_stop_needs_macro_accuracy_strictly_above_the_threshold_in_both_loops(monkeypatch):
    """The early stop compares macro accuracy with the threshold, strictly (mad-lab): a run whose micro accuracy
    is 1.0 from the start goes on while macro is below 0.999 and when it equals it, and stops at the evaluation
    where macro exceeds it (step 6 of 10); a threshold never exceeded trains to the end. Checked alone
    (train_run) and stacked (the engine). Stopping without the comparison, on micro accuracy, or at >= would
    stop at step 2, 2 or 4."""
    calls = {"alone": 0, "stack": 0}
    real_evaluate, real_stack_evaluate = train_module.evaluate, engine._Stack.evaluate

    def alone(*args, **kwargs):
        calls["alone"] += 1
        return _scripted(real_evaluate(*args, **kwargs), calls["alone"] - 1)

    def stacked(self, run_tasks, rows, batch_size):
        calls["stack"] += 1
        return [_scripted(m, calls["stack"] - 1) for m in real_stack_evaluate(self, run_tasks, rows, batch_size)]

    monkeypatch.setattr(train_module, "evaluate", alone)
    monkeypatch.setattr(engine._Stack, "evaluate", stacked)
    stops = tiny(epochs=None, steps=10, eval_every=2, early_stop_acc=0.999)
    never = tiny(epochs=None, steps=10, eval_every=2, early_stop_acc=0.9995, init_seed=1)
    for record in (train_run(stops, progress=False), train_runs_batched([stops], progress=False)[0]):
        assert record["stopped_early"] and record["steps"] == 6
        assert [h["acc_macro"] for h in record["history"]] == [0.5, 0.999, 0.9991]
    calls.update(alone=0, stack=0)
    for record in (train_run(never, progress=False), train_runs_batched([never], progress=False)[0]):
        assert not record["stopped_early"] and record["steps"] == 10 and len(record["history"]) == 5
