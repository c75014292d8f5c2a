import pytest
import torch
from mixlab.analysis.ceilings import (
    accuracy_by_multiplicity,
    ceiling_table,
    memorization_ceiling,
    memorization_ceilings,
    mqar_varlen_window_ceiling,
    multiplicity_table,
    query_multiplicity,
)
from mixlab.runners.train.config import RunConfig, TrainConfig
from mixlab.runners.train.run import train_run
from mixlab.tasks import get_task
from mixlab.tasks.base import IGNORE, Role, TaskData
from torch import nn


def hand_row() -> TaskData:
    """Keys `a b c`, `x b c` (length 3) and `b c` (length 2), each asked once: W=4 sees `b c` + SEP of each."""
    a, b, c, x = 10, 11, 12, 13  # key tokens; SEP_L has id L; values 40..42
    pairs = [((a, b, c), 40), ((x, b, c), 41), ((b, c), 42)]
    inputs, targets, roles = [], [], []
    for scored in (False, True):
        for key, value in pairs:
            inputs += [*key, len(key), value]
            roles += [Role.KEY] * len(key) + [Role.SEPARATOR, Role.VALUE]
            targets += [IGNORE] * len(key) + [value if scored else IGNORE, IGNORE]
    as_row = [torch.tensor([t]) for t in (inputs, targets, roles)]
    return TaskData(inputs=as_row[0], targets=as_row[1], roles=as_row[2].to(torch.uint8), vocab_size=64)


@pytest.mark.parametrize("window,expected", [(1, 2 / 3), (3, 2 / 3), (4, 2 / 3), (5, 1.0), (8, 1.0)],
                         ids=["W1", "W3", "W4", "W5", "W8"])
def test_hand_built_row(window, expected):
    """The two 3-token keys differ only in their first token, so they are one key until W = 5."""
    assert mqar_varlen_window_ceiling(hand_row(), window) == pytest.approx(expected)


def test_multiplicity_sits_at_the_scored_separators_only():
    data = hand_row()
    m = query_multiplicity(data, 4)
    assert torch.equal(m > 0, data.targets != IGNORE)
    assert m[data.targets != IGNORE].tolist() == [2, 2, 1]


class Answers(nn.Module):
    """Logits [B, T, V] whose argmax is a fixed answer per position, batch after batch in row order."""

    def __init__(self, answers: torch.Tensor, vocab_size: int) -> None:
        super().__init__()
        self.answers, self.vocab_size, self.next_row = answers, vocab_size, 0

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        rows = slice(self.next_row, self.next_row + len(inputs))
        self.next_row += len(inputs)
        return nn.functional.one_hot(self.answers[rows].clamp(min=0), self.vocab_size).float()


def test_accuracy_by_multiplicity_counts_right_answers_per_m():
    data = get_task("mqar_varlen", vocab_size=64, seq_len=64, num_kv_pairs=4).generate(60, seed=2, split="test")
    m = query_multiplicity(data, 4)
    answers = data.targets.clone()
    answers[m >= 2] = 0  # wrong wherever the window leaves the key ambiguous
    rows = accuracy_by_multiplicity(Answers(answers, data.vocab_size), data, 4, batch_size=7)
    assert [r["m"] for r in rows][0] == 1 and len(rows) >= 2
    assert rows[0]["acc"] == 1.0 and all(r["acc"] == 0.0 for r in rows[1:])
    assert sum(r["n"] for r in rows) == int((data.targets != IGNORE).sum())


def test_generated_data_rises_with_the_window_and_reaches_one():
    data = get_task("mqar_varlen", vocab_size=64, seq_len=64, num_kv_pairs=4).generate(200, seed=0, split="test")
    ceilings = [mqar_varlen_window_ceiling(data, w) for w in range(1, 6)]
    assert ceilings == sorted(ceilings)
    assert ceilings[3] < 1.0  # shared suffixes occur at share_prob 0.5
    assert ceilings[4] == 1.0  # W = longest key + 2 sees every key whole


def test_without_sharing_and_a_large_vocabulary_keys_rarely_collide():
    task = get_task("mqar_varlen", vocab_size=8192, seq_len=64, num_kv_pairs=4, share_prob=0.0)
    assert mqar_varlen_window_ceiling(task.generate(200, seed=1, split="test"), 4) > 0.999


def test_rejects_a_bad_window():
    with pytest.raises(ValueError, match="window"):
        mqar_varlen_window_ceiling(hand_row(), 0)


def test_ceiling_table_has_a_row_per_setting_and_window():
    settings = [{"vocab_size": 64, "seq_len": 64, "num_kv_pairs": n} for n in (3, 4)]
    lines = ceiling_table("small", settings, [4, 5], rows=50, seeds=2).splitlines()
    assert len(lines) == 2 + 2 * 2 and all(line.startswith("| small | {'vocab_size': 64") for line in lines[2:])
    assert lines[-1].endswith("| 5 | 1.0000, 1.0000 |")


def test_multiplicity_table_splits_a_saved_run(tmp_path):
    config = RunConfig(task="mqar_varlen", task_params={"vocab_size": 64, "seq_len": 64, "num_kv_pairs": 4},
                       model={"d_model": 16, "n_heads": 1, "n_layers": 1, "mlp_hidden": 32, "qkv_conv": "static",
                              "conv_width": 4},
                       train=TrainConfig(steps=1, epochs=None, batch_size=4, num_train=4, num_test=40, device="cpu"))
    train_run(config, out_dir=tmp_path, run_name="r", progress=False, save=True)
    lines = multiplicity_table(tmp_path / "r.pt", 4).splitlines()
    assert "ceiling" in lines[0] and lines[3].startswith("| 1 | ")
    assert sum(int(line.split("|")[2]) for line in lines[3:]) == 40 * 4  # every query of the 40 test rows


def memorization_rows(keys: list[list[int]], vocab_size: int = 16) -> TaskData:
    """Memorization rows ``key <insert>`` over ``keys`` [N, T/2]; every key's value is key + 8."""
    inputs = torch.full((len(keys), 2 * len(keys[0])), vocab_size - 1)
    inputs[:, 0::2] = torch.tensor(keys)
    targets = torch.full(inputs.shape, IGNORE)
    targets[:, 1::2] = torch.tensor(keys) + 8
    roles = torch.full(inputs.shape, int(Role.SPECIAL), dtype=torch.uint8)
    roles[:, 0::2] = int(Role.KEY)
    return TaskData(inputs=inputs, targets=targets, roles=roles, vocab_size=vocab_size)


def test_the_memorization_ceiling_counts_the_test_keys_training_shows():
    train = memorization_rows([[0, 1], [1, 2]])
    # keys 0, 1, 2 seen; 3 and 4 never: 4 of the 6 scored test positions can be answered
    assert memorization_ceiling(train, memorization_rows([[0, 3], [4, 1], [2, 2]])) == pytest.approx(4 / 6)
    assert memorization_ceiling(train, train) == 1.0
    # the insert token is in every training row but is no key: a test "key" equal to it is not seen
    assert memorization_ceiling(train, memorization_rows([[15, 0]])) == pytest.approx(1 / 2)


def test_the_mad_sweeps_memorization_ceiling_falls_from_vocabulary_2048():
    """256 training rows of 16 keys: at V = 2048, 4096 and 8192 about 0.98, 0.87 and 0.63 of the test keys were
    shown (docs/mad.md quotes these)."""
    rows = memorization_ceilings(seeds=(0,))
    by_vocab = {row["vocab_size"]: row["ceiling"] for row in rows}
    assert [by_vocab[v] for v in (256, 512, 1024)] == [1.0, 1.0, 1.0]
    assert [round(by_vocab[v], 2) for v in (2048, 4096, 8192)] == [0.98, 0.87, 0.64]
