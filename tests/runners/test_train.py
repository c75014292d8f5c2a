import json
import math

import pytest
import torch
from mixlab import models
from mixlab.runners.train.config import RunConfig, TrainConfig, config_hash
from mixlab.runners.train.metrics import batch_counts, macro_accuracy
from mixlab.runners.train.run import train_run
from mixlab.runners.train.schedule import StepPlan, lr_at
from mixlab.tasks import TASKS

TINY_MODEL = {"d_model": 16, "n_heads": 2, "n_layers": 1, "mlp_hidden": 32}
# Task parameters that keep every task small; packed rows default to 2048 tokens.
TINY_TASK = {
    "mqar": {"vocab_size": 64, "seq_len": 32, "num_kv_pairs": 4},
    "mqar_varlen": {"vocab_size": 128, "seq_len": 48, "num_kv_pairs": 4},
    "mad/in_context_recall": {"seq_len": 32},
    "mad/noisy_recall": {"seq_len": 32},
    "mad/fuzzy_recall": {"seq_len": 32},
    "mad/selective_copy": {"seq_len": 32, "num_tokens_to_copy": 4},
    "mad/compression": {"seq_len": 16},
    "mad/memorization": {"seq_len": 16},
    "packed/associative_retrieval": {"seq_len": 128},
    "packed/noisy_recall": {"seq_len": 128},
}


def tiny(task, mixer="attention", steps=2, **train):
    params = TINY_TASK.get(task, {})
    fields = {"steps": steps, "epochs": None, "batch_size": 8, "num_train": 16, "num_test": 8, "device": "cpu",
              **train}
    return RunConfig(task=task, task_params=params, model={**TINY_MODEL, "mixer": mixer}, train=TrainConfig(**fields))


@pytest.mark.parametrize("task", sorted(TASKS), ids=sorted(TASKS))
def test_every_task_trains(task):
    record = train_run(tiny(task), progress=False)
    assert record["steps"] == 2 and record["history"]
    final = record["final"]
    assert 0 <= final["acc_micro"] <= 1 and 0 <= final["acc_macro"] <= 1 and math.isfinite(final["test_loss"])


@pytest.mark.parametrize("mixer", sorted(models.MIXERS), ids=sorted(models.MIXERS))
def test_every_mixer_trains_on_a_packed_task(mixer):
    record = train_run(tiny("packed/associative_retrieval", mixer=mixer), progress=False)
    assert math.isfinite(record["final"]["test_loss"])


def test_tiny_model_beats_chance_quickly():
    config = RunConfig(
        task="mqar", task_params={"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2},
        model={"d_model": 32, "n_heads": 2, "n_layers": 2, "mlp_hidden": 64},
        train=TrainConfig(epochs=6, batch_size=32, num_train=512, num_test=128, lr=1e-2, device="cpu"),
    )
    record = train_run(config, progress=False)
    chance = 1 / 16  # sixteen value tokens
    assert record["final"]["acc_micro"] > 4 * chance


def test_same_seeds_same_metrics_and_init_seed_matters():
    a = train_run(tiny("mqar", steps=6), progress=False)
    b = train_run(tiny("mqar", steps=6), progress=False)
    c = train_run(tiny("mqar", steps=6, init_seed=1), progress=False)
    assert a["history"] == b["history"]
    assert a["history"] != c["history"]


def test_global_rng_untouched():
    state = torch.get_rng_state()
    train_run(tiny("mqar"), progress=False)
    assert torch.equal(state, torch.get_rng_state())


def test_record_written_whole_and_config_round_trips(tmp_path):
    config = tiny("mqar_varlen", steps=4, eval_every=2)
    record = train_run(config, out_dir=tmp_path, progress=False)
    files = list(tmp_path.iterdir())
    assert [f.name for f in files] == [f"{record['name']}.json"] and config_hash(config) in record["name"]
    saved = json.loads(files[0].read_text())
    assert RunConfig.from_dict(saved["config"]) == config
    assert saved["resolved"]["model"]["vocab_size"] == 128 and saved["resolved"]["task_params"]["seq_len"] == 48
    assert {"torch", "numpy", "python"} <= set(saved["versions"]) and saved["device"]["type"] == "cpu"
    assert [h["step"] for h in saved["history"]] == [2, 4]
    best = min(saved["history"], key=lambda h: h["test_ppl"])
    assert saved["final"]["test_ppl"] == best["test_ppl"] and saved["final"]["best_step"] == best["step"]
    assert saved["steps_per_s"] > 0 and saved["wall_time_s"] > 0


def test_early_stop_at_accuracy_threshold():
    record = train_run(tiny("mqar", steps=10, eval_every=2, early_stop_acc=1e-9), progress=False)
    assert record["stopped_early"] and record["steps"] == 2


def test_cosine_per_epoch_schedule():
    tc = TrainConfig(epochs=4, lr=1e-3, min_lr=1e-6)
    lrs = [lr_at(tc, step=e * 10, epoch=e, total_steps=40, total_epochs=4) for e in range(4)]
    assert lrs[0] == pytest.approx(1e-3) and lrs == sorted(lrs, reverse=True) and lrs[-1] > 1e-6
    assert lr_at(tc, 5, 0, 40, 4) == lrs[0], "constant within an epoch"
    warm = TrainConfig(steps=100, epochs=None, warmup_steps=10, schedule="cosine_step", lr=1.0, min_lr=0.0)
    assert lr_at(warm, 0, 0, 100, 1) == pytest.approx(0.1) and lr_at(warm, 99, 0, 100, 1) < 1e-3


@pytest.mark.parametrize("schedule", ["cosine_epoch", "cosine_step"])
def test_a_run_with_epochs_and_steps_is_the_start_of_the_epochs_run(schedule):
    """epochs=4 and steps=5 (2 steps an epoch): the run's evaluations, learning rates and losses are those of
    the 4-epoch run at the same steps, bitwise; it stops after step 5."""
    full_config = tiny("mad/in_context_recall", steps=None, epochs=4, schedule=schedule, lr=1e-2)
    full = train_run(full_config, progress=False)
    prefix = train_run(tiny("mad/in_context_recall", steps=5, epochs=4, schedule=schedule, lr=1e-2), progress=False)
    assert prefix["steps"] == 5 and [h["step"] for h in prefix["history"]] == [2, 4, 5]
    assert prefix["history"][:2] == full["history"][:2]
    last_lr = StepPlan.of(full_config.train).lr(full_config.train, 4)  # of step 5 (index 4) in the 8-step run
    assert prefix["history"][2]["lr"] == last_lr < full["history"][0]["lr"]


def test_macro_accuracy_follows_torchmetrics_defaults():
    # targets 0,0,1,2; predictions 0,1,1,3 -> recall: c0 1/2, c1 1, c2 0; c3 only predicted -> 0; mean over 4.
    logits = torch.full((1, 4, 5), -10.0)
    for pos, pred in enumerate([0, 1, 1, 3]):
        logits[0, pos, pred] = 10.0
    counts = batch_counts(logits, torch.tensor([[0, 0, 1, 2]]))
    assert float(counts["correct"]) == 2 and float(counts["n"]) == 4
    assert float(macro_accuracy(counts["tp"], counts["fp"], counts["fn"])) == pytest.approx((0.5 + 1 + 0 + 0) / 4)


@pytest.mark.parametrize(
    "fields,named",
    [({"epochs": 3, "steps": 301}, "steps=301"), ({"epochs": None}, "neither"), ({"lr": 0.0}, "lr"),
     ({"schedule": "linear"}, "linear"), ({"device": "tpu"}, "tpu"), ({"batch_size": 0}, "batch_size")],
    ids=["steps-past-epochs", "no-length", "zero-lr", "bad-schedule", "bad-device", "zero-batch"],
)
def test_bad_train_config(fields, named):
    with pytest.raises(ValueError, match=named):
        TrainConfig(**fields)


def test_unknown_keys_rejected():
    with pytest.raises(ValueError, match="bogus"):
        RunConfig.from_dict({"task": "mqar", "train": {"bogus": 1}})
    with pytest.raises(ValueError, match="widht"):
        train_run(RunConfig(task="mqar", model={"widht": 3}), progress=False)


def test_associative_retrieval_reports_present_and_absent_accuracy():
    record = train_run(tiny("packed/associative_retrieval", num_test=16), progress=False)
    final = record["final"]
    assert final["n_present"] + final["n_absent"] == final["n_scored"] and final["n_absent"] > 0
    weighted = (final["acc_present"] * final["n_present"] + final["acc_absent"] * final["n_absent"]) / final["n_scored"]
    assert weighted == pytest.approx(final["acc_micro"])


class _FixedLogits(torch.nn.Module):
    """Returns the logits [N, T, V] stored for each row; a row's id is its first input token."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits

    def forward(self, inputs, doc_ids=None, positions=None):
        return self.logits[inputs[:, 0]]


def test_macro_accuracy_and_perplexity_match_torchmetrics_per_batch_as_mad_lab_logs_them():
    """evaluate() over 300 rows in batches of 128 (the last of 44), a third of the targets ignored (-100), some
    classes only predicted: acc_macro and test_ppl equal torchmetrics' MulticlassAccuracy (macro, ignore -100)
    and Perplexity of each batch, averaged weighted by the batch's rows, which is the epoch value PyTorch
    Lightning gives the per-batch values mad-lab logs; the unweighted mean differs."""
    torchmetrics = pytest.importorskip("torchmetrics")
    from mixlab.runners.train.evaluation import evaluate
    from mixlab.tasks import TaskData

    n, t, v, batch = 300, 6, 7, 128
    gen = torch.Generator().manual_seed(0)
    targets = torch.randint(0, v - 1, (n, t), generator=gen)  # class v-1 is never a target
    targets[torch.rand(n, t, generator=gen) < 1 / 3] = -100
    logits = torch.randn(n, t, v, generator=gen)
    right = torch.rand(n, t, generator=gen) < 0.5
    logits[right] += 4 * torch.nn.functional.one_hot(targets.clamp(min=0), v)[right].float()
    inputs = torch.arange(n)[:, None].expand(n, t).contiguous()
    data = TaskData(inputs=inputs, targets=targets, roles=torch.zeros(n, t, dtype=torch.uint8), vocab_size=n)
    metrics = evaluate(_FixedLogits(logits), data, batch, torch.device("cpu"), autocast=False)

    accs, ppls, rows = [], [], []
    for start in range(0, n, batch):
        lg, tg = logits[start:start + batch], targets[start:start + batch]
        acc = torchmetrics.classification.MulticlassAccuracy(num_classes=v, average="macro", ignore_index=-100)
        accs.append(acc(lg.argmax(-1).reshape(-1), tg.reshape(-1)).item())
        ppls.append(torchmetrics.text.Perplexity(ignore_index=-100)(lg, tg).item())
        rows.append(len(tg))
    assert rows == [128, 128, 44]
    weighted = sum(a * r for a, r in zip(accs, rows)) / n
    assert metrics["acc_macro"] == pytest.approx(weighted, abs=1e-6)
    assert abs(sum(accs) / len(accs) - weighted) > 1e-4, "the short batch must move the unweighted mean"
    assert metrics["test_ppl"] == pytest.approx(sum(p * r for p, r in zip(ppls, rows)) / n, rel=1e-5)
    assert metrics["test_loss"] == pytest.approx(
        torch.nn.functional.cross_entropy(logits.reshape(-1, v), targets.reshape(-1)).item(), rel=1e-6)
