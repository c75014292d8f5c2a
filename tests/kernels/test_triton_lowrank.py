"""The low-rank dynamic short conv's Triton kernels against the float64 torch reference: the forward, and the
backward's dx, dz (its channel blocks in one or several splits) and dU launches (dstatic_w as one more rank),
at the table's launch settings and at small tiles that cross chunks, splits and channel blocks.

Stacked runs, document isolation and the custom ops are in test_triton_short_conv.py with the other short convs'.
"""

import pytest
import torch
from kernel_checks import DEVICE, assert_matches_reference, cu_from_rows, fwd_bwd, launch_fwd_bwd, randn
from mixlab import kernels
from mixlab.kernels.dynamic_conv import triton_lowrank

FP32, BF16, FP16 = torch.float32, torch.bfloat16, torch.float16
pytestmark = pytest.mark.usefixtures("poisoned_outputs")

LOWRANK_CASES = [
    # B, T, D, R, W, document lengths per row, residual, static_w, dtype
    pytest.param(1, 1, 1, 1, 1, None, False, False, FP32, id="T1-D1-R1-W1"),
    pytest.param(1, 63, 65, 8, 4, None, False, True, FP32, id="R8-T63-D65-static"),
    pytest.param(2, 65, 63, 16, 3, [[20, 1, 44], [65]], True, False, FP32, id="R16-T65-D63-W3-docs-residual"),
    pytest.param(2, 20, 3, 16, 8, [[3, 5, 0, 2, 7, 3], [1] * 20], True, True, FP32, id="R16-W8-short-docs-empty"),
    pytest.param(2, 127, 1, 3, 2, [[1, 2, 7, 0, 40, 77], [127]], False, True, FP32, id="R3-T127-D1-docs"),
    pytest.param(1, 33, 130, 20, 6, [[1, 32]], False, True, FP32, id="R20-padded-to-32-W6"),
    pytest.param(1, 20, 17, 16, 9, [[3, 17]], True, True, FP32, id="R16-W9"),
    pytest.param(3, 65, 63, 16, 4, [[60, 5], [65], [1] * 15 + [50]], True, True, BF16, id="bf16-R16-docs"),
    pytest.param(2, 63, 32, 8, 4, [[20, 43], [63]], False, True, FP16, id="fp16-R8-docs"),
]


def _check(B, T, D, R, W, rows, residual, static, dtype, fwd=None, bwd=None) -> None:
    """Triton's output and every input gradient against the float64 reference: through the public op, or through
    the launchers when launch settings are given (keyword arguments fwd and bwd)."""
    gen = torch.Generator().manual_seed(12)
    inputs = {
        "x": randn(gen, B, T, D).to(dtype),
        "z": randn(gen, B, T, R).to(dtype),
        "U": randn(gen, R, W * D).to(dtype),
        "static_w": randn(gen, W, D).to(dtype) if static else None,
    }
    upstream = randn(gen, B, T, D).to(dtype)
    kwargs = {"cu_seqlens": cu_from_rows(rows, T, DEVICE), "residual": residual}
    if fwd is None and bwd is None:
        y, grads = fwd_bwd(kernels.dynamic_conv_lowrank, inputs, upstream, "triton", **kwargs)
    else:
        y, grads = launch_fwd_bwd(triton_lowrank.lowrank_triton, inputs, upstream, fwd=fwd, bwd=bwd, **kwargs)
    assert_matches_reference(kernels.dynamic_conv_lowrank, inputs, upstream, y, grads, dtype, **kwargs)


@pytest.mark.parametrize("B, T, D, R, W, rows, residual, static, dtype", LOWRANK_CASES)
def test_dynamic_conv_lowrank(B, T, D, R, W, rows, residual, static, dtype):
    _check(B, T, D, R, W, rows, residual, static, dtype)


def _small(splits: int) -> tuple[dict, dict]:
    """Tiles of 16 tokens: the forward's and dx's of 16 channels, dz's of 32 in ``splits`` splits (several
    channel blocks a program, one past D at some widths), dU's of 16 x 16 at a budget of 4 programs (several tiles
    a chunk)."""
    tiles = triton_lowrank.Tiles(BT=16, BD=16, warps=4, stages=1)
    return ({"config": tiles},
            {"dx_config": tiles, "dz_config": triton_lowrank.DzTiles(BT=16, BD=32, warps=4, stages=1, splits=splits),
             "du_config": triton_lowrank.DuTiles(BT=16, BD=16, warps=4, stages=1, programs=4)})


@pytest.mark.parametrize("splits", [2, 1], ids=["dz-in-2-splits", "dz-stored-whole"])
@pytest.mark.parametrize("B, T, D, R, W, rows, residual, static, dtype", LOWRANK_CASES)
def test_dynamic_conv_lowrank_small_tiles(B, T, D, R, W, rows, residual, static, dtype, splits):
    _check(B, T, D, R, W, rows, residual, static, dtype, *_small(splits))


def test_config_for_has_one_row_a_launch():
    assert {launch: triton_lowrank.config_for(launch) for launch in ("fwd", "dx", "dz", "du")} == \
        triton_lowrank.CONFIGS
    with pytest.raises(ValueError, match="at least 16"):
        triton_lowrank.Tiles(BT=8, BD=16, warps=4, stages=1)
    with pytest.raises(TypeError):
        triton_lowrank.Tiles(BT=16, BD=16, warps=4, stages=1, splits=2)
