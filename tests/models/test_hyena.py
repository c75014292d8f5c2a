"""The Hyena operator (models/mixers/hyena.py) against an explicit-sum reference: every short-conv tap and every
long-conv tap written out as a sum over the token's own document (or its row, for hyena_leaky)."""

import pytest
import torch
from mixlab.models import MIXERS, ModelConfig

D, T, W = 4, 9, 3
LAYOUT = [[4, 5], [1, 2, 6]]  # documents per row, one of a single token
B = len(LAYOUT)


def config(mixer: str, order: int) -> ModelConfig:
    return ModelConfig(vocab_size=7, d_model=D, n_layers=1, mixer=mixer, n_heads=2, mlp_hidden=8, max_seq_len=T,
                       conv_width=W, hyena_order=order, kernel_backend="torch")


def doc_starts() -> torch.Tensor:
    """[B, T] index of the first token of each token's document."""
    starts = torch.zeros(B, T, dtype=torch.long)
    for r, lengths in enumerate(LAYOUT):
        s = 0
        for length in lengths:
            starts[r, s:s + length] = s
            s += length
    return starts


def cu_seqlens() -> torch.Tensor:
    offsets = [0]
    for lengths in LAYOUT:
        for length in lengths:
            offsets.append(offsets[-1] + length)
    return torch.tensor(offsets, dtype=torch.int32)


def explicit_hyena(mixer, x: torch.Tensor, long_starts: torch.Tensor) -> torch.Tensor:
    """y[b, t] by explicit sums in float64: short conv taps k < W from the token's document start on, long conv
    taps from ``long_starts[b, t]`` on (the document start, or 0 for one convolution per row)."""
    x = x.double()
    u = x @ mixer.in_proj.weight.double().T  # [B, T, (N+1) D]
    w, bias = mixer.short_conv.weight.double(), mixer.short_conv.bias.double()  # [W, (N+1) D], [(N+1) D]
    starts = doc_starts()
    conv = torch.zeros_like(u)
    for b in range(B):
        for t in range(T):
            conv[b, t] = u[b, t] + bias + sum(w[k] * u[b, t - k] for k in range(W) if t - k >= starts[b, t])
    *gates, z = conv.split(D, dim=-1)
    filters, skip = mixer.filters.double(), mixer.skip.double()  # [N-1, D, L_F], [N-1, D]
    for o, gate in enumerate(reversed(gates[1:])):
        g = gate * z
        out = torch.zeros_like(g)
        for b in range(B):
            for t in range(T):
                taps = range(t - int(long_starts[b, t]) + 1)
                out[b, t] = sum(filters[o, :, j] * g[b, t - j] for j in taps) + skip[o] * g[b, t]
        z = out
    return (gates[0] * z) @ mixer.out_proj.weight.double().T


@pytest.mark.parametrize("order", [2, 3], ids=["order2", "order3"])
@pytest.mark.parametrize("mixer", ["hyena", "hyena_leaky"])
def test_hyena_matches_the_explicit_sums(mixer, order):
    torch.manual_seed(order)
    module = MIXERS[mixer](config(mixer, order), 0)
    with torch.no_grad():  # non-trivial short conv taps and skips: the init's are nearly zero and one
        module.short_conv.weight.normal_()
        module.skip.normal_()
    x = torch.randn(B, T, D)
    long_starts = torch.zeros(B, T, dtype=torch.long) if module.leaks_across_documents else doc_starts()
    expected = explicit_hyena(module, x, long_starts)
    with torch.no_grad():
        y = module(x, cu_seqlens=cu_seqlens())
    assert module.filters.shape == (order - 1, D, T) and module.in_proj.out_features == (order + 1) * D
    torch.testing.assert_close(y.double(), expected, rtol=1e-4, atol=1e-5)


def test_the_leaky_hyena_differs_only_across_documents():
    """One FFT per row changes the outputs of every document after a row's first, never the first's."""
    exact, leaky = MIXERS["hyena"](config("hyena", 2), 0), MIXERS["hyena_leaky"](config("hyena_leaky", 2), 0)
    leaky.load_state_dict(exact.state_dict())
    x = torch.randn(B, T, D)
    with torch.no_grad():
        diff = (exact(x, cu_seqlens=cu_seqlens()) - leaky(x, cu_seqlens=cu_seqlens())).abs().amax(-1)  # [B, T]
    first = doc_starts() == 0
    assert (diff[first] < 1e-6).all() and (diff[~first] > 1e-6).all()


@pytest.mark.parametrize("order", [0, 1], ids=["zero", "one"])
def test_order_below_two_is_refused(order):
    with pytest.raises(ValueError, match="hyena_order"):
        config("hyena", order)
