"""The static short conv's Triton kernels against the float64 torch reference, and what the three short convs
(static, head-wise, low-rank) share: chunked weight gradients, document isolation, custom ops, torch.compile,
stacked runs, backend choice.

Without CUDA they run in the Triton interpreter (tests/conftest.py sets TRITON_INTERPRET=1 before `kernels` is
imported), with CUDA on the GPU. Every comparison covers the output and the gradient of every input, driven by a
random upstream gradient, and every buffer the launchers allocate starts full of NaN. The public ops run the
table's launch settings (``config_for``: the tiled forms under the interpreter); the launchers, called directly,
take others (the streaming forms, small tiles that cross chunks and programs at tiny shapes).
"""

import collections

import pytest
import torch
import triton
from kernel_checks import (
    DEVICE,
    assert_close,
    assert_matches_reference,
    assert_stacked_runs_equal_alone,
    cu_from_rows,
    fwd_bwd,
    launch_fwd_bwd,
    randn,
)
from mixlab import kernels
from mixlab.kernels import triton_utils as tu
from mixlab.kernels import utils as kutils
from mixlab.kernels.dynamic_conv import triton_headwise, triton_lowrank
from mixlab.kernels.short_conv import op as short_op
from mixlab.kernels.short_conv import triton as short_triton
from torch.utils._python_dispatch import TorchDispatchMode

FP32, BF16, FP16 = torch.float32, torch.bfloat16, torch.float16
pytestmark = pytest.mark.usefixtures("poisoned_outputs")


def _cu(rows: list[list[int]] | None, T: int) -> torch.Tensor | None:
    return cu_from_rows(rows, T, DEVICE)


def _check_op(op, inputs: dict, gen, bound, **kwargs) -> None:
    """The public op on Triton, output and every input gradient against the float64 reference."""
    upstream = randn(gen, *inputs["x"].shape).to(inputs["x"].dtype)
    y, grads = fwd_bwd(op, inputs, upstream, "triton", **kwargs)
    assert_matches_reference(op, inputs, upstream, y, grads, bound, **kwargs)


def _check_launchers(op, triton_op, inputs: dict, gen, bound, cu_seqlens, residual, fwd, bwd) -> None:
    """``_check_op`` through the op's launchers with explicit launch settings (keyword arguments fwd and bwd)."""
    upstream = randn(gen, *inputs["x"].shape).to(inputs["x"].dtype)
    y, grads = launch_fwd_bwd(triton_op, inputs, upstream, cu_seqlens, residual, fwd, bwd)
    assert_matches_reference(op, inputs, upstream, y, grads, bound, cu_seqlens=cu_seqlens, residual=residual)


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
# past tu.SLOTS taps: the tiled forms wherever the op runs
WIDE_CASES = [
    pytest.param(1, 20, 5, 9, [[3, 17]], True, FP32, id="W9-docs"),
    pytest.param(2, 33, 17, 12, [[5, 28], [1, 0, 32]], False, FP32, id="W12-docs-shorter-than-W-empty"),
]


def _short_inputs(gen, B, T, D, W, dtype) -> dict:
    return {"x": randn(gen, B, T, D).to(dtype), "weight": randn(gen, W, D).to(dtype)}


@pytest.mark.parametrize("B, T, D, W, rows, residual, dtype", SHORT_CASES + WIDE_CASES)
def test_short_conv(B, T, D, W, rows, residual, dtype):
    gen = torch.Generator().manual_seed(10)
    _check_op(kernels.short_conv, _short_inputs(gen, B, T, D, W, dtype), gen, dtype, cu_seqlens=_cu(rows, T),
              residual=residual)


# the tiled forms on tiles of 16 tokens and 16 channels, 4 programs a channel block: several tiles a chunk
SMALL_TILES = ({"config": short_triton.TiledFwd(BT=16, BD=16, warps=4)},
               {"config": short_triton.TiledBwd(BT=16, BD=16, warps=4, stages=1, programs=4)})
# the streaming forms on programs of 12 positions walked 4 a step: several programs a row, several steps a program,
# a last step past T
SMALL_STREAMS = ({"config": tu.Stream(CH=12, U=4, BD=64, warps=1)}, {"config": tu.Stream(CH=12, U=4, BD=64, warps=1)})


@pytest.mark.parametrize("B, T, D, W, rows, residual, dtype", SHORT_CASES + WIDE_CASES)
def test_short_conv_tiled_forms_in_chunks(B, T, D, W, rows, residual, dtype):
    gen = torch.Generator().manual_seed(10)
    _check_launchers(kernels.short_conv, short_triton.short_conv_triton, _short_inputs(gen, B, T, D, W, dtype), gen,
                     dtype, _cu(rows, T), residual, *SMALL_TILES)


@pytest.mark.parametrize("B, T, D, W, rows, residual, dtype", SHORT_CASES + [
    # documents of every length 1-15 in a row: with steps of 4 a document ends at every offset of a step and of
    # its W - 1 rows on either side, so the check that a step lies in one document is tried at each edge
    pytest.param(2, 127, 20, 4, [list(range(1, 16)) + [7], list(range(15, 0, -1)) + [7]], True, FP32,
                 id="docs-of-every-length-W4"),
    pytest.param(1, 127, 20, 3, [list(range(1, 16)) + [7]], False, FP32, id="docs-of-every-length-W3"),
    pytest.param(1, 40, 8, 1, [[17, 23]], False, FP32, id="W1-docs")])
def test_short_conv_streaming_forms(B, T, D, W, rows, residual, dtype):
    """The forward and backward that walk each row's positions (the shipped forms up to tu.SLOTS taps)."""
    gen = torch.Generator().manual_seed(10)
    _check_launchers(kernels.short_conv, short_triton.short_conv_triton, _short_inputs(gen, B, T, D, W, dtype), gen,
                     dtype, _cu(rows, T), residual, *SMALL_STREAMS)


@pytest.mark.parametrize("form", ["tiled", "stream"])
@pytest.mark.parametrize("W", range(1, 9), ids=lambda w: f"W{w}")
def test_short_conv_every_width(W, form):
    """Every width of the streaming forms' slots, each tap's sum its own."""
    gen = torch.Generator().manual_seed(W)
    B, T, D, rows = 2, 12, 3, [[1, W, 11 - W], [12]]
    configs = SMALL_STREAMS if form == "stream" else SMALL_TILES
    _check_launchers(kernels.short_conv, short_triton.short_conv_triton, _short_inputs(gen, B, T, D, W, FP32), gen,
                     FP32, _cu(rows, T), False, *configs)


def test_streaming_forms_refuse_widths_past_the_slots():
    x, weight = torch.zeros(1, 4, 2, device=DEVICE), torch.zeros(tu.SLOTS + 1, 2, device=DEVICE)
    with pytest.raises(ValueError, match="widths up to 8"):
        short_triton._short_conv_fwd(x, weight, None, False, config=SMALL_STREAMS[0]["config"])


@pytest.mark.parametrize(("W", "interpreted", "form"), [(1, False, tu.Stream), (tu.SLOTS, False, tu.Stream),
                                                        (tu.SLOTS + 1, False, "tiled"), (4, True, "tiled")])
def test_config_for_streams_up_to_the_slots_on_the_gpu(W, interpreted, form):
    for backward, tiled in ((False, short_triton.TiledFwd), (True, short_triton.TiledBwd)):
        config = short_triton.config_for(backward, W, interpreted)
        assert isinstance(config, tiled if form == "tiled" else form)
        assert config in short_triton.CONFIGS.values()


def test_configs_refuse_unknown_fields_and_bad_values():
    with pytest.raises(TypeError):
        short_triton.TiledFwd(BT=16, BD=16, warps=4, stages=2)
    with pytest.raises(ValueError, match="power of two"):
        short_triton.TiledFwd(BT=24, BD=16, warps=4)
    with pytest.raises(ValueError, match="multiple"):
        tu.Stream(CH=10, U=4, BD=64, warps=1)
    with pytest.raises(ValueError, match="positive int"):
        short_triton.TiledBwd(BT=16, BD=16, warps=4, stages=1, programs=0)


# ---- poisoned outputs, non-contiguous inputs, chunks, determinism ----


def test_poisoned_buffer_shows_an_unwritten_tile():
    """Negative control: a launch whose grid misses the last row tile leaves NaN that the checks see."""
    gen = torch.Generator().manual_seed(14)
    T, D = 300, 8
    x, weight = randn(gen, 1, T, D).float(), randn(gen, 3, D).float()
    config = short_triton.CONFIGS["fwd", "tiled"]
    BT, BD = tu.tiles(T, D, config.BT, config.BD)
    assert BT < T, "the case needs two row tiles"
    y = tu.empty((1, T, D), x.dtype, x.device)
    assert torch.isnan(y).all()
    short_triton._short_conv_fwd_kernel[(1, 1, 1)](
        x, weight, y, None, T, D, 1, 0, 0, W=3, BT=BT, BD=BD, HAS_CU=False, RESIDUAL=False
    )
    assert torch.isfinite(y[:, :BT]).all()
    assert torch.isnan(y[:, BT:]).all()


def test_non_contiguous_inputs_and_upstream():
    """A transposed x and the stride-0 upstream gradient of y.sum()."""
    gen = torch.Generator().manual_seed(15)
    B, T, D = 2, 19, 12
    x = randn(gen, B, D, T).float().transpose(1, 2)  # [B, T, D], not contiguous
    z = randn(gen, B, 3, T).float().transpose(1, 2)  # [B, T, 3]
    U, static_w = randn(gen, 3, 4 * D).float(), randn(gen, 4, D).float()
    results = {}
    for backend in ("triton", "torch"):
        leaves = [t.detach().clone().requires_grad_() for t in (x, z, U, static_w)]
        y = kernels.dynamic_conv_lowrank(*leaves, backend=backend)
        results[backend] = [y, *torch.autograd.grad(y.sum(), leaves)]
    for name, got, ref in zip(
        ["y", "dx", "dz", "dU", "dstatic_w"], results["triton"], results["torch"], strict=True
    ):
        assert_close(got, ref, FP32, name)


def test_mixed_dtypes_as_under_autocast():
    """bf16 activations with fp32 parameters (the models under autocast): y in x's dtype, each gradient in
    its input's dtype, within the bf16 bound."""
    gen = torch.Generator().manual_seed(13)
    B, T, D, W, cu = 2, 33, 24, 4, _cu([[10, 23], [33]], 33)
    x = randn(gen, B, T, D).to(BF16)
    static_w = randn(gen, W, D).float()
    cases = [
        (kernels.short_conv, {"x": x, "weight": static_w}),
        (kernels.dynamic_conv_headwise, {"x": x, "weight": randn(gen, B, T, 3, W).to(BF16), "static_w": static_w}),
        (kernels.dynamic_conv_lowrank,
         {"x": x, "z": randn(gen, B, T, 5).to(BF16), "U": randn(gen, 5, W * D).float(), "static_w": static_w}),
    ]
    for op, inputs in cases:
        _check_op(op, inputs, gen, BF16, cu_seqlens=cu, residual=True)


CHUNK_B, CHUNK_T, CHUNK_D = 5, 65, 40
CHUNK_ROWS = [[30, 35], [65], [1] * 15 + [50], [3, 0, 62], [65]]
# Backward budgets of 4 programs: chunks of several token tiles, rows split across chunks, the last chunk part empty
# (the test shapes would otherwise give one tile per chunk). The low-rank dz walks 3 channel blocks of 16 in 2
# splits, the second one past D for its last block.
CHUNKS = {
    "short_conv": (short_triton.short_conv_triton, {},
                   {"config": short_triton.TiledBwd(BT=16, BD=64, warps=4, stages=1, programs=4)}),
    "dynamic_conv_headwise": (triton_headwise.headwise_triton, {},
                              {"config": triton_headwise.TiledBwd(tile=1024, channels=128, warps=4, stages=1,
                                                                  programs=4)}),
    "dynamic_conv_lowrank": (triton_lowrank.lowrank_triton, {},
                             {"dx_config": triton_lowrank.Tiles(BT=32, BD=16, warps=4, stages=1),
                              "dz_config": triton_lowrank.DzTiles(BT=32, BD=16, warps=4, stages=1, splits=2),
                              "du_config": triton_lowrank.DuTiles(BT=64, BD=64, warps=4, stages=1, programs=4)}),
}


def _chunk_inputs(op_name: str, gen) -> dict:
    B, T, D, W = CHUNK_B, CHUNK_T, CHUNK_D, 4
    x, static_w = randn(gen, B, T, D).float(), randn(gen, W, D).float()
    if op_name == "short_conv":
        return {"x": x, "weight": static_w}
    if op_name == "dynamic_conv_headwise":
        return {"x": x, "weight": randn(gen, B, T, D // 2, W).float(), "static_w": static_w}
    return {"x": x, "z": randn(gen, B, T, 16).float(), "U": randn(gen, 16, W * D).float(), "static_w": static_w}


@pytest.fixture(scope="module")
def chunk_runs() -> dict:
    """op name -> (inputs, upstream, Triton's (y, grads)) of each op on CHUNK_ROWS, with a residual, its backward
    under CHUNKS' small budgets. The two tests below share these runs: one Triton pass of the three ops takes
    seconds in the interpreter."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(tu, "POISON_OUTPUTS", True)
        gen = torch.Generator().manual_seed(16)
        cu = _cu(CHUNK_ROWS, CHUNK_T)
        runs = {}
        for op_name, (triton_op, fwd, bwd) in CHUNKS.items():
            inputs = _chunk_inputs(op_name, gen)
            upstream = randn(gen, CHUNK_B, CHUNK_T, CHUNK_D).float()
            runs[op_name] = (inputs, upstream, launch_fwd_bwd(triton_op, inputs, upstream, cu, True, fwd, bwd))
        return runs


def test_chunks_of_several_tiles(chunk_runs):
    config = CHUNKS["short_conv"][2]["config"]
    BT, BD = tu.tiles(CHUNK_T, CHUNK_D, config.BT, config.BD)
    n_tiles = CHUNK_B * triton.cdiv(CHUNK_T, BT)
    per_chunk, n_chunks = tu.chunk_plan(n_tiles, triton.cdiv(CHUNK_D, BD), config.programs)
    assert per_chunk > 1 and per_chunk * n_chunks > n_tiles, "the case needs long chunks with a ragged tail"
    cu = _cu(CHUNK_ROWS, CHUNK_T)
    for op_name, (inputs, upstream, (y, grads)) in chunk_runs.items():
        assert_matches_reference(getattr(kernels, op_name), inputs, upstream, y, grads, FP32, cu_seqlens=cu,
                                 residual=True)


def test_backward_is_bitwise_deterministic(chunk_runs):
    """Weight gradients sum fp32 partials of several chunks in a fixed order: a second run agrees bit for bit
    with the first (chunk_runs)."""
    cu = _cu(CHUNK_ROWS, CHUNK_T)
    for op_name, (inputs, upstream, first) in chunk_runs.items():
        triton_op, fwd, bwd = CHUNKS[op_name]
        second = launch_fwd_bwd(triton_op, inputs, upstream, cu, True, fwd, bwd)
        assert torch.equal(first[0], second[0])
        for name, grad in first[1].items():
            assert torch.equal(grad, second[1][name]), f"{op_name}: d{name} differs between runs"


def test_sum_partials_adds_rows_in_a_fixed_order():
    """Ragged row and column blocks (P=37 rows of BP=8, M=300 columns of BM=128); cast to the given dtype."""
    config = tu.SumConfig(BM=128, BP=8, warps=4)
    partial = torch.randn(37, 3, 100, generator=torch.Generator().manual_seed(23)).to(DEVICE)
    got = tu.sum_partials(partial, torch.float32, config=config)
    assert got.shape == (3, 100)
    torch.testing.assert_close(got, partial.sum(0), rtol=1e-6, atol=1e-6)
    assert torch.equal(got, tu.sum_partials(partial, torch.float32, config=config))
    assert tu.sum_partials(partial, BF16, config=config).dtype == BF16


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
# the public ops (the tiled forms under the interpreter), and the streaming forms through their launchers (the
# head-wise ones at head size 4 on the taps-aligned layout)
STREAMED = {"short_conv": short_triton.short_conv_triton, "dynamic_conv_headwise": triton_headwise.headwise_triton}
OPS = [
    pytest.param("short_conv", False, id="short_conv"),
    pytest.param("short_conv", True, id="short_conv-streamed"),
    pytest.param("dynamic_conv_headwise", False, id="headwise"),
    pytest.param("dynamic_conv_headwise", True, id="headwise-streamed"),
    pytest.param("dynamic_conv_lowrank", False, id="lowrank"),
]


def _iso_inputs(op_name: str, gen) -> tuple[dict, list[str]]:
    """fp32 inputs of an op on the isolation layout and the names of its per-token inputs ([B, T, ...])."""
    B, T, D, W = ISO_B, ISO_T, ISO_D, 4
    x, static_w = randn(gen, B, T, D).float(), randn(gen, W, D).float()
    if op_name == "short_conv":
        return {"x": x, "weight": static_w}, ["x"]
    if op_name == "dynamic_conv_headwise":
        return {"x": x, "weight": randn(gen, B, T, 5, W).float(), "static_w": static_w}, ["x", "weight"]
    z, U = randn(gen, B, T, 8).float(), randn(gen, 8, W * D).float()
    return {"x": x, "z": z, "U": U, "static_w": static_w}, ["x", "z"]


def _forward(op_name: str, streamed: bool, inputs: dict, cu) -> torch.Tensor:
    if streamed:
        return STREAMED[op_name].fwd(*inputs.values(), cu, False, **SMALL_STREAMS[0])
    return getattr(kernels, op_name)(**inputs, cu_seqlens=cu, backend="triton")


def _grads(op_name: str, streamed: bool, inputs: dict, upstream: torch.Tensor, cu) -> dict:
    if streamed:
        return launch_fwd_bwd(STREAMED[op_name], inputs, upstream, cu, False, *SMALL_STREAMS)[1]
    return fwd_bwd(getattr(kernels, op_name), inputs, upstream, "triton", cu_seqlens=cu)[1]


def _in_doc(doc: tuple[int, int]) -> torch.Tensor:
    """[B, T] bool on DEVICE, True on the tokens of doc."""
    flat = torch.arange(ISO_B * ISO_T, device=DEVICE)
    return ((flat >= doc[0]) & (flat < doc[1])).view(ISO_B, ISO_T)


def _set_doc(t: torch.Tensor, doc: tuple[int, int], values: torch.Tensor | float) -> torch.Tensor:
    return torch.where(_in_doc(doc).view(ISO_B, ISO_T, *[1] * (t.dim() - 2)), values, t)


@pytest.mark.parametrize("doc", TARGET_DOCS)
@pytest.mark.parametrize("op_name, streamed", OPS)
def test_documents_are_blind_to_each_other(op_name, streamed, doc):
    """Perturbing one document leaves the others' outputs bitwise equal; a NaN document leaves them finite and
    equal; the gradients of one document's outputs are exactly zero outside it."""
    gen = torch.Generator().manual_seed(17)
    cu = _cu(ISO_ROWS, ISO_T)
    inputs, token_inputs = _iso_inputs(op_name, gen)
    inside = _in_doc(doc)
    before = _forward(op_name, streamed, inputs, cu)
    changed = {k: _set_doc(v, doc, 10 * randn(gen, *v.shape).float()) if k in token_inputs else v
               for k, v in inputs.items()}  # fmt: skip
    after = _forward(op_name, streamed, changed, cu)
    assert not torch.equal(before[inside], after[inside]), "the perturbation did not reach its own document"
    assert torch.equal(before[~inside], after[~inside])

    nan_doc = {k: _set_doc(v, doc, float("nan")) if k in token_inputs else v for k, v in inputs.items()}
    after = _forward(op_name, streamed, nan_doc, cu)
    assert torch.isnan(after[inside]).all()
    assert torch.equal(before[~inside], after[~inside])

    upstream = torch.where(inside[..., None], randn(gen, ISO_B, ISO_T, ISO_D).float(), 0.0)
    grads = _grads(op_name, streamed, inputs, upstream, cu)
    for name in token_inputs:
        assert (grads[name][~inside] == 0).all(), f"d{name} leaks outside the document"
        assert (grads[name][inside] != 0).any(), f"d{name} is zero inside the document"


@pytest.mark.parametrize("op_name, streamed", OPS)
def test_a_nan_document_changes_no_other_gradient(op_name, streamed):
    gen = torch.Generator().manual_seed(18)
    cu = _cu(ISO_ROWS, ISO_T)
    inputs, token_inputs = _iso_inputs(op_name, gen)
    upstream = randn(gen, ISO_B, ISO_T, ISO_D).float()
    poisoned = (0, 7)  # row 0's first document
    clean = _grads(op_name, streamed, inputs, upstream, cu)
    dirty = _grads(op_name, streamed, {**inputs, "x": _set_doc(inputs["x"], poisoned, float("nan"))}, upstream, cu)
    outside = ~_in_doc(poisoned)
    for name in token_inputs:
        assert torch.equal(dirty[name][outside], clean[name][outside]), f"d{name} changed by the NaN"


@pytest.mark.parametrize("op_name, streamed", OPS)
def test_leaky_control_is_caught(op_name, streamed):
    """Without cu_seqlens a packed row is one document: the perturbation check must see the leak."""
    gen = torch.Generator().manual_seed(19)
    inputs, token_inputs = _iso_inputs(op_name, gen)
    before = _forward(op_name, streamed, inputs, None)
    changed = {k: _set_doc(v, (8, 20), 10 * randn(gen, *v.shape).float()) if k in token_inputs else v
               for k, v in inputs.items()}  # fmt: skip
    after = _forward(op_name, streamed, changed, None)
    later_in_row0 = _in_doc((20, 40))
    assert not torch.equal(before[later_in_row0], after[later_in_row0])


# ---- custom ops: registration, torch.compile, stacked runs, backend choice ----


class _ThreeConvs(torch.nn.Module):
    """static -> head-wise -> low-rank, every one on the Triton backend."""

    def __init__(self, D: int, W: int, H: int, R: int, gen: torch.Generator) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(randn(gen, W, D).float())
        self.static_w = torch.nn.Parameter(randn(gen, W, D).float())
        self.U = torch.nn.Parameter(randn(gen, R, W * D).float())
        self.H, self.W = H, W

    def forward(self, x, head_weight, z, cu_seqlens):
        return _three_convs(self.weight, self.static_w, self.U, x, head_weight, z, cu_seqlens)


def _three_convs(weight, static_w, U, x, head_weight, z, cu_seqlens):
    """_ThreeConvs' forward with its parameters as arguments (one run's)."""
    y = kernels.short_conv(x, weight, cu_seqlens=cu_seqlens, residual=True, backend="triton")
    y = kernels.dynamic_conv_headwise(y, head_weight, static_w, cu_seqlens=cu_seqlens, backend="triton")
    return kernels.dynamic_conv_lowrank(y, z, U, static_w, cu_seqlens=cu_seqlens, backend="triton")


@pytest.mark.parametrize("rows", [pytest.param(None, id="rows"), pytest.param([[5, 12], [17]], id="docs")])
def test_compiles_fullgraph_and_matches_eager(rows):
    gen = torch.Generator().manual_seed(20)
    B, T, D, W, H, R = 2, 17, 8, 3, 4, 5
    model = _ThreeConvs(D, W, H, R, gen)
    inputs = [randn(gen, B, T, D).float(), randn(gen, B, T, H, W).float(), randn(gen, B, T, R).float()]
    cu, upstream = _cu(rows, T), randn(gen, B, T, D).float()

    def run(fn):
        leaves = [t.clone().requires_grad_() for t in inputs]
        y = fn(*leaves, cu)
        grads = torch.autograd.grad(y, leaves + list(model.parameters()), upstream)
        return [y, *grads]

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for eager, graph in zip(run(model), run(compiled), strict=True):
        assert torch.equal(eager, graph)


class _OpCalls(TorchDispatchMode):
    """Counts the calls of each op that reaches the dispatcher (custom ops by their qualified name)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("rows", [pytest.param(None, id="rows"), pytest.param([[5, 12], [17]], id="docs")])
def test_vmap_over_stacked_runs_matches_each_run_alone(rows):
    """runners.train.engine stacks runs with torch.func.vmap: each op's vmap rule folds the runs into one launch (with
    documents, one launch per run), so outputs and the gradients of every run's own weights and inputs are bitwise
    those of the run alone."""
    gen = torch.Generator().manual_seed(22)
    N, B, T, D, W, H, R = 3, 2, 17, 8, 3, 4, 5
    stacked = [randn(gen, N, W, D).float(), randn(gen, N, W, D).float(), randn(gen, N, R, W * D).float(),
               randn(gen, N, B, T, D).float(), randn(gen, N, B, T, H, W).float(), randn(gen, N, B, T, R).float()]
    cu, upstream = _cu(rows, T), randn(gen, N, B, T, D).float()
    assert_stacked_runs_equal_alone(_three_convs, stacked, upstream, cu)
    with _OpCalls() as mode:
        torch.func.vmap(_three_convs, in_dims=(0,) * 6 + (None,))(*stacked, cu)
    per_launch = 1 if rows is None else N
    for name in ("short_conv", "dynamic_conv_headwise", "dynamic_conv_lowrank"):
        assert mode.calls[f"mixlab.{name}"] == per_launch, name


def _opcheck_cases():
    gen = torch.Generator().manual_seed(21)
    B, T, D, W = 2, 9, 6, 3
    x, dy, static_w = randn(gen, B, T, D).float(), randn(gen, B, T, D).float(), randn(gen, W, D).float()
    weight, z, U = randn(gen, B, T, 2, W).float(), randn(gen, B, T, 4).float(), randn(gen, 4, W * D).float()
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


def test_backend_choice(monkeypatch):
    """Auto follows the device, MIXLAB_BACKEND overrides it, float64 stays on the reference under auto."""
    calls = []
    original = short_op.short_conv_triton
    monkeypatch.setattr(short_op, "short_conv_triton", lambda *args: calls.append(1) or original(*args))
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
    pytest.param({"mixer": "attention", "n_heads": 2, "qkv_conv": "dynamic_lowrank"}, id="attention-qkv-lowrank"),
]


@pytest.mark.parametrize("fields", MODEL_MIXERS)
def test_models_on_the_triton_backend_match_the_reference(fields):
    """A packed batch through a small model: logits and every parameter gradient, Triton against torch."""
    from mixlab import models  # the one place the kernel tests reach up: the models' kernel_backend must reach the ops

    gen = torch.Generator().manual_seed(22)
    input_ids = torch.randint(0, 16, (2, 21), generator=gen).to(DEVICE)
    doc_ids = torch.tensor([[0] * 6 + [1] * 15, [0] * 20 + [1]], device=DEVICE)
    built = {}
    for backend in ("triton", "torch"):
        config = models.ModelConfig(vocab_size=16, d_model=32, n_layers=1, mlp_hidden=0, kernel_backend=backend,
                                    **fields)
        built[backend] = models.build_model(config).to(DEVICE)
    built["torch"].load_state_dict(built["triton"].state_dict())
    results = {}
    for backend, model in built.items():
        logits = model(input_ids, doc_ids)
        results[backend] = [logits, *torch.autograd.grad(logits.square().sum(), list(model.parameters()))]
    names = ["logits"] + [f"d{name}" for name, _ in built["torch"].named_parameters()]
    for name, got, ref in zip(names, results["triton"], results["torch"], strict=True):
        assert_close(got, ref, FP32, name)


# ---- stacked runs folded into one launch ----

STACK_N, STACK_B, STACK_T, STACK_D, STACK_W = 3, 5, 37, 8, 4


def _stacked_inputs(op_name: str, gen, hs: int = 4) -> tuple[dict, list[dict], set[str]]:
    """One launch's inputs of STACK_N stacked runs (per-token inputs [N * B, ...], weights [N, ...]), each run's
    alone, and the names of the per-token inputs."""
    N, B, T, D, W = STACK_N, STACK_B, STACK_T, STACK_D, STACK_W
    x = randn(gen, N, B, T, D).float()
    if op_name == "short_conv":
        runs = {"x": x, "weight": randn(gen, N, W, D).float()}
    elif op_name == "dynamic_conv_headwise":
        runs = {"x": x, "weight": randn(gen, N, B, T, D // hs, W).float(), "static_w": randn(gen, N, W, D).float()}
    else:
        runs = {"x": x, "z": randn(gen, N, B, T, 5).float(), "U": randn(gen, N, 5, W * D).float(),
                "static_w": randn(gen, N, W, D).float()}
    per_token = {"x", "weight", "z"} if op_name == "dynamic_conv_headwise" else {"x", "z"}
    stack = {k: v.flatten(0, 1) if k in per_token else v for k, v in runs.items()}
    return stack, [{k: v[n] for k, v in runs.items()} for n in range(N)], per_token


# op, its launchers' settings: tiled backwards at a budget that cuts a run's token tiles (5 rows of 37 tokens)
# into 4 chunks, the last one partial; streaming ones in programs of 12 positions
FOLDED = [
    pytest.param("short_conv", 4, *SMALL_TILES[:1], {"config": short_triton.TiledBwd(
        BT=16, BD=64, warps=4, stages=1, programs=4)}, id="static"),
    pytest.param("short_conv", 4, *SMALL_STREAMS, id="static-streamed"),
    pytest.param("dynamic_conv_headwise", 4, {}, {"config": triton_headwise.TiledBwd(
        tile=16 * 2 * 4, channels=128, warps=4, stages=1, programs=4)}, id="headwise"),
    pytest.param("dynamic_conv_headwise", 1, {}, {"config": triton_headwise.TiledBwd(
        tile=64, channels=8, warps=4, stages=1, programs=4)}, id="headwise-hs1"),
    pytest.param("dynamic_conv_headwise", 1, *SMALL_STREAMS, id="headwise-hs1-streamed", marks=pytest.mark.slow),
    pytest.param("dynamic_conv_headwise", 4, {"config": tu.Stream(CH=12, U=4, BD=128, warps=1)},
                 {"config": tu.Stream(CH=12, U=4, BD=128, warps=1)}, id="headwise-wide-heads-streamed",
                 marks=pytest.mark.slow),
    pytest.param("dynamic_conv_lowrank", 4, {}, {"du_config": triton_lowrank.DuTiles(
        BT=16, BD=64, warps=4, stages=1, programs=4)}, id="lowrank"),
]
LAUNCHERS = {"short_conv": short_triton.short_conv_triton, "dynamic_conv_headwise": triton_headwise.headwise_triton,
             "dynamic_conv_lowrank": triton_lowrank.lowrank_triton}


@pytest.mark.parametrize(("op_name", "hs", "fwd", "bwd"), FOLDED)
def test_stacked_convs_fold_into_one_launch_and_keep_each_runs_bits(op_name, hs, fwd, bwd):
    """Stacked runs without documents, as the ops' vmap rules fold them: one forward and one backward launch for
    all runs, each row with its run's weights, and each run's output and gradients equal to the run alone's bit
    for bit, also where a run's token tiles end in a partial chunk."""
    gen = torch.Generator().manual_seed(23)
    stack, alone, per_token = _stacked_inputs(op_name, gen, hs)
    upstream = randn(gen, STACK_N * STACK_B, STACK_T, STACK_D).float()
    y, grads = launch_fwd_bwd(LAUNCHERS[op_name], stack, upstream, None, True, fwd, bwd)
    for n, inputs in enumerate(alone):
        rows = slice(n * STACK_B, (n + 1) * STACK_B)
        y_n, grads_n = launch_fwd_bwd(LAUNCHERS[op_name], inputs, upstream[rows], None, True, fwd, bwd)
        assert torch.equal(y[rows], y_n), f"run {n}: the output differs from the run alone"
        for name, grad in grads_n.items():
            got = grads[name][rows] if name in per_token else grads[name][n]
            assert torch.equal(got, grad), f"run {n}: d{name} differs from the run alone"
