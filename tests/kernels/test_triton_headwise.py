"""The head-wise dynamic short conv's Triton kernels against the float64 torch reference, every form and routing
branch: streaming at head size 1 (weights as rows at widths 2 and 4, tap by tap at the others) and on the
taps-aligned layout (head sizes that are multiples of the padded width), tiled forward and backward at every head
size, head size 1's own tiled backward (weights gathered from rows or loaded where used), dstatic_w summed once a
chunk (widths up to tu.SLOTS) or every tile.

The public op runs the table's launch settings (the tiled forms under the interpreter); the launchers, called
directly, take the streaming forms and small tiles. Stacked runs, document isolation and the custom ops are in
test_triton_short_conv.py with the other short convs'.
"""

import pytest
import torch
from kernel_checks import DEVICE, assert_matches_reference, cu_from_rows, fwd_bwd, launch_fwd_bwd, randn
from mixlab import kernels
from mixlab.kernels import triton_utils as tu
from mixlab.kernels.dynamic_conv import triton_headwise

FP32, BF16, FP16 = torch.float32, torch.bfloat16, torch.float16
pytestmark = pytest.mark.usefixtures("poisoned_outputs")
LAUNCHERS = triton_headwise.headwise_triton


def _inputs(gen, B, T, D, hs, W, static, dtype) -> dict:
    return {
        "x": randn(gen, B, T, D).to(dtype),
        "weight": randn(gen, B, T, D // hs, W).to(dtype),
        "static_w": randn(gen, W, D).to(dtype) if static else None,
    }


def _check(B, T, D, hs, W, rows, residual, static, dtype, fwd=None, bwd=None, seed=11) -> None:
    """Triton's output and every input gradient against the float64 reference: through the public op, or through
    the launchers when launch settings are given (keyword arguments fwd and bwd)."""
    gen = torch.Generator().manual_seed(seed)
    inputs = _inputs(gen, B, T, D, hs, W, static, dtype)
    upstream = randn(gen, B, T, D).to(dtype)
    kwargs = {"cu_seqlens": cu_from_rows(rows, T, DEVICE), "residual": residual}
    if fwd is None and bwd is None:
        y, grads = fwd_bwd(kernels.dynamic_conv_headwise, inputs, upstream, "triton", **kwargs)
    else:
        y, grads = launch_fwd_bwd(LAUNCHERS, inputs, upstream, fwd=fwd, bwd=bwd, **kwargs)
    assert_matches_reference(kernels.dynamic_conv_headwise, inputs, upstream, y, grads, dtype, **kwargs)


HEADWISE_CASES = [
    # B, T, D, head size, W, document lengths per row, residual, static_w, dtype
    pytest.param(1, 1, 1, 1, 1, None, False, False, FP32, id="T1-D1-hs1-W1"),
    pytest.param(2, 65, 63, 1, 4, [[20, 1, 44], [65]], True, True, FP32, id="hs1-T65-D63-docs-static-residual"),
    pytest.param(2, 9, 257, 1, 3, [[4, 5], [9]], False, True, FP32, id="hs1-D257-three-head-blocks"),
    pytest.param(1, 63, 6, 2, 3, None, False, True, FP32, id="hs2-T63-D6-H3-static"),
    pytest.param(2, 20, 20, 4, 8, [[3, 5, 2, 7, 3], [1] * 20], True, False, FP32, id="hs4-H5-W8-short-docs"),
    pytest.param(2, 127, 64, 16, 5, [[1, 2, 7, 0, 40, 77], [127]], False, True, FP32, id="hs16-T127-W5-docs"),
    pytest.param(1, 9, 256, 128, 2, None, True, True, FP32, id="hs128-D256-one-head-a-tile"),
    pytest.param(2, 17, 9, 3, 4, [[5, 12], [17]], False, True, FP32, id="hs3-not-a-power-of-two"),
    pytest.param(3, 65, 32, 2, 4, [[60, 5], [65], [1] * 15 + [50]], True, True, BF16, id="bf16-hs2-docs"),
    pytest.param(2, 63, 32, 16, 4, [[20, 43], [63]], False, True, FP16, id="fp16-hs16-docs"),
]
# past tu.SLOTS taps: the tiled forms wherever the op runs, dstatic_w summed every tile
WIDE_CASES = [
    pytest.param(1, 20, 6, 3, 9, [[3, 17]], True, True, FP32, id="hs3-W9"),
    pytest.param(2, 33, 10, 1, 12, [[5, 28], [1, 0, 32]], False, True, FP32, id="hs1-W12-docs-empty"),
]


@pytest.mark.parametrize("B, T, D, hs, W, rows, residual, static, dtype", HEADWISE_CASES + WIDE_CASES)
def test_dynamic_conv_headwise(B, T, D, hs, W, rows, residual, static, dtype):
    _check(B, T, D, hs, W, rows, residual, static, dtype)


def _stream(bd: int) -> dict:
    """Programs of 12 positions walked 4 a step (several programs a row, several steps a program, a last step
    past T), about ``bd`` channels."""
    return {"config": tu.Stream(CH=12, U=4, BD=bd, warps=1)}


@pytest.mark.parametrize("B, T, D, hs, W, rows, residual, static, dtype", [
    *[case for case in HEADWISE_CASES if case.values[3] == 1],
    pytest.param(2, 60, 12, 1, 2, [[1, 2, 3, 4, 50], [60]], True, False, FP32, id="hs1-W2-docs"),
    pytest.param(1, 40, 5, 1, 8, [[17, 23]], True, True, BF16, id="bf16-hs1-W8"),
    # documents of every length 1-15 in a row: with steps of 4 a document ends at every offset of a step and of
    # its W - 1 rows on either side
    pytest.param(2, 127, 20, 1, 4, [list(range(1, 16)) + [7], list(range(15, 0, -1)) + [7]], True, True, FP32,
                 id="docs-of-every-length-hs1-W4"),
    pytest.param(1, 127, 8, 1, 3, [list(range(1, 16)) + [7]], False, False, FP32, id="docs-of-every-length-hs1-W3"),
])
def test_streaming_forms_at_head_size_1(B, T, D, hs, W, rows, residual, static, dtype):
    """The plain layout: weights read as rows and dweight stored as tiles at widths 2 and 4, tap by tap at the
    others."""
    _check(B, T, D, hs, W, rows, residual, static, dtype, fwd=_stream(64), bwd=_stream(32))


@pytest.mark.parametrize("B, T, D, hs, W, rows, residual, static, dtype", [
    *[case for case in HEADWISE_CASES if case.values[3] > 1 and case.values[3] % tu.next_power_of_2(case.values[4])
      == 0],
    pytest.param(1, 1, 8, 4, 4, None, True, True, FP32, id="T1-hs4-W4"),
    pytest.param(2, 65, 24, 8, 8, [[20, 1, 0, 44], [65]], False, True, FP32, id="hs8-T65-W8-docs-empty"),
    pytest.param(2, 40, 48, 16, 4, [[13, 27], [40]], True, True, FP32, id="hs16-W4-H3-docs-static-residual"),
    pytest.param(1, 30, 16, 8, 3, [[1, 0, 29]], False, True, FP32, id="hs8-W3"),
    pytest.param(2, 127, 20, 2, 2, [list(range(1, 16)) + [7], list(range(15, 0, -1)) + [7]], True, False, FP32,
                 id="docs-of-every-length-hs2-W2"),
])
def test_streaming_forms_on_the_taps_aligned_layout(B, T, D, hs, W, rows, residual, static, dtype):
    """Head sizes that are multiples of the padded width, each head's channels as [groups, padded width]; 128
    channels a program, so at H=3 heads of 16 two programs split the heads and the second is partly masked."""
    _check(B, T, D, hs, W, rows, residual, static, dtype, fwd=_stream(128), bwd=_stream(128))


@pytest.mark.parametrize(("hs", "W"), [(2, 4), (3, 2), (1, 9)])
def test_streaming_forms_refuse_the_layouts_they_lack(hs, W):
    """No streaming form of head sizes off the taps-aligned layout (other than 1) or of widths past tu.SLOTS."""
    x, weight = torch.zeros(1, 4, 2 * hs, device=DEVICE), torch.zeros(1, 4, 2, W, device=DEVICE)
    with pytest.raises(ValueError, match="streaming forms take"):
        triton_headwise._headwise_fwd(x, weight, None, None, False, config=_stream(64)["config"])


@pytest.mark.parametrize(("hs", "W", "form"), [(1, 4, "stream"), (16, 4, "stream"), (8, 4, "stream"), (16, 3, "stream"),
                                               (6, 2, "stream"), (1, 8, "stream"), (3, 4, "tiled"), (2, 4, "tiled"),
                                               (3, 2, "tiled"), (1, 9, "tiled"), (16, 9, "tiled")])
def test_config_for_streams_at_head_size_1_and_on_the_taps_aligned_layout(hs, W, form):
    """On the GPU head size 1 streams on the plain layout and multiples of the padded width on the taps-aligned
    one, widths up to tu.SLOTS; the rest take the tiled kernels, and so does everything under the interpreter."""
    heads, table = "hs1" if hs == 1 else "wide", triton_headwise.CONFIGS
    for backward, pass_ in ((False, "fwd"), (True, "bwd")):
        assert triton_headwise.config_for(backward, 2, 2 * hs, W, False) is table[pass_, form, heads]
        assert triton_headwise.config_for(backward, 2, 2 * hs, W, True) is table[pass_, "tiled", heads]


# tiled forward and backward on tiles of 4 channels (head size 1: 7 head blocks at D=26, the last one half full;
# head size 8: heads wider than the block, one a tile), 4 programs a head block
def _tiles(tile: int) -> tuple[dict, dict]:
    return ({"config": triton_headwise.TiledFwd(tile=tile, channels=4, warps=4)},
            {"config": triton_headwise.TiledBwd(tile=tile, channels=4, warps=4, stages=1, programs=4)})


@pytest.mark.parametrize("B, T, D, hs, W, rows, residual, static, dtype", HEADWISE_CASES + WIDE_CASES + [
    pytest.param(2, 33, 26, 1, 4, [[5, 28], [33]], True, True, FP32, id="hs1-D26-seven-head-blocks"),
    pytest.param(2, 33, 24, 8, 4, [[5, 28], [33]], True, True, FP32, id="hs8-one-head-a-tile"),
    pytest.param(2, 20, 20, 4, 8, [[3, 5, 2, 7, 3], [1] * 20], True, True, FP32, id="hs4-W8-every-slot-a-sum"),
])
def test_tiled_forms_in_chunks(B, T, D, hs, W, rows, residual, static, dtype):
    """Several tiles a chunk: tiles of 8 tokens at head size 1 (so weight[t + k] is gathered from the tile's rows,
    W - 1 <= 8, except at W=12), else of at most 32 (one head of 4 to 128 channels, or two of 2)."""
    _check(B, T, D, hs, W, rows, residual, static, dtype, *_tiles(32 * tu.next_power_of_2(hs)))


@pytest.mark.parametrize(("W", "gathered"), [(4, True), (8, True), (12, False)])
def test_head_size_1_backward_gathers_weights_where_a_tile_holds_the_taps(W, gathered):
    """Head size 1's tiled backward reads weight[t + k] from the tile's own rows where W - 1 <= BT (tiles of 8
    tokens here), else each element where it is used: both against the reference. (The gather also indexes the
    padded taps, up to BT - 1 + WP - 1, which the interpreter refuses past the 2 BT rows: W=9 at BT=8.)"""
    T, D = 33, 10
    BT = triton_headwise._head_tiles(T, D, 1, 32, 4)[0]
    assert BT == 8 and (W - 1 <= BT) == gathered
    _check(2, T, D, 1, W, [[5, 28], [1, 0, 32]], True, True, FP32, *_tiles(32))
