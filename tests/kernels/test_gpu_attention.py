"""The causal-attention kernel on a CUDA GPU at the MAD table's shapes: bf16, 16 heads of size 8, rows up to 1,024
tokens, q, k and v in the mixers' transposed layout. Forward and backward against the float64 reference, bitwise
repeats at a whole stack of 18 runs, and packed documents through the attention mixer's document path, each
document against itself run alone, and blind to the others. Skipped without CUDA (tests/conftest.py)."""

import numpy as np
import pytest
import torch
from kernel_checks import assert_close
from mixlab import kernels
from mixlab.models.layers import rope_cos_sin
from mixlab.models.mixers.attention import causal_attention as rope_attention
from mixlab.models.mixers.attention import document_attention

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned_outputs")]

DEVICE = torch.device("cuda")
BF16 = torch.bfloat16
H, HD = 16, 8  # the MAD models' heads
ROPE_BASE = 10000.0


def _leaves(gen: torch.Generator, B: int, T: int) -> list[torch.Tensor]:
    """q, k, v leaves [B, T, H, hd] in bf16: each transposed to [B, H, T, hd] is the layout the mixers pass."""
    return [torch.randn(B, T, H, HD, generator=gen, device=DEVICE).to(BF16).requires_grad_() for _ in range(3)]


def _fwd_bwd(leaves: list[torch.Tensor], upstream: torch.Tensor, backend: str) -> list[torch.Tensor]:
    """[o, dq, dk, dv], each [B, T, H, hd], of the public op on the transposed views of ``leaves``."""
    o = kernels.causal_attention(*(t.transpose(1, 2) for t in leaves), backend=backend).transpose(1, 2)
    return [o, *torch.autograd.grad(o, leaves, upstream)]


@pytest.mark.parametrize("T", [127, 255, 511, 1023, 1024])
def test_mad_row_lengths_against_float64(T):
    gen = torch.Generator(device=DEVICE).manual_seed(T)
    leaves = _leaves(gen, 4, T)
    upstream = torch.randn(4, T, H, HD, generator=gen, device=DEVICE).to(BF16)
    got = _fwd_bwd(leaves, upstream, "triton")
    want = _fwd_bwd([t.detach().double().requires_grad_() for t in leaves], upstream.double(), "torch")
    for name, a, b in zip(["o", "dq", "dk", "dv"], got, want, strict=True):
        assert a.dtype == BF16, f"{name} is {a.dtype}"
        assert_close(a, b, BF16, f"{name} at T={T}")


def test_a_stack_of_18_runs_at_1023_repeats_bitwise():
    """The shape a MAD stack folds into one launch (18 runs x 128 rows, T=1023): two calls, the same bits."""
    gen = torch.Generator(device=DEVICE).manual_seed(7)
    leaves = _leaves(gen, 18 * 128, 1023)
    upstream = torch.randn(18 * 128, 1023, H, HD, generator=gen, device=DEVICE).to(BF16)
    first = _fwd_bwd(leaves, upstream, "triton")
    second = _fwd_bwd(leaves, upstream, "triton")
    for name, a, b in zip(["o", "dq", "dk", "dv"], first, second, strict=True):
        assert torch.isfinite(a).all(), name
        assert torch.equal(a, b), f"{name} differs between two calls"


def _packed(rng: np.random.Generator, B: int, T: int, n_docs: int) -> torch.Tensor:
    """cu_seqlens of ``n_docs`` documents of random lengths over B rows of T tokens, two of them empty."""
    cuts = [sorted(rng.choice(np.arange(1, T), size=n_docs // B - 1, replace=False).tolist()) for _ in range(B)]
    offsets = [0] + [row * T + c for row in range(B) for c in cuts[row] + [T]]
    offsets[2:2] = [offsets[1], offsets[1]]  # an empty document, twice, after the first
    return torch.tensor(offsets, dtype=torch.int32, device=DEVICE)


def _documents(qkv: torch.Tensor, cu: torch.Tensor, upstream: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [B, T, D], d qkv [B, T, 3D]) of the Triton document path over the packed rows."""
    leaf = qkv.detach().clone().requires_grad_()
    out = document_attention(leaf, cu, H, ROPE_BASE, "triton")
    return out, torch.autograd.grad(out, leaf, upstream)[0]


def test_packed_documents_at_1024_match_each_document_alone_and_ignore_the_others():
    B, T, D = 2, 1024, H * HD
    rng = np.random.default_rng(5)
    gen = torch.Generator(device=DEVICE).manual_seed(5)
    cu = _packed(rng, B, T, 64)
    qkv = torch.randn(B, T, 3 * D, generator=gen, device=DEVICE).to(BF16)
    upstream = torch.randn(B, T, D, generator=gen, device=DEVICE).to(BF16)
    out, grad = _documents(qkv, cu, upstream)
    # each document alone, float64, through the torch path: a row of its own, positions from 0
    want_out, want_grad = torch.zeros_like(out, dtype=torch.float64), torch.zeros_like(grad, dtype=torch.float64)
    flat_qkv, flat_up = qkv.view(B * T, 3 * D), upstream.view(B * T, D)
    bounds = cu.tolist()
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        if end == start:
            continue
        leaf = flat_qkv[start:end].double().requires_grad_()
        cos, sin = rope_cos_sin(end - start, HD, ROPE_BASE, DEVICE)
        alone = rope_attention(leaf.view(1, end - start, 3, H, HD), cos, sin, "torch").reshape(end - start, D)
        want_out.view(B * T, D)[start:end] = alone.detach()
        want_grad.view(B * T, 3 * D)[start:end] = torch.autograd.grad(alone, leaf, flat_up[start:end].double())[0]
    assert_close(out, want_out, BF16, "out")
    assert_close(grad, want_grad, BF16, "d qkv")
    # a change to one document's tokens leaves every other token's output and gradient bitwise as it was
    start, end = bounds[5], bounds[6]
    changed = qkv.clone()
    changed.view(B * T, 3 * D)[start:end] = torch.randn(end - start, 3 * D, generator=gen, device=DEVICE).to(BF16)
    out2, grad2 = _documents(changed, cu, upstream)
    others = torch.ones(B * T, dtype=torch.bool, device=DEVICE)
    others[start:end] = False
    assert torch.equal(out.view(B * T, D)[others], out2.view(B * T, D)[others])
    assert torch.equal(grad.view(B * T, 3 * D)[others], grad2.view(B * T, 3 * D)[others])
    assert not torch.equal(out.view(B * T, D)[~others], out2.view(B * T, D)[~others])
