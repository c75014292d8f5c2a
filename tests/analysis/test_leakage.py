"""The leakage probes (docs/leakage.md) and `mixlab leakage`: every boundary-respecting mixer passes every probe on
random packed layouts, fft_conv_leaky is caught, and each probe fails on a variant built to leak the way it
detects (a short conv or attention that ignores documents, a dense 0/1 mask, a leak below rounding, absolute
positions)."""

import numpy as np
import pytest
import torch
import typer
from mixlab import kernels, models
from mixlab.analysis import leakage
from mixlab.kernels.utils import validate_cu_seqlens
from mixlab.runners.cli.leakage import register
from torch import nn

SMALL = {"rows": 3, "seq_len": 32, "d_model": 16}
NAMES = leakage.mixer_names()
BLIND = [name for name in NAMES if not leakage.build_probe_module(name, d_model=16).leaks_across_documents]
LAYOUT_SEEDS = [0, 1]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def fresh_generator(seed=0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class IgnoresDocuments(nn.Module):
    """Claims exact blindness but runs `inner` as if every row were one document."""

    leaks_across_documents = False

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x, cu_seqlens=None):
        return self.inner(x, cu_seqlens=None)


class StaticConvIgnoringDocuments(models.MIXERS["static_conv"]):
    """A registered mixer that claims exact blindness but convolves as if every row were one document."""

    def forward(self, x, cu_seqlens=None):
        return super().forward(x, cu_seqlens=None)


class ReadsNextToken(nn.Module):
    """y[t] = x[t] + x[t + 1] across boundaries: leaks into the previous document (non-causal)."""

    def forward(self, x, cu_seqlens=None):
        return x + torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], dim=1)


class DenseMaskMixer(nn.Module):
    """Block-diagonal causal sum through a dense [BT, BT] 0/1 matrix: bitwise blind to perturbations and with
    exactly zero cross-document gradients, yet 0 * NaN = NaN reaches the other documents."""

    def forward(self, x, cu_seqlens=None):
        n = x.shape[0] * x.shape[1]
        pos = torch.arange(n)
        cu = torch.tensor([0, n]) if cu_seqlens is None else cu_seqlens.long()
        doc = torch.searchsorted(cu[1:], pos, right=True)  # [BT]
        mask = ((doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None])).to(x.dtype)  # [BT, BT]
        return (mask @ x.reshape(n, -1)).view_as(x)


class LeakBelowRounding(nn.Module):
    """x + 1e-30 * (row sum of x): the added term is lost when rounding to fp32, so perturbing another
    document changes no bit, but the gradient is not zero."""

    def forward(self, x, cu_seqlens=None):
        return x + 1e-30 * x.sum(dim=1, keepdim=True)


class RowPositions(nn.Module):
    """x + 0.01 * (position in the row): blind to other documents' content but not restarting positions at
    each document, so a document alone differs from the same document packed."""

    def forward(self, x, cu_seqlens=None):
        return x + 0.01 * torch.arange(x.shape[1], dtype=x.dtype)[None, :, None]


class _Double(torch.autograd.Function):
    """Old-style autograd.Function (no setup_context): torch.func cannot transform it, as a Triton op."""

    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, grad):
        return 2 * grad


def build_small(name):
    return leakage.build_probe_module(name, d_model=SMALL["d_model"], seq_len=SMALL["seq_len"])


def ignoring_documents(name):
    return IgnoresDocuments(build_small(name))


def attention_with_qkv_conv_ignoring_documents():
    """Attention that respects documents, but its qkv conv reads across boundaries (W - 1 tokens leak)."""
    mixer = build_small("attention+qkv_static")
    conv_forward = mixer.qkv_conv.forward
    mixer.qkv_conv.forward = lambda u, x, cu_seqlens=None: conv_forward(u, x, cu_seqlens=None)
    return mixer


LEAKY_VARIANTS = {
    "static_conv-no-docs": lambda: ignoring_documents("static_conv"),
    "dynamic_conv-no-docs": lambda: ignoring_documents("dynamic_conv"),
    "dynamic_conv_headwise-no-docs": lambda: ignoring_documents("dynamic_conv_headwise"),
    "attention-dense-causal": lambda: ignoring_documents("attention"),
    "attention-qkv-conv-no-docs": attention_with_qkv_conv_ignoring_documents,
    "reads-next-token": ReadsNextToken,
}


# --- layouts


@pytest.mark.parametrize("seed", LAYOUT_SEEDS)
def test_random_layout_is_valid_and_awkward(seed):
    rows, seq_len = SMALL["rows"], SMALL["seq_len"]
    cu = leakage.random_layout(np.random.default_rng(seed), rows, seq_len)
    validate_cu_seqlens(cu, rows, seq_len)
    lengths = (cu[1:] - cu[:-1]).tolist()
    assert min(lengths) >= 1
    assert max(lengths) <= seq_len // 4
    # a one-token document and a document shorter than the conv width 4 next to a longer one
    assert 1 in lengths and any(length >= 4 for length in lengths)
    assert torch.equal(cu, leakage.random_layout(np.random.default_rng(seed), rows, seq_len))


@pytest.mark.parametrize(("args", "named"),
                         [((0, 8), "rows"), ((2, 0), "seq_len"), ((2, 8, 9), "max_doc_len")],
                         ids=["no-rows", "no-tokens", "doc-longer-than-row"])
def test_random_layout_rejects_bad_arguments(args, named):
    with pytest.raises(ValueError, match=named):
        leakage.random_layout(np.random.default_rng(0), *args)


# --- registered mixers


@pytest.mark.parametrize("seed", LAYOUT_SEEDS, ids=[f"layout{s}" for s in LAYOUT_SEEDS])
@pytest.mark.parametrize("name", BLIND)
def test_blind_mixer_passes_every_probe(name, seed):
    report = leakage.probe_mixer(name, seed=seed, **SMALL)
    assert report.claims_blind
    assert report.perturbation and report.nan and report.gradient
    assert report.packing_max_diff <= leakage.PACKING_TOL
    assert report.leakage == 0
    assert report.gradient_method == "vmap"
    assert not report.failed and report.verdict == "exact"


def test_fft_conv_leaky_is_caught_by_probes_1_to_3_and_the_metric():
    report = leakage.probe_mixer("fft_conv_leaky", **SMALL)
    assert not report.claims_blind
    assert not report.perturbation and not report.nan and not report.gradient
    assert report.leakage > 1e-4
    assert report.verdict == "leaks (declared)" and not report.failed  # it declares the leak


@pytest.mark.parametrize("variant", list(LEAKY_VARIANTS))
def test_leaky_variants_are_caught(variant):
    report = leakage.probe_mixer(LEAKY_VARIANTS[variant](), **SMALL)
    assert report.claims_blind
    assert not report.perturbation and not report.nan and not report.gradient
    assert report.leakage > 0
    assert report.failed and report.verdict.startswith("FAIL")


def test_nan_probe_catches_a_dense_mask_the_perturbation_probe_misses():
    report = leakage.probe_mixer(DenseMaskMixer(), **SMALL)
    assert report.perturbation and report.gradient and report.leakage == 0
    assert not report.nan
    assert report.failed_probes == ["nan"]


def test_gradient_probe_catches_a_leak_below_rounding():
    report = leakage.probe_mixer(LeakBelowRounding(), **SMALL)
    assert report.perturbation  # not one bit of another document changes
    assert not report.gradient and report.leakage > 0
    assert report.failed


def test_packing_probe_catches_positions_that_do_not_restart():
    report = leakage.probe_mixer(RowPositions(), **SMALL)
    assert report.perturbation and report.nan and report.gradient and report.leakage == 0
    assert report.packing_max_diff > 0.01
    assert report.failed_probes == ["packing"]


def test_gradient_probes_fall_back_to_a_loop_when_torch_func_cannot_transform():
    """Same cotangents either way: the loop over plain autograd gives the vmap path's verdicts and metric."""
    B, T, D = 2, 16, 8
    cu = leakage.random_layout(np.random.default_rng(0), B, T)
    x = torch.randn(B, T, D, generator=fresh_generator(1))
    leaky = ReadsNextToken()
    cases = [(lambda inp, c: _Double.apply(inp), True), (lambda inp, c: _Double.apply(leaky(inp, c)), False)]
    for f, blind in cases:
        reference = (lambda inp, c: 2 * inp) if blind else (lambda inp, c: 2 * leaky(inp, c))
        passed, method = leakage.gradient_probe(f, x, cu, generator=fresh_generator())
        assert method == "loop" and passed == blind
        assert leakage.gradient_probe(reference, x, cu, generator=fresh_generator()) == (blind, "vmap")
        metric = leakage.leakage_metric(f, x, cu, generator=fresh_generator())
        assert metric == pytest.approx(leakage.leakage_metric(reference, x, cu, generator=fresh_generator()),
                                       rel=1e-6)
        assert (metric == 0) == blind


def test_leakage_metric_matches_the_exact_jacobian_energy_share():
    """Hutchinson with many probes against the share computed from the full Jacobian."""
    B, T, D = 1, 12, 3
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    weight = torch.randn(B * T * D, B * T * D, generator=fresh_generator(2))

    def f(x, cu_seqlens):  # dense linear map: every output reads every input
        return (x.reshape(-1) @ weight.T).view(B, T, D)

    jac = weight.view(T, D, T, D).pow(2).sum((1, 3)).double()  # [T_out, T_in] energy
    doc = torch.tensor([0] * 5 + [1] * 7)
    exact = (jac * (doc[:, None] != doc[None, :])).sum() / jac.sum()
    x = torch.randn(B, T, D, generator=fresh_generator(3))
    estimate = leakage.leakage_metric(f, x, cu, generator=fresh_generator(), n_probes=512)
    assert estimate == pytest.approx(exact.item(), rel=0.05)


def test_triton_backend_falls_back_to_torch_for_ops_without_a_kernel(monkeypatch):
    monkeypatch.setattr(kernels.utils, "TRITON_OPS", {"short_conv"})
    mixer = leakage.build_probe_module("attention+qkv_dynamic_lowrank", backend="triton", d_model=16)
    assert mixer.qkv_conv.backend == "torch"
    for name, backend in [("static_conv", "triton"), ("rubiconv", "torch")]:
        modules = [m for m in build_small(name).modules() if hasattr(m, "backend")]
        assert modules and all(m.backend is None for m in modules)  # auto
        leakage.use_backend(modules[0], "triton")
        assert modules[0].backend == backend


# --- whole models


@pytest.mark.parametrize("name", ["rubiconv", "attention+qkv_dynamic_lowrank", "static_conv"])
def test_blind_model_passes_every_probe(name):
    report = leakage.probe_mixer(name, level="model", **SMALL)
    assert report.level == "model" and report.claims_blind
    assert not report.failed_probes and report.verdict == "exact"


def test_fft_conv_leaky_model_is_caught():
    report = leakage.probe_mixer("fft_conv_leaky", level="model", **SMALL)
    assert not report.claims_blind
    assert not report.perturbation and not report.nan and not report.gradient and report.leakage > 0


def test_token_probe_catches_a_model_whose_mixer_ignores_documents():
    model = leakage.build_probe_module("static_conv", level="model", d_model=16, seq_len=32)
    model.blocks[1].mixer = IgnoresDocuments(model.blocks[1].mixer)
    ids = torch.randint(0, leakage.VOCAB_SIZE, (2, 32), generator=fresh_generator())
    doc_ids = torch.tensor([[0] * 10 + [1] * 22, [0] * 3 + [1] * 29])
    assert not leakage.token_perturbation_probe(model, ids, doc_ids, generator=fresh_generator())
    report = leakage.probe_model(model, ids, doc_ids, name="leaky", generator=fresh_generator())
    assert report.failed and not report.perturbation and not report.gradient


# --- distance profile


def test_leakage_by_distance_is_zero_for_exact_mixers_and_decays_for_the_leaky_one():
    exact = leakage.leakage_by_distance("rubiconv", **SMALL)
    assert (exact.share == 0).all() and (exact.total > 0).all()
    leaky = leakage.leakage_by_distance("fft_conv_leaky", **SMALL)
    assert (leaky.share > 0).all()
    assert leaky.share[0] == leaky.share.max()  # a document's first token leans most on its neighbour
    assert leaky.distance.tolist() == list(range(SMALL["seq_len"] // 4))


def test_plot_writes_a_file(tmp_path):
    profiles = {name: leakage.leakage_by_distance(name, rows=2, seq_len=16, d_model=16)
                for name in ("static_conv", "fft_conv_leaky")}
    path = leakage.plot_leakage_by_distance(profiles, tmp_path / "leakage.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plot_separates_every_series():
    """Leaky mixers are lines of distinct colours and markers; exact ones (share 0 everywhere, which would lie
    on one another) are a named row each."""
    zero, some = np.zeros(4), np.array([0.3, 0.1, 0.05, 0.01])
    shares = {"exact_a": zero, "leaky_a": some, "exact_b": zero, "leaky_b": some / 2, "leaky_c": some / 3}
    profiles = {name: leakage.DistanceProfile(np.arange(4), share, share, np.ones(4))
                for name, share in shares.items()}
    top, bottom = leakage.leakage_figure(profiles).axes
    lines = top.get_lines()
    assert [line.get_label() for line in lines] == ["leaky_a", "leaky_b", "leaky_c"]
    assert len({line.get_color() for line in lines}) == 3 and len({line.get_marker() for line in lines}) == 3
    assert [tick.get_text() for tick in bottom.get_yticklabels()] == ["exact_a", "exact_b"]
    assert sorted(line.get_ydata()[0] for line in bottom.get_lines()) == [0, 1], "a row each"


# --- determinism


def test_same_seed_same_report_and_global_rng_untouched():
    torch_state, np_state = torch.get_rng_state(), np.random.get_state()[1].copy()
    first = leakage.probe_mixer("fft_conv_leaky", seed=3, **SMALL)
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert (np.random.get_state()[1] == np_state).all()
    assert leakage.probe_mixer("fft_conv_leaky", seed=3, **SMALL) == first
    assert leakage.probe_mixer("fft_conv_leaky", seed=4, **SMALL).leakage != first.leakage


@pytest.mark.parametrize(("settings", "named"), [
    ({"mixer": "bogus"}, "bogus"),
    ({"mixer": "rubiconv+qkv_static"}, r"rubiconv\+qkv_static"),
    ({"mixer": "static_conv", "backend": "cuda"}, "backend"),
    ({"mixer": "static_conv", "device": "tpu"}, "tpu"),
    ({"mixer": "static_conv", "level": "layer"}, "level"),
    ({"mixer": "static_conv", "n_probes": 0}, "n_probes"),
], ids=["unknown-mixer", "qkv-on-non-attention", "bad-backend", "bad-device", "bad-level", "no-probes"])
def test_bad_settings_raise_value_error_naming_them(settings, named):
    with pytest.raises(ValueError, match=named):
        leakage.probe_mixer(**SMALL, **settings)


# --- CLI


def invoke(*args) -> int:
    """Run `mixlab leakage` on a fresh app holding only this command; returns the exit status."""
    app = typer.Typer()
    app.callback()(lambda: None)  # a group, like the mixlab app: `leakage` stays a named subcommand
    register(app)
    try:
        result = app(args=["leakage", *args], standalone_mode=False)
    except typer.Exit as exc:
        return exc.exit_code
    return result or 0


SMALL_ARGS = ["--rows", "2", "--seq-len", "16", "--d-model", "16"]


def test_cli_prints_one_row_per_mixer_and_exits_0(capsys, tmp_path):
    code = invoke("--mixer", "all", "--plot", str(tmp_path / "leak.svg"), *SMALL_ARGS)
    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    for name in NAMES:
        row = next(line for line in lines if line.split()[0] == name)
        leaky = models.MIXERS[leakage.parse_mixer_name(name)[0]].leaks_across_documents
        assert ("leaks (declared)" if leaky else "exact") in row
    assert (tmp_path / "leak.svg").read_text().lstrip().startswith("<?xml")


def test_cli_exits_1_when_a_mixer_claiming_blindness_leaks(capsys, monkeypatch):
    monkeypatch.setitem(models.MIXERS, "leaky_conv", StaticConvIgnoringDocuments)
    code = invoke("--mixer", "leaky_conv", *SMALL_ARGS)
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL: perturbation, nan, gradient, packing, metric" in out
    assert "leaky_conv" in out.splitlines()[-1]


def test_cli_model_level(capsys):
    assert invoke("--mixer", "fft_conv_leaky", "--model", *SMALL_ARGS) == 0
    assert "leaks (declared)" in capsys.readouterr().out


def test_cli_bad_mixer_is_a_value_error():
    with pytest.raises(ValueError, match="no_such_mixer"):
        invoke("--mixer", "no_such_mixer")
