import collections
import dataclasses
import json
import math
import re
from pathlib import Path

import pytest
import typer
from mixlab import models
from mixlab.models.layers import Mixer
from mixlab.runners.cli.sweep import register
from mixlab.runners.sweep import mad
from mixlab.runners.sweep.manifest import write_manifest
from mixlab.runners.train.schedule import StepPlan
from mixlab.tasks import get_task
from mixlab.tasks.mad import mad_sweep_settings
from typer.testing import CliRunner

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_paper_profile_is_the_protocol():
    plan = mad.mad_plan("transformer", "paper")
    assert plan.kind == "mad" and len(plan.runs) == 396 and len({r.hash for r in plan.runs}) == 396
    settings = {(s.task, s.label): s for s in mad_sweep_settings()}
    grids = collections.defaultdict(set)
    for run in plan.runs:
        config, train = run.config, run.config.train
        setting = settings[(run.meta["task"], run.meta["setting"])]
        assert config.task == setting.task
        assert get_task(config.task, **config.task_params).params == get_task(setting.task, **setting.params).params
        assert train.num_train == setting.num_train and train.num_test == 1280
        assert (train.epochs, train.steps, train.batch_size, train.min_lr) == (200, None, 128, 1e-6)
        assert train.eval_batch_size == 128, "mad-lab's test batches: macro accuracy is averaged per batch"
        assert (train.schedule, train.warmup_steps, train.early_stop_acc) == ("cosine_epoch", 0, 0.999)
        assert (train.beta1, train.beta2, train.data_seed, train.init_seed) == (0.9, 0.999, 0, 0)
        assert (config.model["d_model"], config.model["n_layers"], config.model["n_heads"]) == (128, 2, 16)
        assert config.model["mlp_hidden"] == 352 and config.model["mixer"] == "attention"
        # mad-lab's models as the MAD paper's results were made: biased projections, every Linear N(0, 0.02)
        assert config.model["proj_bias"] is True
        assert config.model.get("init", "normal") == "normal"
        grids[(setting.task, setting.label)].add((train.lr, train.weight_decay))
    assert len(grids) == 66
    assert all(g == {(lr, wd) for lr in (1e-4, 5e-4, 1e-3) for wd in (0.0, 0.1)} for g in grids.values())


@pytest.mark.parametrize("model", ["transformer", "static_conv_qkv"])
def test_a_folder_of_runs_under_the_earlier_rules_is_refused(tmp_path, model):
    """The committed paper sweeps were planned before the mad-lab rules (init, test batch, stop, probe): running
    the protocol into such a folder must fail instead of mixing their records with the new runs."""
    old = Path(__file__).resolve().parents[2] / "reproductions" / "mad" / f"{model}-paper" / "sweep.json"
    (tmp_path / "sweep.json").write_text(old.read_text())
    device = json.loads(old.read_text())["spec"]["device"]
    with pytest.raises(ValueError, match="different sweep"):
        write_manifest(tmp_path, mad.mad_plan(model, "paper", device=device))


def test_seeds_vary_data_and_initialisation():
    one, three = mad.mad_plan("transformer", "quick"), mad.mad_plan("transformer", "quick", seeds=3)
    assert len(three.runs) == 3 * len(one.runs) == 3 * 66
    assert [r.hash for r in three.runs[:66]] == [r.hash for r in one.runs], "seed 0 is the one-seed protocol"
    assert {(r.meta["seed"], r.config.train.data_seed, r.config.train.init_seed) for r in three.runs} == {
        (s, s, s) for s in range(3)}


def test_quick_profile_fits_one_gpu_lease():
    profile = mad.PROFILES["quick"]
    plan = mad.mad_plan("transformer", "quick")
    assert len({(r.meta["task"], r.meta["setting"]) for r in plan.runs}) == 66
    steps = [StepPlan.of(r.config.train).total_steps for r in plan.runs]
    assert max(steps) <= 1500 + 100 and sum(steps) == profile.max_total_steps()
    assert profile.max_total_steps() * 7.9e-3 / 60 < 15, "GPU-minutes at 7.9 ms per step (docs/engine.md)"
    assert all(r.config.train.epochs == 200 for r in plan.runs)


def test_quick_runs_are_prefixes_of_paper_runs():
    """A quick run takes the first epochs of the paper run with its lr and wd, at the paper run's learning rate
    at every step it takes (lr_at computed independently: the cosine over 200 epochs); a quick run that reaches
    200 epochs (memorization) is the paper run itself."""
    paper = {(r.meta["task"], r.meta["setting"], r.meta["train_grid"]["lr"], r.meta["train_grid"]["weight_decay"]): r
             for r in mad.mad_plan("transformer", "paper").runs}
    quick = mad.mad_plan("transformer", "quick").runs
    cut = 0
    for run in quick:
        key = (run.meta["task"], run.meta["setting"], 1e-3, 0.0)
        long, short = StepPlan.of(paper[key].config.train), StepPlan.of(run.config.train)
        per_epoch = long.steps_per_epoch
        assert short.steps_per_epoch == per_epoch and short.total_steps % per_epoch == 0
        for k in sorted({0, per_epoch - 1, per_epoch, short.total_steps // 2, short.total_steps - 1}):
            cosine = 1e-6 + (1e-3 - 1e-6) * 0.5 * (1 + math.cos(math.pi * (k // per_epoch) / 200))
            assert short.lr(run.config.train, k) == long.lr(paper[key].config.train, k) == pytest.approx(cosine)
        if short.total_steps < long.total_steps:
            cut += 1
            assert dataclasses.replace(run.config.train, steps=None) == paper[key].config.train
        else:
            assert run.hash == paper[key].hash
    # all but memorization's 6 settings and the five of 800 rows (7 steps an epoch: 1,500 steps pass 200 epochs)
    assert cut == 66 - 6 - 5


@pytest.mark.parametrize("name", mad.model_names(), ids=mad.model_names())
def test_every_model_name_plans(name):
    plan = mad.mad_plan(name, "smoke")
    fields = models.PRESETS.get(name, {"mixer": name})
    assert len(plan.runs) == 12
    assert all(all(r.config.model[k] == v for k, v in fields.items()) for r in plan.runs)
    assert all(r.config.model["d_model"] == 32 for r in plan.runs)


def test_striped_hybrid_preset_builds_a_hyena_block_then_an_attention_block():
    config = mad.mad_plan("striped_hyena_attention", "smoke").runs[0].resolved.model_config
    model = models.build_model(config)
    mixers = [type(m).__name__ for m in model.modules() if isinstance(m, Mixer)]
    assert mixers == ["Hyena", "Attention"]


def test_reference_models_are_registered():
    assert {"transformer", "static_conv_qkv", "dynamic_conv_qkv"} <= set(mad.model_names())
    assert set(models.MIXERS) <= set(mad.model_names())


@pytest.mark.parametrize(
    "kwargs,named",
    [({"model": "transfomer"}, "transfomer"), ({"model": "transformer", "profile": "fast"}, "fast"),
     ({"model": "transformer", "seeds": 0}, "seeds"), ({"model": "transformer", "device": "tpu"}, "tpu")],
    ids=["unknown-model", "unknown-profile", "zero-seeds", "bad-device"],
)
def test_bad_input_names_it(kwargs, named):
    with pytest.raises(ValueError, match=named):
        mad.mad_plan(**kwargs)


def cli():
    app = typer.Typer()
    register(app)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args))


def test_smoke_profile_end_to_end(tmp_path):
    invoke = cli()
    out = tmp_path / "transformer-smoke"
    result = invoke("mad", "run", "--model", "transformer", "--profile", "smoke", "--device", "cpu",
                    "--out", str(out), "--no-progress")
    assert result.exit_code == 0, result.output
    assert "12 runs: 0 already done, 12 run now" in result.output
    assert "profile smoke" in result.output
    table_row = re.compile(r"^\| ([A-Za-z -]+?) +\| (.*)\|$", re.M)
    rows = {m.group(1): m.group(2) for m in table_row.finditer(result.output)}
    for task, ref in [("Compress", "0.375"), ("Memorize", "0.791"), ("Average", "0.709")]:
        assert re.fullmatch(rf"\d\.\d{{3}} +\| {ref} +\| [+-]\d\.\d{{3}} +", rows[task]), "one seed: the value alone"
    assert len(list((out / "runs").glob("*.json"))) == 12

    again = invoke("mad", "run", "--model", "transformer", "--profile", "smoke", "--device", "cpu",
                   "--out", str(out), "--no-progress")
    assert "12 runs: 12 already done, 0 run now" in again.output

    table = invoke("mad", "table", str(out), "--md", str(tmp_path / "t.md"), "--csv", str(tmp_path / "t.csv"))
    assert table.exit_code == 0 and "In-Context Recall" in table.output
    assert (tmp_path / "t.md").read_text().strip() in table.output
    assert len((tmp_path / "t.csv").read_text().splitlines()) == 1 + 9  # six tasks, the average, each copy variant

    report = invoke("report", str(out))
    assert report.exit_code == 0, report.output
    written = {p.name for p in out.iterdir()}
    assert {"report.md", "mad_tasks.csv", "mad_settings.csv", "mad_tasks.png", "mad_curves.png"} <= written
    text = (out / "report.md").read_text()
    assert "Not judged: the smoke profile" in text and "| claim |" not in text, "no verdicts of a toy run"


def test_cli_bad_input_is_a_value_error(tmp_path):
    invoke = cli()
    result = invoke("mad", "run", "--model", "nope", "--profile", "smoke", "--out", str(tmp_path))
    assert isinstance(result.exception, ValueError) and "nope" in str(result.exception)
    result = invoke("mad", "table", str(tmp_path / "missing"))
    assert isinstance(result.exception, ValueError) and "missing" in str(result.exception)
