"""The head at scored positions only (runners.train.metrics.SPARSE_HEAD_MAX_SHARE) and the sync-free evaluation:
same numbers as the full head and the boolean-selection counts they replace."""

import mixlab.runners.train.metrics as metrics
import pytest
import torch
import torch.nn.functional as F
from mixlab import tasks
from mixlab.runners.train.config import RunConfig, TrainConfig
from mixlab.runners.train.engine import train_runs_batched
from mixlab.runners.train.metrics import batch_counts, scored_positions, sparse_width
from mixlab.runners.train.run import train_run
from mixlab.tasks import IGNORE

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop because we have not yet")

MQAR = ("mqar_varlen", {"vocab_size": 64, "seq_len": 48, "num_kv_pairs": 4})  # 4 answers in 48 tokens
COPY = ("mad/selective_copy", {"seq_len": 32, "num_tokens_to_copy": 4})


def config(task, **train):
    fields = {"epochs": 2, "batch_size": 8, "num_train": 36, "num_test": 20, "eval_batch_size": 8,
              "device": "cpu", **train}
    return RunConfig(task=task[0], task_params=dict(task[1]),
                     model={"d_model": 16, "n_heads": 2, "n_layers": 1, "mlp_hidden": 32, "qkv_conv": "static"},
                     train=TrainConfig(**fields))


def test_scored_positions_keep_every_scored_target_in_order():
    targets = torch.full((3, 12), IGNORE)
    targets[0, [2, 5, 9]] = torch.tensor([4, 5, 6])
    targets[1, 0] = 7
    assert sparse_width(targets) == 3  # the most answers in a row
    positions, sparse = scored_positions(targets, 3)
    assert positions[0].tolist() == [2, 5, 9] and sparse[0].tolist() == [4, 5, 6]
    assert positions[1, 0] == 0 and sparse[1].tolist() == [7, IGNORE, IGNORE]
    assert (sparse[2] == IGNORE).all()
    dense = torch.zeros(2, 8, dtype=torch.long)  # every position scored: the full head is as cheap
    assert sparse_width(dense) is None
    assert sparse_width(torch.full((2, 8), IGNORE)) is None


@pytest.mark.parametrize("task", [MQAR, COPY], ids=["mqar_varlen", "selective_copy"])
def test_sparse_head_trains_like_the_full_head(monkeypatch, task):
    cfg = config(task, lr=1e-2)
    assert sparse_width(tasks.get_task(task[0], **task[1]).generate(36, seed=0).targets) is not None
    sparse = train_run(cfg, progress=False)
    monkeypatch.setattr(metrics, "SPARSE_HEAD_MAX_SHARE", 0.0)  # every task dense
    dense = train_run(cfg, progress=False)
    assert [h["step"] for h in sparse["history"]] == [h["step"] for h in dense["history"]]
    for hs, hd in zip(sparse["history"], dense["history"]):
        assert hs["train_loss"] == pytest.approx(hd["train_loss"], rel=1e-5)
        assert hs["test_loss"] == pytest.approx(hd["test_loss"], rel=1e-5)
        assert hs["acc_micro"] == hd["acc_micro"]


def test_sparse_head_batches_like_one_at_a_time():
    # the stacked head's matmul may round differently (few rows): losses to rounding, accuracies equal
    configs = [config(MQAR, lr=1e-2), config(MQAR, lr=3e-3, init_seed=1, data_seed=1)]
    batched = train_runs_batched(configs, progress=False)
    alone = [train_run(c, progress=False) for c in configs]
    for b, a in zip(batched, alone):
        assert [h["step"] for h in b["history"]] == [h["step"] for h in a["history"]]
        for hb, ha in zip(b["history"], a["history"]):
            assert hb["acc_micro"] == ha["acc_micro"] and hb["acc_macro"] == ha["acc_macro"]
            assert hb["test_loss"] == pytest.approx(ha["test_loss"], rel=1e-5)
            assert hb["train_loss"] == pytest.approx(ha["train_loss"], rel=1e-5)


def test_batch_counts_equal_the_selected_positions_counts():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 9, 6, generator=gen)
    targets = torch.randint(0, 6, (4, 9), generator=gen)
    targets[torch.rand(4, 9, generator=gen) < 0.5] = IGNORE
    counts = batch_counts(logits, targets)
    mask = targets != IGNORE
    scored, goal = logits[mask], targets[mask]
    pred = scored.argmax(-1)
    hit = pred == goal
    assert counts["n"] == mask.sum() and counts["correct"] == hit.sum()
    assert counts["tp"].tolist() == torch.bincount(goal[hit], minlength=6).double().tolist()
    assert counts["fn"].tolist() == torch.bincount(goal[~hit], minlength=6).double().tolist()
    assert counts["fp"].tolist() == torch.bincount(pred[~hit], minlength=6).double().tolist()
    assert float(counts["loss_sum"]) == pytest.approx(float(F.cross_entropy(scored, goal, reduction="sum")),
                                                      rel=1e-6)
