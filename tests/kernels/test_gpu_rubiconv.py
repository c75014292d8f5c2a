"""RubiConv's backends on a CUDA GPU at large shapes against the float64 "torch" backend: y, dx and dh of every
backend and precision within the precision's bound, every Triton buffer poisoned with NaN; then, on the benchmark's
row, Triton's bitwise repeats and a perturbed document that changes no other. Skipped without CUDA
(tests/conftest.py)."""

import math

import numpy as np
import pytest
import torch
from kernel_checks import assert_close
from mixlab import kernels

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_outputs")]

DEVICE = torch.device("cuda")
# (backend, precision) -> relative RMS bound: the exact FFT reference, then the GEMM form
RUNS = [("torch", "fp32", 1e-5), ("gemm", "fp32", 1e-3), ("gemm", "bf16", 2e-2), ("triton", "fp32", 1e-3),
        ("triton", "bf16", 2e-2)]
# bfloat16 inputs and outputs: rounding y, dx and dh to bfloat16 alone costs ~2e-3
IO_BOUND = {torch.bfloat16: 1e-2}


def layout(B: int, T: int, kind: str, seed: int, device: torch.device = DEVICE) -> torch.Tensor | None:
    """cu_seqlens: none (one document a row), lognormal (median ~810 tokens, the benchmark's), short (1-64
    tokens), uniform (64 random cuts a row)."""
    if kind == "none":
        return None
    rng = np.random.default_rng(seed)
    offsets = [0]
    for row in range(B):
        end = (row + 1) * T
        while offsets[-1] < end:
            if kind == "lognormal":
                step = max(1, int(rng.lognormal(6.7, 1.0)))
            elif kind == "short":
                step = int(rng.integers(1, 65))
            else:
                step = int(rng.integers(1, 2 * T // 64))
            offsets.append(min(end, offsets[-1] + step))
    return torch.tensor(offsets, dtype=torch.int32, device=device)


def grads(backend, precision, x, h, cu, block, upstream) -> list[torch.Tensor]:
    x, h = x.detach().clone().requires_grad_(), h.detach().clone().requires_grad_()
    y = kernels.rubiconv(x, h, cu_seqlens=cu, block=block, backend=backend, precision=precision)
    return [y, *torch.autograd.grad(y, (x, h), upstream.to(y.dtype))]


CASES = [
    # B, T, D, L_F, layout, block, dtype
    pytest.param(1, 65536, 1024, 65536, "lognormal", None, torch.float32, id="bench-row-fp32", marks=pytest.mark.slow),
    pytest.param(1, 65536, 1024, 65536, "lognormal", None, torch.bfloat16, id="bench-row-bf16",
                 marks=pytest.mark.slow),
    pytest.param(8, 4096, 256, 4096, "uniform", 64, torch.float32, id="rows-uniform-k64"),
    pytest.param(2, 32768, 128, 32768, "none", None, torch.float32, id="one-doc-rows-32k"),
    pytest.param(4, 8192, 512, 128, "short", None, torch.float32, id="short-docs-LF128"),
    pytest.param(1, 4096, 200, 4096, "lognormal", 16, torch.float32, id="k16-odd-D"),
    pytest.param(1, 16384, 64, 16384, "lognormal", 512, torch.float32, id="k512"),
]


@pytest.mark.parametrize("B, T, D, L_F, kind, block, dtype", CASES)
def test_every_backend_and_precision_against_float64(B, T, D, L_F, kind, block, dtype, device=DEVICE):
    gen = torch.Generator(device=device).manual_seed(0)
    cu = layout(B, T, kind, 0, device)
    x = torch.randn(B, T, D, generator=gen, device=device).to(dtype)
    h = (torch.randn(D, L_F, generator=gen, device=device) / math.sqrt(L_F)).to(dtype)
    upstream = torch.randn(B, T, D, generator=gen, device=device)
    want = grads("torch", "fp32", x.double(), h.double(), cu, block, upstream.double())
    for backend, precision, bound in RUNS:
        got = grads(backend, precision, x, h, cu, block, upstream)
        for name, a, b in zip(("y", "dx", "dh"), got, want, strict=True):
            assert_close(a, b, max(bound, IO_BOUND.get(dtype, 0.0)), f"{backend} {precision}: {name}")


@pytest.mark.slow
def test_triton_on_the_benchmark_row_repeats_bitwise_and_keeps_documents_apart(device=DEVICE, T=65536, D=1024):
    cu = layout(1, T, "lognormal", 0, device)
    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(1, T, D, generator=gen, device=device)
    h = torch.randn(D, T, generator=gen, device=device) / math.sqrt(T)

    def run(a):
        return kernels.rubiconv(a, h, cu_seqlens=cu, backend="triton")

    y = run(x)
    assert torch.equal(y, run(x)), "two runs differ"
    offsets = cu.tolist()
    j = int(np.argmax(np.diff(offsets)))  # the longest document
    inside = torch.zeros(T, dtype=torch.bool, device=device)
    inside[offsets[j]: offsets[j + 1]] = True
    perturbed = run(torch.where(inside[None, :, None], 10 * torch.randn_like(x), x))
    assert not torch.equal(y[0, inside], perturbed[0, inside]), "the perturbation did not reach its document"
    assert torch.equal(y[0, ~inside], perturbed[0, ~inside])
