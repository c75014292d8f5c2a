"""RubiConv's GEMM backends: "gemm" (torch matmuls) and "triton" (fused kernels) against an exact per-document
reference, plus the plan, the edge cases of the GEMM form, the Triton kernels' launch settings and document
isolation.

Forward against numpy.convolve per document and channel; every gradient against autograd of the "torch"
backend (an exact FFT convolution per document) in float64, driven by a random upstream gradient. Without
CUDA the Triton kernels run in the interpreter (tests/kernels/conftest.py), so those cases stay tiny.
"""

import numpy as np
import pytest
import torch
from kernel_checks import assert_close, cu_from_rows, rel_rms_error
from mixlab import kernels
from mixlab.kernels.rubiconv import gemm
from mixlab.kernels.rubiconv import triton as rubiconv_triton

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ON_GPU = DEVICE.type == "cuda"

# Relative RMS error allowed, by (backend, precision), against the float64 reference of the same inputs.
BOUNDS = {
    ("gemm", "fp64"): 1e-10,
    ("gemm", "fp32"): 1e-4,  # fp32 matmuls: ~4e-7 measured on the CPU
    ("gemm", "bf16"): 2e-2,  # bfloat16 operands: ~6e-3 measured
    ("triton", "fp32"): 1e-3 if ON_GPU else 1e-5,  # tf32 dots on the GPU (about 5e-4); exact fp32 here
    # bfloat16 spectra; the interpreter truncates fp32 -> bf16 instead of rounding (~2e-2 measured)
    ("triton", "bf16"): 2e-2 if ON_GPU else 5e-2,
}


def _cu(rows: list[list[int]] | None, T: int) -> torch.Tensor | None:
    return cu_from_rows(rows, T, DEVICE)


def _randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(DEVICE)


def _numpy_rubiconv(x: torch.Tensor, h: torch.Tensor, cu: torch.Tensor | None) -> torch.Tensor:
    """x: [B, T, D], h: [D, L_F] float64 -> y [B, T, D]: numpy.convolve per document and channel."""
    B, T, D = x.shape
    offsets = [r * T for r in range(B + 1)] if cu is None else cu.tolist()
    xs, hs = x.detach().reshape(B * T, D).cpu().numpy(), h.detach().cpu().numpy()
    y = np.zeros_like(xs)
    for start, end in zip(offsets[:-1], offsets[1:], strict=True):
        for d in range(D if end > start else 0):
            y[start:end, d] = np.convolve(xs[start:end, d], hs[d])[: end - start]
    return torch.from_numpy(y).view(B, T, D)


def _run(backend: str, x, h, cu, upstream, **kwargs):
    """Leaves from x and h, forward, gradients of both -> (y, dx, dh)."""
    x, h = x.detach().clone().requires_grad_(), h.detach().clone().requires_grad_()
    y = kernels.rubiconv(x, h, cu_seqlens=cu, backend=backend, **kwargs)
    dx, dh = torch.autograd.grad(y, (x, h), upstream.to(y.dtype))
    return y, dx, dh


def _check_backend(backend, precision, dtype, B, T, D, L_F, rows, block, seed=0, plan=None):
    """Output against numpy.convolve, dx and dh against autograd of the float64 "torch" backend; through the
    public op, or with ``plan`` the backend's function on that plan."""
    gen = torch.Generator().manual_seed(seed)
    cu = _cu(rows, T)
    x, h, upstream = _randn(gen, B, T, D).to(dtype), _randn(gen, D, L_F).to(dtype), _randn(gen, B, T, D)
    if plan is None:
        y, dx, dh = _run(backend, x, h, cu, upstream, block=block, precision=precision)
    else:
        fn = gemm.rubiconv_gemm if backend == "gemm" else rubiconv_triton.rubiconv_triton
        xl, hl = x.clone().requires_grad_(), h.clone().requires_grad_()
        y = fn(xl, hl, plan, precision)
        dx, dh = torch.autograd.grad(y, (xl, hl), upstream.to(y.dtype))
    assert y.dtype == dtype and dx.dtype == dtype and dh.dtype == dtype
    _, dx_ref, dh_ref = _run("torch", x.double(), h.double(), cu, upstream)
    bound = BOUNDS[(backend, "fp64" if dtype == torch.float64 else precision)]
    assert_close(y, _numpy_rubiconv(x.double(), h.double(), cu), bound, "y")
    assert_close(dx, dx_ref, bound, "dx")
    assert_close(dh, dh_ref, bound, "dh")


# ---- the plan ----


def test_padded_lengths_follow_spec_5_2():
    lengths = np.array([1, 15, 16, 17, 100])
    # P = k * ceil((L + min(L, L_F) - 1) / k)
    assert gemm.padded_lengths(lengths, 1000, 16).tolist() == [16, 32, 32, 48, 208]
    assert gemm.padded_lengths(lengths, 1, 16).tolist() == [16, 16, 16, 32, 112]
    assert gemm.padded_lengths(lengths, 10, 1).tolist() == [1, 24, 25, 26, 109]


def test_config_for_takes_each_stages_row_of_the_largest_block_at_or_below_k():
    """The F_k stage has a row from k=16 on and one from k=128 on; the block stages one for every k."""
    rt = rubiconv_triton
    small, large = rt.CONFIGS["spectrum", 16], rt.CONFIGS["spectrum", 128]
    assert small != large
    assert [rt.config_for("spectrum", k) for k in (16, 64, 127, 128, 512)] == [small, small, small, large, large]
    assert {rt.config_for("block_fwd", k) for k in (16, 512)} == {rt.CONFIGS["block_fwd", 16]}
    assert rt._spectrum_tiles(128, 1024, True, large) == (32, 32, 64)  # 8,192 values: [128, 64]
    assert rt._spectrum_tiles(64, 1024, True, small) == (16, 32, 64)
    assert rt._spectrum_tiles(64, 1024, False, small) == (16, 32, 128)  # the filter spectra: no accumulator
    with pytest.raises(ValueError, match="at least 16"):
        rt.BlockTiles(BC=8, BB=16, BN=128, warps=4, stages=3)


def test_auto_block_squares_the_longest_padded_document():
    assert gemm.auto_block(np.array([3, 5]), 64) == 16
    assert gemm.auto_block(np.array([3, 300]), 1000) == 32  # 599 > 16^2
    assert gemm.auto_block(np.array([3, 5000]), 65536) == 128  # 9999 > 64^2
    assert gemm.auto_block(np.array([40000]), 65536) == 512  # capped
    assert gemm.auto_block(np.array([40000]), 1) == 256  # only 40000 tokens to pad


def test_modeled_work_counts_each_stage():
    """One document of 100 tokens at k=16: P=208, m=13, mh=7. Block stage and its inverse, [7, 13] complex
    times [13, 16] real: 2 * 7 * 13 * 16 multiply-adds each; the filter's block stage once more; F_k, 4 * 16 * 16 a
    half column each way for the document and forward for the filter."""
    plan = gemm.build_plan(_cu([[100]], 100), 1, 100, 100, 16, DEVICE)
    assert plan.cols.tolist() == [13]
    assert plan.work() == 2 * (2 * 7 * 13 * 16) + 2 * 7 * 13 * 16 + 2 * 7 * (4 * 16 * 16) + 7 * (4 * 16 * 16)


def test_modeled_work_orders_the_blocks_as_the_h200_timed_them():
    """`mixlab bench rubiconv`'s row, timed on the H200 (BENCHMARKS.md): Triton fp32 forward k=64 6.19
    ms, k=128 6.91, k=256 13.88 (fwd+bwd 13.85, 15.79, 36.75). The model orders the three blocks the same way."""
    from mixlab.runners.bench.rubiconv import lognormal_layout

    cu = lognormal_layout(65536, 0, torch.device("cpu"))
    work = [gemm.build_plan(cu, 1, 65536, 65536, k, torch.device("cpu")).work() for k in (64, 128, 256)]
    assert work == sorted(work)


def test_plan_groups_documents_by_column_count():
    cu = _cu([[17, 20, 24, 3, 0, 36], [100]], 100)
    plan = gemm.build_plan(cu, 2, 100, 1000, 16, DEVICE)
    # P: 17, 20, 24 -> 48 (m=3); 3 -> 16 (m=1); 36 -> 80 (m=5); 100 -> 208 (m=13); empty documents dropped
    assert plan.group_m.tolist() == [1, 3, 5, 13]
    assert (plan.group_hi - plan.group_lo).tolist() == [1, 3, 1, 1]
    assert plan.lengths.tolist() == [3, 17, 20, 24, 36, 100]
    assert plan.group_taps.tolist() == [8, 24, 40, 104]  # min(L_F, ceil(P/2))
    assert plan.group_reach.tolist() == [3, 24, 36, 100]
    assert plan.n_cols == 1 + 3 * 2 + 3 + 7
    assert gemm.get_plan(cu, 2, 100, 1000, 16, DEVICE) is gemm.get_plan(cu.clone(), 2, 100, 1000, 16, DEVICE)


def test_shared_sizes_round_up_to_the_cheapest_set():
    """m = 2, 3, 3, 10 at a filter half column priced 1: 2 -> 3 costs no document half column (both have 2) and
    saves a filter spectrum; 3 -> 10 would cost 12 for 2 saved. Free filters keep every m, dear ones one size."""
    cols = np.array([10, 2, 3, 3])
    assert gemm.shared_sizes(cols, 1.0).tolist() == [10, 3, 3, 3]
    assert gemm.shared_sizes(cols, 0.0).tolist() == [10, 2, 3, 3]
    assert gemm.shared_sizes(cols, 100.0).tolist() == [10, 10, 10, 10]
    rng = np.random.default_rng(0)
    for _ in range(20):  # a document only rounds up, and to an m some document has
        cols = rng.integers(1, 60, size=30)
        shared = gemm.shared_sizes(cols, float(rng.uniform(0.1, 5.0)))
        assert (shared >= cols).all() and set(shared) <= set(cols) and shared.max() == cols.max()


@pytest.mark.parametrize("backend", ["gemm", "triton"])
def test_shared_sizes_stay_exact(backend, poisoned_outputs):
    """Documents padded past their shortest size (a filter priced so that most sizes merge): the same answers,
    fewer filter spectra; the plan cache tells the two prices apart."""
    rows, T = [[10, 10, 10, 1, 1, 0, 30, 31, 34], [127], [5] * 25 + [2]], 127
    fewest = gemm.get_plan(_cu(rows, T), 3, T, 300, 16, DEVICE)
    shared = gemm.get_plan(_cu(rows, T), 3, T, 300, 16, DEVICE, filter_cost=4.0)
    assert shared.n_groups < fewest.n_groups and (np.sort(shared.cols) >= np.sort(fewest.cols)).all()
    dtype = torch.float64 if backend == "gemm" else torch.float32
    _check_backend(backend, "fp32", dtype, 3, T, 3, 300, rows, 16, plan=shared)


def test_one_zero_fewer_breaks_the_padding(monkeypatch):
    """The negative control of the padding rule: P - 1 (with k = 1) wraps a document's tail around."""
    gen = torch.Generator().manual_seed(1)
    x, h = _randn(gen, 1, 30, 2), _randn(gen, 2, 30)
    expected = _numpy_rubiconv(x, h, None)
    assert_close(kernels.rubiconv(x, h, block=1, backend="gemm"), expected, 1e-10, "y")
    monkeypatch.setattr(gemm, "padded_lengths", lambda L, L_F, k: L + np.minimum(L, L_F) - 2)
    monkeypatch.setattr(gemm, "_PLANS", type(gemm._PLANS)())
    assert rel_rms_error(kernels.rubiconv(x, h, block=1, backend="gemm"), expected) > 1e-3


# ---- the GEMM form in torch matmuls, float64: the edge cases of docs/rubiconv.md ----

EDGE_CASES = [
    # B, T, D, L_F, document lengths per row, block
    pytest.param(1, 1, 1, 1, None, None, id="T1-LF1"),
    pytest.param(2, 16, 3, 40, [[1] * 16, [1, 0, 15]], 16, id="L1-docs-empty"),
    pytest.param(1, 23, 2, 40, [[5, 9, 9]], 16, id="L-below-k"),
    pytest.param(2, 48, 3, 100, [[16, 15, 17], [16, 16, 16]], 16, id="L-is-k-and-k-pm-1"),
    pytest.param(2, 61, 2, 100, [[17, 20, 24], [61]], 16, id="same-padded-length"),
    pytest.param(2, 65, 3, 1, [[20, 1, 44], [65]], 16, id="LF1-docs"),
    pytest.param(2, 65, 3, 500, [[20, 1, 44], [65]], 16, id="LF-beyond-every-doc"),
    pytest.param(1, 90, 2, 7, [[30, 60]], 16, id="LF-below-docs"),
    pytest.param(2, 100, 2, 100, None, 16, id="one-doc-fills-each-row"),
    pytest.param(1, 100, 2, 100, [[100]], None, id="one-doc-auto-block"),
    pytest.param(3, 127, 3, 300, [[10, 10, 10, 1, 1, 0, 30, 31, 34], [127], [5] * 25 + [2]], 16, id="many"),
    pytest.param(1, 40, 2, 50, [[3, 7, 30]], 1, id="k1-one-dft-per-doc"),
    pytest.param(1, 40, 2, 50, [[3, 7, 30]], 7, id="k7"),
    pytest.param(1, 40, 2, 50, [[3, 7, 30]], 64, id="k-beyond-every-doc"),
]


@pytest.mark.parametrize("B, T, D, L_F, rows, block", EDGE_CASES)
def test_gemm_float64_matches_numpy_convolve(B, T, D, L_F, rows, block):
    _check_backend("gemm", "fp32", torch.float64, B, T, D, L_F, rows, block)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_gemm_float64_ignores_the_precision(precision):
    _check_backend("gemm", precision, torch.float64, 2, 40, 3, 64, [[9, 1, 0, 30], [40]], 16)


@pytest.mark.parametrize(
    "precision, dtype",
    [
        pytest.param("fp32", torch.float32, id="fp32"),
        pytest.param("bf16", torch.float32, id="bf16-precision-fp32-io"),
        pytest.param("fp32", torch.bfloat16, id="bf16-io"),
    ],
)
def test_gemm_low_precision(precision, dtype):
    bound = BOUNDS[("gemm", precision)] if dtype == torch.float32 else BOUNDS[("gemm", "bf16")]
    gen = torch.Generator().manual_seed(2)
    B, T, D, L_F = 2, 300, 8, 300
    cu = _cu([[100, 3, 197], [300]], T)
    x, h, upstream = _randn(gen, B, T, D).to(dtype), _randn(gen, D, L_F).to(dtype), _randn(gen, B, T, D)
    y, dx, dh = _run("gemm", x, h, cu, upstream, precision=precision)
    assert y.dtype == dtype and dx.dtype == dtype and dh.dtype == dtype
    y_ref, dx_ref, dh_ref = _run("torch", x.double(), h.double(), cu, upstream)
    assert_close(y, y_ref, bound, "y")
    assert_close(dx, dx_ref, bound, "dx")
    assert_close(dh, dh_ref, bound, "dh")


# ---- the Triton kernels (interpreter without CUDA: tiny shapes) ----


TRITON_CASES = [
    # B, T, D, L_F, document lengths per row, block, precision (the GPU's fp32 dots are tf32: bound 1e-3)
    pytest.param(1, 1, 1, 1, None, None, "fp32", id="T1-LF1"),
    pytest.param(2, 48, 3, 100, [[16, 15, 1, 0, 16], [17, 20, 11]], 16, "fp32", id="k-pm-1-L1-same-P"),
    pytest.param(2, 65, 5, 1, [[20, 1, 44], [65]], 16, "fp32", id="LF1-docs"),
    pytest.param(1, 600, 2, 600, None, 16, "fp32", id="two-col-tiles-m75"),
    pytest.param(2, 20, 65, 40, [[9, 11], [20]], 32, "fp32", id="D65-two-channel-blocks-k32"),
    pytest.param(1, 130, 2, 20, [[3, 127]], 64, "fp32", id="k64-LF-below-doc"),
    pytest.param(2, 50, 4, 60, [[9, 1, 0, 40], [50]], 16, "bf16", id="bf16"),
]


@pytest.mark.parametrize("B, T, D, L_F, rows, block, precision", TRITON_CASES)
def test_triton_matches_numpy_convolve(B, T, D, L_F, rows, block, precision, poisoned_outputs):
    _check_backend("triton", precision, torch.float32, B, T, D, L_F, rows, block)


@pytest.mark.parametrize(
    "dtype", [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")]
)
def test_triton_half_inputs_and_an_fp32_filter(dtype, poisoned_outputs):
    """The mixer's case: half activations, fp32 filter; y and dx in x's dtype, dh in h's."""
    gen = torch.Generator().manual_seed(3)
    cu = _cu([[7, 25], [32]], 32)
    x, h, upstream = _randn(gen, 2, 32, 4).to(dtype), _randn(gen, 4, 32).float(), _randn(gen, 2, 32, 4)
    y, dx, dh = _run("triton", x, h, cu, upstream, block=16)
    assert (y.dtype, dx.dtype, dh.dtype) == (dtype, dtype, torch.float32)
    y_ref, dx_ref, dh_ref = _run("torch", x.double(), h.double(), cu, upstream.to(dtype))
    for name, actual, expected in [("y", y, y_ref), ("dx", dx, dx_ref), ("dh", dh, dh_ref)]:
        assert_close(actual, expected, 1e-2, name)


@pytest.mark.parametrize("B, T, D, L_F, rows, block, precision", [TRITON_CASES[i] for i in (1, 2, 4, 6)])
def test_triton_gradients_alone_and_in_vmap(B, T, D, L_F, rows, block, precision, poisoned_outputs):
    """The same bits from the launches of one op whatever asks for them: dh with x not requiring a gradient (the dx
    stage then runs for dy's stored spectra alone), dx with h not requiring one (no spectra stored); and y, dx, dh
    through the custom op of the vmap path against the float64 reference."""
    gen = torch.Generator().manual_seed(11)
    cu = _cu(rows, T)
    x, h, upstream = _randn(gen, B, T, D).float(), _randn(gen, D, L_F).float(), _randn(gen, B, T, D).float()

    def rubiconv(xs, hs):
        return kernels.rubiconv(xs, hs, cu_seqlens=cu, block=block, backend="triton", precision=precision)

    y, dx, dh = _run("triton", x, h, cu, upstream, block=block, precision=precision)
    hl = h.clone().requires_grad_()
    assert torch.equal(torch.autograd.grad(rubiconv(x, hl), hl, upstream)[0], dh), "dh without dx"
    xl = x.clone().requires_grad_()
    assert torch.equal(torch.autograd.grad(rubiconv(xl, h), xl, upstream)[0], dx), "dx without dh"
    xl, hl = x.clone().requires_grad_(), h.clone().requires_grad_()
    y_vmap = torch.func.vmap(rubiconv)(xl[None], hl[None])[0]
    _, dx_ref, dh_ref = _run("torch", x.double(), h.double(), cu, upstream.double())
    bound = BOUNDS[("triton", precision)]
    assert_close(y_vmap, _numpy_rubiconv(x.double(), h.double(), cu), bound, "y in vmap")
    for name, got, want in zip(("dx", "dh"), torch.autograd.grad(y_vmap, (xl, hl), upstream), (dx_ref, dh_ref),
                               strict=True):
        assert_close(got, want, bound, f"{name} in vmap")


@pytest.mark.parametrize("stage, config", [
    pytest.param("block_fwd", rubiconv_triton.BlockTiles(BC=16, BB=32, BN=64, warps=4, stages=2), id="block-fwd"),
    pytest.param("block_inv", rubiconv_triton.BlockTiles(BC=32, BB=16, BN=32, warps=4, stages=2), id="block-inv"),
    pytest.param("spectrum", rubiconv_triton.SpectrumTiles(rows=16, inner=16, acc=1024, wide=16, warps=4, stages=2),
                 id="spectrum"),
])
def test_triton_stages_at_other_tiles_stay_exact(stage, config, poisoned_outputs):
    """Each stage on tiles of its own, the others at the table's: y, dx and dh of the float64 reference
    (interpreter: exact fp32 dots), on a row whose longest document has more half columns (36) and columns (71)
    than one tile holds, and at k=64 (four chunks of 16 frequency rows, an accumulator of 16 channels)."""
    gen = torch.Generator().manual_seed(0)
    for T, D, L_F, lengths, block in ((600, 3, 600, [37, 563], 16), (130, 2, 20, [3, 127], 64)):
        x, h, dy = (_randn(gen, *shape).float() for shape in ((1, T, D), (D, L_F), (1, T, D)))
        cu = _cu([lengths], T)
        plan = gemm.get_plan(cu, 1, T, L_F, block, DEVICE)
        t = rubiconv_triton._tables(plan, "fp32")
        y, sx, hs = rubiconv_triton._forward(x, h, plan, t, save_spectra=True, configs={stage: config})
        dx, dh = rubiconv_triton._backward(dy, sx, hs, h, plan, t, need_dx=True, configs={stage: config})
        _, dx_ref, dh_ref = _run("torch", x.double(), h.double(), cu, dy.double())
        assert_close(y, _numpy_rubiconv(x.double(), h.double(), cu), 1e-5, f"y, k={block}")
        assert_close(dx, dx_ref, 1e-5, f"dx, k={block}")
        assert_close(dh, dh_ref, 1e-5, f"dh, k={block}")


@pytest.fixture
def tf32_emulated(monkeypatch):
    """The interpreter rounds fp32 dot operands to tf32 as the GPU does (its dots are exact fp32 otherwise)."""
    monkeypatch.setattr(rubiconv_triton, "EMULATE_TF32", True)


def test_triton_tf32_rounding_stays_within_the_fp32_bound(tf32_emulated, poisoned_outputs):
    """The GPU's fp32 path rounds every dot operand to tf32; emulated here, its error lands at tf32 level."""
    gen = torch.Generator().manual_seed(6)
    cu = _cu([[200, 56]], 256)
    x, h, upstream = _randn(gen, 1, 256, 3).float(), _randn(gen, 3, 256).float(), _randn(gen, 1, 256, 3)
    got = _run("triton", x, h, cu, upstream, block=16)
    want = _run("torch", x.double(), h.double(), cu, upstream)
    for name, actual, expected in zip(("y", "dx", "dh"), got, want, strict=True):
        assert 1e-5 < rel_rms_error(actual, expected) <= 1e-3, f"{name}: {rel_rms_error(actual, expected):.3g}"


def test_triton_dh_is_exactly_zero_past_every_document(poisoned_outputs):
    """Taps no document reaches get exactly 0, though each m-group's inverse spans ceil(P/2) taps."""
    gen = torch.Generator().manual_seed(7)
    cu = _cu([[10, 30], [17, 23]], 40)
    x, h = _randn(gen, 2, 40, 3).float().requires_grad_(), _randn(gen, 3, 100).float().requires_grad_()
    kernels.rubiconv(x, h, cu_seqlens=cu, block=16, backend="triton").backward(_randn(gen, 2, 40, 3).float())
    assert (h.grad[:, 30:] == 0).all()
    assert (h.grad[:, 29] != 0).all()


def test_triton_and_gemm_agree_on_their_plan(poisoned_outputs):
    """Same plan, same arithmetic order up to rounding: the two GEMM backends agree to fp32 rounding."""
    gen = torch.Generator().manual_seed(4)
    cu = _cu([[5, 40, 19]], 64)
    x, h = _randn(gen, 1, 64, 3).float(), _randn(gen, 3, 64).float()
    y_gemm = kernels.rubiconv(x, h, cu_seqlens=cu, block=16, backend="gemm")
    y_triton = kernels.rubiconv(x, h, cu_seqlens=cu, block=16, backend="triton")
    assert_close(y_triton, y_gemm, BOUNDS[("triton", "fp32")], "y")


# ---- document isolation: bitwise perturbation, NaN injection, and the leaky control ----

ISO_T, ISO_ROWS = 40, [[7, 1, 0, 12, 20], [40], [3, 3, 3, 31]]
# (start, end) on the flattened axis: row 0's 12-token document, the middle one of row 2's three 3-token
# documents (the three share an m-group, so one batched GEMM), and row 1's one document
TARGETS = [
    pytest.param((8, 20), id="doc-len12"),
    pytest.param((83, 86), id="doc-len3-same-group"),
    pytest.param((40, 80), id="whole-row"),
]
ISO_BACKENDS = [pytest.param("gemm", id="gemm"), pytest.param("triton", id="triton")]


def _iso(backend: str, doc: tuple[int, int], values, cu) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(before, after changing document doc's x to values(x), mask [B, T] of doc's tokens)."""
    gen = torch.Generator().manual_seed(5)
    x, h = _randn(gen, 3, ISO_T, 4).float(), _randn(gen, 4, 64).float()
    flat = torch.arange(3 * ISO_T, device=DEVICE)
    inside = ((flat >= doc[0]) & (flat < doc[1])).view(3, ISO_T)
    changed = torch.where(inside[..., None], values(x, gen), x)
    before = kernels.rubiconv(x, h, cu_seqlens=cu, block=16, backend=backend)
    after = kernels.rubiconv(changed, h, cu_seqlens=cu, block=16, backend=backend)
    return before, after, inside


@pytest.mark.parametrize("doc", TARGETS)
@pytest.mark.parametrize("backend", ISO_BACKENDS)
def test_changing_one_document_leaves_the_others_bitwise_equal(backend, doc):
    new = lambda x, gen: 10 * _randn(gen, *x.shape).float()  # noqa: E731
    before, after, inside = _iso(backend, doc, new, _cu(ISO_ROWS, ISO_T))
    assert not torch.equal(before[inside], after[inside]), "the perturbation did not reach its own document"
    assert torch.equal(before[~inside], after[~inside])


@pytest.mark.parametrize("doc", TARGETS)
@pytest.mark.parametrize("backend", ISO_BACKENDS)
def test_nan_in_one_document_stays_there(backend, doc):
    before, after, inside = _iso(backend, doc, lambda x, gen: float("nan"), _cu(ISO_ROWS, ISO_T))
    assert torch.isnan(after[inside]).all()
    assert torch.equal(before[~inside], after[~inside])


@pytest.mark.parametrize("backend", ISO_BACKENDS)
def test_leaky_control_is_caught(backend):
    """Without cu_seqlens each row is one document: the perturbation must reach the next document."""
    new = lambda x, gen: 10 * _randn(gen, *x.shape).float()  # noqa: E731
    before, after, _ = _iso(backend, (8, 20), new, None)
    assert not torch.equal(before[0, 20:], after[0, 20:])


# ---- input checks ----

_X = torch.zeros(1, 8, 4, device=DEVICE)
BAD_CALLS = [
    pytest.param(dict(precision="fp16"), "'fp16'", id="precision"),
    pytest.param(dict(backend="gemm", block=0), "block", id="gemm-block-0"),
    pytest.param(dict(backend="triton", block=24), "power-of-two block", id="triton-block-24"),
    pytest.param(dict(backend="triton", block=8), "power-of-two block", id="triton-block-8"),
    pytest.param(dict(backend="cufft"), "'cufft'", id="backend"),
]


@pytest.mark.parametrize("kwargs, message", BAD_CALLS)
def test_bad_inputs_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        kernels.rubiconv(_X, torch.ones(4, 3, device=DEVICE), **kwargs)


def test_triton_refuses_float64():
    with pytest.raises(ValueError, match="float64"):
        kernels.rubiconv(_X.double(), torch.ones(4, 3, device=DEVICE).double(), backend="triton")


def test_triton_under_vmap_runs_once_per_run_bitwise(poisoned_outputs):
    """Stacked runs with their own layouts (runners.train.engine): the per-run vmap rule calls the Triton path on plain
    tensors while vmap is active, through its custom op, so outputs and gradients equal each run alone bitwise."""
    gen = torch.Generator().manual_seed(9)
    N, B, T, D, L_F = 2, 2, 24, 3, 30
    cu = torch.stack([_cu([[5, 19], [10, 14]], T), _cu([[1, 0, 23], [24]], T)])  # [N, 5], an empty document
    x, h = _randn(gen, N, B, T, D).float().requires_grad_(), _randn(gen, N, D, L_F).float().requires_grad_()
    up = _randn(gen, N, B, T, D).float()
    y = torch.func.vmap(lambda xs, hs, c: kernels.rubiconv(xs, hs, cu_seqlens=c, block=16, backend="triton"))(x, h, cu)
    dx, dh = torch.autograd.grad(y, [x, h], up)
    for n in range(N):
        xn, hn = x[n].detach().requires_grad_(), h[n].detach().requires_grad_()
        yn = kernels.rubiconv(xn, hn, cu_seqlens=cu[n], block=16, backend="triton")
        assert torch.equal(y[n], yn)
        for got, want in zip((dx[n], dh[n]), torch.autograd.grad(yn, [xn, hn], up[n])):
            assert torch.equal(got, want)


def test_triton_custom_op_schema_and_autograd(poisoned_outputs):
    gen = torch.Generator().manual_seed(10)
    x, h = _randn(gen, 2, 16, 3).float().requires_grad_(), _randn(gen, 3, 20).float().requires_grad_()
    torch.library.opcheck(rubiconv_triton._rubiconv_op, (x, h, _cu([[4, 12], [16]], 16), 16, "fp32"),
                          test_utils=("test_schema", "test_autograd_registration"))
