"""Every registered mixer against a naive reference written here, plus RoPE's invariant.

Each reference reads the module's own parameters by name and recomputes the mixer with explicit loops: attention
head by head with the rotation of every (i, i + hd/2) channel pair written out and a causal softmax over each
document's earlier tokens; the short convs as sums over their taps with each token's generated weights; the long
convs as a sum over the filter taps, restarting at each document (rubiconv) or running across the whole row
(fft_conv_leaky). The parameters are redrawn at a scale where every term matters (the init's 0.02 conv weights
would hide a tap off by one under the residual), and the module runs in float64 on the torch backends; its
rotary tables are float32, hence the tolerance.

The shapes, causality and blindness tests (test_mixers.py) hold for a wrongly wired mixer; these do not (RoPE
left off the keys, a tap off by one, a causal mask shifted by one).
"""

import math

import pytest
import torch
from mixlab.models import MIXERS, ModelConfig
from mixlab.models.layers import apply_rope, rope_cos_sin
from torch import nn

D, N_HEADS, WIDTH, RANK, CONV_HEAD = 8, 2, 3, 2, 4
HEAD_DIM = D // N_HEADS
ROPE_BASE = 50.0  # low, so the rotation angles differ clearly between neighbouring positions
# document lengths per row: a one-token document, documents shorter than the conv width, a whole row
LAYOUT = [[3, 4], [1, 2, 4], [7]]
B, T = len(LAYOUT), 7
TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}


def segments(per_document: bool) -> list[tuple[int, int, int]]:
    """(row, start, length) of every document, or of every whole row."""
    if not per_document:
        return [(row, 0, T) for row in range(B)]
    out = []
    for row, lengths in enumerate(LAYOUT):
        for i, length in enumerate(lengths):
            out.append((row, sum(lengths[:i]), length))
    return out


def layout_cu_seqlens() -> torch.Tensor:
    lengths = [length for row in LAYOUT for length in row]
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)


def params(module: nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """The module's parameters under ``prefix`` by their names below it, detached."""
    return {name[len(prefix):]: p.detach() for name, p in module.named_parameters() if name.startswith(prefix)}


# ---- references: one document (or row) of L tokens at a time, positions from 0 ----


def tap_weights(kind: str, p: dict[str, torch.Tensor], x_t: torch.Tensor, channels: int) -> torch.Tensor:
    """The [W, C] tap weights a conv unit applies at one token whose source vector is x_t [D]."""
    if kind == "static":
        return p["weight"]
    if kind == "dynamic_lowrank":
        z = p["to_z.weight"] @ x_t + p["to_z.bias"]  # [R]
        return (z @ p["U"]).view(WIDTH, channels) + p["static_w"]
    per_head = (p["to_w.weight"] @ x_t).view(channels // CONV_HEAD, WIDTH)  # [H_conv, W]
    return torch.stack([per_head[c // CONV_HEAD] for c in range(channels)], dim=1) + p["static_w"]  # [W, C]


def conv_unit_reference(kind: str, p: dict[str, torch.Tensor], u: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """u [L, C] + sum over taps k <= t of w_t[k] * u[t - k] (+ the static unit's bias); source x [L, D]."""
    out = u.clone()
    for t in range(u.shape[0]):
        w = tap_weights(kind, p, x[t], u.shape[1])
        for k in range(min(WIDTH, t + 1)):
            out[t] += w[k] * u[t - k]
    return out + p["bias"] if kind == "static" else out


def rotate(vectors: torch.Tensor) -> torch.Tensor:
    """RoPE of [L, hd]: the pair (i, i + hd/2) at position m turns by the angle m * base^(-2i / hd)."""
    out = vectors.clone()
    half = HEAD_DIM // 2
    for m in range(vectors.shape[0]):
        for i in range(half):
            angle = m * ROPE_BASE ** (-2 * i / HEAD_DIM)
            a, b = vectors[m, i], vectors[m, i + half]
            out[m, i] = a * math.cos(angle) - b * math.sin(angle)
            out[m, i + half] = a * math.sin(angle) + b * math.cos(angle)
    return out


def attention_reference(mixer: nn.Module, kind: str, x: torch.Tensor) -> torch.Tensor:
    p = params(mixer)
    qkv = x @ p["qkv.weight"].T  # [L, 3D]: Q, K, V, each head after head
    if kind != "none":
        qkv = conv_unit_reference(kind, params(mixer, "qkv_conv."), qkv, x)
    heads = []
    for h in range(N_HEADS):
        q, k, v = (qkv[:, part * D + h * HEAD_DIM:part * D + (h + 1) * HEAD_DIM] for part in range(3))
        q, k = rotate(q), rotate(k)
        out = torch.zeros_like(v)
        for t in range(x.shape[0]):
            scores = torch.stack([q[t] @ k[s] / math.sqrt(HEAD_DIM) for s in range(t + 1)])
            weights = torch.exp(scores - scores.max())
            weights = weights / weights.sum()
            out[t] = sum(weights[s] * v[s] for s in range(t + 1))
        heads.append(out)
    return torch.cat(heads, dim=1) @ p["out.weight"].T


def short_conv_reference(mixer: nn.Module, kind: str, x: torch.Tensor) -> torch.Tensor:
    return conv_unit_reference(kind, params(mixer, "conv."), x, x) @ params(mixer)["out.weight"].T


def long_conv_reference(mixer: nn.Module, kind: str, x: torch.Tensor) -> torch.Tensor:
    """out_proj((sum_j h[:, j] * v[t - j] + skip * v) * gate), the sum over the taps j <= t."""
    p = params(mixer)
    v, gate = (x @ p["in_proj.weight"].T).chunk(2, dim=1)  # [L, D] each
    y = torch.stack([sum(p["filter"][:, j] * v[t - j] for j in range(t + 1)) for t in range(x.shape[0])])
    return ((y + p["skip"] * v) * gate) @ p["out_proj.weight"].T


def identity_reference(mixer: nn.Module, kind: str, x: torch.Tensor) -> torch.Tensor:
    return x


# name -> (reference, the conv unit kind it applies, whether documents restart it when cu_seqlens is given)
REFERENCES = {
    "attention": (attention_reference, None, True),
    "static_conv": (short_conv_reference, "static", True),
    "dynamic_conv": (short_conv_reference, "dynamic_lowrank", True),
    "dynamic_conv_headwise": (short_conv_reference, "dynamic_headwise", True),
    "rubiconv": (long_conv_reference, None, True),
    "fft_conv_leaky": (long_conv_reference, None, False),
    "none": (identity_reference, None, True),
}
QKV_CONVS = ["none", "static", "dynamic_lowrank", "dynamic_headwise"]
# a registered mixer without a reference fails test_every_registered_mixer_has_a_reference, not a KeyError here
CASES = [pytest.param(name, "none", id=name) for name in MIXERS if name in REFERENCES and name != "attention"] + [
    pytest.param("attention", q, id=f"attention-qkv_{q}") for q in QKV_CONVS
]


def make_mixer(name: str, qkv_conv: str) -> nn.Module:
    """The mixer in float64 with every parameter redrawn from N(0, 0.5^2) (seeded)."""
    config = ModelConfig(vocab_size=11, d_model=D, n_layers=1, mixer=name, n_heads=N_HEADS, mlp_hidden=0,
                         max_seq_len=T + 2, qkv_conv=qkv_conv, conv_width=WIDTH, conv_rank=RANK,
                         conv_head_size=CONV_HEAD, rope_base=ROPE_BASE, kernel_backend="torch")
    mixer = MIXERS[name](config, 0).double()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in mixer.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return mixer


def test_every_registered_mixer_has_a_reference():
    missing = sorted(set(MIXERS) - set(REFERENCES))
    assert not missing, f"write a naive reference here for {missing}"
    assert set(REFERENCES) <= set(MIXERS)


@pytest.mark.parametrize(("name", "qkv_conv"), CASES)
@pytest.mark.parametrize("with_docs", [False, True], ids=["rows", "docs"])
def test_mixer_matches_its_naive_reference(name, qkv_conv, with_docs):
    mixer = make_mixer(name, qkv_conv)
    reference, conv_kind, per_document = REFERENCES[name]
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        y = mixer(x, cu_seqlens=layout_cu_seqlens() if with_docs else None)
        expected = torch.empty_like(x)
        for row, start, length in segments(with_docs and per_document):
            doc = x[row, start:start + length]
            expected[row, start:start + length] = reference(mixer, conv_kind or qkv_conv, doc)
    torch.testing.assert_close(y, expected, **TOLERANCE)


def test_rope_scores_depend_only_on_the_offset():
    """q at position m and k at position n, both rotated: q.k is a function of n - m alone, and not a constant
    one; the rotation keeps each vector's norm and leaves position 0 as it is."""
    L, hd = 12, 8
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(hd, generator=gen), torch.randn(hd, generator=gen)
    cos, sin = rope_cos_sin(L, hd, ROPE_BASE, torch.device("cpu"))
    rq = apply_rope(q.expand(1, L, 1, hd), cos, sin)[0, :, 0]  # [L, hd]: q at every position
    rk = apply_rope(k.expand(1, L, 1, hd), cos, sin)[0, :, 0]
    scores = rq @ rk.T  # [m, n]
    by_offset = [scores.diagonal(offset) for offset in range(-L + 1, L)]
    for diagonal in by_offset:
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), atol=1e-5, rtol=1e-5)
    firsts = torch.stack([diagonal[0] for diagonal in by_offset])
    assert firsts.max() - firsts.min() > 0.5, "the score must depend on the offset"
    torch.testing.assert_close(rq.norm(dim=1), q.norm().expand(L))
    torch.testing.assert_close(rq[0], q)
    torch.testing.assert_close(rk[0], k)
