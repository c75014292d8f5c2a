"""The Triton short-convolution kernels (issue #4) against the float64 torch reference.

Without CUDA they run in the Triton interpreter (tests/kernels/conftest.py sets TRITON_INTERPRET=1 before
`kernels` is imported), with CUDA on the GPU. Every comparison covers the output and the gradient of every
input, driven by a random upstream gradient, and every buffer the launchers allocate starts full of NaN.
"""

import functools

import pytest
import torch
import triton
from kernel_checks import assert_stacked_runs_equal_alone, cu_from_rows
from mixlab import kernels
from mixlab.kernels import triton_utils as tu
from mixlab.kernels import utils as kutils
from mixlab.kernels.dynamic_conv import triton_headwise, triton_lowrank
from mixlab.kernels.short_conv import op as short_op
from mixlab.kernels.short_conv import triton as short_triton

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every launcher buffer (outputs and fp32 partials) starts full of NaN: an unwritten element fails."""
    monkeypatch.setattr(tu, "POISON_OUTPUTS", True)


def _cu(rows: list[list[int]] | None, T: int) -> torch.Tensor | None:
    return cu_from_rows(rows, T, DEVICE)


def _randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(DEVICE)


def _fwd_bwd(op, inputs: dict, upstream: torch.Tensor, backend: str, **kwargs):
    """Leaves from inputs (None entries passed as None), op forward, gradients of every leaf -> (y, grads)."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in inputs.items() if v is not None}
    args = {k: leaves.get(k) for k in inputs}
    y = op(**args, **kwargs, backend=backend)
    grads = torch.autograd.grad(y, list(leaves.values()), upstream.to(y.dtype))
    return y, dict(zip(leaves, grads, strict=True))


def _check_against_reference(op, inputs: dict, gen, assert_rel_rms, bound_dtype, **kwargs) -> None:
    """Triton output and every input gradient against the float64 reference on the same rounded inputs."""
    x = inputs["x"]
    upstream = _randn(gen, *x.shape).to(x.dtype)
    y, grads = _fwd_bwd(op, inputs, upstream, "triton", **kwargs)
    _assert_matches_reference(op, inputs, upstream, y, grads, assert_rel_rms, bound_dtype, **kwargs)


def _assert_matches_reference(op, inputs: dict, upstream: torch.Tensor, y: torch.Tensor, grads: dict,
                              assert_rel_rms, bound_dtype, **kwargs) -> None:
    """Triton's (y, grads) of op at inputs and upstream against the float64 reference."""
    x = inputs["x"]
    assert y.dtype == x.dtype
    as64 = {k: None if v is None else v.double() for k, v in inputs.items()}
    y_ref, grads_ref = _fwd_bwd(op, as64, upstream.double(), "torch", **kwargs)
    assert_rel_rms(y, y_ref, bound_dtype, "y")
    for name, grad in grads.items():
        assert grad.dtype == inputs[name].dtype, f"d{name} is {grad.dtype}"
        assert_rel_rms(grad, grads_ref[name], bound_dtype, f"d{name}")


FP32, BF16, FP16 = torch.float32, torch.bfloat16, torch.float16

SHORT_CASES = [
    # B, T, D, W, document lengths per row (None: one per row), residual, dtype
    pytest.param(1, 1, 1, 1, None, False, FP32, id="T1-D1-W1"),
    pytest.param(2, 1, 65, 4, None, True, FP32, id="T1-D65-W4-residual"),
    pytest.param(1, 63, 127, 4, None, False, FP32, id="T63-D127-W4"),
    pytest.param(2, 9, 257, 5, [[4, 5], [9]], True, FP32, id="D257-three-channel-blocks"),
    pytest.param(2, 65, 63, 3, [[20, 1, 44], [65]], True, FP32, id="T65-D63-W3-docs-residual"),
    pytest.param(2, 20, 5, 8, [[3, 5, 2, 7, 3], [6, 0, 14]], False, FP32, id="W8-docs-shorter-than-W-empty"),
    pytest.param(3, 16, 1, 2, [[1] * 16, [2, 3, 0, 0, 11], [16]], True, FP32, id="D1-length1-docs-empty"),
    pytest.param(2, 127, 3, 6, [[1, 2, 7, 0, 40, 77], [127]], False, FP32, id="T127-D3-W6-docs"),
    pytest.param(3, 127, 65, 4, [[60, 67], [127], [1] * 27 + [100]], True, BF16, id="bf16-T127-D65-docs"),
    pytest.param(2, 65, 63, 4, [[20, 1, 44], [65]], False, FP16, id="fp16-T65-D63-docs"),
]


@pytest.mark.parametrize("B, T, D, W, rows, residual, dtype", SHORT_CASES)
def test_short_conv(B, T, D, W, rows, residual, dtype, assert_rel_rms):
    gen = torch.Generator().manual_seed(10)
    inputs = {"x": _randn(gen, B, T, D).to(dtype), "weight": _randn(gen, W, D).to(dtype)}
    op = kernels.short_conv
    _check_against_reference(
        op, inputs, gen, assert_rel_rms, dtype, cu_seqlens=_cu(rows, T), residual=residual
    )


@pytest.mark.parametrize("B, T, D, W, rows, residual, dtype", SHORT_CASES + [  # widths 1-8: a sum each
    pytest.param(1, 20, 5, 9, [[3, 17]], True, FP32, id="W9-per-tile-sums")])  # past 8: the per-tile form
def test_short_conv_dw_other_summation(B, T, D, W, rows, residual, dtype, monkeypatch, assert_rel_rms):
    """The backward with dw summed the other way (a tune knob: every tile, or deferred to the end of each chunk),
    tiles of 8 tokens and 16 channels, 4 programs a channel block (several tiles a chunk); the tiled forms."""
    _stream(monkeypatch, False)
    monkeypatch.setattr(short_triton, "BWD_DW_DEFER", not short_triton.BWD_DW_DEFER)
    monkeypatch.setattr(short_triton, "BWD_BT", 8)
    monkeypatch.setattr(short_triton, "BWD_BD", 16)
    monkeypatch.setattr(short_triton, "BWD_PROGRAMS", 4)
    test_short_conv(B, T, D, W, rows, residual, dtype, assert_rel_rms)


def _stream(monkeypatch, on: bool, ch: int = 12, u: int = 4, bd: int = 64, prefetch: bool = False) -> None:
    """Both streaming forms on or off; on, programs of ``ch`` positions walked ``u`` at a time (several programs a
    row, several steps a program, a last step past T) and ``bd`` channels; on, also under the interpreter."""
    monkeypatch.setattr(tu, "STREAM_UNDER_INTERPRETER", on)
    for form in ("FWD", "BWD"):
        monkeypatch.setattr(short_triton, f"STREAM_{form}_PREFETCH", prefetch)
        monkeypatch.setattr(short_triton, f"{form}_STREAM", on)
        monkeypatch.setattr(short_triton, f"STREAM_{form}_CH", ch)
        monkeypatch.setattr(short_triton, f"STREAM_{form}_U", u)
        monkeypatch.setattr(short_triton, f"STREAM_{form}_BD", bd)


@pytest.mark.parametrize("B, T, D, W, rows, residual, dtype", SHORT_CASES + [
    # documents of every length 1-15 in a row: with steps of 4 a document ends at every offset of a step and of
    # its W - 1 rows on either side, so the check that a step lies in one document is tried at each edge
    pytest.param(2, 127, 20, 4, [list(range(1, 16)) + [7], list(range(15, 0, -1)) + [7]], True, FP32,
                 id="docs-of-every-length-W4"),
    pytest.param(1, 127, 20, 3, [list(range(1, 16)) + [7]], False, FP32, id="docs-of-every-length-W3"),
    pytest.param(1, 20, 5, 9, [[3, 17]], True, FP32, id="W9-tiled")])  # past 8 taps: the tiled form
def test_short_conv_streaming_forms(B, T, D, W, rows, residual, dtype, monkeypatch, assert_rel_rms):
    """The forward and backward that walk each row's positions, with steps and programs small enough that the
    cases cross them."""
    _stream(monkeypatch, True)
    test_short_conv(B, T, D, W, rows, residual, dtype, assert_rel_rms)


@pytest.mark.parametrize("B, T, D, W, rows, residual, dtype",
                         [c for c in SHORT_CASES if c.values[4] is not None or c.id == "T1-D1-W1"] + [
                             pytest.param(2, 127, 20, 4, [list(range(1, 16)) + [7], [127]], True, FP32,
                                          id="docs-of-every-length-W4"),
                             pytest.param(1, 40, 8, 1, [[17, 23]], False, FP32, id="W1")])
def test_short_conv_streaming_prefetched(B, T, D, W, rows, residual, dtype, monkeypatch, assert_rel_rms):
    """The streaming forms with the next step's rows loaded before each step's work (a tune knob), on the cases
    with documents, a width of 1 (no rows shared between steps) and one of a single position."""
    _stream(monkeypatch, True, prefetch=True)
    test_short_conv(B, T, D, W, rows, residual, dtype, assert_rel_rms)


@pytest.mark.parametrize("W", range(1, 9), ids=lambda w: f"W{w}")
def test_short_conv_every_width(W, assert_rel_rms):
    gen = torch.Generator().manual_seed(W)
    B, T, D, rows = 2, 12, 3, [[1, W, 11 - W], [12]]
    inputs = {"x": _randn(gen, B, T, D).float(), "weight": _randn(gen, W, D).float()}
    _check_against_reference(kernels.short_conv, inputs, gen, assert_rel_rms, FP32, cu_seqlens=_cu(rows, T))


HEADWISE_CASES = [
    # B, T, D, head size, W, document lengths per row, residual, static_w, dtype
    pytest.param(1, 1, 1, 1, 1, None, False, False, FP32, id="T1-D1-hs1-W1"),
    pytest.param(
        2, 65, 63, 1, 4, [[20, 1, 44], [65]], True, True, FP32, id="hs1-T65-D63-docs-static-residual"
    ),
    pytest.param(2, 9, 257, 1, 3, [[4, 5], [9]], False, True, FP32, id="hs1-D257-three-head-blocks"),
    pytest.param(1, 63, 6, 2, 3, None, False, True, FP32, id="hs2-T63-D6-H3-static"),
    pytest.param(2, 20, 20, 4, 8, [[3, 5, 2, 7, 3], [1] * 20], True, False, FP32, id="hs4-H5-W8-short-docs"),
    pytest.param(2, 127, 64, 16, 5, [[1, 2, 7, 0, 40, 77], [127]], False, True, FP32, id="hs16-T127-W5-docs"),
    pytest.param(1, 9, 256, 128, 2, None, True, True, FP32, id="hs128-D256-one-head-a-tile"),
    pytest.param(2, 17, 9, 3, 4, [[5, 12], [17]], False, True, FP32, id="hs3-not-a-power-of-two"),
    pytest.param(3, 65, 32, 2, 4, [[60, 5], [65], [1] * 15 + [50]], True, True, BF16, id="bf16-hs2-docs"),
    pytest.param(2, 63, 32, 16, 4, [[20, 43], [63]], False, True, FP16, id="fp16-hs16-docs"),
]


@pytest.mark.parametrize("B, T, D, hs, W, rows, residual, static, dtype", HEADWISE_CASES)
def test_dynamic_conv_headwise(B, T, D, hs, W, rows, residual, static, dtype, assert_rel_rms):
    gen = torch.Generator().manual_seed(11)
    inputs = {
        "x": _randn(gen, B, T, D).to(dtype),
        "weight": _randn(gen, B, T, D // hs, W).to(dtype),
        "static_w": _randn(gen, W, D).to(dtype) if static else None,
    }
    op = kernels.dynamic_conv_headwise
    _check_against_reference(
        op, inputs, gen, assert_rel_rms, dtype, cu_seqlens=_cu(rows, T), residual=residual
    )


def _hw_stream(monkeypatch, on: bool, ch: int = 12, u: int = 4, bd: int = 64, dw_tile: bool = False,
               w_rows: bool = False, fwd_w_rows: bool = False) -> None:
    """Both head-wise streaming forms on (every head size) or off, as ``_stream``: ``bd`` channels a program (at
    least one head); on, also under the interpreter."""
    monkeypatch.setattr(tu, "STREAM_UNDER_INTERPRETER", on)
    monkeypatch.setattr(triton_headwise, "HW_FWD_STREAM_HS", 1 << 30 if on else 0)
    monkeypatch.setattr(triton_headwise, "HW_BWD_STREAM_HS", 1 << 30 if on else 0)
    monkeypatch.setattr(triton_headwise, "HW_STREAM_BWD_DW_TILE", dw_tile)
    monkeypatch.setattr(triton_headwise, "HW_STREAM_BWD_W_ROWS", w_rows)
    monkeypatch.setattr(triton_headwise, "HW_FWD_STREAM_W_ROWS", fwd_w_rows)
    monkeypatch.setattr(triton_headwise, "HW_FWD_STREAM_WIDE", False)  # wide heads on the plain layout too
    monkeypatch.setattr(triton_headwise, "HW_BWD_STREAM_WIDE", False)
    for form in ("FWD", "BWD"):
        monkeypatch.setattr(triton_headwise, f"HW_STREAM_{form}_CH", ch)
        monkeypatch.setattr(triton_headwise, f"HW_STREAM_{form}_U", u)
        monkeypatch.setattr(triton_headwise, f"HW_STREAM_{form}_BD", bd)


@pytest.mark.parametrize("B, T, D, hs, W, rows, residual, static, dtype", HEADWISE_CASES + [
    pytest.param(2, 127, 20, 2, 4, [list(range(1, 16)) + [7], list(range(15, 0, -1)) + [7]], True, True, FP32,
                 id="docs-of-every-length-hs2-W4"),
    pytest.param(1, 127, 8, 8, 3, [list(range(1, 16)) + [7]], False, False, FP32, id="docs-of-every-length-hs8-W3"),
    pytest.param(1, 20, 6, 3, 9, [[3, 17]], True, True, FP32, id="W9-tiled")])
def test_dynamic_conv_headwise_streaming_forms(B, T, D, hs, W, rows, residual, static, dtype, monkeypatch,
                                               assert_rel_rms):
    """The head-wise forward and backward that walk each row's positions (steps and programs small enough that the
    cases cross them; documents ending at every offset of a step)."""
    _hw_stream(monkeypatch, True)
    test_dynamic_conv_headwise(B, T, D, hs, W, rows, residual, static, dtype, assert_rel_rms)


@pytest.mark.parametrize("B, T, D, hs, W, rows, residual, static, dtype",
                         [c for c in HEADWISE_CASES if c.id in ("hs16-T127-W5-docs", "hs128-D256-one-head-a-tile",
                                                                 "fp16-hs16-docs", "hs3-not-a-power-of-two")] + [
    pytest.param(1, 127, 8, 8, 3, [list(range(1, 16)) + [7]], False, False, FP32, id="docs-of-every-length-hs8-W3"),
    pytest.param(2, 50, 48, 16, 4, [[1, 2, 3, 4, 40], [50]], True, True, FP32, id="hs16-W4-H3-docs-static-residual")])
@pytest.mark.parametrize("prefetch", [False, True], ids=["", "prefetched"])
def test_dynamic_conv_headwise_streaming_wide_heads(B, T, D, hs, W, rows, residual, static, dtype, prefetch,
                                                   monkeypatch, assert_rel_rms):
    """The streaming forward and backward of wide heads, with a head's channels laid out as [groups, padded width]
    (each channel reads the tap of its place in the group; dweight gathered on that axis), where the head size is a
    multiple of the padded width (hs3 takes the tiled kernels); 128 channels a program, so two of them split H=3 heads
    of 16 and the second is partly masked. Prefetched: both carry the rows they share with the next step (x; the
    backward also dy and the weights) in registers."""
    _hw_stream(monkeypatch, False)
    monkeypatch.setattr(tu, "STREAM_UNDER_INTERPRETER", True)
    monkeypatch.setattr(triton_headwise, "HW_STREAM_FWD_WIDE_PREFETCH", prefetch)
    monkeypatch.setattr(triton_headwise, "HW_STREAM_BWD_WIDE_PREFETCH", prefetch)
    for form in ("FWD", "BWD"):
        monkeypatch.setattr(triton_headwise, f"HW_{form}_STREAM_WIDE", True)
        for name, value in (("CH", 12), ("U", 4), ("BD", 128)):
            monkeypatch.setattr(triton_headwise, f"HW_STREAM_{form}_WIDE_{name}", value)
    test_dynamic_conv_headwise(B, T, D, hs, W, rows, residual, static, dtype, assert_rel_rms)


@pytest.mark.parametrize("B, T, D, hs, W, rows, residual, static, dtype",
                         [c for c in HEADWISE_CASES if c.values[4] in (2, 4) and c.values[0] * c.values[1] > 1] + [
                             pytest.param(2, 60, 12, 1, 2, [[1, 2, 3, 4, 50], [60]], True, False, FP32,
                                          id="hs1-W2-docs")])
@pytest.mark.parametrize("dw_tile, w_rows, fwd_w_rows", [(True, False, False), (False, True, False),
                                                       (True, True, True)],
                         ids=["dweight-tile", "weight-rows", "all-with-forward-rows"])
def test_dynamic_conv_headwise_streaming_dweight_tile(B, T, D, hs, W, rows, residual, static, dtype, dw_tile, w_rows,
                                                      fwd_w_rows, monkeypatch, assert_rel_rms):
    """The streaming forms' tune knobs of widths 2 and 4, at every head size: each position's dweight stored as
    one [heads, W] tile, the backward's weights read as one [heads, W] row a position and split into taps in
    registers, or both, and then the forward's weights read as rows too."""
    _hw_stream(monkeypatch, True, dw_tile=dw_tile, w_rows=w_rows, fwd_w_rows=fwd_w_rows)
    test_dynamic_conv_headwise(B, T, D, hs, W, rows, residual, static, dtype, assert_rel_rms)


@pytest.mark.parametrize("B, T, D, hs, W, rows, residual, static, dtype", [
    c for c in HEADWISE_CASES if c.values[3] == 1] + [
    pytest.param(2, 127, 20, 2, 4, [list(range(1, 16)) + [7], list(range(15, 0, -1)) + [7]], True, True, FP32,
                 id="docs-of-every-length-hs2-W4")])
@pytest.mark.parametrize("u", [1, 4])
def test_dynamic_conv_headwise_streaming_prefetched(B, T, D, hs, W, rows, residual, static, dtype, u, monkeypatch,
                                                    assert_rel_rms):
    """The streaming forward and backward on the plain layout carrying the rows they share with the next step (x;
    the backward also dy) in registers, with the weights read as rows and without, one position a step or four (12
    a program)."""
    _hw_stream(monkeypatch, True, u=u, w_rows=W in (2, 4), fwd_w_rows=W in (2, 4))
    monkeypatch.setattr(triton_headwise, "HW_STREAM_FWD_PREFETCH", True)
    monkeypatch.setattr(triton_headwise, "HW_STREAM_BWD_PREFETCH", True)
    test_dynamic_conv_headwise(B, T, D, hs, W, rows, residual, static, dtype, assert_rel_rms)


@pytest.mark.parametrize("hs, W, streams", [(1, 4, True), (16, 4, True), (8, 4, True), (16, 3, True), (6, 2, True),
                                             (3, 4, False), (2, 4, False), (3, 2, False)],
                         ids=["hs1", "hs16", "hs8", "hs16-W3", "hs6-W2", "hs3", "hs2-W4", "hs3-W2"])
def test_shipped_constants_stream_only_the_head_sizes_timed_streaming(hs, W, streams, monkeypatch):
    """At the shipped constants head size 1 streams on the plain layout and head sizes that are multiples of the
    padded width on the taps-aligned one; the others, for which no streaming form was timed faster, take the
    tiled kernels, forward and backward."""
    monkeypatch.setattr(tu, "STREAM_UNDER_INTERPRETER", True)
    spies = {}
    for name in ("_headwise_fwd_stream_kernel", "_headwise_bwd_stream_kernel"):
        spies[name] = _LaunchSpy(getattr(triton_headwise, name))
        monkeypatch.setattr(triton_headwise, name, spies[name])
    gen = torch.Generator().manual_seed(0)
    x = _randn(gen, 1, 6, 2 * hs).float().requires_grad_()
    weight = _randn(gen, 1, 6, 2, W).float().requires_grad_()
    kernels.dynamic_conv_headwise(x, weight, backend="triton").sum().backward()
    assert [bool(spy.grids) for spy in spies.values()] == [streams, streams]


@pytest.mark.parametrize("B, T, D, hs, W, rows, residual, static, dtype",
                         [case for case in HEADWISE_CASES if case.values[3] == 1])
def test_dynamic_conv_headwise_hs1_other_backward(B, T, D, hs, W, rows, residual, static, dtype, monkeypatch,
                                                  assert_rel_rms):
    """Head size 1 has two backward kernels (a tune knob: the taps as a tile axis, or the kernel of every other
    head size): the one not shipped, on the head size 1 cases."""
    _hw_stream(monkeypatch, False)  # the tiled kernels
    monkeypatch.setattr(triton_headwise, "HW_HS1_BWD_TAPS_AXIS", not triton_headwise.HW_HS1_BWD_TAPS_AXIS)
    test_dynamic_conv_headwise(B, T, D, hs, W, rows, residual, static, dtype, assert_rel_rms)


@pytest.mark.parametrize("B, T, D, hs, W, rows, residual, static, dtype",
                         [case for case in HEADWISE_CASES if case.id == "hs1-T65-D63-docs-static-residual"])
def test_dynamic_conv_headwise_hs1_dstatic_summed_once_a_chunk(B, T, D, hs, W, rows, residual, static, dtype,
                                                               monkeypatch, assert_rel_rms):
    """The head size 1 taps-axis backward with its dstatic_w sums deferred to the end of each chunk (a tune
    knob), with documents and static weights, several tiles a chunk (tiles of 8 tokens, 4 programs a head
    block)."""
    _hw_stream(monkeypatch, False)  # the tiled kernels
    monkeypatch.setattr(triton_headwise, "HW_HS1_BWD_TAPS_AXIS", True)
    monkeypatch.setattr(triton_headwise, "HW_HS1_BWD_DS_DEFER", not triton_headwise.HW_HS1_BWD_DS_DEFER)
    monkeypatch.setattr(triton_headwise, "HW_HS1_BWD_TILE", 32)
    monkeypatch.setattr(triton_headwise, "HW_HS1_BWD_CHANNELS", 4)
    monkeypatch.setattr(triton_headwise, "HW_BWD_PROGRAMS", 4)
    test_dynamic_conv_headwise(B, T, D, hs, W, rows, residual, static, dtype, assert_rel_rms)


@pytest.mark.parametrize("B, T, D, hs, W, rows, residual, static, dtype",
                         [case for case in HEADWISE_CASES if case.values[3] > 1 and case.values[7]] + [
                             pytest.param(2, 20, 20, 4, 8, [[3, 5, 2, 7, 3], [1] * 20], True, True, FP32,
                                          id="hs4-W8-every-slot-a-sum"),
                             pytest.param(1, 20, 8, 2, 9, [[3, 17]], True, True, FP32,
                                          id="hs2-W9-per-tile-sums")])  # past 8 taps: the per-tile form
def test_dynamic_conv_headwise_dstatic_summed_once_a_chunk(B, T, D, hs, W, rows, residual, static, dtype,
                                                           monkeypatch, assert_rel_rms):
    """The backward of every head size with its dstatic_w sums deferred to the end of each chunk (a tune knob),
    on the cases with static weights, several tiles a chunk (4 programs a head block)."""
    _hw_stream(monkeypatch, False)  # the tiled kernels
    monkeypatch.setattr(triton_headwise, "HW_BWD_DS_DEFER", not triton_headwise.HW_BWD_DS_DEFER)
    monkeypatch.setattr(triton_headwise, "HW_BWD_PROGRAMS", 4)
    test_dynamic_conv_headwise(B, T, D, hs, W, rows, residual, static, dtype, assert_rel_rms)


@pytest.mark.parametrize("gather", [True, False], ids=["gathered", "loaded-where-used"])
@pytest.mark.parametrize("B, T, D, hs, W, rows, residual, static, dtype",
                         [case for case in HEADWISE_CASES if case.values[3] == 1])
def test_dynamic_conv_headwise_hs1_weights_read_as_stored_then_gathered(B, T, D, hs, W, rows, residual, static,
                                                                       dtype, gather, monkeypatch, assert_rel_rms):
    """The head size 1 taps-axis backward both ways of reading weight[t + k, d, k] (a tune knob): rows of weight
    and dy read as stored and each output's taps picked out of the tile, or each element loaded where used; on
    the head size 1 cases with several tiles a chunk (tiles of 8 tokens). The launches must have taken the path
    asked for (gathering needs W - 1 <= 8, which every case here has)."""
    _hw_stream(monkeypatch, False)  # the tiled kernels
    monkeypatch.setattr(triton_headwise, "HW_HS1_BWD_TAPS_AXIS", True)
    monkeypatch.setattr(triton_headwise, "HW_HS1_BWD_GATHER", gather)
    monkeypatch.setattr(triton_headwise, "HW_HS1_BWD_TILE", 32)
    monkeypatch.setattr(triton_headwise, "HW_HS1_BWD_CHANNELS", 4)
    monkeypatch.setattr(triton_headwise, "HW_BWD_PROGRAMS", 4)
    kernel, flags = triton_headwise._headwise_hs1_bwd_kernel, []

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                flags.append(kwargs["GATHER"])
                return kernel[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(triton_headwise, "_headwise_hs1_bwd_kernel", Spy())
    test_dynamic_conv_headwise(B, T, D, hs, W, rows, residual, static, dtype, assert_rel_rms)
    assert flags and all(flag == gather for flag in flags)


@pytest.mark.parametrize(("hs", "D", "other_way"),
                         [(1, 26, False), (1, 26, True), (1, 26, "taps axis"), (8, 24, True)],
                         ids=["hs1-D26-four-heads-a-tile", "hs1-D26-taps-the-other-way", "hs1-D26-taps-axis-bwd",
                              "hs8-one-head-a-tile"])
def test_dynamic_conv_headwise_tune_knobs(hs, D, other_way, monkeypatch, assert_rel_rms):
    """The tune script's knobs, forward and backward: tiles of 4 channels (at head size 1, 7 head blocks, the
    last one half full; at head size 8, heads wider than the block, one a tile); the weights read and dweight
    stored tap by tap or as one tile; at head size 1 the taps-axis backward on its own tile of 4 channels; the
    forward's tile of its head size (head size 1, or wider heads)."""
    _hw_stream(monkeypatch, False)  # the tiled kernels
    monkeypatch.setattr(triton_headwise, "HW_FWD_TILE_WIDE", 2 * triton_headwise.HW_FWD_TILE)
    monkeypatch.setattr(triton_headwise, "HW_FWD_CHANNELS", 4)
    monkeypatch.setattr(triton_headwise, "HW_BWD_CHANNELS", 4)
    monkeypatch.setattr(triton_headwise, "HW_HS1_BWD_TAPS_AXIS", other_way == "taps axis")
    if other_way == "taps axis":
        monkeypatch.setattr(triton_headwise, "HW_HS1_BWD_TILE", 16)
        monkeypatch.setattr(triton_headwise, "HW_HS1_BWD_CHANNELS", 4)
        other_way = False
    tiles = []  # (tile, channels) of every launch
    head_tiles = triton_headwise._head_tiles
    monkeypatch.setattr(triton_headwise, "_head_tiles", lambda *a: tiles.append(a[3:]) or head_tiles(*a))
    monkeypatch.setattr(triton_headwise, "HW_FWD_TAP_LOADS", other_way)
    monkeypatch.setattr(triton_headwise, "HW_BWD_DW_TILE", other_way)
    gen = torch.Generator().manual_seed(12)
    B, T, W = 2, 33, 4
    inputs = {
        "x": _randn(gen, B, T, D).float(),
        "weight": _randn(gen, B, T, D // hs, W).float(),
        "static_w": _randn(gen, W, D).float(),
    }
    _check_against_reference(kernels.dynamic_conv_headwise, inputs, gen, assert_rel_rms, FP32,
                             cu_seqlens=_cu([[5, 28], [33]], T), residual=True)
    backward_tile = (16, 4) if triton_headwise.HW_HS1_BWD_TAPS_AXIS else (triton_headwise.HW_BWD_TILE, 4)
    forward_tile = triton_headwise.HW_FWD_TILE if hs == 1 else triton_headwise.HW_FWD_TILE_WIDE
    assert set(tiles) == {(forward_tile, 4), backward_tile}


LOWRANK_CASES = [
    # B, T, D, R, W, document lengths per row, residual, static_w, dtype
    pytest.param(1, 1, 1, 1, 1, None, False, False, FP32, id="T1-D1-R1-W1"),
    pytest.param(1, 63, 65, 8, 4, None, False, True, FP32, id="R8-T63-D65-static"),
    pytest.param(2, 65, 63, 16, 3, [[20, 1, 44], [65]], True, False, FP32, id="R16-T65-D63-W3-docs-residual"),
    pytest.param(
        2, 20, 3, 16, 8, [[3, 5, 0, 2, 7, 3], [1] * 20], True, True, FP32, id="R16-W8-short-docs-empty"
    ),
    pytest.param(2, 127, 1, 3, 2, [[1, 2, 7, 0, 40, 77], [127]], False, True, FP32, id="R3-T127-D1-docs"),
    pytest.param(1, 33, 130, 20, 6, [[1, 32]], False, True, FP32, id="R20-padded-to-32-W6"),
    pytest.param(3, 65, 63, 16, 4, [[60, 5], [65], [1] * 15 + [50]], True, True, BF16, id="bf16-R16-docs"),
    pytest.param(2, 63, 32, 8, 4, [[20, 43], [63]], False, True, FP16, id="fp16-R8-docs"),
]


@pytest.mark.parametrize("B, T, D, R, W, rows, residual, static, dtype", LOWRANK_CASES)
def test_dynamic_conv_lowrank(B, T, D, R, W, rows, residual, static, dtype, assert_rel_rms):
    gen = torch.Generator().manual_seed(12)
    inputs = {
        "x": _randn(gen, B, T, D).to(dtype),
        "z": _randn(gen, B, T, R).to(dtype),
        "U": _randn(gen, R, W * D).to(dtype),
        "static_w": _randn(gen, W, D).to(dtype) if static else None,
    }
    op = kernels.dynamic_conv_lowrank
    _check_against_reference(
        op, inputs, gen, assert_rel_rms, dtype, cu_seqlens=_cu(rows, T), residual=residual
    )


def test_mixed_dtypes_as_under_autocast(assert_rel_rms):
    """bf16 activations with fp32 parameters (the models under autocast): y in x's dtype, each gradient in
    its input's dtype, within the bf16 bound."""
    gen = torch.Generator().manual_seed(13)
    B, T, D, W, cu = 2, 33, 24, 4, _cu([[10, 23], [33]], 33)
    x = _randn(gen, B, T, D).to(BF16)
    static_w = _randn(gen, W, D).float()
    cases = [
        (kernels.short_conv, {"x": x, "weight": static_w}),
        (
            kernels.dynamic_conv_headwise,
            {"x": x, "weight": _randn(gen, B, T, 3, W).to(BF16), "static_w": static_w},
        ),
        (
            kernels.dynamic_conv_lowrank,
            {
                "x": x,
                "z": _randn(gen, B, T, 5).to(BF16),
                "U": _randn(gen, 5, W * D).float(),
                "static_w": static_w,
            },
        ),
    ]
    for op, inputs in cases:
        _check_against_reference(op, inputs, gen, assert_rel_rms, BF16, cu_seqlens=cu, residual=True)


# ---- poisoned outputs, non-contiguous inputs, determinism ----


def test_poisoned_buffer_shows_an_unwritten_tile():
    """Negative control: a launch whose grid misses the last row tile leaves NaN that the checks see."""
    gen = torch.Generator().manual_seed(14)
    T, D = 300, 8
    x, weight = _randn(gen, 1, T, D).float(), _randn(gen, 3, D).float()
    BT, BD = tu.tiles(T, D, short_triton.FWD_BT, short_triton.FWD_BD)
    assert BT < T, "the case needs two row tiles"
    y = tu.empty((1, T, D), x.dtype, x.device)
    assert torch.isnan(y).all()
    short_triton._short_conv_fwd_kernel[(1, 1, 1)](
        x, weight, y, None, T, D, 1, 0, 0, W=3, BT=BT, BD=BD, HAS_CU=False, RESIDUAL=False
    )
    assert torch.isfinite(y[:, :BT]).all()
    assert torch.isnan(y[:, BT:]).all()


def test_non_contiguous_inputs_and_upstream(assert_rel_rms):
    """A transposed x and the stride-0 upstream gradient of y.sum()."""
    gen = torch.Generator().manual_seed(15)
    B, T, D = 2, 19, 12
    x = _randn(gen, B, D, T).float().transpose(1, 2)  # [B, T, D], not contiguous
    z = _randn(gen, B, 3, T).float().transpose(1, 2)  # [B, T, 3]
    U, static_w = _randn(gen, 3, 4 * D).float(), _randn(gen, 4, D).float()
    results = {}
    for backend in ("triton", "torch"):
        leaves = [t.detach().clone().requires_grad_() for t in (x, z, U, static_w)]
        y = kernels.dynamic_conv_lowrank(*leaves, backend=backend)
        results[backend] = [y, *torch.autograd.grad(y.sum(), leaves)]
    for name, got, ref in zip(
        ["y", "dx", "dz", "dU", "dstatic_w"], results["triton"], results["torch"], strict=True
    ):
        assert_rel_rms(got, ref, FP32, name)


@pytest.mark.parametrize("B, T, D, R, W, rows, residual, static, dtype",
                         [case for case in LOWRANK_CASES if case.values[7]])
def test_dynamic_conv_lowrank_dstatic_summed_once_a_chunk(B, T, D, R, W, rows, residual, static, dtype,
                                                          monkeypatch, assert_rel_rms):
    """The wide dU kernel with its dstatic_w sums deferred to the end of each chunk or not (a tune knob: the other
    way than shipped), on the cases with static weights, several tiles a chunk (tiles of 16 tokens, 4 programs)."""
    monkeypatch.setattr(triton_lowrank, "LR_DU_FORM", "wide")
    monkeypatch.setattr(triton_lowrank, "LR_DU_DS_DEFER", not triton_lowrank.LR_DU_DS_DEFER)
    monkeypatch.setattr(triton_lowrank, "LR_DU_BT", 16)
    monkeypatch.setattr(triton_lowrank, "LOWRANK_BWD_PROGRAMS", 4)
    test_dynamic_conv_lowrank(B, T, D, R, W, rows, residual, static, dtype, assert_rel_rms)


@pytest.mark.parametrize("B, T, D, R, W, rows, residual, static, dtype", LOWRANK_CASES)
def test_dynamic_conv_lowrank_forward_taps_as_a_loop(B, T, D, R, W, rows, residual, static, dtype, monkeypatch,
                                                     assert_rel_rms):
    """The forward with its taps as a loop, not unrolled (a tune knob), or the other way round."""
    monkeypatch.setattr(triton_lowrank, "LR_FWD_TAP_LOOP", not triton_lowrank.LR_FWD_TAP_LOOP)
    test_dynamic_conv_lowrank(B, T, D, R, W, rows, residual, static, dtype, assert_rel_rms)


@pytest.mark.parametrize("B, T, D, R, W, rows, residual, static, dtype", LOWRANK_CASES)
def test_dynamic_conv_lowrank_forward_x_prefetched(B, T, D, R, W, rows, residual, static, dtype, monkeypatch,
                                                   assert_rel_rms):
    """The forward's tap loop with the next tap's x loaded ahead by hand (a tune knob)."""
    monkeypatch.setattr(triton_lowrank, "LR_FWD_TAP_LOOP", True)
    monkeypatch.setattr(triton_lowrank, "LR_FWD_PREFETCH", True)
    test_dynamic_conv_lowrank(B, T, D, R, W, rows, residual, static, dtype, assert_rel_rms)


@pytest.mark.parametrize("form", ["own", "dx"])
@pytest.mark.parametrize("B, T, D, R, W, rows, residual, static, dtype", LOWRANK_CASES)
def test_dynamic_conv_lowrank_dx_dy_prefetched(B, T, D, R, W, rows, residual, static, dtype, form, monkeypatch,
                                               assert_rel_rms):
    """The dx kernel's tap loop with the next tap's dy loaded ahead by hand (a tune knob), dz in a launch of its
    own or in the same one; channel blocks of 16, so each program walks several."""
    monkeypatch.setattr(triton_lowrank, "LR_DX_PREFETCH", True)
    monkeypatch.setattr(triton_lowrank, "LR_DZ_FORM", form)
    monkeypatch.setattr(triton_lowrank, "LR_DX_BD", 16)
    monkeypatch.setattr(triton_lowrank, "LR_DZ_SPLITS", 2)
    test_dynamic_conv_lowrank(B, T, D, R, W, rows, residual, static, dtype, assert_rel_rms)


@pytest.mark.parametrize("dz_form, du_form", [("own", "taps-t"), ("dx", "taps"), ("own", "wide")])
@pytest.mark.parametrize("B, T, D, R, W, rows, residual, static, dtype", LOWRANK_CASES)
def test_dynamic_conv_lowrank_dstatic_with_dz(B, T, D, R, W, rows, residual, static, dtype, dz_form, du_form,
                                              monkeypatch, assert_rel_rms):
    """dstatic_w summed in the launch that forms dz, a partial a token tile (a tune knob), and dU without the rank
    that carried it, in each dU form; tiles of 16 tokens and channel blocks of 16, several a program."""
    monkeypatch.setattr(triton_lowrank, "LR_DZ_DS", True)
    monkeypatch.setattr(triton_lowrank, "LR_DZ_FORM", dz_form)
    monkeypatch.setattr(triton_lowrank, "LR_DU_FORM", du_form)
    for name, value in [("LR_DX_BT", 16), ("LR_DX_BD", 16), ("LR_DZ_BT", 16), ("LR_DZ_BD", 16), ("LR_DZ_SPLITS", 2),
                        ("LR_DU_BD", 16), ("LR_DU_BT", 16), ("LOWRANK_BWD_PROGRAMS", 4)]:
        monkeypatch.setattr(triton_lowrank, name, value)
    test_dynamic_conv_lowrank(B, T, D, R, W, rows, residual, static, dtype, assert_rel_rms)


@pytest.mark.parametrize("form", ["wide", "taps", "taps-t"])
@pytest.mark.parametrize("B, T, D, R, W, rows, residual, static, dtype", LOWRANK_CASES)
def test_dynamic_conv_lowrank_du_forms(B, T, D, R, W, rows, residual, static, dtype, form, monkeypatch,
                                       assert_rel_rms):
    """dU and dstatic_w in each form the tune knob offers: from one [BT, W * BD] tile of g, or (dstatic_w as one
    more rank) from a [BT, BD] tile a tap, plain or transposed; with the dU launch of the shipped dz form, several
    tiles a chunk and channel blocks (tiles of 16 x 16, 4 programs)."""
    monkeypatch.setattr(triton_lowrank, "LR_DZ_FORM", "own")
    monkeypatch.setattr(triton_lowrank, "LR_DU_FORM", form)
    monkeypatch.setattr(triton_lowrank, "LR_DU_BD", 16)
    monkeypatch.setattr(triton_lowrank, "LR_DU_BT", 16)
    monkeypatch.setattr(triton_lowrank, "LOWRANK_BWD_PROGRAMS", 4)
    test_dynamic_conv_lowrank(B, T, D, R, W, rows, residual, static, dtype, assert_rel_rms)


@pytest.mark.parametrize("form", ["dx", "own", "fused", "with-du"])
@pytest.mark.parametrize("B, T, D, R, W, rows, residual, static, dtype", LOWRANK_CASES)
def test_dynamic_conv_lowrank_dz_forms(B, T, D, R, W, rows, residual, static, dtype, form, monkeypatch,
                                       assert_rel_rms):
    """dz summed in each place the tune knob offers: the dx kernel, a dz-only launch of it, or the fused backward
    kernel (one fp32 partial per channel block, dU and dstatic_w in the same pass), with dx there too or in a
    launch of its own; channel blocks of 16 (several partials and splits), several tiles a chunk (tiles of 16
    tokens, 4 programs); the dz-only launch on tiles of its own (16 x 32)."""
    monkeypatch.setattr(triton_lowrank, "LR_DZ_FORM", form)
    monkeypatch.setattr(triton_lowrank, "LR_DX_BD", 16)
    monkeypatch.setattr(triton_lowrank, "LR_DZ_BT", 16)
    monkeypatch.setattr(triton_lowrank, "LR_DZ_BD", 32)
    monkeypatch.setattr(triton_lowrank, "LR_DZ_SPLITS", 2)
    monkeypatch.setattr(triton_lowrank, "LR_DU_BD", 16)
    monkeypatch.setattr(triton_lowrank, "LR_DU_BT", 16)
    monkeypatch.setattr(triton_lowrank, "LOWRANK_BWD_PROGRAMS", 4)
    monkeypatch.setattr(triton_lowrank, "LR_FU_BD", 16)
    monkeypatch.setattr(triton_lowrank, "LR_FU_BT", 16)
    monkeypatch.setattr(triton_lowrank, "LR_FU_PROGRAMS", 4)
    test_dynamic_conv_lowrank(B, T, D, R, W, rows, residual, static, dtype, assert_rel_rms)


@pytest.mark.parametrize("dz_form, du_form, dz_ds", [("own", "taps-t", False), ("dx", "taps", False),
                                                      ("fused", "taps-t", False), ("with-du", "taps-t", False),
                                                      ("own", "taps-t", True), ("dx", "taps", True)])
@pytest.mark.parametrize("B, T, D, R, W, rows, residual, static, dtype", [
    pytest.param(2, 63, 32, 8, 4, [[20, 43], [63]], False, True, FP16, id="fp16-R8-docs"),
    pytest.param(2, 65, 63, 16, 3, [[20, 1, 44], [65]], True, False, FP16, id="fp16-R16-T65-D63-W3-docs-residual"),
    pytest.param(2, 20, 3, 16, 8, [[3, 5, 0, 2, 7, 3], [1] * 20], True, True, FP16, id="fp16-W8-short-docs-empty"),
    pytest.param(1, 33, 130, 20, 6, None, False, True, FP16, id="fp16-R20-padded-to-32-W6"),
])
def test_dynamic_conv_lowrank_g_half(B, T, D, R, W, rows, residual, static, dtype, dz_form, du_form, dz_ds,
                                     monkeypatch, assert_rel_rms):
    """The products g rounded to the inputs' half type before the dz and dU dots (a tune knob), in the dz
    launch of its own, in the dx kernel and in the fused backward (with dx there or not), and in both taps forms of
    dU, also with dstatic_w summed in the dz launch; fp16, as the interpreter's bf16 dot is not to be trusted.
    Tiles of 16 and a budget of 4 programs: several channel blocks, splits and tiles a chunk."""
    monkeypatch.setattr(triton_lowrank, "LR_G_HALF", True)
    monkeypatch.setattr(triton_lowrank, "LR_DZ_DS", dz_ds)
    monkeypatch.setattr(triton_lowrank, "LR_DZ_FORM", dz_form)
    monkeypatch.setattr(triton_lowrank, "LR_DU_FORM", du_form)
    for name, value in [("LR_DX_BD", 16), ("LR_DZ_BT", 16), ("LR_DZ_BD", 32), ("LR_DZ_SPLITS", 2), ("LR_DU_BD", 16),
                        ("LR_DU_BT", 16), ("LOWRANK_BWD_PROGRAMS", 4), ("LR_FU_BD", 16), ("LR_FU_BT", 16),
                        ("LR_FU_PROGRAMS", 4)]:
        monkeypatch.setattr(triton_lowrank, name, value)
    test_dynamic_conv_lowrank(B, T, D, R, W, rows, residual, static, dtype, assert_rel_rms)


def test_g_half_only_for_one_half_type(monkeypatch):
    """The knob rounds g only where x, z and U share a half type the dots take natively: never for fp32
    results, whose bound a half-type g would break."""
    monkeypatch.setattr(triton_lowrank, "LR_G_HALF", True)
    half, full = torch.zeros(1, dtype=FP16), torch.zeros(1, dtype=FP32)
    assert triton_lowrank._g_half(half, half, half)
    assert not triton_lowrank._g_half(full, half, half)
    assert not triton_lowrank._g_half(full, full, full)
    monkeypatch.setattr(triton_lowrank, "LR_G_HALF", False)
    assert not triton_lowrank._g_half(half, half, half)


@pytest.fixture
def small_chunks(monkeypatch):
    """A backward budget of 4 programs: chunks of several token tiles, rows split across chunks, the last
    chunk part empty (the test shapes would otherwise give one tile per chunk). The low-rank dz walks 3
    channel blocks of 16 in 2 splits, the second one past D for its last block."""
    _set_small_chunks(monkeypatch)


def _set_small_chunks(monkeypatch) -> None:
    monkeypatch.setattr(short_triton, "BWD_PROGRAMS", 4)
    monkeypatch.setattr(triton_headwise, "HW_BWD_PROGRAMS", 4)
    monkeypatch.setattr(triton_lowrank, "LOWRANK_BWD_PROGRAMS", 4)
    monkeypatch.setattr(triton_lowrank, "LR_DX_BD", 16)
    monkeypatch.setattr(triton_lowrank, "LR_DZ_BD", 16)
    monkeypatch.setattr(triton_lowrank, "LR_DZ_SPLITS", 2)


CHUNK_B, CHUNK_T, CHUNK_D = 5, 65, 40
CHUNK_ROWS = [[30, 35], [65], [1] * 15 + [50], [3, 0, 62], [65]]


def _chunk_inputs(gen) -> list[tuple]:
    B, T, D, W = CHUNK_B, CHUNK_T, CHUNK_D, 4
    x, static_w = _randn(gen, B, T, D).float(), _randn(gen, W, D).float()
    headwise = {"x": x, "weight": _randn(gen, B, T, D // 2, W).float(), "static_w": static_w}
    lowrank = {
        "x": x,
        "z": _randn(gen, B, T, 16).float(),
        "U": _randn(gen, 16, W * D).float(),
        "static_w": static_w,
    }
    return [
        (kernels.short_conv, {"x": x, "weight": static_w}),
        (kernels.dynamic_conv_headwise, headwise),
        (kernels.dynamic_conv_lowrank, lowrank),
    ]


@pytest.fixture(scope="module")
def chunk_runs() -> list[tuple]:
    """(op, inputs, upstream, Triton's (y, grads)) of each op of _chunk_inputs, with documents and a residual,
    under small_chunks and poisoned buffers. The two tests below share these runs: one Triton pass of the three
    ops takes about ten seconds in the interpreter."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(tu, "POISON_OUTPUTS", True)
        _set_small_chunks(monkeypatch)
        gen = torch.Generator().manual_seed(16)
        cu = _cu(CHUNK_ROWS, CHUNK_T)
        runs = []
        for op, inputs in _chunk_inputs(gen):
            upstream = _randn(gen, CHUNK_B, CHUNK_T, CHUNK_D).float()
            runs.append((op, inputs, upstream, _fwd_bwd(op, inputs, upstream, "triton", cu_seqlens=cu, residual=True)))
        return runs


def test_chunks_of_several_tiles(small_chunks, chunk_runs, assert_rel_rms):
    BT, BD = tu.tiles(CHUNK_T, CHUNK_D, short_triton.BWD_BT, short_triton.BWD_BD)
    n_tiles = CHUNK_B * triton.cdiv(CHUNK_T, BT)
    per_chunk, n_chunks = tu.chunk_plan(n_tiles, triton.cdiv(CHUNK_D, BD), short_triton.BWD_PROGRAMS)
    assert per_chunk > 1 and per_chunk * n_chunks > n_tiles, "the case needs long chunks with a ragged tail"
    cu = _cu(CHUNK_ROWS, CHUNK_T)
    for op, inputs, upstream, (y, grads) in chunk_runs:
        _assert_matches_reference(op, inputs, upstream, y, grads, assert_rel_rms, FP32, cu_seqlens=cu, residual=True)


def test_backward_is_bitwise_deterministic(small_chunks, chunk_runs):
    """Weight gradients sum fp32 partials of several chunks in a fixed order: a second run agrees bit for bit
    with the first (chunk_runs)."""
    cu = _cu(CHUNK_ROWS, CHUNK_T)
    for op, inputs, upstream, first in chunk_runs:
        second = _fwd_bwd(op, inputs, upstream, "triton", cu_seqlens=cu, residual=True)
        assert torch.equal(first[0], second[0])
        for name, grad in first[1].items():
            assert torch.equal(grad, second[1][name]), f"d{name} differs between runs"


def test_sum_partials_adds_rows_in_a_fixed_order(monkeypatch):
    """Ragged row and column blocks (P=37 rows of BP=8, M=300 columns of BM=128); cast to the given dtype."""
    monkeypatch.setattr(tu, "SUM_BLOCK_M", 128)
    monkeypatch.setattr(tu, "SUM_BLOCK_P", 8)
    partial = torch.randn(37, 3, 100, generator=torch.Generator().manual_seed(23)).to(DEVICE)
    got = tu.sum_partials(partial, torch.float32)
    assert got.shape == (3, 100)
    torch.testing.assert_close(got, partial.sum(0), rtol=1e-6, atol=1e-6)
    assert torch.equal(got, tu.sum_partials(partial, torch.float32))
    assert tu.sum_partials(partial, BF16).dtype == BF16


def test_search_steps_cover_every_document_count():
    """Rounded up to an even count, never fewer than ceil(log2(n_docs)) (the kernels' binary search), and no
    more than one step over it."""
    for n_docs, want in ((1, 0), (2, 2), (3, 2), (16, 4), (17, 6), (64, 6), (65, 8), (1000, 10)):
        n_cu, steps = tu.search_steps(torch.zeros(n_docs + 1, dtype=torch.int32))
        assert (n_cu, steps) == (n_docs + 1, want) and 2**steps >= n_docs


def test_host_sizes_agree_with_tritons():
    """The launchers' plain-Python cdiv and next_power_of_2 give Triton's values on every size they see."""
    for n in range(1, 5000):
        assert tu.next_power_of_2(n) == triton.next_power_of_2(n)
        for d in (1, 3, 16, 64, 128):
            assert tu.cdiv(n, d) == triton.cdiv(n, d)


# ---- document isolation on the Triton backend ----

ISO_B, ISO_T, ISO_D = 3, 40, 20
ISO_ROWS = [[7, 1, 0, 12, 20], [40], [3, 3, 3, 31]]
TARGET_DOCS = [
    pytest.param((8, 20), id="doc-row0-len12"),
    pytest.param((83, 86), id="doc-row2-len3"),
    pytest.param((40, 80), id="doc-row1-len40"),
]
OPS = [
    pytest.param("short_conv", id="short_conv"),
    pytest.param("dynamic_conv_headwise", id="headwise"),
    pytest.param("dynamic_conv_lowrank", id="lowrank"),
]


def _iso_inputs(op_name: str, gen) -> tuple[dict, list[str]]:
    """fp32 inputs of an op on the isolation layout and the names of its per-token inputs ([B, T, ...])."""
    B, T, D, W = ISO_B, ISO_T, ISO_D, 4
    x, static_w = _randn(gen, B, T, D).float(), _randn(gen, W, D).float()
    if op_name == "short_conv":
        return {"x": x, "weight": static_w}, ["x"]
    if op_name == "dynamic_conv_headwise":
        return {"x": x, "weight": _randn(gen, B, T, 5, W).float(), "static_w": static_w}, ["x", "weight"]
    z, U = _randn(gen, B, T, 8).float(), _randn(gen, 8, W * D).float()
    return {"x": x, "z": z, "U": U, "static_w": static_w}, ["x", "z"]


def _in_doc(doc: tuple[int, int]) -> torch.Tensor:
    """[B, T] bool on DEVICE, True on the tokens of doc."""
    flat = torch.arange(ISO_B * ISO_T, device=DEVICE)
    return ((flat >= doc[0]) & (flat < doc[1])).view(ISO_B, ISO_T)


def _set_doc(t: torch.Tensor, doc: tuple[int, int], values: torch.Tensor | float) -> torch.Tensor:
    return torch.where(_in_doc(doc).view(ISO_B, ISO_T, *[1] * (t.dim() - 2)), values, t)


@pytest.mark.parametrize("doc", TARGET_DOCS)
@pytest.mark.parametrize("op_name", OPS)
def test_documents_are_blind_to_each_other(op_name, doc):
    """Perturbing one document leaves the others' outputs bitwise equal; a NaN document leaves them finite and
    equal; the gradients of one document's outputs are exactly zero outside it."""
    gen = torch.Generator().manual_seed(17)
    cu, op = _cu(ISO_ROWS, ISO_T), getattr(kernels, op_name)
    inputs, token_inputs = _iso_inputs(op_name, gen)
    inside = _in_doc(doc)
    before = op(**inputs, cu_seqlens=cu, backend="triton")
    changed = {k: _set_doc(v, doc, 10 * _randn(gen, *v.shape).float()) if k in token_inputs else v
               for k, v in inputs.items()}  # fmt: skip
    after = op(**changed, cu_seqlens=cu, backend="triton")
    assert not torch.equal(before[inside], after[inside]), "the perturbation did not reach its own document"
    assert torch.equal(before[~inside], after[~inside])

    nan_doc = {k: _set_doc(v, doc, float("nan")) if k in token_inputs else v for k, v in inputs.items()}
    after = op(**nan_doc, cu_seqlens=cu, backend="triton")
    assert torch.isnan(after[inside]).all()
    assert torch.equal(before[~inside], after[~inside])

    upstream = torch.where(inside[..., None], _randn(gen, ISO_B, ISO_T, ISO_D).float(), 0.0)
    _, grads = _fwd_bwd(op, inputs, upstream, "triton", cu_seqlens=cu)
    for name in token_inputs:
        assert (grads[name][~inside] == 0).all(), f"d{name} leaks outside the document"
        assert (grads[name][inside] != 0).any(), f"d{name} is zero inside the document"


@pytest.mark.parametrize("op_name", OPS)
def test_a_nan_document_changes_no_other_gradient(op_name):
    gen = torch.Generator().manual_seed(18)
    cu, op = _cu(ISO_ROWS, ISO_T), getattr(kernels, op_name)
    inputs, token_inputs = _iso_inputs(op_name, gen)
    upstream = _randn(gen, ISO_B, ISO_T, ISO_D).float()
    poisoned = (0, 7)  # row 0's first document
    _, clean = _fwd_bwd(op, inputs, upstream, "triton", cu_seqlens=cu)
    dirty_inputs = {**inputs, "x": _set_doc(inputs["x"], poisoned, float("nan"))}
    _, dirty = _fwd_bwd(op, dirty_inputs, upstream, "triton", cu_seqlens=cu)
    outside = ~_in_doc(poisoned)
    for name in token_inputs:
        assert torch.equal(dirty[name][outside], clean[name][outside]), f"d{name} changed by the NaN"


@pytest.mark.parametrize("constants", [
    pytest.param({"LR_DZ_FORM": "fused"}, id="fused"),
    pytest.param({"LR_DZ_FORM": "with-du"}, id="with-du"),
    pytest.param({"LR_DZ_FORM": "own", "LR_DZ_DS": True, "LR_FWD_PREFETCH": True, "LR_DX_PREFETCH": True,
                  "LR_DZ_BT": 16, "LR_DZ_SPLITS": 2}, id="own-dstatic-with-dz-prefetched"),
    pytest.param({"LR_DZ_FORM": "dx", "LR_DZ_DS": True, "LR_DX_PREFETCH": True, "LR_DX_BD": 16, "LR_DZ_SPLITS": 2},
                 id="dx-dstatic-with-dz-prefetched"),
])
def test_lowrank_untimed_forms_are_blind_and_repeatable(constants, monkeypatch):
    """The low-rank forms that wait for the GPU's timing (the fused backward, with or without dx; dstatic_w summed
    with dz and dy or x loaded a tap ahead; the forward's taps as a loop) keep what the shipped ones promise:
    documents blind to each other, a NaN document confined to itself, and a second backward bitwise equal to the
    first."""
    monkeypatch.setattr(triton_lowrank, "LR_FWD_TAP_LOOP", True)
    monkeypatch.setattr(triton_lowrank, "LR_FU_BT", 16)
    monkeypatch.setattr(triton_lowrank, "LR_FU_PROGRAMS", 4)
    for name, value in constants.items():
        monkeypatch.setattr(triton_lowrank, name, value)
    for doc in TARGET_DOCS:
        test_documents_are_blind_to_each_other("dynamic_conv_lowrank", doc.values[0])
    test_a_nan_document_changes_no_other_gradient("dynamic_conv_lowrank")
    gen = torch.Generator().manual_seed(20)
    inputs, _ = _iso_inputs("dynamic_conv_lowrank", gen)
    upstream, cu = _randn(gen, ISO_B, ISO_T, ISO_D).float(), _cu(ISO_ROWS, ISO_T)
    first, second = (_fwd_bwd(kernels.dynamic_conv_lowrank, inputs, upstream, "triton", cu_seqlens=cu)
                     for _ in range(2))
    assert torch.equal(first[0], second[0])
    for name, grad in first[1].items():
        assert torch.equal(grad, second[1][name]), f"d{name} differs between runs"


@pytest.mark.parametrize("op_name", OPS)
def test_leaky_control_is_caught(op_name):
    """Without cu_seqlens a packed row is one document: the perturbation check must see the leak."""
    gen = torch.Generator().manual_seed(19)
    op = getattr(kernels, op_name)
    inputs, token_inputs = _iso_inputs(op_name, gen)
    before = op(**inputs, backend="triton")
    changed = {k: _set_doc(v, (8, 20), 10 * _randn(gen, *v.shape).float()) if k in token_inputs else v
               for k, v in inputs.items()}  # fmt: skip
    after = op(**changed, backend="triton")
    later_in_row0 = _in_doc((20, 40))
    assert not torch.equal(before[later_in_row0], after[later_in_row0])


# ---- custom ops: registration, torch.compile, backend choice ----


class _ThreeConvs(torch.nn.Module):
    """static -> head-wise -> low-rank, every one on the Triton backend."""

    def __init__(self, D: int, W: int, H: int, R: int, gen: torch.Generator) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(_randn(gen, W, D).float())
        self.static_w = torch.nn.Parameter(_randn(gen, W, D).float())
        self.U = torch.nn.Parameter(_randn(gen, R, W * D).float())
        self.H, self.W = H, W

    def forward(self, x, head_weight, z, cu_seqlens):
        y = kernels.short_conv(x, self.weight, cu_seqlens=cu_seqlens, residual=True, backend="triton")
        y = kernels.dynamic_conv_headwise(
            y, head_weight, self.static_w, cu_seqlens=cu_seqlens, backend="triton"
        )
        return kernels.dynamic_conv_lowrank(
            y, z, self.U, self.static_w, cu_seqlens=cu_seqlens, backend="triton"
        )


@pytest.mark.parametrize("rows", [pytest.param(None, id="rows"), pytest.param([[5, 12], [17]], id="docs")])
def test_compiles_fullgraph_and_matches_eager(rows):
    gen = torch.Generator().manual_seed(20)
    B, T, D, W, H, R = 2, 17, 8, 3, 4, 5
    model = _ThreeConvs(D, W, H, R, gen)
    inputs = [_randn(gen, B, T, D).float(), _randn(gen, B, T, H, W).float(), _randn(gen, B, T, R).float()]
    cu, upstream = _cu(rows, T), _randn(gen, B, T, D).float()

    def run(fn):
        leaves = [t.clone().requires_grad_() for t in inputs]
        y = fn(*leaves, cu)
        grads = torch.autograd.grad(y, leaves + list(model.parameters()), upstream)
        return [y, *grads]

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for eager, graph in zip(run(model), run(compiled), strict=True):
        assert torch.equal(eager, graph)


def _three_convs(weight, static_w, U, x, head_weight, z, cu_seqlens):
    """_ThreeConvs' forward with its parameters as arguments (one run's)."""
    y = kernels.short_conv(x, weight, cu_seqlens=cu_seqlens, residual=True, backend="triton")
    y = kernels.dynamic_conv_headwise(y, head_weight, static_w, cu_seqlens=cu_seqlens, backend="triton")
    return kernels.dynamic_conv_lowrank(y, z, U, static_w, cu_seqlens=cu_seqlens, backend="triton")


@pytest.mark.parametrize("rows", [pytest.param(None, id="rows"), pytest.param([[5, 12], [17]], id="docs")])
def test_vmap_over_stacked_runs_matches_each_run_alone(rows):
    # runs.engine stacks runs with torch.func.vmap: each op's vmap rule folds the runs into one launch (with
    # documents, one launch per run), so outputs and the gradients of every run's own weights and inputs are
    # bitwise those of the run alone
    gen = torch.Generator().manual_seed(22)
    N, B, T, D, W, H, R = 3, 2, 17, 8, 3, 4, 5
    stacked = [_randn(gen, N, W, D).float(), _randn(gen, N, W, D).float(), _randn(gen, N, R, W * D).float(),
               _randn(gen, N, B, T, D).float(), _randn(gen, N, B, T, H, W).float(), _randn(gen, N, B, T, R).float()]
    cu, upstream = _cu(rows, T), _randn(gen, N, B, T, D).float()
    assert_stacked_runs_equal_alone(_three_convs, stacked, upstream, cu)


def _opcheck_cases():
    gen = torch.Generator().manual_seed(21)
    B, T, D, W = 2, 9, 6, 3
    x, dy, static_w = _randn(gen, B, T, D).float(), _randn(gen, B, T, D).float(), _randn(gen, W, D).float()
    weight, z, U = (
        _randn(gen, B, T, 2, W).float(),
        _randn(gen, B, T, 4).float(),
        _randn(gen, 4, W * D).float(),
    )
    cu = _cu([[4, 5], [9]], T)
    # forward ops get inputs that require grad (their autograd is checked); backward ops have no autograd
    short, headwise = short_triton.short_conv_triton, triton_headwise.headwise_triton
    lowrank = triton_lowrank.lowrank_triton
    return [
        pytest.param(short.op, (x, static_w, cu, True), True, id="short_conv"),
        pytest.param(short.bwd_op, (dy, x, static_w, None, False), False, id="short_conv_bwd"),
        pytest.param(headwise.op, (x, weight, static_w, cu, False), True, id="headwise"),
        pytest.param(headwise.op, (x, weight, None, None, True), True, id="headwise-no-static"),
        pytest.param(headwise.bwd_op, (dy, x, weight, None, cu, True), False, id="headwise_bwd"),
        pytest.param(lowrank.op, (x, z, U, static_w, cu, True), True, id="lowrank"),
        pytest.param(lowrank.bwd_op, (dy, x, z, U, static_w, None, False), False, id="lowrank_bwd"),
    ]


def _is_float(a) -> bool:
    return isinstance(a, torch.Tensor) and a.is_floating_point()


@pytest.mark.parametrize("op, args, differentiable", _opcheck_cases())
def test_custom_op_registration(op, args, differentiable):
    """Schema, fake (meta) kernel, autograd registration and AOT dispatch of each custom op."""
    if differentiable:
        args = tuple(a.clone().requires_grad_() if _is_float(a) else a for a in args)
    torch.library.opcheck(op, args)


def test_ops_register_their_triton_kernels():
    assert {"short_conv", "dynamic_conv_headwise", "dynamic_conv_lowrank"} <= kutils.TRITON_OPS


def _count_calls(monkeypatch, module, name: str) -> list:
    calls = []
    original = getattr(module, name)

    def counting(*args):
        calls.append(1)
        return original(*args)

    monkeypatch.setattr(module, name, counting)
    return calls


def test_backend_choice(monkeypatch):
    """Auto follows the device, MIXLAB_BACKEND overrides it, float64 stays on the reference under auto."""
    calls = _count_calls(monkeypatch, short_op, "short_conv_triton")
    x, weight = torch.ones(1, 5, 3, device=DEVICE), torch.ones(2, 3, device=DEVICE)
    monkeypatch.delenv("MIXLAB_BACKEND", raising=False)
    kernels.short_conv(x, weight)
    assert len(calls) == (1 if DEVICE.type == "cuda" else 0)
    monkeypatch.setenv("MIXLAB_BACKEND", "triton")
    y = kernels.short_conv(x, weight)
    assert len(calls) == (2 if DEVICE.type == "cuda" else 1)
    assert torch.equal(y, kernels.short_conv(x, weight, backend="torch"))
    kernels.short_conv(x.double(), weight.double())
    assert len(calls) == (2 if DEVICE.type == "cuda" else 1), "float64 must stay on the reference"
    monkeypatch.setenv("MIXLAB_BACKEND", "torch")
    kernels.short_conv(x, weight)
    assert len(calls) == (2 if DEVICE.type == "cuda" else 1)
    with pytest.raises(ValueError, match="float64"):
        kernels.short_conv(x.double(), weight.double(), backend="triton")


MODEL_MIXERS = [
    pytest.param({"mixer": "static_conv"}, id="static_conv"),
    pytest.param({"mixer": "dynamic_conv", "conv_rank": 8}, id="dynamic_conv"),
    pytest.param({"mixer": "dynamic_conv_headwise", "conv_head_size": 4}, id="dynamic_conv_headwise"),
    pytest.param(
        {"mixer": "attention", "n_heads": 2, "qkv_conv": "dynamic_lowrank"}, id="attention-qkv-lowrank"
    ),
]


@pytest.mark.parametrize("fields", MODEL_MIXERS)
def test_models_on_the_triton_backend_match_the_reference(fields, assert_rel_rms):
    """A packed batch through a small model: logits and every parameter gradient, Triton against torch."""
    from mixlab import models  # the one place the kernel tests reach up: the models' kernel_backend must reach the ops

    gen = torch.Generator().manual_seed(22)
    input_ids = torch.randint(0, 16, (2, 21), generator=gen).to(DEVICE)
    doc_ids = torch.tensor([[0] * 6 + [1] * 15, [0] * 20 + [1]], device=DEVICE)
    built = {}
    for backend in ("triton", "torch"):
        config = models.ModelConfig(
            vocab_size=16, d_model=32, n_layers=1, mlp_hidden=0, kernel_backend=backend, **fields
        )
        built[backend] = models.build_model(config).to(DEVICE)
    built["torch"].load_state_dict(built["triton"].state_dict())
    results = {}
    for backend, model in built.items():
        logits = model(input_ids, doc_ids)
        results[backend] = [logits, *torch.autograd.grad(logits.square().sum(), list(model.parameters()))]
    names = ["logits"] + [f"d{name}" for name, _ in built["torch"].named_parameters()]
    for name, got, ref in zip(names, results["triton"], results["torch"], strict=True):
        assert_rel_rms(got, ref, FP32, name)


class _LaunchSpy:
    """Stands in for a Triton kernel: records each launch's grid, then launches the kernel."""

    def __init__(self, kernel):
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


def _static(gen, N, B, T, D, W):
    """(per-run weights, per-token inputs, one run's conv) of the static short conv."""
    return [_randn(gen, N, W, D).float()], [], lambda w, x: kernels.short_conv(x, w, residual=True,
                                                                               backend="triton")


def _lowrank(gen, N, B, T, D, W, R=5):
    def conv(U, static_w, x, z):
        return kernels.dynamic_conv_lowrank(x, z, U, static_w, residual=True, backend="triton")

    return [_randn(gen, N, R, W * D).float(), _randn(gen, N, W, D).float()], [_randn(gen, N, B, T, R).float()], conv


def _headwise(gen, N, B, T, D, W, H=2):
    def conv(static_w, x, weight):
        return kernels.dynamic_conv_headwise(x, weight, static_w, backend="triton")

    return [_randn(gen, N, W, D).float()], [_randn(gen, N, B, T, H, W).float()], conv


# op, its kernels (forward, backward), constants that cut a run's token tiles (5 rows of 37 tokens) into 4 chunks,
# the last one partial (tiled backwards: grid axis 1 walks the chunks, 4 a run), or its rows into programs of 12
# positions (streaming backwards: grid axis 2 walks the rows, 5 a run)
TILED, STREAMED = (1, 4), (2, 5)
FOLDED = [
    pytest.param(_static, short_triton, ("_short_conv_fwd_kernel", "_short_conv_bwd_kernel"),
                 {"FWD_STREAM": False, "BWD_STREAM": False, "BWD_BT": 16, "BWD_PROGRAMS": 4}, TILED, id="static"),
    pytest.param(_static, short_triton, ("_short_conv_fwd_kernel", "_short_conv_bwd_kernel"),
                 {"FWD_STREAM": False, "BWD_STREAM": False, "BWD_BT": 16, "BWD_PROGRAMS": 4, "BWD_DW_DEFER": False},
                 TILED, id="static-dw-summed-every-tile"),
    pytest.param(_static, short_triton, ("_short_conv_fwd_stream_kernel", "_short_conv_bwd_stream_kernel"),
                 {"FWD_STREAM": True, "BWD_STREAM": True, "STREAM_FWD_CH": 12, "STREAM_FWD_U": 4,
                  "STREAM_BWD_CH": 12, "STREAM_BWD_U": 4}, STREAMED, id="static-streamed"),
    pytest.param(_lowrank, triton_lowrank,
                 ("_dynamic_conv_lowrank_fwd_kernel", "_dynamic_conv_lowrank_bwd_du_taps_kernel"),
                 {"LR_DU_FORM": "taps-t", "LR_DU_BT": 16, "LOWRANK_BWD_PROGRAMS": 4}, TILED, id="lowrank"),
    pytest.param(_lowrank, triton_lowrank,
                 ("_dynamic_conv_lowrank_fwd_kernel", "_dynamic_conv_lowrank_bwd_du_taps_kernel"),
                 {"LR_DU_FORM": "taps-t", "LR_DU_BT": 16, "LOWRANK_BWD_PROGRAMS": 4, "LR_DZ_DS": True,
                  "LR_DZ_BT": 16}, TILED, id="lowrank-dstatic-with-dz"),
    pytest.param(_lowrank, triton_lowrank, ("_dynamic_conv_lowrank_fwd_kernel", "_dynamic_conv_lowrank_bwd_du_kernel"),
                 {"LR_DU_FORM": "wide", "LR_DU_BT": 16, "LOWRANK_BWD_PROGRAMS": 4, "LR_DU_DS_DEFER": False}, TILED,
                 id="lowrank-du-wide"),
    pytest.param(_lowrank, triton_lowrank, ("_dynamic_conv_lowrank_fwd_kernel", "_dynamic_conv_lowrank_bwd_du_kernel"),
                 {"LR_DU_FORM": "wide", "LR_DU_BT": 16, "LOWRANK_BWD_PROGRAMS": 4, "LR_DU_DS_DEFER": True}, TILED,
                 id="lowrank-dstatic-summed-once-a-chunk"),
    pytest.param(_lowrank, triton_lowrank,
                 ("_dynamic_conv_lowrank_fwd_kernel", "_dynamic_conv_lowrank_bwd_fused_kernel"),
                 {"LR_DZ_FORM": "fused", "LR_FU_BT": 16, "LR_FU_PROGRAMS": 4, "LR_FWD_TAP_LOOP": True}, TILED,
                 id="lowrank-fused-backward"),
    pytest.param(_headwise, triton_headwise, ("_dynamic_conv_headwise_fwd_kernel", "_dynamic_conv_headwise_bwd_kernel"),
                 {"HW_BWD_STREAM_HS": 0, "HW_BWD_TILE": 16 * 2 * 4, "HW_BWD_PROGRAMS": 4}, TILED, id="headwise"),
    pytest.param(_headwise, triton_headwise, ("_dynamic_conv_headwise_fwd_kernel", "_dynamic_conv_headwise_bwd_kernel"),
                 {"HW_BWD_STREAM_HS": 0, "HW_BWD_TILE": 16 * 2 * 4, "HW_BWD_PROGRAMS": 4, "HW_BWD_DS_DEFER": True},
                 TILED, id="headwise-dstatic-summed-once-a-chunk"),
    pytest.param(functools.partial(_headwise, H=8), triton_headwise,
                 ("_dynamic_conv_headwise_fwd_kernel", "_headwise_hs1_bwd_kernel"),
                 {"HW_BWD_STREAM_HS": 0, "HW_HS1_BWD_TAPS_AXIS": True, "HW_HS1_BWD_GATHER": True,
                  "HW_HS1_BWD_TILE": 64, "HW_HS1_BWD_CHANNELS": 8, "HW_BWD_PROGRAMS": 4}, TILED,
                 id="headwise-hs1-gathered"),
    pytest.param(functools.partial(_headwise, H=8), triton_headwise,
                 ("_headwise_fwd_stream_kernel", "_headwise_bwd_stream_kernel"),
                 {"HW_FWD_STREAM_HS": 1, "HW_BWD_STREAM_HS": 1, "HW_STREAM_FWD_CH": 12, "HW_STREAM_FWD_U": 4,
                  "HW_STREAM_BWD_CH": 12, "HW_STREAM_BWD_U": 4}, STREAMED, id="headwise-hs1-streamed"),
    pytest.param(_headwise, triton_headwise, ("_headwise_fwd_stream_kernel", "_headwise_bwd_stream_kernel"),
                 {"HW_FWD_STREAM_WIDE": True, "HW_BWD_STREAM_WIDE": True, "HW_STREAM_FWD_WIDE_CH": 12,
                  "HW_STREAM_FWD_WIDE_U": 4, "HW_STREAM_BWD_WIDE_CH": 12, "HW_STREAM_BWD_WIDE_U": 4}, STREAMED,
                 id="headwise-wide-heads-streamed"),
]


@pytest.mark.parametrize(("make", "module", "kernel_names", "constants", "bwd_grid"), FOLDED)
def test_stacked_convs_fold_into_one_launch_and_keep_each_runs_bits(make, module, kernel_names, constants, bwd_grid,
                                                                     monkeypatch):
    """Stacked runs without documents: one forward and one backward launch for all runs, each row with its run's
    weights, and each run's output and gradients equal to the run alone's bit for bit, also where a run's token
    tiles end in a partial chunk."""
    for name, value in constants.items():
        monkeypatch.setattr(module, name, value)
    monkeypatch.setattr(tu, "STREAM_UNDER_INTERPRETER", bwd_grid == STREAMED)
    gen = torch.Generator().manual_seed(23)
    N, B, T, D, W = 3, 5, 37, 8, 4
    weights, per_token, conv = make(gen, N, B, T, D, W)
    x, upstream = _randn(gen, N, B, T, D).float(), _randn(gen, N, B, T, D).float()
    spies = [_LaunchSpy(getattr(module, name)) for name in kernel_names]
    for name, spy in zip(kernel_names, spies, strict=True):
        monkeypatch.setattr(module, name, spy)
    assert_stacked_runs_equal_alone(conv, [*weights, x, *per_token], upstream)
    # the stack's launches first, then one per run alone
    assert [g[2] for g in spies[0].grids] == [N * B] + [B] * N
    axis, per_run = bwd_grid
    assert [g[axis] for g in spies[1].grids] == [N * per_run] + [per_run] * N
