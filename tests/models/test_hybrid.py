"""Hybrid stacks: ModelConfig.mixer as a per-layer pattern (models.layer_mixers), its checks, the models built
from it, its hash, the engine's stacking of it, and the command lines that take it (mixlab run, mad run)."""

import pytest
import torch
from cli_run import run_cli
from mixlab import models
from mixlab.models import MIXERS, ModelConfig, build_model
from mixlab.models.layers import Mixer
from mixlab.models.mixers.attention import Attention
from mixlab.models.mixers.short_conv import StaticConvMixer
from mixlab.runners.sweep import mad
from mixlab.runners.sweep.spec import SweepSpec
from mixlab.runners.train import engine
from mixlab.runners.train.config import RunConfig, TrainConfig, config_hash
from mixlab.runners.train.resolved import resolve


@pytest.mark.parametrize(("pattern", "n_layers", "expected"), [
    ("attention", 3, ["attention"] * 3),
    ("static_conv,attention", 4, ["static_conv", "attention", "static_conv", "attention"]),
    ("static_conv,attention", 3, ["static_conv", "attention", "static_conv"]),
    ("none, static_conv ,attention", 3, ["none", "static_conv", "attention"]),
], ids=["single", "cycled", "cut", "spaces"])
def test_layer_mixers_cycle_the_pattern(pattern, n_layers, expected):
    assert models.layer_mixers(pattern, n_layers) == expected


@pytest.mark.parametrize(("fields", "message"), [
    ({"mixer": "static_conv,attention,none", "n_layers": 2}, "names 3 layers, more than n_layers=2"),
    ({"mixer": "static_conv,,attention"}, "has an empty entry"),
    ({"mixer": "static_conv,nope"}, "unknown mixer 'nope'"),
    ({"mixer": "static_conv,rubiconv", "qkv_conv": "static"}, "qkv_conv='static' needs mixer='attention'"),
    ({"mixer": "static_conv,attention", "n_heads": 3}, "d_model=16 is not divisible by n_heads=3"),
    ({"mixer": "attention,dynamic_conv_headwise", "conv_head_size": 3}, "conv_head_size=3 does not divide"),
], ids=["too-long", "empty", "unknown", "qkv-without-taker", "attention-check", "conv-check"])
def test_every_mixer_of_a_pattern_checks_the_config(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**{"vocab_size": 11, "d_model": 16, "n_heads": 2, "n_layers": 2, **fields})


def test_a_hybrid_model_builds_each_layers_mixer_and_the_qkv_conv_only_where_it_applies():
    config = ModelConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=4, mixer="static_conv,attention",
                         qkv_conv="static")
    model = build_model(config)
    mixers = [block.mixer for block in model.blocks]
    assert [type(m) for m in mixers] == [StaticConvMixer, Attention] * 2
    assert all(m.qkv_conv is not None for m in mixers[1::2])
    logits = model(torch.randint(0, 11, (2, 8)), doc_ids=torch.tensor([[0] * 3 + [1] * 5] * 2))
    assert logits.shape == (2, 8, 11) and torch.isfinite(logits).all()


def test_a_single_mixer_keeps_its_hash_and_a_pattern_is_stored_as_given():
    # the hash of this config on the main branch before patterns existed
    assert config_hash(RunConfig(task="mqar", model={"mixer": "attention"})) == "8b395bd49acf"
    hybrid = RunConfig(task="mqar", model={"mixer": "static_conv,attention"})
    assert hybrid.model == {"mixer": "static_conv,attention"}
    assert config_hash(hybrid) != config_hash(RunConfig(task="mqar", model={"mixer": "attention,static_conv"}))


def test_a_sweep_takes_patterns_as_models_and_grid_points():
    spec = SweepSpec.from_dict({"name": "hybrids", "tasks": [{"task": "mqar"}], "seeds": 1,
                                "models": {"striped": {"mixer": "static_conv,attention", "n_layers": 4}},
                                "model_grid": {"mixer": ["static_conv,attention", "attention,static_conv"]}})
    mixers = [(run.config.model["mixer"], run.config.model["n_layers"]) for run in spec.plan().runs]
    assert mixers == [("static_conv,attention", 4), ("attention,static_conv", 4)]


class Unstackable(Mixer):
    """A built-in mixer that does not declare vmap support."""

    stacks_on = ()

    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        return x


def tiny(mixer: str, init_seed: int = 0, **model) -> RunConfig:
    return RunConfig(task="mad/in_context_recall", task_params={"seq_len": 16},
                     model={"d_model": 16, "n_heads": 2, "n_layers": 2, "mlp_hidden": 32, "mixer": mixer, **model},
                     train=TrainConfig(epochs=1, batch_size=8, num_train=16, num_test=8, device="cpu",
                                       init_seed=init_seed))


def test_a_hybrid_stacks_only_when_every_mixer_of_it_does(monkeypatch):
    monkeypatch.setitem(MIXERS, "unstackable", Unstackable)
    assert resolve(tiny("static_conv,attention")).unbatchable_reason is None
    assert "mixer 'unstackable' does not stack" in resolve(tiny("attention,unstackable")).unbatchable_reason
    reason = resolve(tiny("attention,rubiconv", kernel_backend="triton")).unbatchable_reason
    assert "a kernel of mixer 'rubiconv' has no vmap rule" in reason
    # the declaration is honoured: such runs are trained one at a time, by train_run
    calls = []
    monkeypatch.setattr(engine, "train_run", lambda run, **kw: calls.append(run.config) or {})
    configs = [tiny("unstackable"), tiny("attention,unstackable")]
    engine.train_runs_batched(configs, progress=False)
    assert calls == configs


def test_a_hybrid_trains_stacked_as_alone(one_torch_thread):
    configs = [tiny("static_conv,attention"), tiny("static_conv,attention", init_seed=1)]
    stacked = engine.train_runs_batched(configs, progress=False)
    alone = [engine.train_run(c, progress=False) for c in configs]
    for s, a in zip(stacked, alone):
        assert s["history"] == a["history"] and s["final"] == a["final"]


def test_command_lines_take_a_pattern(capsys, tmp_path):
    assert mad.model_fields("static_conv,attention") == {"mixer": "static_conv,attention"}
    with pytest.raises(ValueError, match="unknown model 'static_conv,nope'"):
        mad.model_fields("static_conv,nope")
    sets = ["seq_len=16", "d_model=16", "n_heads=2", "mlp_hidden=32", "num_train=16", "num_test=8", "batch_size=8"]
    code, out, err = run_cli(capsys, "run", "mad/in_context_recall", "--mixer", "static_conv,attention",
                             *(a for kv in sets for a in ("--set", kv)), "--steps", "1", "--device", "cpu",
                             "--out", str(tmp_path), "--no-progress")
    assert code == 0, err
    assert "mad/in_context_recall static_conv,attention: acc" in out
    code, _, err = run_cli(capsys, "run", "mqar", "--mixer", "attention,nope", "--out", str(tmp_path))
    assert code == 2 and "unknown mixer 'nope'" in err
