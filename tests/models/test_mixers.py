"""Every registered mixer (read from MIXERS) and every qkv_conv option: shape, causality, exact document
blindness (perturbation and NaN injection, docs/leakage.md), packing invariance and gradients. Each probe also runs on
a variant built to fail it, so a probe that cannot fail is caught."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from mixlab import kernels
from mixlab.models import MIXERS, ModelConfig, build_model
from mixlab.models.layers import Mixer
from mixlab.models.mixers import attention
from mixlab.models.mixers.attention import causal_sdpa_stacked, document_slots
from torch import nn

D, T = 16, 13
# documents per row: several rows, a one-document row, documents of length 1 and shorter than the width W=4
LAYOUT = [[5, 1, 2, 5], [13], [1, 1, 3, 8]]
B = len(LAYOUT)
DOCS = [(row, start, length) for row, lengths in enumerate(LAYOUT)
        for start, length in zip([sum(lengths[:i]) for i in range(len(lengths))], lengths)]
QKV_CONVS = ["static", "dynamic_lowrank", "dynamic_headwise"]
CASES = [pytest.param(name, "none", id=name) for name in MIXERS] + [
    pytest.param("attention", q, id=f"attention-qkv_{q}") for q in QKV_CONVS
]


def make_config(mixer: str, qkv_conv: str = "none") -> ModelConfig:
    return ModelConfig(vocab_size=11, d_model=D, n_layers=1, mixer=mixer, n_heads=2, mlp_hidden=24,
                       max_seq_len=16, qkv_conv=qkv_conv, conv_width=4, conv_rank=4, conv_head_size=4)


def make_mixer(mixer: str, qkv_conv: str = "none", backend: str | None = None) -> nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return MIXERS[mixer](dataclasses.replace(make_config(mixer, qkv_conv), kernel_backend=backend), 0)


BLIND_CASES = [case for case in CASES if not MIXERS[case.values[0]].leaks_across_documents]


def layout_cu_seqlens(layout=LAYOUT, row_len=T) -> torch.Tensor:
    offsets = [0]
    for row, lengths in enumerate(layout):
        assert sum(lengths) == row_len
        for length in lengths:
            offsets.append(offsets[-1] + length)
        assert offsets[-1] == (row + 1) * row_len
    return torch.tensor(offsets, dtype=torch.int32)


def randn(*shape, seed=0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def outside(row, start, length) -> torch.Tensor:
    """[B, T] bool: True outside document (row, start, length)."""
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[row, start:start + length] = False
    return mask


def cross_document_change(mixer, x, cu, doc) -> float:
    """Perturbation probe: largest change outside `doc` when only `doc`'s inputs change."""
    row, start, length = doc
    with torch.no_grad():
        before = mixer(x, cu_seqlens=cu)
        x2 = x.clone()
        x2[row, start:start + length] += randn(length, D, seed=1)
        after = mixer(x2, cu_seqlens=cu)
    keep = outside(*doc)
    return (after[keep] - before[keep]).abs().max().item()


def nan_escapes(mixer, x, cu, doc, last_only) -> bool:
    """NaN probe: does a NaN in `doc` (all of it, or its last token) reach another document?"""
    row, start, length = doc
    x2 = x.clone()
    x2[row, start + length - 1 if last_only else start:start + length] = float("nan")
    with torch.no_grad():
        y = mixer(x2, cu_seqlens=cu)
    return not torch.isfinite(y[outside(*doc)]).all().item()


def causal_violation(mixer, x, cu, t) -> tuple[float, float]:
    """(largest change before t, largest change at t) when x[:, t] changes."""
    with torch.no_grad():
        before = mixer(x, cu_seqlens=cu)
        x2 = x.clone()
        x2[:, t] += randn(B, D, seed=2)
        after = mixer(x2, cu_seqlens=cu)
    diff = (after - before).abs()
    return diff[:, :t].max().item() if t else 0.0, diff[:, t].max().item()


class TimeReversedConv(nn.Module):
    """Deliberately non-causal: y[t] = x[t] + x[t + 1]."""

    bitwise_causal = True

    def forward(self, x, cu_seqlens=None):
        return x + torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], dim=1)


class DenseMaskMixer(nn.Module):
    """Block-diagonal causal mixing through a dense [BT, BT] 0/1 matrix: bitwise blind to perturbations, yet a
    NaN leaks through 0 * NaN. The pitfall the attention mixer's per-document gather avoids."""

    def forward(self, x, cu_seqlens=None):
        n = x.shape[0] * x.shape[1]
        pos = torch.arange(n)
        doc = torch.searchsorted(cu_seqlens.long()[1:], pos, right=True)  # [BT]
        mask = ((doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None])).to(x.dtype)  # [BT, BT]
        return (mask @ x.reshape(n, -1)).view_as(x)


@pytest.mark.parametrize(("mixer", "qkv_conv"), CASES)
@pytest.mark.parametrize("with_docs", [False, True], ids=["rows", "docs"])
def test_output_shape_and_dtype(mixer, qkv_conv, with_docs):
    y = make_mixer(mixer, qkv_conv)(randn(B, T, D), cu_seqlens=layout_cu_seqlens() if with_docs else None)
    assert y.shape == (B, T, D)
    assert y.dtype == torch.float32
    assert torch.isfinite(y).all()


@pytest.mark.parametrize(("mixer", "qkv_conv"), CASES)
@pytest.mark.parametrize("with_docs", [False, True], ids=["rows", "docs"])
def test_causal(mixer, qkv_conv, with_docs):
    module = make_mixer(mixer, qkv_conv)
    x, cu = randn(B, T, D), layout_cu_seqlens() if with_docs else None
    for t in (0, 4, 7, T - 1):
        before_t, at_t = causal_violation(module, x, cu, t)
        assert at_t > 0
        if module.bitwise_causal:
            assert before_t == 0, f"t={t}"
        else:  # FFT arithmetic: causal up to fp32 rounding
            assert before_t < 1e-5, f"t={t}"


def test_causality_probe_catches_a_non_causal_mixer():
    before_t, _ = causal_violation(TimeReversedConv(), randn(B, T, D), None, 4)
    assert before_t > 0


@pytest.mark.parametrize(("mixer", "qkv_conv"), BLIND_CASES)
def test_blind_to_perturbed_document(mixer, qkv_conv):
    module, x, cu = make_mixer(mixer, qkv_conv), randn(B, T, D), layout_cu_seqlens()
    for doc in DOCS:
        assert cross_document_change(module, x, cu, doc) == 0, f"document {doc}"


@pytest.mark.parametrize(("mixer", "qkv_conv"), BLIND_CASES)
@pytest.mark.parametrize("last_only", [False, True], ids=["whole_doc", "last_token"])
def test_blind_to_nan_document(mixer, qkv_conv, last_only):
    module, x, cu = make_mixer(mixer, qkv_conv), randn(B, T, D), layout_cu_seqlens()
    for doc in DOCS:
        assert not nan_escapes(module, x, cu, doc, last_only), f"document {doc}"


def test_fft_conv_leaky_leaks():
    module, x, cu = make_mixer("fft_conv_leaky"), randn(B, T, D), layout_cu_seqlens()
    first_doc = DOCS[0]  # row 0 holds three more documents after it
    assert cross_document_change(module, x, cu, first_doc) > 1e-4
    assert nan_escapes(module, x, cu, first_doc, last_only=False)


def test_nan_probe_catches_dense_mask_that_perturbation_misses():
    module, x, cu = DenseMaskMixer(), randn(B, T, D), layout_cu_seqlens()
    assert all(cross_document_change(module, x, cu, doc) == 0 for doc in DOCS)
    assert any(nan_escapes(module, x, cu, doc, last_only=False) for doc in DOCS)


@pytest.mark.parametrize(("mixer", "qkv_conv"), BLIND_CASES)
def test_packing_invariance(mixer, qkv_conv):
    """Each document alone (one row, no cu_seqlens) equals its slice of the packed batch."""
    module, x = make_mixer(mixer, qkv_conv), randn(B, T, D)
    with torch.no_grad():
        packed = module(x, cu_seqlens=layout_cu_seqlens())
        for row, start, length in DOCS:
            alone = module(x[row:row + 1, start:start + length])
            torch.testing.assert_close(packed[row:row + 1, start:start + length], alone, rtol=0, atol=1e-5)


@pytest.mark.parametrize(("mixer", "qkv_conv"), CASES)
@pytest.mark.parametrize("with_docs", [False, True], ids=["rows", "docs"])
def test_gradients_reach_every_parameter(mixer, qkv_conv, with_docs):
    module = make_mixer(mixer, qkv_conv)
    x = randn(B, T, D).requires_grad_()
    y = module(x, cu_seqlens=layout_cu_seqlens() if with_docs else None)
    y.backward(randn(B, T, D, seed=3))
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for name, p in module.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_document_slots_layout():
    """Documents of lengths 2, 1, 3 in a padded [3, 3] layout, one slot per token; the empty one gets no row."""
    slot, n_docs, max_len = document_slots(torch.tensor([0, 2, 3, 3, 6], dtype=torch.int32), 6)
    assert (n_docs, max_len) == (3, 3)
    assert slot.tolist() == [0, 1, 3, 6, 7, 8]


@pytest.mark.parametrize("runs_dim", [0, 2], ids=["runs_first", "runs_inside"])
def test_stacked_attention_folds_runs_and_matches_each_run(runs_dim):
    """causal_sdpa_stacked under vmap: each run's output and q/k/v gradients equal plain SDPA on that run."""
    g = torch.Generator().manual_seed(0)
    shape = [3, 4, 2, 17, 8]  # [R, N, H, L, hd] with the run axis moved to runs_dim below
    qkv = [torch.randn(shape, generator=g).movedim(0, runs_dim).requires_grad_() for _ in range(3)]
    up = torch.randn(shape, generator=g)  # [R, N, H, L, hd]
    out = torch.func.vmap(causal_sdpa_stacked, in_dims=runs_dim)(*qkv)  # [R, N, H, L, hd]
    grads = torch.autograd.grad(out, qkv, up)
    for r in range(shape[0]):
        run = [t.select(runs_dim, r) for t in qkv]
        ref = F.scaled_dot_product_attention(*run, is_causal=True)
        ref_grads = torch.autograd.grad(ref, qkv, up[r])
        torch.testing.assert_close(out[r], ref, rtol=1e-6, atol=1e-6)
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got.select(runs_dim, r), want.select(runs_dim, r), rtol=1e-6, atol=1e-6)


def test_stacked_attention_op_registration():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 9, 8, generator=g, requires_grad=True) for _ in range(3))
    torch.library.opcheck(causal_sdpa_stacked, (q, k, v))


def test_a_model_built_to_fold_runs_folds_them_in_attention(monkeypatch):
    """build_model(config, fold_runs=True), as the stacked engine builds its model on CUDA, makes attention call
    causal_sdpa_stacked, whose vmap rule folds the runs into one batch: each run's logits as alone, and the same
    parameters as a model built without it, whose attention never calls the op."""
    calls = []

    def spy(q, k, v):
        calls.append(q.shape)
        return causal_sdpa_stacked(q, k, v)

    monkeypatch.setattr(attention, "causal_sdpa_stacked", spy)
    built = {}
    for fold in (True, False):
        with torch.random.fork_rng():
            torch.manual_seed(0)
            built[fold] = build_model(make_config("attention"), fold_runs=fold)
    assert [m.fold_runs for m in built[True].modules() if isinstance(m, Mixer)] == [True]
    assert [m.fold_runs for m in built[False].modules() if isinstance(m, Mixer)] == [False]
    plain, folded = built[False].state_dict(), built[True].state_dict()
    assert all(torch.equal(plain[name], folded[name]) for name in plain)
    ids = torch.randint(0, 11, (2, B, T), generator=torch.Generator().manual_seed(0))  # two runs
    out = torch.func.vmap(built[True])(ids)  # [2, B, T, V]
    assert calls and calls[-1][0] == 2 * B  # [R * B, H, T, hd]: the op's vmap rule folded the runs
    calls.clear()
    expected = torch.stack([built[False](ids[0]), built[False](ids[1])])
    torch.func.vmap(built[False])(ids)
    assert not calls
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors need the Triton interpreter, set only without "
                    "CUDA; on a GPU tests/runners/test_engine.py's CUDA tests train attention on the kernel")
@pytest.mark.parametrize("with_docs", [False, True], ids=["rows", "docs"])
def test_attention_on_the_triton_kernel_matches_sdpa(with_docs):
    """kernel_backend="triton" sends attention through kernels.causal_attention (the Triton interpreter here):
    outputs and every parameter gradient as on the SDPA path, with and without documents, also stacked."""
    config = dataclasses.replace(make_config("attention"), kernel_backend="triton")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        on_kernel = MIXERS["attention"](config, 0)
    on_sdpa = make_mixer("attention")
    assert attention._on_kernel(randn(1, 2, 3, 8), on_kernel.backend)
    assert not attention._on_kernel(randn(1, 2, 3, 8), on_sdpa.backend)
    x, up = randn(B, T, D), randn(B, T, D, seed=1)
    cu = layout_cu_seqlens() if with_docs else None
    outs = [m(x, cu_seqlens=cu) for m in (on_kernel, on_sdpa)]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    grads = [torch.autograd.grad(o, list(m.parameters()), up) for o, m in zip(outs, (on_kernel, on_sdpa))]
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    stacked = torch.func.vmap(on_kernel)(torch.stack([x, x.flip(1)]))  # two runs through the op's vmap rule
    torch.testing.assert_close(stacked[1], on_kernel(x.flip(1)), rtol=1e-6, atol=1e-6)


def padded_layout(slots: int) -> torch.Tensor:
    """LAYOUT as the training loops lay it out: ``slots`` per row, empty documents at each row's end."""
    doc_ids = torch.tensor([[d for d, length in enumerate(row) for _ in range(length)] for row in LAYOUT])
    return kernels.utils.rows_cu_seqlens(kernels.utils.row_starts(doc_ids, slots), T)


def test_padded_layout_is_the_layout_with_empty_documents():
    padded = padded_layout(6)
    assert padded.shape == (B * 6 + 1,)  # static: slots per row, whatever the documents
    assert padded.unique_consecutive().tolist() == layout_cu_seqlens().tolist()
    assert padded.tolist()[:7] == [0, 5, 6, 8, T, T, 13]  # row 0: its starts, then T = row 1's start
    with pytest.raises(ValueError, match="slots=3 is fewer than the 4 documents"):
        padded_layout(3)


@pytest.mark.parametrize(("name", "qkv_conv"), CASES)
def test_empty_documents_change_no_output_or_gradient(name, qkv_conv):
    """Padding a layout with empty documents (the static layouts of runners.train.run and runners.train.engine) leaves
    every output and every parameter gradient bitwise as with the plain layout."""
    mixer = make_mixer(name, qkv_conv)
    x, up = randn(B, T, D).requires_grad_(), randn(B, T, D, seed=1)
    results = []
    for cu in (layout_cu_seqlens(), padded_layout(4), padded_layout(9)):
        out = mixer(x, cu_seqlens=cu)
        results.append((out, *torch.autograd.grad(out, [x, *mixer.parameters()], up)))
    for padded in results[1:]:
        for got, want in zip(padded, results[0]):
            assert torch.equal(got, want)


STACKED_DOC_CASES = [pytest.param(*c.values, None, id=c.id) for c in CASES
                     if MIXERS[c.values[0]].stacks_with_documents] + [
    # the Triton kernels called from the per-run vmap rules, where vmap is still active (kernels.triton_utils)
    pytest.param(name, "none", "triton", id=f"{name}-triton") for name in ("attention", "rubiconv", "hyena")
]


@pytest.mark.parametrize(("name", "qkv_conv", "backend"), STACKED_DOC_CASES)
def test_stacked_runs_with_their_own_layouts_match_each_run(name, qkv_conv, backend):
    """Under vmap each run's own cu_seqlens [N, n + 1] reaches the mixer batched (runners.train.engine): outputs and
    gradients per run as the run alone (per-run ops: document attention, RubiConv), up to the rounding of
    batched matmuls and FFTs (tests/runners/test_engine.py checks the records bitwise where they are)."""
    mixer = make_mixer(name, qkv_conv, backend)
    names = [n for n, _ in mixer.named_parameters()]
    params = {n: torch.stack([p.detach(), p.detach() * 0.5]).requires_grad_() for n, p in mixer.named_parameters()}
    x, up = randn(2, B, T, D).requires_grad_(), randn(2, B, T, D, seed=1)
    other = torch.tensor([[0, 13, 13, 13, 13], [0, 1, 3, 13, 13], [0, 6, 7, 13, 13]], dtype=torch.int32)  # [B, 5]
    cu = torch.stack([padded_layout(5), kernels.utils.rows_cu_seqlens(other, T)])  # [2, B * 5 + 1]

    def run(p, xs, c):
        return torch.func.functional_call(mixer, p, (xs,), {"cu_seqlens": c})

    out = torch.func.vmap(run)(params, x, cu)
    grads = torch.autograd.grad(out, [x, *(params[n] for n in names)], up)
    for r in range(2):
        alone = {n: params[n][r].detach().requires_grad_() for n in names}
        xr = x[r].detach().requires_grad_()
        want = run(alone, xr, cu[r])
        torch.testing.assert_close(out[r], want, rtol=1e-5, atol=1e-6)
        for n, got, ref in zip(["x", *names], grads, torch.autograd.grad(want, [xr, *alone.values()], up[r])):
            torch.testing.assert_close(got[r], ref, rtol=1e-5, atol=1e-5, msg=n)
