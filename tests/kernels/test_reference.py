"""The plain-torch backends of kernels/ against deliberately dumb implementations, plus document isolation,
the cu_seqlens helpers, input checks and backend choice.

Dumb implementations: python loops over documents, tokens and taps in float64 (autograd gives their
gradients); RubiConv against numpy.convolve per document and channel, with its adjoint written out.
"""

import importlib
import types

import numpy as np
import pytest
import torch
from kernel_checks import cu_from_rows
from mixlab import kernels
from mixlab.kernels import utils as kutils


def _cu(rows: list[list[int]] | None, T: int) -> torch.Tensor | None:
    return cu_from_rows(rows, T)


def _docs(cu: torch.Tensor | None, B: int, T: int) -> list[tuple[int, int]]:
    """(start, end) on the flattened B*T axis of every document, empty ones included."""
    offsets = [r * T for r in range(B + 1)] if cu is None else cu.tolist()
    return list(zip(offsets[:-1], offsets[1:], strict=True))


def _randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


# ---- dumb implementations (float64) ----


def _dumb_conv(x, taps, docs, residual):
    """x: [B, T, D], taps: [B, T, W, D] per-token weights -> [B, T, D]; loops over documents, tokens, taps."""
    B, T, D = x.shape
    x, taps = x.reshape(B * T, D), taps.reshape(B * T, taps.shape[2], D)
    rows = []
    for start, end in docs:
        for t in range(start, end):
            y_t = torch.zeros(D, dtype=x.dtype)
            for k in range(min(taps.shape[1], t - start + 1)):
                y_t = y_t + taps[t, k] * x[t - k]
            rows.append(y_t + x[t] if residual else y_t)
    return torch.stack(rows).view(B, T, D)


def _dumb_static_taps(weight, B, T):
    return weight.expand(B, T, *weight.shape)  # [B, T, W, D]


def _dumb_headwise_taps(weight, static_w, D):
    H = weight.shape[2]
    per_channel = [weight[:, :, d // (D // H), :] for d in range(D)]  # D x [B, T, W]
    taps = torch.stack(per_channel, dim=-1)  # [B, T, W, D]
    return taps if static_w is None else taps + static_w


def _dumb_lowrank_taps(z, U, static_w, D):
    W = U.shape[1] // D
    taps = torch.stack([torch.stack([z @ U[:, k * D + d] for d in range(D)], -1) for k in range(W)], 2)
    return taps if static_w is None else taps + static_w  # [B, T, W, D]


def _numpy_rubiconv(x, h, docs, g):
    """x, g: [B*T, D], h: [D, L_F] numpy float64 -> (y, dx, dh), per document with numpy.convolve."""
    y, dx, dh = np.zeros_like(x), np.zeros_like(x), np.zeros_like(h)
    for start, end in docs:
        L = end - start
        if L == 0:
            continue  # numpy.convolve refuses empty input
        for d in range(x.shape[1]):
            y[start:end, d] = np.convolve(x[start:end, d], h[d])[:L]
            # adjoint of a causal convolution: convolve the time-reversed upstream gradient
            dx[start:end, d] = np.convolve(g[start:end, d][::-1], h[d])[:L][::-1]
            for j in range(min(h.shape[1], L)):
                dh[d, j] += g[start + j : end, d] @ x[start : end - j, d]
    return y, dx, dh


# ---- forward and every gradient against the dumb implementations ----


def _run(op, inputs: dict, dtype, gen, **kwargs):
    """Cast float64 inputs to dtype, run op forward and backward with a random upstream gradient.

    Returns (y, grads, cast inputs as float64 leaves, upstream as float64)."""
    cast = {k: v.to(dtype).requires_grad_() for k, v in inputs.items() if v is not None}
    y = op(**cast, **kwargs, backend="torch")
    assert y.dtype == dtype
    g = _randn(gen, *y.shape).to(dtype)
    y.backward(g)
    for name, t in cast.items():
        assert t.grad.dtype == dtype, f"grad of {name} is {t.grad.dtype}"
    grads = {k: t.grad for k, t in cast.items()}
    leaves = {k: t.detach().double().requires_grad_() for k, t in cast.items()}
    return y, grads, leaves, g.double()


def _check_against(assert_rel_rms, y, grads, y_ref, leaves, g, dtype):
    y_ref.backward(g)
    assert_rel_rms(y, y_ref, dtype, "y")
    for name, grad in grads.items():
        assert_rel_rms(grad, leaves[name].grad, dtype, f"d{name}")


SHORT_CASES = [
    # B, T, D, W, document lengths per row (None: one per row), residual
    pytest.param(1, 1, 1, 1, None, False, id="T1-D1-W1"),
    pytest.param(2, 1, 3, 4, None, True, id="T1-W4-residual"),
    pytest.param(1, 63, 7, 4, None, False, id="T63-D7-W4"),
    pytest.param(2, 65, 5, 3, [[20, 1, 44], [65]], True, id="T65-D5-W3-docs-residual"),
    pytest.param(2, 20, 3, 8, [[3, 5, 2, 7, 3], [6, 0, 14]], False, id="W8-docs-shorter-than-W-empty"),
    pytest.param(3, 16, 1, 2, [[1] * 16, [2, 3, 0, 0, 11], [16]], True, id="D1-length1-docs-empty"),
    pytest.param(2, 127, 3, 6, [[1, 2, 7, 0, 40, 77], [127]], False, id="T127-D3-W6-packed"),
]


@pytest.mark.parametrize("B, T, D, W, rows, residual", SHORT_CASES)
def test_short_conv_matches_loops(B, T, D, W, rows, residual, assert_rel_rms):
    gen = torch.Generator().manual_seed(0)
    cu = _cu(rows, T)
    inputs = {"x": _randn(gen, B, T, D), "weight": _randn(gen, W, D)}
    y, grads, leaves, g = _run(kernels.short_conv, inputs, torch.float64, gen, cu_seqlens=cu, residual=residual)
    taps = _dumb_static_taps(leaves["weight"], B, T)
    y_ref = _dumb_conv(leaves["x"], taps, _docs(cu, B, T), residual)
    _check_against(assert_rel_rms, y, grads, y_ref, leaves, g, torch.float64)


@pytest.mark.parametrize("W", range(1, 9), ids=lambda w: f"W{w}")
def test_short_conv_every_width(W, assert_rel_rms):
    gen = torch.Generator().manual_seed(W)
    B, T, D, cu = 2, 12, 3, _cu([[1, W, 11 - W], [12]], 12)
    inputs = {"x": _randn(gen, B, T, D), "weight": _randn(gen, W, D)}
    y, grads, leaves, g = _run(kernels.short_conv, inputs, torch.float64, gen, cu_seqlens=cu)
    y_ref = _dumb_conv(leaves["x"], _dumb_static_taps(leaves["weight"], B, T), _docs(cu, B, T), False)
    _check_against(assert_rel_rms, y, grads, y_ref, leaves, g, torch.float64)


HEADWISE_CASES = [
    # B, T, D, H, W, document lengths per row, residual, static_w
    pytest.param(1, 1, 1, 1, 1, None, False, False, id="T1-D1-H1-W1"),
    pytest.param(1, 63, 6, 3, 4, None, False, True, id="T63-D6-H3-W4-static"),
    pytest.param(2, 65, 5, 5, 3, [[20, 1, 44], [65]], True, False, id="T65-D5-H5-W3-docs-residual"),
    pytest.param(2, 65, 5, 1, 4, [[64, 1], [30, 0, 35]], False, True, id="T65-D5-H1-W4-docs-empty-static"),
    pytest.param(2, 20, 8, 2, 8, [[3, 5, 2, 7, 3], [1] * 20], True, True, id="D8-H2-W8-short-docs-static-residual"),
]


@pytest.mark.parametrize("B, T, D, H, W, rows, residual, static", HEADWISE_CASES)
def test_dynamic_conv_headwise_matches_loops(B, T, D, H, W, rows, residual, static, assert_rel_rms):
    gen = torch.Generator().manual_seed(1)
    cu = _cu(rows, T)
    inputs = {
        "x": _randn(gen, B, T, D),
        "weight": _randn(gen, B, T, H, W),
        "static_w": _randn(gen, W, D) if static else None,
    }
    op = kernels.dynamic_conv_headwise
    y, grads, leaves, g = _run(op, inputs, torch.float64, gen, cu_seqlens=cu, residual=residual)
    taps = _dumb_headwise_taps(leaves["weight"], leaves.get("static_w"), D)
    y_ref = _dumb_conv(leaves["x"], taps, _docs(cu, B, T), residual)
    _check_against(assert_rel_rms, y, grads, y_ref, leaves, g, torch.float64)


LOWRANK_CASES = [
    # B, T, D, R, W, document lengths per row, residual, static_w
    pytest.param(1, 1, 1, 1, 1, None, False, False, id="T1-D1-R1-W1"),
    pytest.param(1, 63, 7, 4, 4, None, False, True, id="T63-D7-R4-W4-static"),
    pytest.param(2, 65, 5, 2, 3, [[20, 1, 44], [65]], True, False, id="T65-D5-R2-W3-docs-residual"),
    pytest.param(2, 20, 3, 3, 8, [[3, 5, 0, 2, 7, 3], [1] * 20], True, True, id="W8-short-docs-empty-static-res"),
]


@pytest.mark.parametrize("B, T, D, R, W, rows, residual, static", LOWRANK_CASES)
def test_dynamic_conv_lowrank_matches_loops(B, T, D, R, W, rows, residual, static, assert_rel_rms):
    gen = torch.Generator().manual_seed(2)
    cu = _cu(rows, T)
    inputs = {
        "x": _randn(gen, B, T, D),
        "z": _randn(gen, B, T, R),
        "U": _randn(gen, R, W * D),
        "static_w": _randn(gen, W, D) if static else None,
    }
    op = kernels.dynamic_conv_lowrank
    y, grads, leaves, g = _run(op, inputs, torch.float64, gen, cu_seqlens=cu, residual=residual)
    taps = _dumb_lowrank_taps(leaves["z"], leaves["U"], leaves.get("static_w"), D)
    y_ref = _dumb_conv(leaves["x"], taps, _docs(cu, B, T), residual)
    _check_against(assert_rel_rms, y, grads, y_ref, leaves, g, torch.float64)


RUBICONV_CASES = [
    # B, T, D, L_F, document lengths per row
    pytest.param(1, 1, 1, 1, None, id="T1-D1-LF1"),
    pytest.param(2, 63, 7, 1, None, id="T63-D7-LF1"),
    pytest.param(2, 65, 5, 200, None, id="T65-D5-LF200-longer-than-row"),
    pytest.param(2, 65, 3, 16, [[20, 1, 44], [65]], id="T65-D3-LF16-docs"),
    pytest.param(3, 16, 1, 5, [[1] * 16, [2, 3, 0, 0, 11], [16]], id="D1-LF5-length1-docs-empty"),
    pytest.param(3, 127, 3, 300, [[10, 10, 10, 1, 1, 0, 30, 31, 34], [127], [5] * 25 + [2]], id="T127-LF300-many-docs"),
]


@pytest.mark.parametrize("B, T, D, L_F, rows", RUBICONV_CASES)
def test_rubiconv_matches_numpy_convolve(B, T, D, L_F, rows, assert_rel_rms):
    gen = torch.Generator().manual_seed(3)
    cu = _cu(rows, T)
    x, h = _randn(gen, B, T, D).requires_grad_(), _randn(gen, D, L_F).requires_grad_()
    y = kernels.rubiconv(x, h, cu_seqlens=cu, backend="torch")
    g = _randn(gen, B, T, D)
    y.backward(g)
    as_np = lambda t: t.detach().reshape(-1, t.shape[-1]).numpy()  # noqa: E731
    y_np, dx_np, dh_np = _numpy_rubiconv(as_np(x), h.detach().numpy(), _docs(cu, B, T), as_np(g))
    assert_rel_rms(y, torch.from_numpy(y_np).view(B, T, D), torch.float64, "y")
    assert_rel_rms(x.grad, torch.from_numpy(dx_np).view(B, T, D), torch.float64, "dx")
    assert_rel_rms(h.grad, torch.from_numpy(dh_np), torch.float64, "dh")


# ---- low precision: compute in float32, return the input dtype ----

LOW_PRECISION = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.bfloat16, id="bf16"),
    pytest.param(torch.float16, id="fp16"),
]
DTYPE_ROWS, DTYPE_B, DTYPE_T, DTYPE_D = [[9, 1, 0, 30], [40]], 2, 40, 6


@pytest.mark.parametrize("dtype", LOW_PRECISION)
def test_short_convs_low_precision(dtype, assert_rel_rms):
    gen = torch.Generator().manual_seed(4)
    B, T, D, W = DTYPE_B, DTYPE_T, DTYPE_D, 4
    cu, docs = _cu(DTYPE_ROWS, T), _docs(_cu(DTYPE_ROWS, T), B, T)
    static = {"x": _randn(gen, B, T, D), "weight": _randn(gen, W, D)}
    y, grads, leaves, g = _run(kernels.short_conv, static, dtype, gen, cu_seqlens=cu, residual=True)
    y_ref = _dumb_conv(leaves["x"], _dumb_static_taps(leaves["weight"], B, T), docs, True)
    _check_against(assert_rel_rms, y, grads, y_ref, leaves, g, dtype)

    headwise = {"x": _randn(gen, B, T, D), "weight": _randn(gen, B, T, 3, W), "static_w": _randn(gen, W, D)}
    y, grads, leaves, g = _run(kernels.dynamic_conv_headwise, headwise, dtype, gen, cu_seqlens=cu)
    taps = _dumb_headwise_taps(leaves["weight"], leaves["static_w"], D)
    _check_against(assert_rel_rms, y, grads, _dumb_conv(leaves["x"], taps, docs, False), leaves, g, dtype)

    lowrank = {
        "x": _randn(gen, B, T, D),
        "z": _randn(gen, B, T, 2),
        "U": _randn(gen, 2, W * D),
        "static_w": _randn(gen, W, D),
    }
    y, grads, leaves, g = _run(kernels.dynamic_conv_lowrank, lowrank, dtype, gen, cu_seqlens=cu)
    taps = _dumb_lowrank_taps(leaves["z"], leaves["U"], leaves["static_w"], D)
    _check_against(assert_rel_rms, y, grads, _dumb_conv(leaves["x"], taps, docs, False), leaves, g, dtype)


@pytest.mark.parametrize("dtype", LOW_PRECISION)
def test_rubiconv_low_precision(dtype, assert_rel_rms):
    gen = torch.Generator().manual_seed(5)
    B, T, D = DTYPE_B, DTYPE_T, DTYPE_D
    cu = _cu(DTYPE_ROWS, T)
    x, h = _randn(gen, B, T, D).to(dtype).requires_grad_(), _randn(gen, D, 50).to(dtype).requires_grad_()
    y = kernels.rubiconv(x, h, cu_seqlens=cu, backend="torch")
    assert y.dtype == dtype
    g = _randn(gen, B, T, D).to(dtype)
    y.backward(g)
    assert x.grad.dtype == dtype and h.grad.dtype == dtype
    x64, h64 = x.detach().double().requires_grad_(), h.detach().double().requires_grad_()
    y64 = kernels.rubiconv(x64, h64, cu_seqlens=cu, backend="torch")
    y64.backward(g.double())
    assert_rel_rms(y, y64, dtype, "y")
    assert_rel_rms(x.grad, x64.grad, dtype, "dx")
    assert_rel_rms(h.grad, h64.grad, dtype, "dh")


def test_autocast_does_not_lower_the_reference_precision():
    gen = torch.Generator().manual_seed(6)
    x, z, U = _randn(gen, 2, 9, 4).float(), _randn(gen, 2, 9, 3).float(), _randn(gen, 3, 4 * 4).float()
    plain = kernels.dynamic_conv_lowrank(x, z, U, backend="torch")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_autocast = kernels.dynamic_conv_lowrank(x, z, U, backend="torch")
    assert under_autocast.dtype == torch.float32
    assert torch.equal(plain, under_autocast)


# ---- document isolation: bitwise perturbation, NaN injection, exact-zero gradients ----

ISO_B, ISO_T, ISO_D = 3, 40, 4
ISO_ROWS = [[7, 1, 0, 12, 20], [40], [3, 3, 3, 31]]


def _iso_inputs(op_name: str, dtype, gen) -> tuple[dict, list[str]]:
    """Inputs of an op on the isolation layout and the names of its per-token inputs ([B, T, ...])."""
    B, T, D = ISO_B, ISO_T, ISO_D
    x = _randn(gen, B, T, D).to(dtype)
    if op_name == "short_conv":
        return {"x": x, "weight": _randn(gen, 4, D).to(dtype)}, ["x"]
    if op_name == "dynamic_conv_headwise":
        weight, static_w = _randn(gen, B, T, 2, 4).to(dtype), _randn(gen, 4, D).to(dtype)
        return {"x": x, "weight": weight, "static_w": static_w}, ["x", "weight"]
    if op_name == "dynamic_conv_lowrank":
        z, U, static_w = _randn(gen, B, T, 2), _randn(gen, 2, 4 * D), _randn(gen, 4, D)
        return {"x": x, "z": z.to(dtype), "U": U.to(dtype), "static_w": static_w.to(dtype)}, ["x", "z"]
    return {"x": x, "h": _randn(gen, D, 64).to(dtype)}, ["x"]


OPS = [
    pytest.param("short_conv", id="short_conv"),
    pytest.param("dynamic_conv_headwise", id="headwise"),
    pytest.param("dynamic_conv_lowrank", id="lowrank"),
    pytest.param("rubiconv", id="rubiconv"),
]
# (start, end) on the flattened axis of the document that is changed. RubiConv buckets documents by
# ceil(log2(length)) and zero-pads each to the longest of its bucket: row 0's 12-token document is alone in its
# bucket; a 3-token document of row 2 shares one with two others; row 1's 40-token document follows row 0's
# last one (20 tokens, padded to 31 beside row 2's), so it is what that padding must not read.
TARGET_DOCS = [
    pytest.param((8, 20), id="doc-row0-len12"),
    pytest.param((83, 86), id="doc-row2-len3"),
    pytest.param((40, 80), id="doc-row1-len40"),
]
ISO_DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]


def _in_doc(doc: tuple[int, int]) -> torch.Tensor:
    """[B, T] bool, True on the tokens of doc."""
    flat = torch.arange(ISO_B * ISO_T)
    return ((flat >= doc[0]) & (flat < doc[1])).view(ISO_B, ISO_T)


def _set_doc(t: torch.Tensor, doc: tuple[int, int], values: torch.Tensor | float) -> torch.Tensor:
    mask = _in_doc(doc).view(ISO_B, ISO_T, *[1] * (t.dim() - 2))
    return torch.where(mask, values, t)


def _perturbed_outputs(op_name, dtype, doc, make_values, cu):
    gen = torch.Generator().manual_seed(7)
    inputs, token_inputs = _iso_inputs(op_name, dtype, gen)
    op = getattr(kernels, op_name)
    before = op(**inputs, cu_seqlens=cu, backend="torch")
    changed = dict(inputs)
    for name in token_inputs:
        changed[name] = _set_doc(inputs[name], doc, make_values(inputs[name], gen))
    after = op(**changed, cu_seqlens=cu, backend="torch")
    return before, after


@pytest.mark.parametrize("dtype", ISO_DTYPES)
@pytest.mark.parametrize("doc", TARGET_DOCS)
@pytest.mark.parametrize("op_name", OPS)
def test_changing_one_document_leaves_the_others_bitwise_equal(op_name, doc, dtype):
    cu = _cu(ISO_ROWS, ISO_T)
    other = ~_in_doc(doc)
    new_values = lambda t, gen: (10 * _randn(gen, *t.shape)).to(t.dtype)  # noqa: E731
    before, after = _perturbed_outputs(op_name, dtype, doc, new_values, cu)
    assert not torch.equal(before[~other], after[~other]), "the perturbation did not reach its own document"
    assert torch.equal(before[other], after[other])


@pytest.mark.parametrize("dtype", ISO_DTYPES)
@pytest.mark.parametrize("doc", TARGET_DOCS)
@pytest.mark.parametrize("op_name", OPS)
def test_nan_in_one_document_stays_there(op_name, doc, dtype):
    cu = _cu(ISO_ROWS, ISO_T)
    other = ~_in_doc(doc)
    before, after = _perturbed_outputs(op_name, dtype, doc, lambda t, gen: float("nan"), cu)
    assert torch.isnan(after[~other]).all()
    assert torch.isfinite(after[other]).all()
    assert torch.equal(before[other], after[other])


@pytest.mark.parametrize("op_name", OPS)
def test_leaky_control_is_caught(op_name):
    """Without cu_seqlens a packed row is one document: the perturbation check must see the leak."""
    later_in_row0 = _in_doc((20, 40))  # the document after the changed one, in the same row
    new_values = lambda t, gen: (10 * _randn(gen, *t.shape)).to(t.dtype)  # noqa: E731
    before, after = _perturbed_outputs(op_name, torch.float32, (8, 20), new_values, None)
    assert not torch.equal(before[later_in_row0], after[later_in_row0])


@pytest.mark.parametrize("doc", TARGET_DOCS)
@pytest.mark.parametrize("op_name", OPS)
def test_cross_document_gradients_are_exactly_zero(op_name, doc):
    """Gradients of one document's outputs vanish outside it; a NaN document changes no other gradient."""
    gen = torch.Generator().manual_seed(8)
    cu = _cu(ISO_ROWS, ISO_T)
    inputs, token_inputs = _iso_inputs(op_name, torch.float32, gen)
    upstream = torch.where(_in_doc(doc)[..., None], _randn(gen, ISO_B, ISO_T, ISO_D).float(), 0.0)
    poisoned = (0, 7)  # row 0's first document, never the target

    def token_grads(inputs: dict) -> dict:
        leaves = {k: v.clone().requires_grad_(k in token_inputs) for k, v in inputs.items()}
        getattr(kernels, op_name)(**leaves, cu_seqlens=cu, backend="torch").backward(upstream)
        return {name: leaves[name].grad for name in token_inputs}

    clean = token_grads(inputs)
    nan_doc = token_grads({**inputs, "x": _set_doc(inputs["x"], poisoned, float("nan"))})
    outside, unpoisoned = ~_in_doc(doc), ~_in_doc(poisoned)
    for name in token_inputs:
        assert (clean[name][outside] == 0).all(), f"d{name} leaks outside the document"
        assert (clean[name][~outside] != 0).any(), f"d{name} is zero inside the document"
        # inside the NaN document itself 0 * NaN = NaN is that document's own business
        assert torch.equal(nan_doc[name][unpoisoned], clean[name][unpoisoned]), f"d{name} changed by the NaN"


# ---- cu_seqlens helpers ----


def test_positions_and_doc_ids_of_a_small_layout():
    cu = _cu([[3, 0, 2], [1, 4]], 5)
    assert kernels.positions_in_doc(cu, 2, 5).tolist() == [[0, 1, 2, 0, 1], [0, 0, 1, 2, 3]]
    assert kernels.cu_seqlens_to_doc_ids(cu, 2, 5).tolist() == [[0, 0, 0, 1, 1], [0, 1, 1, 1, 1]]


def test_doc_ids_round_trip():
    rng = np.random.default_rng(9)
    B, T = 4, 50
    # each row: documents of random lengths, numbered 0, 1, ... in order
    doc_ids = torch.from_numpy(np.sort(rng.integers(0, 7, size=(B, T)), axis=1))
    doc_ids = torch.stack([torch.unique(row, return_inverse=True)[1] for row in doc_ids])
    cu = kernels.doc_ids_to_cu_seqlens(doc_ids)
    assert cu.dtype == torch.int32
    assert torch.equal(kernels.cu_seqlens_to_doc_ids(cu, B, T), doc_ids)
    assert torch.equal(kernels.doc_ids_to_cu_seqlens(kernels.cu_seqlens_to_doc_ids(cu, B, T)), cu)


def test_doc_ids_of_a_layout_with_empty_documents_drop_them():
    with_empty = _cu([[2, 0, 3, 0], [0, 5]], 5)
    without = _cu([[2, 3], [5]], 5)
    assert torch.equal(kernels.doc_ids_to_cu_seqlens(kernels.cu_seqlens_to_doc_ids(with_empty, 2, 5)), without)


def test_doc_ids_start_a_new_document_at_each_row():
    doc_ids = torch.zeros(3, 4, dtype=torch.long)
    assert kernels.doc_ids_to_cu_seqlens(doc_ids).tolist() == [0, 4, 8, 12]


def _i32(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


BAD_CU = [
    # cu_seqlens for B=2, T=4, the message fragment expected
    pytest.param(torch.tensor([0, 4, 8]), "int32", id="int64"),
    pytest.param(_i32(0, 4, 8).view(1, 3), "1-D", id="2-D"),
    pytest.param(_i32(0), "1-D", id="one-offset"),
    pytest.param(_i32(1, 4, 8), "start at 0", id="not-from-0"),
    pytest.param(_i32(0, 4, 7), "B*T=8", id="short-of-B*T"),
    pytest.param(_i32(0, 4, 3, 4, 8), "decreases", id="decreasing"),
    pytest.param(_i32(0, 2, 6, 8), "row end 4", id="document-spans-rows"),
    pytest.param([0, 4, 8], "tensor", id="list"),
]


@pytest.mark.parametrize("cu, message", BAD_CU)
def test_bad_cu_seqlens_raise(cu, message):
    with pytest.raises(ValueError, match=message):
        kernels.validate_cu_seqlens(cu, 2, 4)
    if isinstance(cu, torch.Tensor):
        with pytest.raises(ValueError, match=message):
            kernels.short_conv(torch.zeros(2, 4, 3), torch.zeros(2, 3), cu_seqlens=cu, backend="torch")


@pytest.mark.parametrize(
    "doc_ids",
    [
        pytest.param(torch.tensor([[0, 1, 0]]), id="decreasing"),
        pytest.param(torch.zeros(1, 3), id="float"),
        pytest.param(torch.zeros(3, dtype=torch.long), id="1-D"),
    ],
)
def test_bad_doc_ids_raise(doc_ids):
    with pytest.raises(ValueError, match="doc_ids"):
        kernels.doc_ids_to_cu_seqlens(doc_ids)


# ---- input checks and backend choice ----

_X = torch.zeros(2, 5, 4)
BAD_CALLS = [
    pytest.param(lambda: kernels.short_conv(_X[0], torch.zeros(3, 4)), "x must have 3", id="short-x-2d"),
    pytest.param(lambda: kernels.short_conv(_X, torch.zeros(3, 5)), "weight must be", id="short-weight-D"),
    pytest.param(lambda: kernels.short_conv(_X.long(), torch.zeros(3, 4)), "x must be float", id="short-x-int"),
    pytest.param(lambda: kernels.short_conv(_X[:, :0], torch.zeros(3, 4)), "non-empty", id="short-T0"),
    pytest.param(
        lambda: kernels.dynamic_conv_headwise(_X, torch.zeros(2, 5, 3, 4)),
        "H=3",
        id="headwise-H-not-dividing-D",
    ),
    pytest.param(lambda: kernels.dynamic_conv_headwise(_X, torch.zeros(2, 4, 2, 4)), "T=5", id="headwise-weight-T"),
    pytest.param(
        lambda: kernels.dynamic_conv_headwise(_X, torch.zeros(2, 5, 2, 4), torch.zeros(3, 4)),
        "static_w",
        id="headwise-static-W",
    ),
    pytest.param(
        lambda: kernels.dynamic_conv_lowrank(_X, torch.zeros(2, 5, 3), torch.zeros(3, 10)),
        "U must",
        id="lowrank-U",
    ),
    pytest.param(
        lambda: kernels.dynamic_conv_lowrank(_X, torch.zeros(2, 5, 3), torch.zeros(2, 8)),
        "R=3",
        id="lowrank-R",
    ),
    pytest.param(
        lambda: kernels.dynamic_conv_lowrank(_X, torch.zeros(1, 5, 3), torch.zeros(3, 8)),
        "z must",
        id="lowrank-z",
    ),
    pytest.param(lambda: kernels.rubiconv(_X, torch.zeros(3, 8)), "h must be", id="rubiconv-h-D"),
    pytest.param(lambda: kernels.rubiconv(_X, torch.zeros(4, 8), block=0), "block", id="rubiconv-block-0"),
    pytest.param(lambda: kernels.rubiconv(_X, torch.zeros(4, 8), block=2.0), "block", id="rubiconv-block-float"),
    pytest.param(lambda: kernels.short_conv(_X, torch.zeros(3, 4), backend="cuda"), "'cuda'", id="unknown-backend"),
    pytest.param(lambda: kernels.rubiconv(_X, torch.zeros(4, 8), backend="fft"), "'fft'", id="unknown-backend-rc"),
]


@pytest.mark.parametrize("call, message", BAD_CALLS)
def test_bad_inputs_raise(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def calls(monkeypatch, module, name: str) -> list:
    """Replace ``module.name`` by a wrapper that records what each call returns in the returned list."""
    seen, real = [], getattr(module, name)

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(module, name, spy)
    return seen


def test_rubiconv_block_sets_the_gemm_form_and_the_reference_ignores_it(monkeypatch, assert_rel_rms):
    """A block becomes the GEMM plan's column count k, and every k gives numpy's convolution; "torch" takes a
    block without building a plan."""
    op = importlib.import_module("mixlab.kernels.rubiconv.op")
    plans, references = calls(monkeypatch, op, "get_plan"), calls(monkeypatch, op, "rubiconv_ref")
    B, T, D, rows = 2, 20, 3, [[7, 13], [20]]
    gen = torch.Generator().manual_seed(5)
    cu = _cu(rows, T)
    x, h = _randn(gen, B, T, D), _randn(gen, D, 9)
    flat = x.reshape(-1, D).numpy()
    y_np, _, _ = _numpy_rubiconv(flat, h.numpy(), _docs(cu, B, T), np.zeros_like(flat))
    expected = torch.from_numpy(y_np).view(B, T, D)
    for block in (3, 8):
        assert_rel_rms(kernels.rubiconv(x, h, cu_seqlens=cu, block=block, backend="gemm"), expected,
                       torch.float64, f"y at block {block}")
        assert plans[-1].k == block
    assert not references
    plans.clear()
    assert_rel_rms(kernels.rubiconv(x, h, cu_seqlens=cu, block=3, backend="torch"), expected, torch.float64, "y")
    assert len(references) == 1 and not plans


def test_auto_backend_follows_the_device_and_the_registry(monkeypatch):
    monkeypatch.delenv("MIXLAB_BACKEND", raising=False)
    on_cuda = types.SimpleNamespace(is_cuda=True)
    assert kutils.resolve_backend(None, _X) == "torch"
    assert kutils.resolve_backend(None, on_cuda) == "triton"
    assert kutils.resolve_backend(None, on_cuda, op="short_conv") == "triton"  # registered by its op.py
    assert kutils.resolve_backend(None, on_cuda, op="no_kernel") == "torch"
    monkeypatch.setattr(kutils, "TRITON_OPS", {"short_conv"})
    assert kutils.resolve_backend(None, on_cuda, op="short_conv") == "triton"
    assert kutils.resolve_backend(None, on_cuda, op="rubiconv") == "torch"
    assert kutils.resolve_backend("torch", on_cuda, op="short_conv") == "torch"


def test_mixlab_backend_env_var(monkeypatch):
    monkeypatch.setenv("MIXLAB_BACKEND", "triton")
    on_cpu = types.SimpleNamespace(is_cuda=False)
    assert kutils.resolve_backend(None, on_cpu) == "triton"
    assert kutils.resolve_backend(None, on_cpu, op="no_kernel") == "torch"
    assert kutils.resolve_backend("torch", on_cpu) == "torch"
    monkeypatch.setattr(kutils, "TRITON_OPS", set())
    op = importlib.import_module("mixlab.kernels.short_conv.op")
    references, kernel_calls = calls(monkeypatch, op, "short_conv_ref"), calls(monkeypatch, op, "short_conv_triton")
    y = kernels.short_conv(_X + 1, torch.ones(3, 4))  # no kernel registered: auto falls back to the reference
    assert len(references) == 1 and not kernel_calls
    assert torch.equal(y, torch.tensor([1.0, 2.0, 3.0, 3.0, 3.0])[None, :, None].expand(2, 5, 4)), "3 taps of ones"
    monkeypatch.setenv("MIXLAB_BACKEND", "torch")
    assert kutils.resolve_backend(None, types.SimpleNamespace(is_cuda=True)) == "torch"
    monkeypatch.setenv("MIXLAB_BACKEND", "cuda")
    with pytest.raises(ValueError, match="MIXLAB_BACKEND='cuda'"):
        kernels.rubiconv(_X, torch.zeros(4, 8))


def test_cu_seqlens_validated_once_per_layout_and_again_after_a_change():
    x = torch.randn(2, 4, 3)
    cu = torch.tensor([0, 4, 8], dtype=torch.int32)
    kutils.check_cu_seqlens(cu, x)
    assert kutils._VALIDATED[id(cu)][1] == (2, 4, cu._version)
    cu[1] = 5  # in place: a document now spans rows, and the version counter moved on
    with pytest.raises(ValueError, match="row end"):
        kutils.check_cu_seqlens(cu, x)
    with pytest.raises(ValueError, match="B\\*T"):
        kutils.check_cu_seqlens(torch.tensor([0, 4, 8], dtype=torch.int32), torch.randn(3, 4, 3))


def test_host_offsets_read_the_kept_copy_of_a_tensor_and_its_views():
    """remember_host_copy (offsets_to_device on a GPU): host_offsets answers from the host copy, for the tensor and
    for a view (one run's row of a stack's [N, S + 1] offsets), until an in-place change; else it reads the
    tensor. A copy with other values stands for the host copy here, so the test can tell which was read."""
    stacked = torch.tensor([[0, 4, 8], [0, 2, 8]], dtype=torch.int32)  # [N=2, S+1]
    kutils.remember_host_copy(stacked, stacked + 100)
    assert kutils.host_offsets(stacked).tolist() == [[100, 104, 108], [100, 102, 108]]
    assert kutils.host_offsets(stacked.select(0, 1)).tolist() == [100, 102, 108]
    assert kutils.host_offsets(stacked[:, 1]).tolist() == [104, 102]
    stacked.add_(0)  # an in-place op: the copy may be stale
    assert kutils.host_offsets(stacked.select(0, 1)).tolist() == [0, 2, 8]
    assert kutils.host_offsets(torch.tensor([0, 3], dtype=torch.int32)).tolist() == [0, 3]


def test_row_starts_and_rows_cu_seqlens_against_doc_ids_to_cu_seqlens():
    """The static layout of a batch is doc_ids_to_cu_seqlens's with empty documents added (repeated offsets)."""
    g = torch.Generator().manual_seed(0)
    doc_ids = (torch.rand(5, 17, generator=g) < 0.3).long().cumsum(dim=1)  # [5, 17], random documents
    doc_ids[2] = 0  # a one-document row
    slots = kutils.max_docs_per_row(doc_ids)
    assert slots == int(max(len(row.unique()) for row in doc_ids))
    for extra in (0, 3):
        starts = kutils.row_starts(doc_ids, slots + extra)  # [5, slots + extra]
        cu = kutils.rows_cu_seqlens(starts, 17)
        assert cu.shape == (5 * (slots + extra) + 1,) and cu.dtype == torch.int32
        kutils.validate_cu_seqlens(cu, 5, 17)
        assert cu.unique_consecutive().tolist() == kutils.doc_ids_to_cu_seqlens(doc_ids).tolist()
    stacked = kutils.rows_cu_seqlens(torch.stack([starts, starts.flip(0)]), 17)  # [2, 5 * S + 1]: per run
    assert torch.equal(stacked[0], cu) and torch.equal(stacked[1], kutils.rows_cu_seqlens(starts.flip(0), 17))
