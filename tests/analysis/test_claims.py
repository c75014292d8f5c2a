"""Claims as data and their verdicts: synthetic seeds whose answer is known (a clear effect, no effect, a bimodal
outcome, too few seeds), claims naming what a sweep lacks refused in one line (exit 2 from the command line), and
the verdicts in `mixlab report` and the `mixlab claims` ledger."""

import dataclasses
import json
import re
import shutil

import pytest
from mixlab.analysis import claims
from mixlab.analysis.aggregate import load_sweep
from mixlab.analysis.claims import Claim, Observation, evaluate, parse_claim
from mixlab.analysis.ledger import PAPERS, PRESET_SWEEPS, write_ledger
from mixlab.analysis.report import write_report
from mixlab.runners.cli.main import main
from mixlab.runners.sweep.manifest import _identity
from mixlab.runners.sweep.spec import SweepSpec, load_spec, preset_names, reference_claims
from scipy.stats import binomtest
from test_aggregate import grid_dir, mad_dir, manifest_for, record, write_sweep  # noqa: F401  (fixtures)


def observations(per_model, labels=None):
    """Observations of acc_micro: {model: [value of seed 0, seed 1, ...]}."""
    return [Observation(model, seed, labels or {"task": "t"}, {"acc_micro": value})
            for model, values in per_model.items() for seed, value in enumerate(values)]


def judge(claim, per_model):
    (verdict,) = evaluate(claim, observations(per_model), "acc_micro")
    return verdict


BEATS = Claim(text="a beats b", difference=("a", "b"), op=">")


def test_a_clear_effect_is_reproduced_and_its_opposite_contradicted():
    a, b = [0.90, 0.92, 0.91, 0.93, 0.90], [0.80, 0.81, 0.79, 0.80, 0.82]
    verdict = judge(BEATS, {"a": a, "b": b})
    assert verdict.verdict == "reproduced" and verdict.n == 5
    assert verdict.effect == pytest.approx(0.11)  # median of the per-seed differences .10 .11 .12 .13 .08
    assert verdict.interval.low == pytest.approx(0.08) and verdict.interval.high == pytest.approx(0.13)
    assert verdict.p == pytest.approx(1 / 32) and verdict.seeds_needed is None
    assert judge(BEATS, {"a": b, "b": a}).verdict == "contradicted"


def test_no_effect_is_inconclusive_with_the_seeds_that_would_likely_decide():
    verdict = judge(BEATS, {"a": [0.5, 0.52, 0.49, 0.51], "b": [0.5, 0.5, 0.5, 0.5]})
    # differences 0 .02 -.01 .01: median 0.005, interval [-0.01, 0.02]; 4 * (0.015 / 0.005)^2 = 36 -> 37
    assert verdict.verdict == "inconclusive"
    assert verdict.effect == pytest.approx(0.005)
    assert verdict.seeds_needed == 37
    # a difference exactly zero in every seed: "a beats b" is wrong, not undecided
    assert judge(BEATS, {"a": [0.5] * 3, "b": [0.5] * 3}).verdict == "contradicted"


def test_too_few_seeds_is_inconclusive_whatever_the_values():
    verdict = judge(BEATS, {"a": [0.9, 0.95], "b": [0.1, 0.2]})
    assert (verdict.verdict, verdict.n, verdict.interval, verdict.seeds_needed) == ("inconclusive", 2, None, 3)
    assert "too few seeds (2 < 3)" in verdict.verdict_text()


def test_too_few_seeds_of_a_solve_fraction_show_no_interval():
    claim = Claim(text="a sometimes solves it", level="a", solved_at=0.9, op=">", value=0.1)
    verdict = judge(claim, {"a": [0.99]})  # Wilson's interval of 1/1, [0.21, 1], would clear 0.1
    assert (verdict.verdict, verdict.interval, verdict.seeds_needed) == ("inconclusive", None, 3)
    assert verdict.effect_text() == "1/1 solved" and "too few seeds (1 < 3)" in verdict.verdict_text()
    assert judge(claim, {"a": [0.99] * 3}).verdict == "reproduced"


def test_a_claim_without_any_scored_seed_has_no_data():
    (verdict,) = evaluate(Claim(text="c wins", level="c", op=">", value=0.5), observations({"a": [0.9] * 3}),
                          "acc_micro")
    assert (verdict.verdict, verdict.n, verdict.effect_text()) == ("no data", 0, "—")


def test_differences_pair_seeds_and_skip_seeds_one_model_lacks():
    obs = observations({"a": [0.9, 0.9, 0.9, 0.9], "b": [0.1, 0.2, 0.3]})
    (verdict,) = evaluate(BEATS, obs, "acc_micro")
    assert verdict.n == 3 and verdict.effect == pytest.approx(0.7)


def test_a_bimodal_outcome_is_a_solve_fraction_with_a_wilson_interval():
    claim = Claim(text="a solves it", level="a", solved_at=0.9, op=">", value=0.5)
    # solved or stuck on the plateau: the median (0.95 here) would hide the stuck seeds
    verdict = judge(claim, {"a": [0.99, 0.32, 1.0, 0.95, 0.31]})
    assert (verdict.solved, verdict.n, verdict.effect) == (3, 5, pytest.approx(0.6))
    assert verdict.interval.low == pytest.approx(0.2307, abs=1e-3) and verdict.interval.high == pytest.approx(
        0.8824, abs=1e-3)
    assert verdict.verdict == "inconclusive" and verdict.effect_text() == "3/5 solved"
    # the first n at which round(0.6 n) of n solved has a Wilson interval above 0.5, by scipy's Wilson
    first = next(n for n in range(6, 1000)
                 if binomtest(round(0.6 * n), n).proportion_ci(method="wilson").low > 0.5)
    assert verdict.seeds_needed == first
    solved = judge(claim, {"a": [0.99, 0.98, 1.0, 0.97, 0.995]})
    assert solved.verdict == "reproduced"  # 5/5: Wilson [0.566, 1]
    stuck = judge(claim, {"a": [0.3, 0.31, 0.32]})
    assert (stuck.verdict, stuck.seeds_needed) == ("inconclusive", 4)  # 0/3: [0, 0.561]; 0/4: [0, 0.490]


def test_a_value_claim_holds_inside_its_tolerance():
    claim = Claim(text="a is 0.8", level="a", op="=", value=0.8, tolerance=0.05)
    assert judge(claim, {"a": [0.79, 0.81, 0.80]}).verdict == "reproduced"
    assert judge(claim, {"a": [0.6, 0.62, 0.61]}).verdict == "contradicted"
    assert judge(claim, {"a": [0.7, 0.8, 0.9]}).verdict == "inconclusive"


def test_each_gives_one_verdict_per_value_and_where_picks_cells():
    obs = [*observations({"a": [0.9] * 3, "b": [0.1] * 3}, {"task": "t", "d_model": "32"}),
           *observations({"a": [0.1] * 3, "b": [0.9] * 3}, {"task": "t", "d_model": "64"})]
    per_width = Claim(text="a beats b", difference=("a", "b"), op=">", each=("d_model",))
    assert [(v.split, v.verdict) for v in evaluate(per_width, obs, "acc_micro")] == [
        ({"d_model": "32"}, "reproduced"), ({"d_model": "64"}, "contradicted")]
    at_64 = Claim(text="a beats b", difference=("a", "b"), op=">", where={"d_model": 64})
    assert [v.verdict for v in evaluate(at_64, obs, "acc_micro")] == ["contradicted"]
    with pytest.raises(ValueError, match="several cells of a for seed 0 .*d_model"):
        evaluate(BEATS, obs, "acc_micro")


@pytest.mark.parametrize("data, message", [
    ({"text": "x", "level": "a", "op": ">", "colour": 1}, "unknown keys ['colour']"),
    ({"text": "x", "op": ">"}, "exactly one of level or difference"),
    ({"text": "x", "level": "a", "difference": ["a", "b"], "op": ">"}, "exactly one of level or difference"),
    ({"text": "x", "difference": ["a"], "op": ">"}, "difference names two models"),
    ({"text": "x", "level": "a", "op": "=="}, "claim.op must be one of"),
    ({"text": "x", "level": "a", "op": "="}, "tolerance goes with op '='"),
    ({"text": "x", "level": "a", "op": ">", "tolerance": 0.1}, "tolerance goes with op '='"),
    ({"text": "x", "difference": ["a", "b"], "op": ">", "solved_at": 0.9}, "solved_at goes with a level"),
    ({"text": "x", "level": "a", "op": ">", "solved_at": 0.9, "value": 2}, "value in [0, 1]"),
    ({"text": "x", "level": "a", "op": ">=", "value": 1, "every": True}, "every goes with solved_at"),
    ({"text": "x", "level": "a", "op": ">", "value": 0.5, "solved_at": 0.9, "every": True},
     "every goes with solved_at, op '>=' and value 1"),
    ({"text": "x", "difference": ["a", "b"], "op": ">", "fails_by_design": ["c"]}, "fails_by_design names ['c']"),
    ("a sentence", "must be a mapping"),
], ids=["unknown-key", "neither", "both", "one-model-difference", "bad-op", "equal-without-tolerance",
        "tolerance-without-equal", "solved-difference", "fraction-above-one", "every-without-solved",
        "every-as-a-share", "fails-by-design-stranger", "plain-sentence"])
def test_a_malformed_claim_is_refused_in_one_line(data, message):
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        parse_claim(data, "claims[0]")
    assert "\n" not in str(info.value)


TINY_GRID = {
    "name": "tiny_claims",
    "tasks": [{"task": "mqar", "params": {"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2}}],
    "models": {"attn": {"mixer": "attention", "n_layers": 1, "n_heads": 2},
               "conv": {"mixer": "attention", "n_layers": 1, "n_heads": 2, "qkv_conv": "static"}},
    "model_grid": {"d_model": [8, 16]},
}


@pytest.mark.parametrize("claim, named", [
    ({"level": "atn"}, "unknown model 'atn'"),
    ({"difference": ["conv", "atn"]}, "unknown model 'atn'"),
    ({"level": "attn", "metric": "acc_presnt"}, "unknown metric 'acc_presnt'"),
    ({"level": "attn", "where": {"width": 8}}, "unknown setting 'width'"),
    ({"level": "attn", "each": ["width"]}, "unknown setting 'width'"),
    ({"level": "attn", "where": {"d_model": 32}}, "d_model 32 is not in the sweep"),
    ({"level": "attn", "where": {"task": "mqar_varlen"}}, "task 'mqar_varlen' is not in the sweep"),
], ids=["model", "model-in-difference", "metric", "where-key", "each-key", "where-value", "task"])
def test_a_claim_naming_what_the_sweep_lacks_is_refused(claim, named):
    reference = {"claims": [{"text": "x", "op": ">", **claim}]}
    with pytest.raises(ValueError, match=named) as info:
        SweepSpec.from_dict({**TINY_GRID, "reference": reference})
    assert "reference.claims[0]" in str(info.value) and "\n" not in str(info.value)


def test_a_score_group_of_the_sweeps_task_is_a_metric_claims_may_name():
    spec = {**TINY_GRID, "tasks": [{"task": "packed/associative_retrieval", "params": {"seq_len": 128}}],
            "reference": {"claims": [{"text": "x", "level": "attn", "metric": "acc_present", "op": ">"}]}}
    assert SweepSpec.from_dict(spec).reference["claims"] == [
        {"text": "x", "level": "attn", "metric": "acc_present", "op": ">"}]


def test_the_command_line_exits_2_on_a_bad_claim(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**TINY_GRID, "reference": {"claims": [{"text": "x", "level": "atn", "op": ">"}]}}))
    yaml_path = tmp_path / "bad.yaml"
    yaml_path.write_text(path.read_text())  # JSON is YAML
    with pytest.raises(SystemExit) as info:
        main(["sweep", str(yaml_path), "--out", str(tmp_path / "out")])
    assert info.value.code == 2
    assert "unknown model 'atn'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_claims_leave_run_hashes_and_the_sweeps_identity_alone():
    bare = SweepSpec.from_dict(TINY_GRID).plan()
    claimed = SweepSpec.from_dict({**TINY_GRID, "reference": {"claims": [
        {"text": "conv beats attn", "difference": ["conv", "attn"], "op": ">", "each": ["d_model"]}],
        "deviations": ["toy size"]}}).plan()
    assert [r.hash for r in bare.runs] == [r.hash for r in claimed.runs]
    assert _identity(bare.spec) == _identity(claimed.spec)


def test_every_preset_states_checkable_claims_and_the_mad_claims_parse():
    for name in preset_names():
        reference = load_spec(name).reference
        for i, item in enumerate(reference["claims"]):
            assert isinstance(parse_claim(item, f"{name}[{i}]"), Claim)
    mad = claims.mad_claims()
    assert len(mad) == 4 + 3 * 7 and {c.metric for c in mad} == {None}


def with_claims(grid_dir):  # noqa: F811
    manifest = json.loads((grid_dir / "sweep.json").read_text())
    manifest["spec"]["reference"] = {"source": "a paper", "deviations": ["toy size"], "claims": [
        {"text": "Dynamic conv beats no conv at every width.", "difference": ["dynamic_conv", "no_conv"],
         "op": ">", "each": ["d_model"]},
        "An old sentence."]}
    (grid_dir / "sweep.json").write_text(json.dumps(manifest))
    return grid_dir


def test_report_prints_the_verdicts_of_a_grids_claims(grid_dir):  # noqa: F811
    text = write_report([with_claims(grid_dir)])[0].read_text()
    rows = [line for line in text.splitlines() if line.startswith("| Dynamic conv beats no conv")]
    # best lr per seed: dynamic 0.6 + d/1000 + 0.1 + 0.01 s against no conv 0.3 + d/1000 + 0.1 + 0.01 s
    assert len(rows) == 2 and all("+0.300" in r and "reproduced" in r for r in rows)
    assert "d_model=32" in rows[0] and "d_model=64" in rows[1]
    assert "- An old sentence. (a sentence, not a check: no verdict)" in text


def test_the_ledger_has_a_row_per_claim_and_paper_and_says_no_runs(grid_dir, tmp_path):  # noqa: F811
    out = tmp_path / "CLAIMS.md"
    text = write_ledger([with_claims(grid_dir)], reference_claims(PRESET_SWEEPS), out)
    assert out.read_text() == text + "\n"
    for paper in PAPERS:
        assert f"## {paper.title}" in text
    assert "## Other sweeps with claims" in text
    row = next(line for line in text.splitlines() if "d_model=64" in line)
    assert "reproduced" in row and "widths" in row
    assert "widths (24 runs, seeds 0-2)" in row
    assert f"(a) widths: `{grid_dir}`. Deviations from the paper's protocol:\n\n- toy size\n- 3 seeds\n" in text
    case_study = text.split("post-QKV conv case study")[1]
    assert "no runs" in case_study
    fig2 = text.split("Figure 2")[1].split("##")[0]  # no folder of its sweeps: its preset's claims, no runs
    assert fig2.count("| no runs") == len(load_spec("mqar_varlen_fig2").reference["claims"])
    assert ("Sweeps of this paper with no folder of their own here: `mqar_varlen_fig2`, `mqar_varlen_fig2_lr1e-3`, "
            "`mqar_varlen_small`.") in fig2


def test_a_newer_folder_of_one_model_and_profile_supersedes_the_older(mad_dir, tmp_path):  # noqa: F811
    """The protocol run again in a new folder (changed rules): the claims are judged on the folder created last,
    whatever the folders' order, never on both pooled, and the ledger names the one left out."""
    newer = tmp_path / "mad-v2"
    shutil.copytree(mad_dir, newer)
    manifest = json.loads((newer / "sweep.json").read_text())
    manifest["created"] = "2026-12-02T00:00:00+00:00"
    (newer / "sweep.json").write_text(json.dumps(manifest))
    for path in (newer / "runs").glob("*.json"):  # memorization scores 0.95 in every run of the newer folder
        rec = json.loads(path.read_text())
        if rec["config"]["task"] == "mad/memorization":
            for entry in rec["history"]:
                entry["acc_macro"] = 0.95
            rec["final"]["acc_macro"] = 0.95
            path.write_text(json.dumps(rec))
    old, new = load_sweep(mad_dir), load_sweep(newer)
    for datas in ([old, new], [new, old]):
        assert claims.mad_judged(datas)["paper"]["transformer"] is new
        memorize = next(v for v in claims.mad_verdicts(datas)["paper"] if "Memorize" in v.claim.text)
        assert memorize.effect == pytest.approx(0.95)
    assert claims.mad_judged([old])["paper"]["transformer"] is old
    text = write_ledger([mad_dir, newer], reference_claims(PRESET_SWEEPS), tmp_path / "CLAIMS.md")
    assert f"superseded by a newer folder of the same model and profile: `{mad_dir}`" in text
    assert f"(a) MAD, paper profile: `{newer}`. Deviations" in text


def runs(model, accuracies, *, labels=None, loss_fall=0.8, chance=0.001, stopped_at=None):
    """Observations of acc_micro for one model, one per seed, with what tells a trained run from one that is not
    (a loss that fell by ``loss_fall``, a test split whose chance is ``chance``) and the step of an early stop."""
    stops = stopped_at if isinstance(stopped_at, list) else [stopped_at] * len(accuracies)
    return [Observation(model, seed, labels or {"task": "t"}, {"acc_micro": acc}, stopped_at=stop,
                        loss_fall=loss_fall, chance=chance)
            for seed, (acc, stop) in enumerate(zip(accuracies, stops, strict=True))]


def test_a_model_whose_loss_barely_fell_leaves_a_comparison_not_tested():
    trained = runs("a", [0.97, 0.99, 0.98])
    (verdict,) = evaluate(BEATS, trained + runs("b", [0.20, 0.30, 0.25], loss_fall=0.05), "acc_micro")
    assert verdict.verdict == "not tested" and verdict.interval is None
    assert "b did not train in 3 of 3 seeds: training loss down 5% from its first evaluation" in verdict.note
    assert verdict.effect == pytest.approx(0.73)  # shown beside the verdict, not judged
    (judged,) = evaluate(BEATS, trained + runs("b", [0.20, 0.30, 0.25], loss_fall=0.5), "acc_micro")
    assert judged.verdict == "reproduced"


def test_a_model_at_chance_leaves_the_claim_not_tested_and_says_its_chance():
    # packed retrieval answered NONE everywhere: 0.5 is the best constant answer's accuracy there
    leaky = runs("b", [0.506, 0.496, 0.52], chance=0.5)
    (verdict,) = evaluate(BEATS, runs("a", [0.56, 0.54, 0.58], chance=0.5) + leaky, "acc_micro")
    assert verdict.verdict == "not tested"
    assert "acc_micro 0.496-0.520 against a chance of 0.500" in verdict.note
    clear = runs("b", [0.60, 0.61, 0.62], chance=0.5)  # 0.5 + 0.05 * 0.5 = 0.525 is the edge
    assert evaluate(BEATS, runs("a", [0.7] * 3, chance=0.5) + clear, "acc_micro")[0].verdict == "reproduced"


def test_a_level_claim_about_a_model_that_did_not_train_is_not_tested():
    claim = Claim(text="b fails", level="b", op="<", value=0.25)
    (verdict,) = evaluate(claim, runs("b", [0.002, 0.003, 0.001]), "acc_micro")
    assert verdict.verdict == "not tested"


def test_most_seeds_decide_whether_a_model_trained():
    def b(stuck):  # seeds 0..stuck-1 at chance with a flat loss, the rest trained to 0.25
        return [Observation("b", s, {"task": "t"}, {"acc_micro": 0.001 if s < stuck else 0.25},
                            loss_fall=0.01 if s < stuck else 0.5, chance=0.001) for s in range(3)]

    (verdict,) = evaluate(BEATS, runs("a", [0.9] * 3) + b(stuck=1), "acc_micro")
    assert verdict.verdict == "reproduced"  # one of three: judged, the stuck seed is data
    (verdict,) = evaluate(BEATS, runs("a", [0.9] * 3) + b(stuck=2), "acc_micro")
    assert verdict.verdict == "not tested" and "b did not train in 2 of 3 seeds" in verdict.note


def test_a_model_that_fails_by_design_is_judged_as_it_stands():
    claim = Claim(text="conv beats none", difference=("a", "b"), op=">", fails_by_design=("b",))
    (verdict,) = evaluate(claim, runs("a", [0.9] * 3) + runs("b", [0.001] * 3, loss_fall=0.01), "acc_micro")
    assert verdict.verdict == "reproduced"
    # the model it names must still train
    (verdict,) = evaluate(claim, runs("a", [0.001] * 3, loss_fall=0.01) + runs("b", [0.0] * 3), "acc_micro")
    assert verdict.verdict == "not tested" and "a did not train" in verdict.note


def test_scores_without_training_facts_count_as_trained():
    (verdict,) = evaluate(BEATS, observations({"a": [0.002] * 3, "b": [0.001] * 3}), "acc_micro")
    assert verdict.verdict == "reproduced"  # MAD scores: no loss fall, no chance known


def test_two_models_at_the_early_stop_are_compared_on_their_steps_to_it():
    # both stop above the threshold in every seed: their accuracies tie, the steps do not (packed_mq's hyena)
    exact = runs("a", [0.9995, 0.9994, 0.9996], stopped_at=1500)
    leaky = runs("b", [0.9996, 0.9995, 0.9995], stopped_at=[3000, 3500, 3500])
    (verdict,) = evaluate(BEATS, exact + leaky, "acc_micro")
    assert (verdict.basis, verdict.verdict, verdict.effect) == ("steps", "reproduced", -2000)
    assert (verdict.interval.low, verdict.interval.high) == (-2000, -1500)
    assert verdict.effect_text() == "-2,000 steps" and verdict.interval_text() == "[-2,000, -1,500]"
    assert verdict.check_text() == "steps to the early stop: a - b < 0" and verdict.p == pytest.approx(1 / 8)
    (slower,) = evaluate(BEATS, runs("a", [0.9995] * 3, stopped_at=4000) + leaky, "acc_micro")
    assert slower.verdict == "contradicted"


def test_steps_decide_only_when_both_models_stopped_in_every_seed():
    exact = runs("a", [0.9995, 0.9994, 0.9996], stopped_at=1500)
    leaky = runs("b", [0.98, 0.985, 0.99], stopped_at=[3000, 3500, None])  # seed 2 never got there
    (verdict,) = evaluate(BEATS, exact + leaky, "acc_micro")
    assert verdict.basis == "metric" and verdict.verdict == "reproduced"
    assert verdict.effect == pytest.approx(0.0144)  # differences .0195 .0144 .0096
    value_claim = Claim(text="a beats b by 0.1", difference=("a", "b"), op=">", value=0.1)
    both = runs("b", [0.9995] * 3, stopped_at=3000)
    (verdict,) = evaluate(value_claim, exact + both, "acc_micro")
    assert verdict.basis == "metric" and verdict.verdict == "contradicted"  # a margin is not a step count


def test_a_claim_about_every_run_counts_the_runs_over_its_cells():
    claim = Claim(text="a solves it everywhere", level="a", solved_at=0.97, every=True, op=">=", value=1)
    cells = [{"task": "t", "d_model": d} for d in ("64", "128", "256")]
    values = {"64": [0.98, 0.016, 0.99], "128": [0.99] * 3, "256": [0.999] * 3}
    obs = [o for c in cells for o in runs("a", values[c["d_model"]], labels=c)]
    obs[1] = dataclasses.replace(obs[1], loss_fall=0.5)  # failed, but it trained: a run short of the level
    (verdict,) = evaluate(claim, obs, "acc_micro")
    assert (verdict.verdict, verdict.solved, verdict.n) == ("contradicted", 8, 9)
    assert verdict.effect_text() == "8 of 9 runs >= 0.97"
    assert verdict.interval.high < 1  # Wilson's interval of 8 of 9 excludes every run
    obs[1] = dataclasses.replace(obs[1], values={"acc_micro": 0.975})
    (verdict,) = evaluate(claim, obs, "acc_micro")
    assert (verdict.verdict, verdict.solved) == ("reproduced", 9)
    (verdict,) = evaluate(claim, obs[:2], "acc_micro")
    assert verdict.verdict == "inconclusive" and "too few runs (2 < 3)" in verdict.verdict_text()


def test_grid_observations_carry_the_early_stop_the_loss_fall_and_the_chance(tmp_path):
    """From records: the fewest steps at which one of a cell's training points stopped early, the loss fall of
    the run judged (the best point), and the chance of its test split."""
    params = {"vocab_size": 64, "seq_len": 16, "num_kv_pairs": 2}
    records, metas = [], []
    for lr, acc, stopped, steps in [(1e-3, 0.9992, True, 40), (1e-2, 0.9995, True, 60), (3e-3, 0.5, False, 80)]:
        rec = record(f"r{lr}", "mqar", params, 100, [(2.0, acc / 2), (1.5, acc)], lr=lr,
                     model={"mixer": "attention", "d_model": 16})
        rec["config"]["train"]["num_test"] = 50
        rec["history"][0]["train_loss"], rec["history"][1]["train_loss"] = 4.0, 1.0
        rec["stopped_early"], rec["steps"] = stopped, steps
        records.append(rec)
        metas.append({"task": "mqar", "setting": "default", "model": "m", "model_grid": {"d_model": 16},
                      "train_grid": {"lr": lr}, "seed": 0})
    spec = {"name": "g", "metric": "acc_micro", "seeds": [0]}
    data = load_sweep(write_sweep(tmp_path / "g", records, manifest_for(records, metas, "grid", spec)))
    (obs,) = claims.grid_observations(data)
    assert obs.values["acc_micro"] == 0.9995 and obs.stopped_at == 40 and obs.loss_fall == 0.75
    from mixlab.analysis.ceilings import chance_accuracy
    assert obs.chance == chance_accuracy("mqar", params, 50, 0) and 0 < obs.chance < 0.2
