"""The fla-core baselines (models.mixers.fla, fla_ops) on the CPU: the torch path of every op against an explicit
recurrence written here (with and without documents), each mixer learning a tiny MQAR, the leakage probes
confirming their blindness claims, and the one-line message without fla-core. Shapes, causality, NaN and
gradient probes run for them in tests/models/test_mixers.py (parametrised over MIXERS); stacking in
tests/runners/test_engine.py."""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from mixlab.analysis import leakage
from mixlab.models import ModelConfig, build_model
from mixlab.models.mixers import fla_ops
from mixlab.runners.train.metrics import training_loss
from mixlab.tasks import get_task

needs_fla = pytest.mark.skipif(not fla_ops.fla_available(),
                               reason=f"fla-core is not installed ({fla_ops.INSTALL_HINT})")

FLA_MIXERS = ["gla", "gated_delta_net", "retnet", "based", "mamba2"]
B, T, H, K, V = 2, 11, 2, 4, 6


def recurrence(op, q, k, v, g=None, beta=None, scale=None):
    """Token by token in float64, straight from the definitions (fla_ops docstring): o [B, T, H, V]."""
    q, k, v = (t.double() for t in (q, k, v))
    scale = K ** -0.5 if scale is None else scale
    if op == "retention":
        g = fla_ops.retention_log_decay(H).double().expand(q.shape[:3])
    if op == "based":
        s = torch.einsum("bthk,bshk->bhts", q * scale, k)
        f = (1 + s + s * s / 2).tril()  # [B, H, T, T]
        return (torch.einsum("bhts,bshv->bthv", f, v) / (f.sum(-1).transpose(1, 2)[..., None] + 1e-6))
    state = q.new_zeros(q.shape[0], H, K, V)
    out = []
    for t in range(q.shape[1]):
        decay = g[:, t].double().exp()  # [B, H, K] (gla) or [B, H]
        state = state * (decay[..., None] if op == "gla" else decay[..., None, None])
        write = v[:, t]  # [B, H, V]
        if op == "gated_delta_rule":
            write = beta[:, t, :, None].double() * (v[:, t] - torch.einsum("bhk,bhkv->bhv", k[:, t], state))
        state = state + k[:, t, ..., None] * write[..., None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, state))
    return torch.stack(out, dim=1)


def op_inputs(op, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, T, H, K, generator=gen), torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, H, V, generator=gen)
    extra = {}
    if op == "gla":
        extra["g"] = F.logsigmoid(torch.randn(B, T, H, K, generator=gen))
    if op in ("simple_gla", "gated_delta_rule"):
        extra["g"] = F.logsigmoid(torch.randn(B, T, H, generator=gen))
    if op == "gated_delta_rule":
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        extra["beta"] = torch.rand(B, T, H, generator=gen)
    return q, k, v, extra


OP_CASES = [pytest.param(op, None, id=op) for op in fla_ops.OPS] + [
    pytest.param("simple_gla", 1.0, id="simple_gla-scale1"), pytest.param("gated_delta_rule", 0.3, id="gdr-scale")]


@needs_fla
@pytest.mark.parametrize(("op", "scale"), OP_CASES)
def test_torch_path_matches_the_recurrence(op, scale):
    q, k, v, extra = op_inputs(op)
    if scale is not None:
        extra["scale"] = scale
    out = fla_ops.linear_attention(op, q, k, v, backend="torch", **extra)
    assert out.shape == (B, T, H, V) and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), recurrence(op, q, k, v, **extra), rtol=1e-4, atol=1e-4)


@needs_fla
@pytest.mark.parametrize("op", fla_ops.OPS)
def test_torch_path_with_documents_is_the_recurrence_per_document(op):
    q, k, v, extra = op_inputs(op, seed=1)
    bounds = [0, 4, 5, T, T + 7, 2 * T]  # row 0: 4, 1, 6 tokens; row 1: 7, 4
    cu = torch.tensor(bounds, dtype=torch.int32)
    out = fla_ops.linear_attention(op, q, k, v, cu_seqlens=cu, backend="torch", **extra).flatten(0, 1)
    flat = [t.flatten(0, 1) for t in (q, k, v)]
    flat_extra = {name: t.flatten(0, 1) for name, t in extra.items()}
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        doc = [t[lo:hi][None] for t in flat]
        expected = recurrence(op, *doc, **{name: t[lo:hi][None] for name, t in flat_extra.items()})[0]
        torch.testing.assert_close(out[lo:hi].double(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("chunk", [16, 64])
@pytest.mark.parametrize("length", [1, 63, 65, 127])
def test_chunked_gated_delta_rule_matches_the_recurrence_forward_and_backward(length, chunk):
    """The lab's torch form of the gated delta rule (one triangular solve a chunk, a loop over chunks; no fla
    needed) against the token-by-token recurrence in float64: output and the gradients of q, k, v, g and beta
    under a random upstream gradient, at lengths that end mid-chunk, fill one chunk short of a token or span
    several."""
    gen = torch.Generator().manual_seed(length)
    q, k = torch.randn(2, length, H, K, generator=gen), F.normalize(torch.randn(2, length, H, K, generator=gen), dim=-1)
    v = torch.randn(2, length, H, V, generator=gen)
    g, beta = F.logsigmoid(torch.randn(2, length, H, generator=gen)), torch.rand(2, length, H, generator=gen)
    upstream = torch.randn(2, length, H, V, generator=gen)
    leaves = [t.double().requires_grad_() for t in (q, k, v, g, beta)]
    want = recurrence("gated_delta_rule", *leaves[:3], g=leaves[3], beta=leaves[4], scale=0.7)
    want_grads = torch.autograd.grad(want, leaves, upstream.double())
    inputs = [t.clone().requires_grad_() for t in (q, k, v, g, beta)]
    got = fla_ops.chunked_gated_delta_rule(*inputs, scale=0.7, chunk_size=chunk)
    assert got.shape == (2, length, H, V) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)
    for name, a, b in zip(["q", "k", "v", "g", "beta"], torch.autograd.grad(got, inputs, upstream), want_grads):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4, msg=lambda m, name=name: f"d{name}: {m}")


def test_chunked_gated_delta_rule_keeps_fp32_under_autocast():
    """bf16 autocast would round its matmuls, and the state carried from chunk to chunk with them: the form
    computes in fp32 under autocast, to the bit of the form without it."""
    q, k, v, extra = op_inputs("gated_delta_rule", seed=2)
    q, k, v = (t.bfloat16() for t in (q, k, v))
    want = fla_ops.chunked_gated_delta_rule(q, k, v, extra["g"], extra["beta"], scale=0.5, chunk_size=4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = fla_ops.chunked_gated_delta_rule(q, k, v, extra["g"], extra["beta"], scale=0.5, chunk_size=4)
    assert got.dtype == torch.float32
    assert torch.equal(got, want)


@needs_fla
def test_retention_agrees_with_flas_naive_retention():
    from fla.ops.retention.naive import naive_retention

    q, k, v, _ = op_inputs("retention")
    expected = naive_retention(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)
    torch.testing.assert_close(fla_ops.linear_attention("retention", q, k, v, backend="torch"), expected,
                               rtol=1e-4, atol=1e-5)


@needs_fla
def test_bad_op_arguments_raise_one_line():
    q, k, v, extra = op_inputs("gla")
    with pytest.raises(ValueError, match="unknown fla op 'nope'"):
        fla_ops.linear_attention("nope", q, k, v)
    with pytest.raises(ValueError, match="op 'gla' takes only the default scale"):
        fla_ops.linear_attention("gla", q, k, v, scale=1.0, **extra)
    with pytest.raises(ValueError, match="needs a CUDA tensor"):
        fla_ops.linear_attention("gla", q, k, v, backend="triton", **extra)


@needs_fla
def test_fla_autotuners_keep_their_first_config_unless_full_tuning_is_asked_for(monkeypatch):
    fla_ops.load_fla()
    tuners = fla_ops.fla_autotuners()
    assert len(tuners) > 50 and all(len(t.configs) == 1 for t in tuners)
    # fla's own lists, in a fresh process (the trim above is for good in this one)
    count = ("from mixlab.models.mixers import fla_ops; fla_ops.load_fla(); "
             "print(max(len(t.configs) for t in fla_ops.fla_autotuners()))")
    env = {**os.environ, "MIXLAB_FLA_AUTOTUNE": "full"}
    most = subprocess.run([sys.executable, "-c", count], env=env, capture_output=True, text=True, check=True)
    assert int(most.stdout.split()[-1]) > 1
    monkeypatch.setenv("MIXLAB_FLA_AUTOTUNE", "fast")
    with pytest.raises(ValueError, match="MIXLAB_FLA_AUTOTUNE='fast' is not a mode; expected first or full"):
        fla_ops.autotune_mode()


def mqar_losses(mixer: str, steps: int) -> list[float]:
    task = get_task("mqar", vocab_size=16, seq_len=16, num_kv_pairs=2)
    data = task.generate(64, seed=0)
    config = ModelConfig(vocab_size=16, d_model=32, n_heads=2, n_layers=2, mlp_hidden=64, max_seq_len=16,
                         mixer=mixer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = build_model(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        loss = training_loss(model(data.inputs), data.targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@needs_fla
@pytest.mark.parametrize("mixer", FLA_MIXERS)
def test_each_mixer_learns_a_tiny_mqar(mixer, one_torch_thread):
    losses = mqar_losses(mixer, steps=12)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.9 * losses[0], losses


@needs_fla
@pytest.mark.parametrize("mixer", FLA_MIXERS)
def test_leakage_probes_confirm_the_blindness_claim(mixer, one_torch_thread):
    report = leakage.probe_mixer(mixer, rows=2, seq_len=24, d_model=16, n_probes=2)
    assert report.claims_blind
    assert report.perturbation and report.nan and report.gradient and report.packing, report
    assert report.leakage == 0


def test_without_fla_core_the_mixers_say_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fla" else real(name, *a))
    for mixer in FLA_MIXERS:
        with pytest.raises(ValueError, match=r"mixer '\w+' needs fla-core: pip install 'mixlab\[baselines\]'"):
            ModelConfig(vocab_size=11, d_model=16, n_heads=2, mixer=mixer)
    with pytest.raises(ValueError, match=r"mixer 'mamba2' needs fla-core"):
        ModelConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=2, mixer="attention,mamba2")
    assert not set(FLA_MIXERS) & set(leakage.mixer_names())  # `mixlab leakage --mixer all` leaves them out
    assert "attention" in leakage.mixer_names()


@needs_fla
def test_head_widths_are_checked():
    with pytest.raises(ValueError, match=r"n_heads=3 does not divide the key width 8 of mixer 'gla'"):
        ModelConfig(vocab_size=11, d_model=16, n_heads=3, mixer="gla")
    with pytest.raises(ValueError, match="odd head size"):
        ModelConfig(vocab_size=11, d_model=12, n_heads=4, mixer="retnet")


@needs_fla
@pytest.mark.skipif(torch.cuda.is_available(), reason="runs fla's Based kernel on CPU tensors in the Triton "
                    "interpreter, set only without CUDA; on a GPU tests/kernels/test_gpu_fla.py checks every kernel")
def test_the_kernel_op_recomputes_its_backward_and_runs_once_per_run_under_vmap():
    # fla's parallel Based kernel is the one that runs in the interpreter (the others autotune on a driver); it
    # exercises the custom op's wiring: padding of small heads, documents, backward by recomputation, vmap rule
    q, k, v, _ = op_inputs("based", seed=2)
    cu = torch.tensor([0, 3, T, 2 * T], dtype=torch.int32)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = fla_ops.fla_linear_attention(*leaves, None, None, cu, "based", K ** -0.5)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    grads = torch.autograd.grad(out, leaves, upstream)
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = fla_ops.linear_attention("based", *ref_leaves, cu_seqlens=cu, backend="torch")
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, torch.autograd.grad(ref, ref_leaves, upstream)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    runs = torch.stack([q, q.flip(1)]), torch.stack([k, k.flip(1)]), torch.stack([v, v.flip(1)])
    batched = torch.func.vmap(lambda a, b, c: fla_ops.fla_linear_attention(a, b, c, None, None, None, "based",
                                                                           K ** -0.5))(*runs)
    alone = [fla_ops.fla_linear_attention(a, b, c, None, None, None, "based", K ** -0.5) for a, b, c in zip(*runs)]
    assert torch.equal(batched, torch.stack(alone))


@needs_fla
@pytest.mark.skipif(torch.cuda.is_available(), reason="runs fla's fused recurrent kernels on CPU tensors in the "
                    "Triton interpreter, set only without CUDA; on a GPU tests/kernels/test_gpu_fla.py")
@pytest.mark.parametrize("op", fla_ops.RECURRENT_OPS)
@pytest.mark.parametrize("cu", [None, [0, 0, 1, 4, T, T, 2 * T]], ids=["rows", "docs-empty-and-one-token"])
def test_rows_up_to_the_recurrent_limit_take_fla_recurrent_kernel_and_match_the_torch_path(monkeypatch, op, cu):
    """Rows of at most RECURRENT_MAX_T tokens run fla's fused recurrent kernel (never the chunked one), forward
    and backward through the custom op, equal to the torch path (per document) to rounding; longer rows go back
    to the chunked kernel."""
    fla_ops._fla()
    monkeypatch.setattr(fla_ops, "RECURRENT_MAX_T", dict.fromkeys(fla_ops.RECURRENT_OPS, 0) | {op: T})
    others = [other for other in fla_ops.RECURRENT_OPS if other != op]
    assert [fla_ops.kernel_form(other, 1) for other in others] == ["chunk"] * len(others)
    assert [fla_ops.kernel_form(op, t) for t in (1, T, T + 1)] == ["recurrent", "recurrent", "chunk"]
    assert fla_ops.kernel_form("based", 1) == fla_ops.kernel_form("gated_delta_rule", 1) == "chunk"

    def chunked(*args, **kwargs):
        raise AssertionError("the chunked kernel ran")

    monkeypatch.setitem(fla_ops._fla()["kernels"], op, chunked)
    monkeypatch.setitem(fla_ops._fla()["kernels"], "gla", chunked)  # simple_gla's stand-in where fla refuses
    q, k, v, extra = op_inputs(op, seed=6)
    cu = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    names = ["q", "k", "v", *extra]
    leaves = [t.clone().requires_grad_() for t in (q, k, v, *extra.values())]
    gate = leaves[3] if extra else None
    out = fla_ops.fla_linear_attention(*leaves[:3], gate, None, cu, op, K ** -0.5)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    grads = torch.autograd.grad(out, leaves, upstream)
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v, *extra.values())]
    ref = fla_ops.linear_attention(op, *ref_leaves[:3], cu_seqlens=cu, backend="torch",
                                   **dict(zip(extra, ref_leaves[3:])))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for name, got, want in zip(names, grads, torch.autograd.grad(ref, ref_leaves, upstream)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"d{name}: {m}")
    with pytest.raises(ValueError, match="op 'based' has no 'recurrent' kernel"):
        fla_ops.fla_kernel("based", "recurrent", q, k, v)


@needs_fla
@pytest.mark.parametrize(("form", "with_docs", "grid_rows", "launches"),
                         [("chunk", False, None, [3 * B]), ("chunk", True, None, [1, 1, 1]),
                          ("chunk", False, 2 * H, [2] * (3 * B // 2)), ("recurrent", False, 2 * H, [3 * B]),
                          ("recurrent", True, None, [1, 1, 1])],
                         ids=["folded", "documents-per-run", "folded-sliced-at-grid-cap",
                              "recurrent-folded-past-the-cap", "recurrent-documents-per-run"])
def test_stacked_runs_fold_into_one_kernel_launch_unless_they_have_documents(monkeypatch, form, with_docs,
                                                                            grid_rows, launches):
    """Under vmap (the batched engine's stacks) the op's rows of all runs go to fla's kernel as one batch, run
    after run; with documents, one call per run; past the grid cap (rows x heads), the chunked kernel in slices
    of rows (the recurrent one puts rows x heads on the grid's first axis, which has no such cap). The fake
    kernel runs the explicit recurrence on what it is given, so outputs and the gradients of every input (q, k,
    v and the per-run gate; runs may share none) must equal each run alone's."""
    fla_ops._fla()
    monkeypatch.setattr(fla_ops, "RECURRENT_MAX_T", {"gla": T if form == "recurrent" else 0})
    if grid_rows is not None:
        monkeypatch.setattr(fla_ops, "MAX_GRID_ROWS", grid_rows)
    seen = []

    def fake_gla(q, k, v, g, scale=None, cu_seqlens=None):
        seen.append(q.shape[0])
        if cu_seqlens is not None:  # [1, B*T, ...] rows of one run; the documents do not matter here
            q, k, v, g = (t.view(B, T, *t.shape[2:]) for t in (q, k, v, g))
        # the op hands the kernel heads zero-padded to MIN_KERNEL_DIM: the recurrence takes the real channels
        out = recurrence("gla", q[..., :K], k[..., :K], v[..., :V], g=g[..., :K], scale=scale).to(q.dtype)
        out = F.pad(out, (0, v.shape[-1] - V))
        return (out.reshape(1, B * T, *out.shape[2:]) if cu_seqlens is not None else out), None

    monkeypatch.setitem(fla_ops._fla()["kernels" if form == "chunk" else "recurrent"], "gla", fake_gla)
    runs = [op_inputs("gla", seed=10 + n) for n in range(3)]
    stacked = [torch.stack([r[i] if i < 3 else r[3]["g"] for r in runs]).requires_grad_() for i in range(4)]
    cu = torch.tensor([0, 4, T, 2 * T], dtype=torch.int32) if with_docs else None

    def op(q, k, v, g):
        return fla_ops.fla_linear_attention(q, k, v, g, None, cu, "gla", K ** -0.5)

    batched = torch.func.vmap(op)(*stacked)  # [3, B, T, H, V]
    assert seen == launches
    upstream = torch.randn(batched.shape, generator=torch.Generator().manual_seed(5))
    grads = torch.autograd.grad(batched, stacked, upstream)
    for n in range(3):
        leaves = [t[n].detach().clone().requires_grad_() for t in stacked]
        alone = op(*leaves)
        torch.testing.assert_close(batched[n], alone, rtol=0, atol=0)
        for got, want in zip(grads, torch.autograd.grad(alone, leaves, upstream[n])):
            torch.testing.assert_close(got[n], want, rtol=1e-6, atol=1e-6)


@needs_fla
def test_where_fla_refuses_its_gated_backward_simple_gla_runs_on_the_gla_kernel_and_the_delta_rule_keeps_its_own(
        monkeypatch):
    """fla-core 0.6 raises in the backward of simple_gla and the gated delta rule on Hopper GPUs with Triton
    3.4-3.7.0. There simple_gla goes to GLA's kernel with its scalar gate broadcast over K (same recurrence:
    the fake kernel below runs the explicit recurrence on what it is given, including the scale), and the delta
    rule keeps its kernels, with the lab's torch chunk_bwd_dqkwg registered in fla's backend registry."""
    from fla.backends import _get_operation_registry
    from mixlab.models.mixers import fla_dqkwg

    fla_ops._fla()
    called = []

    def fake_gla(q, k, v, g, scale=None, cu_seqlens=None):
        called.append(tuple(g.shape))
        return recurrence("gla", q, k, v, g=g, scale=scale).to(q.dtype), None

    monkeypatch.setattr(fla_ops, "gated_backward_refused", lambda: True)
    monkeypatch.setitem(fla_ops._fla()["kernels"], "gla", fake_gla)
    q, k, v, extra = op_inputs("simple_gla", seed=4)
    got = fla_ops._padded_kernel("simple_gla", q, k, v, extra["g"], None, None, 0.7)
    assert called == [(B, T, H, K)]
    torch.testing.assert_close(got.double(), recurrence("simple_gla", q, k, v, g=extra["g"], scale=0.7))
    registry = _get_operation_registry("common")
    monkeypatch.setattr(registry, "_backends", dict(registry._backends))  # the registration below is undone
    monkeypatch.setattr(fla_ops.kernels.utils, "TRITON_OPS", set())
    monkeypatch.setattr(fla_dqkwg, "_registered", False)
    fla_ops._fla.cache_clear()
    try:
        fla_ops.load_fla()
        assert fla_ops.kernel_op_name("simple_gla") in fla_ops.kernels.utils.TRITON_OPS
        assert fla_ops.kernel_op_name("gated_delta_rule") in fla_ops.kernels.utils.TRITON_OPS
        assert fla_dqkwg.BACKEND_TYPE in registry._backends
    finally:
        fla_ops._fla.cache_clear()


@needs_fla
def test_the_kernel_gets_q_k_v_of_one_dtype_when_autocast_leaves_them_mixed(monkeypatch):
    """Under bf16 autocast the gated delta net's l2-normalised q, k are fp32 and its v bf16; fla's kernels assert
    one dtype in their dots (an H200 run failed so), so the op runs them at v's dtype. The fake kernel asserts as
    fla's do and runs the recurrence; output in q's dtype, every gradient in its input's dtype."""
    fla_ops._fla()
    seen = []

    def fake_gdr(q, k, v, g, beta, scale=None, cu_seqlens=None):
        assert q.dtype == k.dtype == v.dtype, (q.dtype, k.dtype, v.dtype)
        seen.append(v.dtype)
        out = recurrence("gated_delta_rule", q[..., :K], k[..., :K], v[..., :V], g=g, beta=beta, scale=scale)
        return F.pad(out, (0, v.shape[-1] - V)).to(v.dtype), None

    monkeypatch.setitem(fla_ops._fla()["kernels"], "gated_delta_rule", fake_gdr)
    q, k, v, extra = op_inputs("gated_delta_rule", seed=6)
    leaves = [q.requires_grad_(), k.requires_grad_(), v.bfloat16().requires_grad_(), extra["g"].requires_grad_(),
              extra["beta"].requires_grad_()]
    out = fla_ops.fla_linear_attention(*leaves, None, "gated_delta_rule", K ** -0.5)
    assert out.dtype == torch.float32 and seen == [torch.bfloat16]
    want = recurrence("gated_delta_rule", q, k, v.bfloat16().float(), g=extra["g"], beta=extra["beta"])
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2)
    grads = torch.autograd.grad(out, leaves, torch.randn(out.shape, generator=torch.Generator().manual_seed(1)))
    assert [g.dtype for g in grads] == [t.dtype for t in leaves]
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
