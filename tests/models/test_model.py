"""Whole models: logits shapes, doc_ids blindness and packing invariance of the LM, the compression model,
ModelConfig validation and round trips, presets, and the MAD model's size."""

import dataclasses
import json
import math

import pytest
import torch
from mixlab.models import MIXERS, PRESETS, ModelConfig, RMSNorm, build_model, count_parameters, preset_config
from mixlab.models.lm import CompressionAutoencoder, LanguageModel

V, T = 11, 13
# document lengths per row: several rows, documents of length 1 and shorter than the conv width 4
LAYOUT = [[5, 1, 2, 5], [13], [1, 1, 3, 8]]
B = len(LAYOUT)
DOCS = [(row, start, length) for row, lengths in enumerate(LAYOUT)
        for start, length in zip([sum(lengths[:i]) for i in range(len(lengths))], lengths)]
CASES = [pytest.param(name, "none", id=name) for name in MIXERS] + [
    pytest.param("attention", q, id=f"attention-qkv_{q}")
    for q in ("static", "dynamic_lowrank", "dynamic_headwise")
]


def make_config(mixer="attention", qkv_conv="none", **fields) -> ModelConfig:
    return ModelConfig(**{"vocab_size": V, "d_model": 16, "n_layers": 2, "mixer": mixer, "n_heads": 2,
                          "mlp_hidden": 24, "max_seq_len": 16, "qkv_conv": qkv_conv, "conv_rank": 4,
                          "conv_head_size": 4, **fields})


def make_model(config: ModelConfig) -> torch.nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return build_model(config).eval()


def tokens(seed=0) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def layout_doc_ids() -> torch.Tensor:
    return torch.stack([torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
                        for lengths in LAYOUT])


def outside(row, start, length) -> torch.Tensor:
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[row, start:start + length] = False
    return mask


BLIND_CASES = [case for case in CASES if not MIXERS[case.values[0]].leaks_across_documents]
# the mixer tests probe every document; here a first document with neighbours after it, a length-1 document
# between two others, and a last document after two length-1 ones
PROBED_DOCS = [DOCS[0], DOCS[1], DOCS[-1]]
# the compression model differs from the LM after the blocks only, so one mixer covers its document handling
COMPRESSION_CASE = pytest.param("attention", "dynamic_lowrank", "compression", id="compression-attention")
MODEL_CASES = [pytest.param(*case.values, "lm", id=case.id) for case in BLIND_CASES] + [COMPRESSION_CASE]


@pytest.mark.parametrize(("mixer", "qkv_conv"), CASES)
@pytest.mark.parametrize("objective", ["lm", "compression"])
def test_logits_shape(mixer, qkv_conv, objective):
    model = make_model(make_config(mixer, qkv_conv, objective=objective))
    assert isinstance(model, LanguageModel if objective == "lm" else CompressionAutoencoder)
    with torch.no_grad():
        for doc_ids in (None, layout_doc_ids()):
            logits = model(tokens(), doc_ids=doc_ids)
            assert logits.shape == (B, T, V)
            assert torch.isfinite(logits).all()


@pytest.mark.parametrize(("mixer", "qkv_conv", "objective"), MODEL_CASES)
def test_blind_to_other_documents(mixer, qkv_conv, objective):
    """Perturbing one document's tokens, or setting its embeddings to NaN, leaves every other document's
    logits bitwise unchanged."""
    model = make_model(make_config(mixer, qkv_conv, objective=objective))
    ids, doc_ids = tokens(), layout_doc_ids()
    with torch.no_grad():
        before = model(ids, doc_ids=doc_ids)
        for row, start, length in PROBED_DOCS:
            keep = outside(row, start, length)
            changed = ids.clone()
            changed[row, start:start + length] = (changed[row, start:start + length] + 1) % V
            assert torch.equal(model(changed, doc_ids=doc_ids)[keep], before[keep]), (row, start)

            def poison(module, args, output, row=row, start=start, length=length):
                output = output.clone()
                output[row, start:start + length] = float("nan")
                return output

            handle = model.embed.register_forward_hook(poison)
            try:
                poisoned = model(ids, doc_ids=doc_ids)
            finally:
                handle.remove()
            assert torch.isfinite(poisoned[keep]).all(), (row, start)
            assert torch.isnan(poisoned[~keep]).all()


def test_fft_conv_leaky_model_leaks():
    model, ids, doc_ids = make_model(make_config("fft_conv_leaky")), tokens(), layout_doc_ids()
    changed = ids.clone()
    changed[0, 0] = (changed[0, 0] + 1) % V  # first document of row 0; three more follow it
    with torch.no_grad():
        diff = (model(changed, doc_ids=doc_ids) - model(ids, doc_ids=doc_ids))[outside(*DOCS[0])]
    assert diff.abs().max() > 1e-4


@pytest.mark.parametrize(("mixer", "qkv_conv", "objective"), MODEL_CASES)
def test_packing_invariance(mixer, qkv_conv, objective):
    """Each document run alone equals the same document packed among its neighbours."""
    model, ids = make_model(make_config(mixer, qkv_conv, objective=objective)), tokens()
    with torch.no_grad():
        packed = model(ids, doc_ids=layout_doc_ids())
        for row, start, length in DOCS:
            alone = model(ids[row:row + 1, start:start + length])
            torch.testing.assert_close(packed[row:row + 1, start:start + length], alone, rtol=0, atol=1e-5)


def test_single_document_doc_ids_match_no_doc_ids():
    model, ids = make_model(make_config("attention", "dynamic_lowrank")), tokens()
    with torch.no_grad():
        torch.testing.assert_close(model(ids, doc_ids=torch.zeros_like(ids)), model(ids), rtol=0, atol=1e-5)


@pytest.mark.parametrize("objective", ["lm", "compression"])
def test_model_gradients_reach_every_parameter(objective):
    model = build_model(make_config("attention", "dynamic_lowrank", objective=objective))
    logits = model(tokens(), doc_ids=layout_doc_ids())
    logits.backward(torch.randn(logits.shape, generator=torch.Generator().manual_seed(1)))
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_lm_is_causal():
    model, ids = make_model(make_config("attention", "static")), tokens()
    changed = ids.clone()
    changed[:, 6] = (changed[:, 6] + 1) % V
    with torch.no_grad():
        before, after = model(ids), model(changed)
    assert torch.equal(before[:, :6], after[:, :6])
    assert not torch.equal(before[:, 6], after[:, 6])


def test_compression_decodes_every_position_from_the_last_state():
    """Changing the first token reaches every position's logits (through the code at the last position), and
    the decoder's position embedding makes positions differ for one code."""
    model, ids = make_model(make_config("attention", objective="compression")), tokens()
    changed = ids.clone()
    changed[:, 0] = (changed[:, 0] + 1) % V
    with torch.no_grad():
        before, after = model(ids), model(changed)
    assert ((before - after).abs().amax(dim=-1) > 0).all()
    assert not torch.allclose(before[:, 0], before[:, 1])


def test_compression_without_documents_decodes_each_row_as_one_document():
    """The document-free path (no searchsorted, so inductor can compile it) gives what the packed path gives
    for one document per row."""
    model, ids = make_model(make_config("attention", objective="compression")), tokens()
    with torch.no_grad():
        plain, packed = model(ids), model(ids, doc_ids=torch.zeros_like(ids))
    torch.testing.assert_close(plain, packed, rtol=1e-5, atol=1e-5)


def test_mad_attention_model_has_about_041m_parameters():
    model = build_model(preset_config("transformer", vocab_size=16))
    assert 400_000 <= count_parameters(model) <= 420_000
    assert len(model.blocks) == 2


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_build_and_run(name):
    config = preset_config(name, vocab_size=V, d_model=16, n_heads=2, mlp_hidden=24, max_seq_len=16)
    assert config.mixer == PRESETS[name]["mixer"]
    assert "attention" in config.mixer.split(",")  # every preset is the MAD table's attention or a hybrid with it
    assert make_model(config)(tokens()).shape == (B, T, V)


def test_unknown_preset_rejected():
    with pytest.raises(ValueError, match="transfomer"):
        preset_config("transfomer", vocab_size=V)


def test_mlp_hidden_zero_drops_the_mlp():
    for hidden in (0, None):
        model = build_model(make_config(mlp_hidden=hidden))
        assert model.blocks[0].mlp is None
        assert not any("mlp" in name for name, _ in model.named_parameters())


def test_config_round_trip_through_json():
    config = make_config("attention", "dynamic_headwise", objective="compression", kernel_backend="torch")
    assert ModelConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_config_is_keyword_only_and_frozen():
    with pytest.raises(TypeError):
        ModelConfig(16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        make_config().d_model = 32


def test_config_rejects_unknown_keys():
    with pytest.raises(TypeError, match="d_modle"):
        ModelConfig(vocab_size=V, d_modle=16)
    with pytest.raises(ValueError, match="d_modle"):
        ModelConfig.from_dict({"vocab_size": V, "d_modle": 16})
    with pytest.raises(ValueError, match="vocab_size"):
        ModelConfig.from_dict({"d_model": 16})


@pytest.mark.parametrize(("fields", "named"), [
    pytest.param({"mixer": "atention"}, "mixer", id="unknown_mixer"),
    pytest.param({"qkv_conv": "dynamic"}, "qkv_conv", id="unknown_qkv_conv"),
    pytest.param({"mixer": "static_conv", "qkv_conv": "static"}, "qkv_conv", id="qkv_conv_without_attention"),
    pytest.param({"d_model": 16, "n_heads": 3}, "d_model", id="heads_do_not_divide"),
    pytest.param({"d_model": 18, "n_heads": 6}, "n_heads", id="odd_head_size"),
    pytest.param({"qkv_conv": "dynamic_headwise", "d_model": 16, "n_heads": 2, "conv_head_size": 5},
                 "conv_head_size", id="head_size_does_not_divide"),
    pytest.param({"vocab_size": 0}, "vocab_size", id="zero_vocab"),
    pytest.param({"n_layers": 2.0}, "n_layers", id="float_layers"),
    pytest.param({"d_model": True}, "d_model", id="bool_width"),
    pytest.param({"mlp_hidden": -1}, "mlp_hidden", id="negative_mlp"),
    pytest.param({"conv_width": 0}, "conv_width", id="zero_width"),
    pytest.param({"rope_base": 0}, "rope_base", id="zero_rope_base"),
    pytest.param({"objective": "mlm"}, "objective", id="unknown_objective"),
    pytest.param({"kernel_backend": "cuda"}, "kernel_backend", id="unknown_backend"),
])
def test_config_rejects_bad_values(fields, named):
    with pytest.raises(ValueError, match=named):
        ModelConfig(**{"vocab_size": V, **fields})


@pytest.mark.parametrize("objective", ["lm", "compression"])
def test_bad_inputs_rejected(objective):
    model = build_model(make_config(objective=objective))
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="doc_ids"):
        model(tokens(), doc_ids=torch.zeros(B, T - 1, dtype=torch.long))
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.zeros(T, dtype=torch.long))


def test_build_model_needs_a_config():
    with pytest.raises(ValueError, match="ModelConfig"):
        build_model({"vocab_size": V})


def _linear_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: m.weight for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def test_torch_linear_init_keeps_pytorch_default_on_linear_weights():
    """Under init="torch_linear" every Linear weight of the MAD LM has PyTorch's default spread: uniform on
    +-1/sqrt(fan_in), std 1/sqrt(3 fan_in) (0.051 at D=128), within 5 standard errors of the sample std
    (uniform: kurtosis 1.8, so SE = std * sqrt(0.2 / n)); embeddings stay N(0, init_std), norms at one,
    biases at zero. Under "normal" the same weights have std 0.02."""
    model = make_model(ModelConfig(vocab_size=64, init="torch_linear", proj_bias=True))
    for name, weight in _linear_weights(model).items():
        fan_in = weight.shape[1]
        expected = 1 / math.sqrt(3 * fan_in)
        assert weight.std().item() == pytest.approx(expected, abs=5 * expected * math.sqrt(0.2 / weight.numel())), name
        assert weight.abs().max().item() <= 1 / math.sqrt(fan_in), name
    assert model.embed.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert all(torch.equal(m.weight, torch.ones_like(m.weight)) for m in model.modules() if isinstance(m, RMSNorm))
    biases = [m.bias for m in model.modules() if isinstance(m, torch.nn.Linear) and m.bias is not None]
    assert len(biases) == 5 and all(not b.any() for b in biases)
    normal = make_model(ModelConfig(vocab_size=64))
    for name, weight in _linear_weights(normal).items():
        assert weight.std().item() == pytest.approx(0.02, rel=0.05), name


@pytest.mark.parametrize("proj_bias", [False, True], ids=["no-bias", "bias"])
def test_proj_bias_on_attention_projections_and_head_only(proj_bias):
    model = build_model(make_config(proj_bias=proj_bias))
    biased = {name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m.bias is not None}
    expected = {f"blocks.{i}.mixer.{p}" for i in range(2) for p in ("qkv", "out")} | {"head"}
    assert biased == (expected if proj_bias else set())
    logits = model(tokens())
    logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize(("mixer", "qkv_conv", "objective"), MODEL_CASES + [
    pytest.param(name, "none", "lm", id=name) for name in MIXERS if MIXERS[name].leaks_across_documents])
def test_stacked_runs_keep_the_dtypes_of_a_run_alone_under_bf16_autocast(mixer, qkv_conv, objective):
    """Every module's output dtype, two runs stacked under vmap (as runners.train.engine steps them) against one run
    alone, bf16 autocast, biases on: a biased Linear under vmap once returned fp32 and every op after it ran in
    fp32 (slow on a GPU, and the stacked run's numbers were no longer the run's own)."""
    config = make_config(mixer, qkv_conv, objective=objective, init="torch_linear", proj_bias=True)
    model = make_model(config)
    seen: list[torch.dtype] = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
             for m in model.modules() if m is not model]
    params = dict(model.named_parameters())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(tokens())
        alone, seen[:] = seen[:], []
        torch.func.vmap(lambda p, x: torch.func.functional_call(model, p, (x,)))(
            {n: torch.stack([p, p]) for n, p in params.items()}, torch.stack([tokens(), tokens(1)]))
    for hook in hooks:
        hook.remove()
    assert torch.bfloat16 in alone
    assert seen == alone
