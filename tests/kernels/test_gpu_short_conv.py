"""The short convs' Triton kernels on a CUDA GPU at large shapes, the shipped launch settings (the streaming forms
where they ship): each case forward and backward with a random upstream gradient against the float64 reference on
the same (rounded) inputs, every launcher buffer poisoned with NaN; then bitwise repeats, document blindness, stacked
runs under vmap and torch.compile. Skipped without CUDA (tests/conftest.py)."""

import numpy as np
import pytest
import torch
from kernel_checks import assert_close, fwd_bwd
from mixlab import kernels

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_outputs")]

DEVICE = torch.device("cuda")
F32, B16, F16 = torch.float32, torch.bfloat16, torch.float16
OPS = {"static": kernels.short_conv, "headwise": kernels.dynamic_conv_headwise, "lowrank": kernels.dynamic_conv_lowrank}
TOKEN_INPUTS = {"static": ("x",), "headwise": ("x", "weight"), "lowrank": ("x", "z")}
LARGE = (4, 4096, 2048, 4)  # B, T, D, W


def layout(B: int, T: int, kind: str, seed: int, device: torch.device = DEVICE) -> torch.Tensor | None:
    """cu_seqlens of a layout: none (one document a row), docs64 (64 random documents), short (lengths 0-9, many
    below W, zeros are empty documents)."""
    if kind == "none":
        return None
    rng = np.random.default_rng(seed)
    offsets = [0]
    for row in range(B):
        if kind == "docs64":
            n = 64 // B + (row < 64 % B)
            k = min(n - 1, T - 1)
            cuts = sorted(rng.choice(np.arange(1, T), size=k, replace=False).tolist()) if k > 0 else []
        else:
            cuts, t = [], 0
            while (t := t + int(rng.integers(0, 10))) < T:  # a step of 0: an empty document
                cuts.append(t)
        offsets += [row * T + c for c in cuts] + [(row + 1) * T]
    return torch.tensor(offsets, dtype=torch.int32, device=device)


def make_inputs(op: str, B: int, T: int, D: int, W: int, size: int, static: bool, dtype, param_dtype, gen,
                device: torch.device = DEVICE) -> dict:
    """Inputs of an op; ``size`` is the head size (headwise) or the rank (lowrank)."""

    def randn(*shape, scale=1.0, dt=dtype):
        return (scale * torch.randn(*shape, generator=gen, device=device)).to(dt)

    x = randn(B, T, D)
    static_w = randn(W, D, scale=W**-0.5, dt=param_dtype) if static else None
    if op == "static":
        return {"x": x, "weight": randn(W, D, scale=W**-0.5, dt=param_dtype)}
    if op == "headwise":
        return {"x": x, "weight": randn(B, T, D // size, W, scale=W**-0.5), "static_w": static_w}
    U = randn(size, W * D, scale=(size * W) ** -0.5, dt=param_dtype)
    return {"x": x, "z": randn(B, T, size), "U": U, "static_w": static_w}


def check_case(op, B, T, D, W, size, docs, static, residual, dtype, param_dtype=None, seed=0,
               device: torch.device = DEVICE) -> None:
    """The op on Triton against the float64 reference: y and every input gradient, each in its input's dtype."""
    gen = torch.Generator(device=device).manual_seed(seed)
    param_dtype = param_dtype or dtype
    cu = layout(B, T, docs, seed, device)
    inputs = make_inputs(op, B, T, D, W, size, static, dtype, param_dtype, gen, device)
    upstream = torch.randn(B, T, D, generator=gen, device=device).to(dtype)
    kwargs = {"cu_seqlens": cu, "residual": residual}
    y, grads = fwd_bwd(OPS[op], inputs, upstream, "triton", **kwargs)
    as64 = {k: None if v is None else v.double() for k, v in inputs.items()}
    y_ref, grads_ref = fwd_bwd(OPS[op], as64, upstream.double(), "torch", **kwargs)
    assert y.dtype == dtype
    assert_close(y, y_ref, dtype, "y")
    for name, grad in grads.items():
        assert grad.dtype == inputs[name].dtype, f"d{name} is {grad.dtype}"
        assert_close(grad, grads_ref[name], dtype, f"d{name}")


def _large_cases() -> list:
    B, T, D, W = LARGE
    return [pytest.param(op, B, T, D, W, size, docs, op != "static", True, dtype, id=f"{op}{size or ''}-{docs}-"
                         f"{str(dtype)[6:]}")
            for dtype in (F32, B16) for docs in ("none", "docs64")
            for op, size in (("static", 0), ("headwise", 1), ("headwise", 16), ("lowrank", 16))]


def _odd_cases() -> list:
    cases = []
    for W in range(1, 9):
        dtype = F32 if W % 2 else B16
        cases += [
            ("static", 3, 1000, 771, W, 0, "short", False, W % 3 == 0, dtype),
            ("headwise", 3, 1000, 768, W, 2 ** (W % 5), "short", W % 2 == 0, True, dtype),
            ("lowrank", 3, 1000, 771, W, 8 if W % 2 else 16, "short", W % 2 == 0, W % 3 == 0, dtype),
        ]
    for W in (9, 12):  # past the streaming forms' slots: the tiled kernels
        cases += [("static", 2, 1031, 1000, W, 0, "docs64", False, True, F32),
                  ("headwise", 2, 1031, 1024, W, 1, "docs64", True, False, B16),
                  ("headwise", 2, 1031, 1024, W, 16, "short", True, True, F32)]
    for hs in (1, 2, 3, 4, 8, 16, 32, 64, 128, 256):
        cases.append(("headwise", 2, 1031, 768 if hs == 3 else 1024, 4, hs, "docs64", True, False,
                      B16 if hs % 3 else F32))
    for R in (1, 8, 16, 20, 32, 64):
        cases.append(("lowrank", 2, 1031, 1000, 4, R, "docs64", True, False, F32 if R % 2 else B16))
    for dtype in (F32, B16):
        for op, size in (("static", 0), ("headwise", 1), ("lowrank", 16)):
            cases += [
                (op, 1, 1, 1, 4, size, "none", True, True, dtype),
                (op, 2, 63, 65, 4, size, "short", True, False, dtype),
                (op, 2, 65, 63, 3, size, "short", False, True, dtype),
                (op, 2, 127, 127, 8, size, "docs64", True, True, dtype),
                (op, 7, 4096, 2048, 4, size, "docs64", True, True, dtype),
            ]
    for op, size in (("static", 0), ("headwise", 16), ("lowrank", 16)):
        cases.append((op, 4, 2048, 2048, 4, size, "docs64", True, True, F16))
    return [pytest.param(*case, id=f"{case[0]}{case[5] or ''}-B{case[1]}-T{case[2]}-D{case[3]}-W{case[4]}-{case[6]}-"
                         f"{str(case[9])[6:]}") for case in cases]


@pytest.mark.parametrize("op, B, T, D, W, size, docs, static, residual, dtype", _large_cases())
def test_large_shapes(op, B, T, D, W, size, docs, static, residual, dtype):
    check_case(op, B, T, D, W, size, docs, static, residual, dtype)


@pytest.mark.parametrize("op, B, T, D, W, size, docs, static, residual, dtype", _odd_cases())
def test_odd_shapes_widths_head_sizes_and_ranks(op, B, T, D, W, size, docs, static, residual, dtype):
    check_case(op, B, T, D, W, size, docs, static, residual, dtype)


@pytest.mark.parametrize(("op", "size"), [("static", 0), ("headwise", 8), ("lowrank", 16)])
def test_bf16_activations_with_fp32_weights(op, size):
    """As the models pass them under autocast."""
    check_case(op, 4, 4096, 2048, 4, size, "docs64", True, True, B16, param_dtype=F32)


@pytest.mark.parametrize(("op", "size"), [("static", 0), ("headwise", 1), ("headwise", 16), ("lowrank", 16)])
def test_two_runs_are_bitwise_equal(op, size, device: torch.device = DEVICE, shape=LARGE):
    B, T, D, W = shape
    gen = torch.Generator(device=device).manual_seed(5)
    inputs = make_inputs(op, B, T, D, W, size, True, B16, B16, gen, device)
    upstream = torch.randn(B, T, D, generator=gen, device=device).to(B16)
    cu = layout(B, T, "docs64", 5, device)
    first, second = (fwd_bwd(OPS[op], inputs, upstream, "triton", cu_seqlens=cu, residual=True) for _ in range(2))
    assert torch.equal(first[0], second[0])
    for name, grad in first[1].items():
        assert torch.equal(grad, second[1][name]), f"d{name} differs between runs"


@pytest.mark.parametrize(("op", "size"), [("static", 0), ("headwise", 1), ("headwise", 4), ("lowrank", 16)])
def test_a_nan_document_leaves_the_others_bitwise_equal(op, size, device: torch.device = DEVICE, shape=LARGE):
    B, T, D, W = shape
    cu = layout(B, T, "docs64", 6, device)
    starts, ends = cu[:-1].tolist(), cu[1:].tolist()
    j = max(range(len(starts)), key=lambda i: ends[i] - starts[i])  # the longest document
    flat = torch.arange(B * T, device=device)
    inside = ((flat >= starts[j]) & (flat < ends[j])).view(B, T)
    gen = torch.Generator(device=device).manual_seed(6)
    inputs = make_inputs(op, B, T, D, W, size, True, B16, B16, gen, device)
    before = OPS[op](**inputs, cu_seqlens=cu, residual=True, backend="triton")
    changed = dict(inputs)
    for name in TOKEN_INPUTS[op]:
        t = inputs[name]
        changed[name] = torch.where(inside.view(B, T, *[1] * (t.dim() - 2)), torch.full_like(t, float("nan")), t)
    after = OPS[op](**changed, cu_seqlens=cu, residual=True, backend="triton")
    assert torch.isnan(after[inside]).all()
    assert torch.equal(before[~inside], after[~inside])


@pytest.mark.parametrize(("op", "size"), [("static", 0), ("headwise", 1), ("headwise", 8), ("lowrank", 16)])
def test_stacked_runs_fold_into_one_launch_bitwise_each_run_alone(op, size, device: torch.device = DEVICE,
                                                                  shape=(6, 8, 512, 384, 4)):
    """Stacked runs under torch.func.vmap (the engine's stacks, no documents), bf16 activations, fp32 weights."""
    N, B, T, D, W = shape
    gen = torch.Generator(device=device).manual_seed(8)
    runs = [make_inputs(op, B, T, D, W, size, True, B16, F32, gen, device) for _ in range(N)]
    names = list(runs[0])
    stacked = {k: torch.stack([r[k] for r in runs]) for k in names}
    upstream = torch.randn(N, B, T, D, generator=gen, device=device).to(B16)

    def conv(*tensors):
        return OPS[op](**dict(zip(names, tensors, strict=True)), residual=True, backend="triton")

    leaves = [stacked[k].clone().requires_grad_() for k in names]
    y = torch.func.vmap(conv)(*leaves)
    grads = torch.autograd.grad(y, leaves, upstream)
    for n in range(N):
        alone = [runs[n][k].clone().requires_grad_() for k in names]
        y_n = conv(*alone)
        assert torch.equal(y[n], y_n), f"run {n}: y"
        for name, stacked_grad, grad in zip(names, grads, torch.autograd.grad(y_n, alone, upstream[n]), strict=True):
            assert torch.equal(stacked_grad[n], grad), f"run {n}: d{name}"


def test_compiled_fullgraph_matches_eager(device: torch.device = DEVICE, shape=(2, 1024, 512, 4, 16)):
    """torch.compile(fullgraph=True) with inductor: the loss and the gradients of the three convs in a row."""
    B, T, D, W, R = shape
    gen = torch.Generator(device=device).manual_seed(7)
    H = D // 8
    w, s = torch.randn(W, D, generator=gen, device=device), torch.randn(W, D, generator=gen, device=device)
    U = torch.randn(R, W * D, generator=gen, device=device) / 8
    x = torch.randn(B, T, D, generator=gen, device=device)
    hw = torch.randn(B, T, H, W, generator=gen, device=device)
    z = torch.randn(B, T, R, generator=gen, device=device)
    cu = layout(B, T, "docs64", 7, device)

    def model(x, hw, z):
        y = kernels.short_conv(x, w, cu_seqlens=cu, residual=True, backend="triton")
        y = kernels.dynamic_conv_headwise(torch.sin(y), hw, s, cu_seqlens=cu, backend="triton")
        return kernels.dynamic_conv_lowrank(y, z, U, s, cu_seqlens=cu, backend="triton").square().mean()

    results = []
    for fn in (model, torch.compile(model, fullgraph=True)):
        leaves = [t.clone().requires_grad_() for t in (x, hw, z)]
        loss = fn(*leaves)
        results.append([loss, *torch.autograd.grad(loss, leaves)])
    for name, compiled, eager in zip(("loss", "dx", "dweight", "dz"), results[1], results[0], strict=True):
        assert_close(compiled, eager, 1e-5, name)
