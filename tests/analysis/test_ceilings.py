import pytest
import torch

from analysis.ceilings import main, mqar_varlen_window_ceiling
from tasks import get_task
from tasks.base import IGNORE, Role, TaskData


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


def test_main_prints_a_row_per_window(capsys):
    main(["--preset", "mqar_varlen_small", "--windows", "4,5", "--rows", "50", "--seeds", "1"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and lines[-1].endswith("| 5 | 1.0000 |")
