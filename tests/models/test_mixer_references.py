"""Every registered mixer against a naive reference written here, plus RoPE's invariant.

Each reference reads the module's own parameters by name and recomputes the mixer with explicit loops: attention
head by head with the rotation of every (i, i + hd/2) channel pair written out and a causal softmax over each
document's earlier tokens; the short convs as sums over their taps with each token's generated weights; the long
convs as a sum over the filter taps, restarting at each document (rubiconv) or running across the whole row
(fft_conv_leaky); the fla baselines (gla, gated_delta_net, retnet, based, mamba2) as one recurrence per head on a
state S [K, V] from zero at each document start, S_t = diag(decay_t) S_{t-1} + k_t v_t^T (the delta rule's write
for gated_delta_net; Based's Taylor features of q and k, with a column of ones for its normaliser), inside the
layer around it (projections, SiLU short convs, gates, norms). RetNet's rotary positions restart at each
document, but retention scores see q and k only through their offset, so no output shows the restart.

The parameters are redrawn at a scale where every term matters (the init's 0.02 conv weights would hide a tap off
by one under the residual), and the module runs in float64 on the torch backends; its rotary tables, RMSNorms
and fla's naive ops are float32, hence the tolerance.

The shapes, causality and blindness tests (test_mixers.py) hold for a wrongly wired mixer; these do not (RoPE
left off the keys, a tap off by one, a causal mask shifted by one, a decay gate dropped, a state carried into
the next document).
"""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from mixlab.models import MIXERS, ModelConfig
from mixlab.models.layers import apply_rope, rope_cos_sin
from torch import nn

D, N_HEADS, WIDTH, RANK, CONV_HEAD = 8, 2, 3, 2, 4
NORM_EPS = 1e-5
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


def causal_taps(kind: str, p: dict[str, torch.Tensor], u: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Sum over taps k <= t of w_t[k] * u[t - k] for u [L, C], w_t the tap weights at token t (source x [L, D])."""
    out = torch.zeros_like(u)
    for t in range(u.shape[0]):
        w = tap_weights(kind, p, x[t], u.shape[1])
        for k in range(min(WIDTH, t + 1)):
            out[t] += w[k] * u[t - k]
    return out


def conv_unit_reference(kind: str, p: dict[str, torch.Tensor], u: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """u [L, C] + its causal taps (+ the static unit's bias); source x [L, D]."""
    out = u + causal_taps(kind, p, u, x)
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


def hyena_reference(mixer: nn.Module, kind: str, x: torch.Tensor, lengths: list[int] | None = None) -> torch.Tensor:
    """Order N: streams x_0 .. x_{N-1}, v from the static short conv of in_proj(x) (per document of ``lengths``
    when given: the leaky variant's short convs stay inside documents, its long convs cross them); z = v, then
    for n = N-1 .. 1 z = sum_j h[:, j] * (x_n z)[t - j] + skip * x_n z; out_proj(x_0 * z)."""
    p = params(mixer)
    projected, unit = x @ p["in_proj.weight"].T, params(mixer, "short_conv.")
    bounds = itertools.accumulate([0, *(lengths or [x.shape[0]])])
    u = torch.cat([conv_unit_reference("static", unit, projected[a:b], x[a:b])
                   for a, b in itertools.pairwise(bounds)])  # [L, (N+1) D]
    *gates, z = u.chunk(len(p["filters"]) + 2, dim=1)
    for h, skip, gate in zip(p["filters"], p["skip"], reversed(gates[1:])):
        g = gate * z
        z = torch.stack([sum(h[:, j] * g[t - j] for j in range(t + 1)) for t in range(x.shape[0])]) + skip * g
    return (gates[0] * z) @ p["out_proj.weight"].T


def identity_reference(mixer: nn.Module, kind: str, x: torch.Tensor) -> torch.Tensor:
    return x


# ---- the fla baselines: a per-head state S [K, V] updated token by token ----

GATE_NORMALIZER, BASED_FEATURES, SSM_STATE = 16, 16, 16  # fla's gate_logit_normalizer, Based's and Mamba-2's N


def column(t: torch.Tensor, h: int, size: int) -> torch.Tensor:
    """Head h's channels of t [L, H * size] -> [L, size]."""
    return t[:, h * size:(h + 1) * size]


def scan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, decay: torch.Tensor, scale: float,
         beta: torch.Tensor | None = None) -> torch.Tensor:
    """One head, from S_0 = 0: S_t = diag(decay_t) S_{t-1}, then S_t += k_t v_t^T (or, with beta, the delta rule
    S_t += beta_t k_t (v_t - S_t^T k_t)^T); o_t = scale * q_t S_t. q, k [L, K], v [L, V], decay [L, K] (a scalar
    decay repeated over K), beta [L] -> o [L, V]."""
    S = q.new_zeros(q.shape[1], v.shape[1])
    out = []
    for t in range(q.shape[0]):
        S = decay[t][:, None] * S
        write = v[t] if beta is None else beta[t] * (v[t] - S.T @ k[t])
        S = S + torch.outer(k[t], write)
        out.append(scale * q[t] @ S)
    return torch.stack(out)


def rms_norm(t: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + NORM_EPS) * weight


def gated_head_norm(o: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """fla's gated output norm of one head: rmsnorm(o) * silu(gate), o and gate [L, V]."""
    return rms_norm(o, weight) * F.silu(gate)


def gla_reference(mixer: nn.Module, kind: str, x: torch.Tensor) -> torch.Tensor:
    """GLA: per key channel forget gate a_t = sigmoid(x W_r W_g + b)^(1/16); rmsnorm(o) * silu(g) per head."""
    p = params(mixer)
    dk, hk, hv = D // 2, D // 2 // N_HEADS, HEAD_DIM
    q, k, v, gate = (x @ p["qkvg.weight"].T).split((dk, dk, D, D), dim=1)
    forget = torch.sigmoid(x @ p["forget.0.weight"].T @ p["forget.1.weight"].T + p["forget.1.bias"])
    decay = forget ** (1 / GATE_NORMALIZER)  # [L, dk]
    heads = [gated_head_norm(scan(column(q, h, hk), column(k, h, hk), column(v, h, hv), column(decay, h, hk),
                                  hk ** -0.5), column(gate, h, hv), p["out_norm.norm.weight"])
             for h in range(N_HEADS)]
    return torch.cat(heads, dim=1) @ p["out.weight"].T


def mamba_step(a: torch.Tensor, p: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mamba's step dt = softplus(a + dt_bias) [L, H] and the decay exp(-exp(A_log) * dt) [L, H]."""
    dt = F.softplus(a + p["dt_bias"])
    return dt, torch.exp(-p["a_log"].exp() * dt)


def gated_delta_net_reference(mixer: nn.Module, kind: str, x: torch.Tensor) -> torch.Tensor:
    """Gated DeltaNet: q, k, v through silu(short conv); unit q, k; the delta rule with a scalar decay per head."""
    p = params(mixer)
    qkv = F.silu(causal_taps("static", params(mixer, "qkv_conv."), x @ p["qkv.weight"].T, x))
    q, k, v = qkv.split((D, D, 2 * D), dim=1)
    b, a = (x @ p["beta_a.weight"].T).chunk(2, dim=1)  # [L, H] each
    _, decay = mamba_step(a, p)
    gate = x @ p["gate.weight"].T
    heads = []
    for h in range(N_HEADS):
        qh, kh = (column(t, h, HEAD_DIM) for t in (q, k))
        qh, kh = qh / qh.norm(dim=1, keepdim=True), kh / kh.norm(dim=1, keepdim=True)
        o = scan(qh, kh, column(v, h, 2 * HEAD_DIM), decay[:, h, None].expand_as(kh), HEAD_DIM ** -0.5,
                 beta=torch.sigmoid(b[:, h]))
        heads.append(gated_head_norm(o, column(gate, h, 2 * HEAD_DIM), p["out_norm.norm.weight"]))
    return torch.cat(heads, dim=1) @ p["out.weight"].T


def retnet_reference(mixer: nn.Module, kind: str, x: torch.Tensor) -> torch.Tensor:
    """Retention: rotated q, k; head h keeps 1 - 2^(-5-h) of its state each step; gated output norm."""
    p = params(mixer)
    q, k, v, gate = (x @ p["qkvg.weight"].T).split((D, D, 2 * D, 2 * D), dim=1)
    heads = []
    for h in range(N_HEADS):
        qh, kh = (rotate(column(t, h, HEAD_DIM)) for t in (q, k))
        decay = torch.full_like(qh, 1 - 2.0 ** (-5 - h))
        o = scan(qh, kh, column(v, h, 2 * HEAD_DIM), decay, HEAD_DIM ** -0.5)
        heads.append(gated_head_norm(o, column(gate, h, 2 * HEAD_DIM), p["out_norm.norm.weight"]))
    return torch.cat(heads, dim=1) @ p["out.weight"].T


def taylor_features(t: torch.Tensor) -> torch.Tensor:
    """Based's feature map of t [L, F]: [1, t / F^(1/4), t_i t_j / sqrt(2 F)] [L, 1 + F + F^2], so that
    phi(q).phi(k) = 1 + s + s^2 / 2 for s = q.k / sqrt(F), exp's Taylor series to second order."""
    n = t.shape[1]
    square = (t[:, :, None] * t[:, None, :]).flatten(1)
    return torch.cat([torch.ones_like(t[:, :1]), t / n ** 0.25, square / math.sqrt(2 * n)], dim=1)


def based_reference(mixer: nn.Module, kind: str, x: torch.Tensor) -> torch.Tensor:
    """Based: linear attention on the Taylor features, normalised by the running sum of phi(q_t).phi(k_s); the
    state carries the normaliser as a last value column of ones."""
    p = params(mixer)
    f = BASED_FEATURES * N_HEADS
    q, k, v = (x @ p["qkv.weight"].T).split((f, f, D), dim=1)
    heads = []
    for h in range(N_HEADS):
        fq, fk = (taylor_features(column(t, h, BASED_FEATURES)) for t in (q, k))
        vh = torch.cat([column(v, h, HEAD_DIM), torch.ones_like(v[:, :1])], dim=1)
        o = scan(fq, fk, vh, torch.ones_like(fk), 1.0)  # [L, V + 1]
        heads.append(o[:, :-1] / o[:, -1:])
    return torch.cat(heads, dim=1) @ p["out.weight"].T


def mamba2_reference(mixer: nn.Module, kind: str, x: torch.Tensor) -> torch.Tensor:
    """Mamba-2's SSD, one group: h_t = exp(dt_t A) h_{t-1} + B_t (dt_t x_t)^T, y_t = C_t h_t + D_skip x_t per
    head; x, B, C through silu(short conv); out(rmsnorm(y * silu(z)))."""
    p = params(mixer)
    inner, n = 2 * D, SSM_STATE
    z, xbc, a = (x @ p["in_proj.weight"].T).split((inner, inner + 2 * n, N_HEADS), dim=1)
    u, b, c = F.silu(causal_taps("static", params(mixer, "conv."), xbc, x)).split((inner, n, n), dim=1)
    dt, decay = mamba_step(a, p)  # [L, H] each
    size = inner // N_HEADS
    y = torch.cat([scan(c, b, column(u, h, size) * dt[:, h, None], decay[:, h, None].expand_as(b), 1.0)
                   + p["d_skip"][h] * column(u, h, size) for h in range(N_HEADS)], dim=1)
    return rms_norm(y * F.silu(z), p["norm.weight"]) @ p["out.weight"].T


# name -> (reference, the conv unit kind it applies, whether documents restart it when cu_seqlens is given: True,
# False (it reads the whole row), or "short_convs" (only its short convs restart; the reference gets the lengths))
REFERENCES = {
    "attention": (attention_reference, None, True),
    "static_conv": (short_conv_reference, "static", True),
    "dynamic_conv": (short_conv_reference, "dynamic_lowrank", True),
    "dynamic_conv_headwise": (short_conv_reference, "dynamic_headwise", True),
    "rubiconv": (long_conv_reference, None, True),
    "fft_conv_leaky": (long_conv_reference, None, False),
    "hyena": (hyena_reference, None, True),
    "hyena_leaky": (hyena_reference, None, "short_convs"),
    "none": (identity_reference, None, True),
    "gla": (gla_reference, None, True),
    "gated_delta_net": (gated_delta_net_reference, None, True),
    "retnet": (retnet_reference, None, True),
    "based": (based_reference, None, True),
    "mamba2": (mamba2_reference, None, True),
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
                         conv_head_size=CONV_HEAD, rope_base=ROPE_BASE, norm_eps=NORM_EPS,
                         kernel_backend="torch")
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
        for row, start, length in segments(with_docs and per_document is True):
            doc = x[row, start:start + length]
            lengths = {"lengths": LAYOUT[row] if with_docs else None} if per_document == "short_convs" else {}
            expected[row, start:start + length] = reference(mixer, conv_kind or qkv_conv, doc, **lengths)
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
