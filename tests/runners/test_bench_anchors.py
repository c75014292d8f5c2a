"""Public anchors of the convolution benchmarks: each is turned into our layout correctly, checked against our
reference before it is timed, and skipped with a reason when absent.

The anchors' own kernels need CUDA; here stand-ins with each project's documented call and convention (written
as explicit loops) take their place, so what is tested is our side: layout conversion, the agreement check, the
rows and ratios, and the skip lines."""

import types

import pytest
import torch
from mixlab.kernels.rubiconv.naive import rubiconv_ref
from mixlab.kernels.short_conv.naive import short_conv_ref
from mixlab.runners.bench import anchors as bench_anchors
from mixlab.runners.bench import shortconv as bench_shortconv_module
from mixlab.runners.bench.anchors import Anchor, Missing, long_conv_anchors, short_conv_anchors


def _fla_style_conv(x, weight, residual=None, cu_seqlens=None):
    """fla's documented causal_conv1d: x [B, T, D], weight [D, W] whose last tap multiplies the current token,
    documents by cu_seqlens over a batch of one row; returns (y, final state)."""
    B, T, D = x.shape
    W = weight.shape[1]
    starts = torch.zeros(B * T, dtype=torch.long)
    if cu_seqlens is not None:
        for s, e in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
            starts[s:e] = s
    flat = x.reshape(B * T, D)
    y = torch.zeros_like(flat)
    for t in range(B * T):
        row_start = (t // T) * T if cu_seqlens is None else int(starts[t])
        for k in range(W):
            src = t - (W - 1) + k
            if src >= row_start:
                y[t] += weight[:, k] * flat[src]
    y = y.view(B, T, D)
    return (y if residual is None else y + residual), None


def _modules(monkeypatch, **found):
    """Pretend these (module, attribute) lookups succeed; every other anchor is absent."""
    monkeypatch.setattr(bench_anchors, "_module", lambda name, attribute: found.get(name))


def _static_inputs(B=2, T=9, D=3, W=4):
    gen = torch.Generator().manual_seed(0)
    return {"x": torch.randn(B, T, D, generator=gen, dtype=torch.float64),
            "weight": torch.randn(W, D, generator=gen, dtype=torch.float64)}


@pytest.mark.parametrize("with_docs", [False, True], ids=["one-doc-per-row", "documents"])
def test_static_anchor_in_fla_layout_computes_our_conv(monkeypatch, with_docs):
    from mixlab.kernels.short_conv.naive import short_conv_ref

    _modules(monkeypatch, **{"fla.modules.causal_conv1d": _fla_style_conv})
    inputs = _static_inputs()
    cu = torch.tensor([0, 2, 9, 10, 18], dtype=torch.int32) if with_docs else None
    anchors = short_conv_anchors("static", inputs, cu)
    fla = next(a for a in anchors if a.name == "fla causal_conv1d")
    assert isinstance(fla, Anchor)
    want = short_conv_ref(inputs["x"], inputs["weight"], cu_seqlens=cu, residual=True)
    torch.testing.assert_close(fla.fn(**fla.inputs), want)
    missing = next(a for a in anchors if a.name == "causal-conv1d")
    assert isinstance(missing, Missing) and "pip install causal-conv1d" in missing.reason


def test_dynamic_conv1d_without_documents_only():
    assert all(isinstance(a, Missing) for a in short_conv_anchors("headwise", {"x": None, "weight": None,
                                                                             "static_w": None}, None))


def test_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="unknown short-conv kernel 'nope'"):
        short_conv_anchors("nope", {"x": None}, None)


def _headwise_module(residual_honoured: bool):
    from mixlab.kernels.dynamic_conv.naive import dynamic_conv_headwise_ref

    def conv(x, weight, static_w=None, residual=False):
        return dynamic_conv_headwise_ref(x, weight, static_w=static_w, residual=residual and residual_honoured)

    return conv


@pytest.mark.parametrize(("honest", "expect"), [(True, "Triton / dynamic-conv1d: fwd 2.00x, fwd+bwd 3.00x"),
                                                (False, "not timed, disagrees with our reference")],
                         ids=["agrees", "drops-residual"])
def test_an_agreeing_anchor_is_timed_with_its_ratio_and_a_disagreeing_one_is_not(monkeypatch, honest, expect):
    _modules(monkeypatch, headwise=_headwise_module(honest))
    # our timings 2x and 3x the anchor's (the anchor's are pinned: measure_pair is replaced)
    monkeypatch.setattr(bench_shortconv_module, "measure_pair", lambda fwd, total, repeats, device: (10.0, 20.0, ""))
    kernel = next(k for k in bench_shortconv_module.bench_kernels(1, 8, 4, 2, torch.float32, torch.device("cpu"))
                  if k.kind == "headwise")
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    upstream = torch.randn(1, 8, 4, generator=torch.Generator().manual_seed(0))
    lines, notes = bench_shortconv_module._anchor_rows(
        kernel, [(None, ""), (cu, ", 2 documents")], {"Triton": (20.0, 60.0, None, None, None)}, upstream, 1, 1e9)
    assert [line.split(" | ")[0] for line in lines] == (["| anchor: dynamic-conv1d"] if honest else [])
    assert any(expect in n for n in notes)
    assert "anchor: dynamic-conv1d, 2 documents: skipped, no document support" in notes


def test_the_graphed_and_backward_ratios_join_the_note_and_the_row_when_both_sides_were_timed(monkeypatch):
    _modules(monkeypatch, headwise=_headwise_module(True))
    monkeypatch.setattr(bench_shortconv_module, "measure_pair", lambda fwd, total, repeats, device: (10.0, 20.0, ""))
    monkeypatch.setattr(bench_shortconv_module, "measure_graphed",
                        lambda fwd, total, repeats, device: (8.0, 16.0, ""))
    monkeypatch.setattr(bench_shortconv_module, "measure_one", lambda fn, repeats, device: (25.0, ""))
    kernel = next(k for k in bench_shortconv_module.bench_kernels(1, 8, 4, 2, torch.float32, torch.device("cpu"))
                  if k.kind == "headwise")
    upstream = torch.randn(1, 8, 4, generator=torch.Generator().manual_seed(0))
    timed = {"Triton": (20.0, 60.0, 12.0, 40.0, 50.0)}
    lines, notes = bench_shortconv_module._anchor_rows(kernel, [(None, "")], timed, upstream, 1, 1e9)
    assert lines[0].split(" | ")[1:6] == ["10.0", "20.0", "8.0", "16.0", "25.0"]
    assert any("fwd+bwd 3.00x; as CUDA graphs fwd+bwd 2.50x; with .backward() 2.00x" in n for n in notes)


def test_backward_call_accumulates_into_the_leaves_grad_as_a_training_step_does():
    """The ``.backward()`` column's closure: the first call leaves each input's gradient in ``.grad``, the second
    adds to it (what ``autograd.grad`` in the fwd+bwd column never does)."""
    from mixlab.runners.bench.utils import backward_call, fwd_bwd_call

    gen = torch.Generator().manual_seed(3)
    inputs = {"x": torch.randn(2, 9, 4, generator=gen), "weight": torch.randn(3, 4, generator=gen)}
    upstream = torch.randn(2, 9, 4, generator=gen)
    _, *want = fwd_bwd_call(short_conv_ref, inputs, upstream, residual=True)()
    leaves = {}

    def conv(**tensors):
        leaves.update(x=tensors["x"], weight=tensors["weight"])
        return short_conv_ref(**tensors)

    call = backward_call(conv, inputs, upstream, residual=True)
    call()
    torch.testing.assert_close([leaves["x"].grad, leaves["weight"].grad], want)
    call()
    torch.testing.assert_close([leaves["x"].grad, leaves["weight"].grad], [2 * w for w in want])
    assert inputs["x"].grad is None  # the caller's tensors are left alone


def test_graphed_timing_is_absent_off_cuda():
    from mixlab.runners.bench.utils import measure_graphed

    assert measure_graphed(lambda: None, lambda: None, 1, torch.device("cpu")) == (None, None, "")


def test_fla_fft_conv_anchor_is_the_leaky_conv():
    """fla's FFT conv, in our layout and without its skip term, equals our one-FFT-per-row (leaky) reference."""
    pytest.importorskip("fla.modules.long_conv")
    (anchor,) = long_conv_anchors()
    gen = torch.Generator().manual_seed(1)
    x, h = torch.randn(1, 40, 3, generator=gen), torch.randn(3, 40, generator=gen)
    torch.testing.assert_close(anchor.fn(x, h), rubiconv_ref(x, h), rtol=1e-5, atol=1e-5)


def test_long_conv_anchor_absent_names_the_install(monkeypatch):
    _modules(monkeypatch)
    assert long_conv_anchors() == [Missing("fla fft_conv", "not installed: pip install 'mixlab[anchors]'")]


def test_a_module_that_fails_to_import_counts_as_absent(monkeypatch):
    def broken(name):
        raise OSError("libcudart.so: cannot open shared object file")

    monkeypatch.setattr(bench_anchors.importlib, "import_module", broken)
    assert bench_anchors._module("causal_conv1d", "causal_conv1d_fn") is None
    monkeypatch.setattr(bench_anchors.importlib, "import_module", lambda name: types.SimpleNamespace())
    assert bench_anchors._module("causal_conv1d", "causal_conv1d_fn") is None


def test_an_anchor_failing_on_a_bare_assert_is_noted_by_where_it_failed(monkeypatch):
    """Another project's kernel may fail on a bare ``assert`` (no message): the note names the file and line,
    and the benchmark goes on (it raised IndexError on the empty message before)."""

    def headwise_dynamic_convolution(x, weight, static_w=None, residual=False):
        if not x.is_cuda:  # what a bare assert raises (pytest rewrites asserts in test modules into messages)
            raise AssertionError
        return x

    _modules(monkeypatch, headwise=headwise_dynamic_convolution)
    kernel = next(k for k in bench_shortconv_module.bench_kernels(1, 8, 4, 2, torch.float32, torch.device("cpu"))
                  if k.kind == "headwise")
    upstream = torch.randn(1, 8, 4, generator=torch.Generator().manual_seed(0))
    lines, notes = bench_shortconv_module._anchor_rows(kernel, [(None, "")], {"Triton": (20.0, 60.0, None, None, None)},
                                                       upstream, 1, 1e9)
    line = headwise_dynamic_convolution.__code__.co_firstlineno + 2
    assert lines == []
    assert notes == [f"anchor: dynamic-conv1d: failed, AssertionError at test_bench_anchors.py:{line}"]


def test_error_line_keeps_the_first_line_of_a_message():
    from mixlab.runners.bench.utils import error_line

    assert error_line(RuntimeError("out of memory\nmore detail"), 3) == "RuntimeError: out"


def test_bench_shortconv_times_only_the_kernels_asked_and_shows_its_header_first(monkeypatch, capsys):
    """A capped GPU call may time a subset (``--kernels``); the header (GPU, versions, shape) goes to stderr before
    the first section, so output cut short by a timeout still says where it was measured."""
    _modules(monkeypatch)
    monkeypatch.setattr(bench_shortconv_module, "copy_bandwidth", lambda device, repeats: 1e12)
    monkeypatch.setattr(bench_shortconv_module, "_gate", lambda kernel, cu, upstream: 0.0)
    monkeypatch.setattr(bench_shortconv_module, "measure_pair", lambda fwd, total, repeats, device: (10.0, 20.0, ""))
    report = bench_shortconv_module.bench_shortconv((1, 8, 16, 2), dtype="fp32", n_docs=2, repeats=1,
                                                    device="cpu", progress=True, only=("hs16", "static"))
    assert [line for line in report.splitlines() if line.startswith("## ")] == [
        "## static", "## head-wise, head size 16"]
    err = capsys.readouterr().err
    assert err.startswith("# Short-convolution kernels") and err.index("- device: ") < err.index("## static")
    with pytest.raises(ValueError, match="unknown kernel 'hs2'; choose from static, hs1, hs16, lowrank"):
        bench_shortconv_module.bench_shortconv((1, 8, 16, 2), device="cpu", only=("hs2",))
