"""``mixlab bench tune``'s groups build valid rows of the kernels' tables, and its timing path runs end to end on
tiny shapes (the Triton interpreter without CUDA: a check of the code, not a measurement)."""

import dataclasses

import pytest
from mixlab.runners.bench import tune as bench_tune

GROUPS = [pytest.param(op, group, id=f"{op}-{group.name}") for op, groups in bench_tune.GROUPS.items()
          for group in groups]


@pytest.mark.parametrize("op, group", GROUPS)
def test_every_candidate_is_a_valid_row_of_its_table(op, group):
    """The table's row first, then distinct replacements of its own fields (the dataclass refuses unknown fields
    and bad values), each case one the op's tuner builds."""
    candidates = group.candidates()
    assert candidates[0] is group.module.CONFIGS[group.key]
    assert all(type(c) is type(candidates[0]) for c in candidates)
    assert len(set(candidates)) == len(candidates), "a candidate repeats another (or the table's row)"
    assert all(dataclasses.replace(c) == c for c in candidates)
    assert set(group.cases) <= set(bench_tune.CASE_NAMES[op])


def test_unknown_ops_and_groups_are_named():
    with pytest.raises(ValueError, match="unknown op 'conv'"):
        bench_tune.select("conv")
    with pytest.raises(ValueError, match="unknown attention tune group 'nope'"):
        bench_tune.select("attention", ["nope"])


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize(("op", "group"), [("shortconv", "static fwd stream"), ("shortconv", "low-rank bwd dz"),
                                           ("attention", "bwd"), ("rubiconv", "block inv")])
def test_tuning_a_group_times_every_candidate_and_names_the_winner(op, group):
    lines = []
    winners = bench_tune.tune(op, [group], rep=1, device="cpu", smoke=True, out=lines.append)
    text = "\n".join(lines)
    assert "WRONG" not in text and "FAILED" not in text, text
    rows = [line for line in text.splitlines() if line.startswith(("* ", "  "))]
    candidates = next(g for g in bench_tune.GROUPS[op] if g.name == group).candidates()
    assert len(rows) == len(candidates) and sum(row.startswith("* ") for row in rows) == 1
    assert winners[group] in candidates
    assert text.splitlines()[-1].endswith(repr(winners[group]))
