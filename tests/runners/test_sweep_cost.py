"""``mixlab mad remaining`` and ``mixlab sweep-cost``: what a sweep lacks (or costs before it runs), counted from
its plan and its folder's records, with steps, tokens and device-minutes."""

import pytest
from mixlab.runners.cli.main import main
from mixlab.runners.sweep.cost import TaskCost, parse_rates, remaining, remaining_table, sweep_costs


@pytest.fixture(scope="module")
def smoke_folder(tmp_path_factory):
    """The MAD smoke profile's memorization runs (2) and one of compression's 2, trained on the CPU."""
    out = tmp_path_factory.mktemp("mad") / "transformer-smoke"
    for tasks, limit in (("mad/memorization", "2"), ("mad/compression", "1")):
        main(["mad", "run", "--model", "transformer", "--profile", "smoke", "--seeds", "1", "--device", "cpu",
              "--tasks", tasks, "--limit", limit, "--out", str(out), "--no-progress"])
    return out


def test_missing_runs_steps_and_tokens_follow_the_plan(smoke_folder):
    costs = {c.task: c for c in remaining(smoke_folder, seeds=2)}
    assert list(costs) == ["mad/in_context_recall", "mad/noisy_recall", "mad/fuzzy_recall", "mad/selective_copy",
                           "mad/compression", "mad/memorization"]
    assert costs["mad/memorization"].missing == {1: 2} and costs["mad/memorization"].planned == {0: 2, 1: 2}
    assert costs["mad/compression"].missing == {0: 1, 1: 2}
    # smoke: 64 training rows in batches of 128 for 2 epochs, so 2 short steps a run; compression's rows are 32
    # tokens
    compression = costs["mad/compression"]
    assert compression.steps == 3 * 2 and compression.tokens == 3 * 2 * 64 * 32
    # the finished runs trained their whole budget (smoke runs never reach the early stop)
    assert compression.trained_share == 1.0 and costs["mad/noisy_recall"].trained_share is None


def test_table_minutes_at_a_rate_and_totals(smoke_folder):
    costs = remaining(smoke_folder, seeds=1)
    text = remaining_table(costs, {"transformer": 4096 / 60})  # compression's missing run: one minute
    row = next(line for line in text.splitlines() if "| mad/compression |" in line)
    assert row.split(" | ")[3:] == ["0: 1/2", "2", "0.0", "1.00", "1", "1 |"]
    assert "| mad/memorization |" not in text  # nothing missing
    assert "| transformer | **all tasks** |" in text
    assert text.splitlines()[-1].startswith("| **all** |")
    assert "| — | — |" in remaining_table(costs, {})  # no rate, no minutes


def test_a_grid_sweep_costs_its_whole_plan_before_it_runs_and_less_after(tmp_path):
    planned = {c.model: c for c in sweep_costs("smoke", None, device="cpu")}
    assert list(planned) == ["no_conv", "static_conv", "dynamic_conv"]
    # 2 widths x 2 lr x 2 seeds a model; 4 steps of 16 rows, one epoch of the 64 training rows, a run
    no_conv = planned["no_conv"]
    assert no_conv.missing == {0: 4, 1: 4} and no_conv.steps == 8 * 4 and no_conv.tokens % (8 * 64) == 0
    assert sweep_costs("smoke", tmp_path / "not-yet", device="cpu")[0].missing == no_conv.missing
    main(["sweep", "smoke", "--device", "cpu", "--out", str(tmp_path / "s"), "--limit", "2", "--no-progress"])
    after = sweep_costs("smoke", tmp_path / "s", device="cpu")
    assert sum(n for c in after for n in c.missing.values()) == 24 - 2
    assert any(c.trained_share == 1.0 for c in after)


def test_nothing_missing_says_so():
    done = TaskCost("f", "m", "mad/compression", {}, {0: 2}, 0, 0, 1.0)
    assert remaining_table([done], {}) == "nothing missing: every planned run has its record"


def test_rates_parse_per_model_or_for_all():
    assert parse_rates(["transformer=2e7", "1.5e7"]) == {"transformer": 2e7, "": 1.5e7}
    for bad in ("transformer=fast", "x=-1", "0", "m=nan"):
        with pytest.raises(ValueError, match=f"got {bad!r}"):
            parse_rates([bad])


def test_cli_prints_the_tables_and_refuses_bad_input_in_one_line(smoke_folder, tmp_path, capsys):
    main(["mad", "remaining", str(smoke_folder), "--seeds", "1", "--rate", "transformer=1e6"])
    assert "| transformer-smoke | transformer | mad/compression | 0: 1/2 |" in capsys.readouterr().out
    main(["sweep-cost", "smoke", "--device", "cpu", "--seeds", "1"])
    assert "| smoke | static_conv | mqar_varlen | 0: 4/4 |" in capsys.readouterr().out
    for argv in (["mad", "remaining", str(tmp_path), "--seeds", "1"], ["sweep-cost", "nope"],
                 ["sweep-cost", "smoke", "--rate", "fast"]):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("mixlab: error:") and len(err.strip().splitlines()) == 1, err
