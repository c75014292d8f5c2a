"""Mixers from outside mixlab: import paths, the ``mixlab.mixers`` entry point of the example package
(examples/mixlab-maxpool, installed by the README's test command; the tests that need it are marked
``example_plugin`` and skip without it), the factory contract and its errors."""

import importlib.metadata
import re
from pathlib import Path

import pytest
import torch
from mixlab import models
from mixlab.analysis import leakage
from mixlab.models.mixers import ExternalFactory, ExternalMixer

HELPERS = Path(__file__).resolve().parent  # byo_mixers.py, byo_broken_mixer.py
EXAMPLE = "gated_maxpool"
EXAMPLE_PATH = "mixlab_maxpool:GatedMaxPool"


@pytest.fixture(autouse=True)
def helper_modules(monkeypatch):
    monkeypatch.syspath_prepend(str(HELPERS))


def small_config(mixer: str, **fields) -> models.ModelConfig:
    return models.ModelConfig(vocab_size=11, d_model=16, n_layers=2, mixer=mixer, n_heads=2, mlp_hidden=24,
                              max_seq_len=32, **fields)


def fake_entry_point(name: str, value: str) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name=name, value=value, group="mixlab.mixers")


def test_builtin_names_resolve_to_the_registry():
    assert all(models.resolve_mixer(name) is factory for name, factory in models.MIXERS.items())
    assert list(models.mixer_origins())[:len(models.MIXERS)] == list(models.MIXERS)


@pytest.mark.example_plugin
def test_example_entry_point_is_listed_with_its_origin_and_resolves():
    origins = models.mixer_origins()
    assert origins[EXAMPLE] == f"entry point of mixlab-maxpool 0.1.0 ({EXAMPLE_PATH})"
    import mixlab_maxpool

    factory = models.resolve_mixer(EXAMPLE)
    assert isinstance(factory, ExternalFactory) and factory.target is mixlab_maxpool.GatedMaxPool
    assert models.resolve_mixer(EXAMPLE_PATH).target is mixlab_maxpool.GatedMaxPool


@pytest.mark.parametrize("mixer", [
    pytest.param(EXAMPLE, id="entry-point", marks=pytest.mark.example_plugin),
    pytest.param(EXAMPLE_PATH, id="example-import-path", marks=pytest.mark.example_plugin),
    pytest.param("byo_mixers:CumulativeMean", id="helper-import-path"),
])
def test_external_mixer_trains_in_a_model(mixer):
    config = small_config(mixer)
    assert models.ModelConfig.from_dict(config.to_dict()) == config and hash(config)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = models.build_model(config)
    assert all(isinstance(block.mixer, ExternalMixer) for block in model.blocks)
    ids = torch.randint(0, 11, (3, 9), generator=torch.Generator().manual_seed(0))
    logits = model(ids)
    assert logits.shape == (3, 9, 11)
    logits.sum().backward()
    inner = model.blocks[0].mixer.module
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in inner.parameters())


@pytest.mark.example_plugin
def test_example_respects_documents_exactly():
    """The example's max-pool against a loop over each document's window (conv_width taps, cut at its
    start)."""
    import mixlab_maxpool

    with torch.random.fork_rng():
        torch.manual_seed(0)
        mixer = mixlab_maxpool.GatedMaxPool(8, conv_width=3)
    x = torch.randn(2, 7, 8, generator=torch.Generator().manual_seed(1))
    cu = torch.tensor([0, 1, 4, 7, 9, 14], dtype=torch.int32)  # a one-token document, a row of two
    v, gate = mixer.in_proj(x).chunk(2, dim=-1)
    flat_v = v.reshape(14, 8)
    expected = torch.empty(14, 8)
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
        for t in range(start, end):
            expected[t] = flat_v[max(start, t - 2):t + 1].amax(0)
    expected = mixer.out_proj(torch.sigmoid(gate) * expected.view(2, 7, 8))
    torch.testing.assert_close(mixer(x, cu_seqlens=cu), expected, rtol=0, atol=0)


def test_factory_gets_d_model_and_the_extras_its_signature_names():
    config = small_config("byo_mixers:WithExtras")
    model = models.build_model(config)
    received = [block.mixer.module.received for block in model.blocks]
    assert [r["layer_idx"] for r in received] == [0, 1]
    assert all(r["width"] == 16 and r["n_heads"] == 2 and r["config"] is config and r["unrelated"] == "kept"
               for r in received)


@pytest.mark.parametrize(
    "mixer,claims",
    [pytest.param("attention", True, id="attention"), pytest.param("fft_conv_leaky", False, id="fft_conv_leaky"),
     pytest.param("byo_mixers:CumulativeMean", False, id="no-cu_seqlens"),
     pytest.param("byo_mixers:DeclaredLeaky", False, id="declared-leaky"),
     pytest.param("byo_mixers:LeakyClaimsBlind", True, id="claims-blind"),
     pytest.param(EXAMPLE_PATH, True, id="example", marks=pytest.mark.example_plugin)],
)
def test_document_blindness_claim(mixer, claims):
    module = models.resolve_mixer(mixer)(small_config(mixer), 0)
    assert models.claims_document_blindness(module) is claims


def test_mixer_without_cu_seqlens_refuses_packed_inputs():
    model = models.build_model(small_config("byo_mixers:CumulativeMean"))
    ids = torch.zeros(2, 6, dtype=torch.long)
    assert model(ids).shape == (2, 6, 11)
    with pytest.raises(ValueError, match="'byo_mixers:CumulativeMean' takes no cu_seqlens"):
        model(ids, doc_ids=torch.tensor([[0, 0, 0, 1, 1, 1]] * 2))


def test_wrong_output_shape_in_a_model_names_the_mixer():
    model = models.build_model(small_config("byo_mixers:WrongShape"))
    message = "'byo_mixers:WrongShape' returned (2, 6, 1) for an input of shape (2, 6, 16)"
    with pytest.raises(ValueError, match=re.escape(message)):
        model(torch.zeros(2, 6, dtype=torch.long))


@pytest.mark.parametrize(
    "mixer,message",
    [
        ("lstm", "unknown mixer 'lstm'; choose from attention, "),
        ("byo_mixers.CumulativeMean", "unknown mixer 'byo_mixers.CumulativeMean'"),
        ("byo mixers:X", "is not an import path of the form package.module:Factory"),
        ("not_a_module_xyz:Mixer", "cannot import 'not_a_module_xyz': ModuleNotFoundError"),
        ("byo_broken_mixer:Broken", "cannot import 'byo_broken_mixer': ModuleNotFoundError: No module named "
                                    "'mixlab_test_missing_dependency'"),
        ("byo_mixers:Missing", "'byo_mixers' has no attribute 'Missing'"),
        ("byo_mixers:NOT_A_FACTORY", "byo_mixers:NOT_A_FACTORY is a int, not a callable factory"),
    ],
    ids=["unknown-name", "dot-not-colon", "malformed-path", "missing-module", "module-fails-to-import",
         "missing-attribute", "not-callable"],
)
def test_bad_mixer_names_raise_one_line_naming_them(mixer, message):
    with pytest.raises(ValueError) as info:
        small_config(mixer)
    text = str(info.value)
    assert text.startswith("ModelConfig.mixer: ") and message in text and "\n" not in text


@pytest.mark.parametrize(
    "mixer,message",
    [("byo_mixers:RaisesInInit", "RaisesInInit(d_model=16) raised RuntimeError: cannot build at d_model=16"),
     ("byo_mixers:returns_tensor", "returns_tensor(d_model=16) returned a Tensor, not a torch.nn.Module")],
    ids=["factory-raises", "factory-returns-a-tensor"],
)
def test_bad_factories_fail_at_build_naming_the_mixer(mixer, message):
    with pytest.raises(ValueError, match="^" + re.escape(f"mixer '{mixer}': {message}")):
        models.build_model(small_config(mixer))


def test_entry_points_ambiguous_and_shadowed(monkeypatch):
    fakes = {"twice": [fake_entry_point("twice", "byo_mixers:CumulativeMean"),
                       fake_entry_point("twice", "byo_mixers:Lookahead")],
             "attention": [fake_entry_point("attention", "byo_mixers:CumulativeMean")],
             "broken": [fake_entry_point("broken", "byo_broken_mixer:Broken")]}
    monkeypatch.setattr(models.mixers, "entry_points", lambda: fakes)
    origins = models.mixer_origins()
    assert origins["attention"].startswith("built-in (ignored: entry point")
    assert models.resolve_mixer("attention") is models.MIXERS["attention"]
    assert origins["twice"].startswith("ambiguous: ")
    with pytest.raises(ValueError, match="'twice' is registered by several packages"):
        models.resolve_mixer("twice")
    message = "mixer 'broken' (entry point (byo_broken_mixer:Broken)): cannot import 'byo_broken_mixer'"
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        models.resolve_mixer("broken")


@pytest.mark.parametrize(
    "mixer,failed",
    [pytest.param(EXAMPLE, False, id="example-exact", marks=pytest.mark.example_plugin),
     pytest.param("byo_mixers:LeakyClaimsBlind", True, id="claims-blind-but-leaks"),
     pytest.param("byo_mixers:DeclaredLeaky", False, id="declared-leaky")],
)
def test_leakage_probes_reach_external_mixers_by_name(mixer, failed, one_torch_thread):
    report = leakage.probe_mixer(mixer, rows=2, seq_len=24)
    assert report.failed is failed
    assert report.claims_blind is (mixer != "byo_mixers:DeclaredLeaky")
