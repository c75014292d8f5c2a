"""The fla-core baselines on a CUDA GPU: fla's Triton kernels against the plain-torch path the CPU runs (fla's naive
functions, per document). Skipped without CUDA (tests/conftest.py) or without fla-core.

- ops: every op of ``models.mixers.fla_ops`` forward and backward (random upstream gradient) through each of fla's
  kernel forms the op has (chunked, fused recurrent), with and without ``cu_seqlens`` (and an empty document), at the
  lab's small head sizes (padded for the kernels) and at head size 64, fp32 and bf16 inputs; the output and every
  input gradient against the torch path on the same inputs in fp32, within 5e-3 (fp32: the kernels' dots may run
  in tf32) or 2e-2 (bf16).
- stacks: each op under ``torch.func.vmap`` (its per-run rule) equals the op run once per run, bitwise.
- mixers: every baseline mixer on "triton" against the same weights on "torch", forward and parameter gradients, with
  and without documents; in fp32, and at the first width under bf16 autocast as training runs them, where a
  tensor's bound is the larger of the bf16 bound and autocast's own shift of the torch path (the gradient of a decay
  parameter sums many terms of both signs).
- leakage: ``mixlab leakage``'s perturbation, NaN and gradient probes through the kernels hold bitwise.
Where fla-core refuses its gated backward (``fla_ops.gated_backward_refused``) the ops run on what the lab puts in
its place (``models/mixers/fla_dqkwg.py``), which these checks cover end to end.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from kernel_checks import assert_close, rel_rms_error
from mixlab.models import MIXERS, ModelConfig
from mixlab.models.mixers import fla_ops

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not fla_ops.fla_available(), reason=fla_ops.INSTALL_HINT)]

DEVICE = torch.device("cuda")
QKV = ("q", "k", "v")
FLA_MIXERS = [name for name, cls in MIXERS.items() if cls.__module__.endswith(".fla")]
BOUND = {torch.float32: 5e-3, torch.bfloat16: 2e-2}
OP_SHAPES = [(2, 100, 4, 8, 8), (2, 256, 4, 64, 64)]  # B, T, H, K, V
MIXER_SHAPES = [(128, 16), (64, 4)]  # d_model, n_heads
ROWS, SEQ_LEN = 4, 256


def random_layout(rows: int, seq_len: int, seed: int, empty: bool = True) -> torch.Tensor:
    """cu_seqlens of random documents (lengths 1 to 80) filling ``rows`` rows of ``seq_len`` tokens, with one
    empty document (a repeated offset) at the start when ``empty``."""
    rng = np.random.default_rng(seed)
    offsets = [0, 0] if empty else [0]
    for row in range(rows):
        t = 0
        while (t := t + int(rng.integers(1, 81))) < seq_len:
            offsets.append(row * seq_len + t)
        offsets.append((row + 1) * seq_len)
    return torch.tensor(offsets, dtype=torch.int32, device=DEVICE)


def op_inputs(op: str, shape: tuple, dtype: torch.dtype, gen: torch.Generator) -> dict[str, torch.Tensor]:
    B, T, H, K, V = shape

    def randn(*size):
        return torch.randn(*size, generator=gen, device=DEVICE)

    q, k, v = randn(B, T, H, K), randn(B, T, H, K), randn(B, T, H, V)
    inputs = {"q": q, "k": k, "v": v}
    if op == "gla":
        inputs["g"] = F.logsigmoid(randn(B, T, H, K)) / 16
    if op in ("simple_gla", "gated_delta_rule"):
        inputs["g"] = F.logsigmoid(randn(B, T, H))
    if op == "gated_delta_rule":
        inputs["q"], inputs["k"] = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        inputs["beta"] = torch.rand(B, T, H, generator=gen, device=DEVICE)
    return {name: t.to(dtype) if name in QKV else t for name, t in inputs.items()}


def op_fwd_bwd(op: str, inputs: dict, upstream: torch.Tensor, cu: torch.Tensor | None,
               backend: str) -> list[torch.Tensor]:
    leaves = {name: t.detach().clone().requires_grad_() for name, t in inputs.items()}
    q, k, v = leaves.pop("q"), leaves.pop("k"), leaves.pop("v")
    o = fla_ops.linear_attention(op, q, k, v, cu_seqlens=cu, backend=backend, **leaves)
    return [o, *torch.autograd.grad(o, [q, k, v, *leaves.values()], upstream)]


@pytest.fixture(scope="module", autouse=True)
def fla_loaded():
    fla_ops.load_fla()


OP_CASES = [pytest.param(op, form, shape, dtype, docs, id=f"{op}-{form}-K{shape[3]}-{str(dtype)[6:]}-{docs}")
            for op in fla_ops.OPS for form in fla_ops.FORMS if form == "chunk" or op in fla_ops.RECURRENT_OPS
            for shape in OP_SHAPES for dtype in BOUND for docs in ("none", "varlen", "varlen+empty")]


@pytest.mark.parametrize("op, form, shape, dtype, docs", OP_CASES)
def test_ops_on_fla_kernels_match_the_torch_path(op, form, shape, dtype, docs, monkeypatch):
    limit = 0 if form == "chunk" else max(s[1] for s in OP_SHAPES)  # rows up to the limit on the recurrent form
    monkeypatch.setattr(fla_ops, "RECURRENT_MAX_T", dict.fromkeys(fla_ops.RECURRENT_OPS, limit))
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    inputs = op_inputs(op, shape, dtype, gen)
    cu = None if docs == "none" else random_layout(shape[0], shape[1], 1, empty=docs.endswith("empty"))
    upstream = torch.randn(*shape[:3], shape[4], generator=gen, device=DEVICE).to(dtype)
    got = op_fwd_bwd(op, inputs, upstream, cu, "triton")
    want = op_fwd_bwd(op, {n: t.float() for n, t in inputs.items()}, upstream.float(), cu, "torch")
    for name, a, b in zip(["o"] + [f"d{n}" for n in inputs], got, want, strict=True):  # q, k, v, then the gates
        assert_close(a.float(), b.float(), BOUND[dtype], name)


@pytest.mark.parametrize("op", fla_ops.OPS)
def test_stacked_runs_equal_each_run_alone(op):
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    runs = [op_inputs(op, OP_SHAPES[0], torch.float32, gen) for _ in range(3)]
    stacked = {n: torch.stack([r[n] for r in runs]) for n in runs[0]}

    def one(inputs: dict) -> torch.Tensor:
        rest = {n: t for n, t in inputs.items() if n not in QKV}
        return fla_ops.linear_attention(op, inputs["q"], inputs["k"], inputs["v"], backend="triton", **rest)

    assert torch.equal(torch.func.vmap(one)(stacked), torch.stack([one(r) for r in runs]))


def mixer_fwd_bwd(module: torch.nn.Module, x: torch.Tensor, cu: torch.Tensor | None,
                  upstream: torch.Tensor) -> list[torch.Tensor]:
    module.zero_grad()
    y = module(x, cu_seqlens=cu)
    y.backward(upstream)
    return [y.detach(), *(p.grad.clone() for p in module.parameters())]


MIXER_CASES = [pytest.param(name, shape, dtype, id=f"{name}-d{shape[0]}-{str(dtype)[6:]}")
               for name in FLA_MIXERS for shape in MIXER_SHAPES
               for dtype in ((torch.float32, torch.bfloat16) if shape == MIXER_SHAPES[0] else (torch.float32,))]


@pytest.mark.parametrize("name, shape, dtype", MIXER_CASES)
@pytest.mark.parametrize("docs", [False, True], ids=["rows", "docs"])
def test_mixers_on_fla_kernels_match_the_torch_path(name, shape, dtype, docs):
    from mixlab.analysis import leakage

    d_model, n_heads = shape
    config = ModelConfig(vocab_size=16, d_model=d_model, n_heads=n_heads, max_seq_len=SEQ_LEN, mixer=name)
    torch.manual_seed(0)
    module = MIXERS[name](config, 0).to(DEVICE)
    x = torch.randn(ROWS, SEQ_LEN, d_model, device=DEVICE)
    upstream = torch.randn_like(x)
    cu = random_layout(ROWS, SEQ_LEN, seed=2) if docs else None
    results = {}
    for backend in ("triton", "torch"):
        leakage.use_backend(module, backend)
        for run_dtype in {dtype, torch.float32}:
            with torch.autocast(DEVICE.type, dtype=run_dtype, enabled=run_dtype != torch.float32):
                results[backend, run_dtype] = mixer_fwd_bwd(module, x, cu, upstream)
    names = ["y"] + [f"d{n}" for n, _ in module.named_parameters()]
    for i, name_i in enumerate(names):
        got, want = results["triton", dtype][i].float(), results["torch", dtype][i].float()
        # under autocast: at least autocast's own shift of the torch path
        shift = rel_rms_error(results["torch", dtype][i], results["torch", torch.float32][i])
        assert_close(got, want, max(BOUND[dtype], shift), name_i)


@pytest.mark.parametrize("name", FLA_MIXERS)
def test_leakage_probes_hold_through_the_kernels(name):
    from mixlab.analysis import leakage

    report = leakage.probe_mixer(name, device=DEVICE, backend="triton")
    assert report.perturbation and report.nan and report.gradient, leakage.format_table([report])
