"""The Zoology-configured MQAR presets: what each run is set to (Zoology's experiment files, docs/baselines.md),
and the CPU twin trained a few steps through the sweep, every model of it."""

import dataclasses
import json

import numpy as np
import pytest
from mixlab.models import MIXERS
from mixlab.runners.sweep.run import SweepOptions, run_sweep
from mixlab.runners.sweep.spec import load_spec

MODELS = {"attention", "conv_attention", "based", "gla", "gated_delta_net", "mamba2", "hyena", "base_conv",
          "dynamic_conv"}
# [BaseConv, mixer] in Zoology's models_repo.py: the lab's gated short conv in layer 0, the mixer in layer 1
CONV_FRONT = {"conv_attention": "attention", "based": "based", "gla": "gla", "gated_delta_net": "gated_delta_net",
              "base_conv": "rubiconv"}


def test_the_gpu_preset_trains_as_zoologys_figure_2_config():
    runs = load_spec("baselines_mqar_zoology").plan().runs
    assert len(runs) == 9 * 3 * 3 * 4 * 3
    assert {r.meta["model"] for r in runs} == MODELS
    points = {(r.config.task_params["seq_len"], r.config.task_params["num_kv_pairs"], r.config.train.batch_size)
              for r in runs}
    assert points == {(64, 4, 512), (128, 8, 512), (256, 16, 256)}
    assert {r.config.model["d_model"] for r in runs} == {64, 128, 256}
    assert sorted({r.config.train.lr for r in runs}) == pytest.approx(np.logspace(-4, -2, 4), rel=1e-4)
    for run in runs:
        model, train, params = run.config.model, run.config.train, run.config.task_params
        assert (model["n_layers"], model["mlp_hidden"], params["vocab_size"]) == (2, 0, 8192)
        assert (train.epochs, train.num_train, train.num_test, train.weight_decay) == (64, 100_000, 3000, 0.1)
        assert (train.schedule, train.warmup_steps, train.min_lr, train.early_stop_acc) == ("cosine_epoch", 0, 0, 0.99)
        label = run.meta["model"]
        if label in CONV_FRONT:
            assert model["mixer"] == f"dynamic_conv,{CONV_FRONT[label]}"
        else:
            assert "," not in model["mixer"]
    widths = {r.meta["model"]: r.config.model["conv_width"] for r in runs}
    assert widths["gla"] == widths["base_conv"] == widths["hyena"] == 3  # BaseConv's and Hyena's 3 taps
    assert widths["gated_delta_net"] == widths["mamba2"] == 4  # their own short convs' 4 taps


def test_the_cpu_twin_has_the_gpu_presets_models_and_rules():
    gpu, cpu = load_spec("baselines_mqar_zoology"), load_spec("baselines_mqar_zoology_small")
    assert cpu.models == gpu.models and cpu.train_grid == gpu.train_grid
    same = ("weight_decay", "schedule", "warmup_steps", "min_lr", "early_stop_acc")
    assert {k: cpu.train[k] for k in same} == {k: gpu.train[k] for k in same}
    runs = cpu.plan().runs
    assert len(runs) == 9 * 2 * 2 * 4 * 3 and {r.config.train.device for r in runs} == {"cpu"}


@pytest.mark.slow
def test_the_cpu_twin_trains_a_few_steps_of_every_model(tmp_path):
    if not MIXERS["gla"].available():
        pytest.skip("the fla-core baselines need pip install 'mixlab[baselines]'")
    spec = load_spec("baselines_mqar_zoology_small")
    short = dataclasses.replace(spec, tasks=spec.tasks[:1], model_grid=spec.model_grid[:1],
                                train={**spec.train, "epochs": 2, "num_train": 32, "num_test": 16, "batch_size": 32},
                                train_grid=({"lr": 2.1544e-3},))
    plan = short.plan(seeds=[0])
    result = run_sweep(plan, tmp_path, SweepOptions(progress=False))
    assert result.ran == len(plan.runs) == len(MODELS)
    records = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*.json")]
    assert {r["config"]["model"]["mixer"] for r in records} == {spec.models[m]["mixer"] for m in MODELS}
    for record in records:
        assert record["steps"] == 2 and [h["epoch"] for h in record["history"]] == [1, 2]
        assert 0 <= record["final"]["acc_micro"] <= 1 and np.isfinite(record["final"]["test_loss"])
