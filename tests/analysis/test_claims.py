"""Claims as data and their verdicts: synthetic seeds whose answer is known (a clear effect, no effect, a bimodal
outcome, too few seeds), claims naming what a sweep lacks refused in one line (exit 2 from the command line), and
the verdicts in `mixlab report` and the `mixlab claims` ledger."""

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
from test_aggregate import grid_dir, mad_dir  # noqa: F401  (fixtures)


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
    ("a sentence", "must be a mapping"),
], ids=["unknown-key", "neither", "both", "one-model-difference", "bad-op", "equal-without-tolerance",
        "tolerance-without-equal", "solved-difference", "fraction-above-one", "plain-sentence"])
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
