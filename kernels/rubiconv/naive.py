"""Plain-torch reference of RubiConv: a long causal convolution that restarts at every document start.

Each document gets its own linear (not circular) FFT convolution: with a document of length L and the filter
truncated to K = min(L_F, L) taps (later taps only reach outputs past the document end), an FFT of size
n >= L + K - 1 has no wrap-around, so no output mixes two documents and the result is exact. Documents
are bucketed by ceil(log2(L)) and zero-padded to the longest of their bucket, so one batched FFT serves each
bucket and a packed row costs about log2(T) FFT calls, not one per document. Every stage is linear and
differentiable.
"""

import torch
from mixlab.kernels.utils import compute_dtype, host_offsets, host_to_device


def _fft_size(n: int) -> int:
    """Smallest 2^a * 3^b * 5^c >= n: the sizes the FFT libraries are fastest on."""
    best = 1 << (n - 1).bit_length()
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            size = p35
            while size < n:
                size *= 2
            best = min(best, size)
            p35 *= 3
        p5 *= 5
    return best


def _causal_fft_conv(xs: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """xs: [N, L, D], one document per row, h: [D, L_F] -> [N, L, D], y[t] = sum_{j<=t} h[:, j] x[t-j]."""
    L = xs.shape[1]
    taps = min(h.shape[1], L)
    n = _fft_size(L + taps - 1)
    xf = torch.fft.rfft(xs, n=n, dim=1)  # [N, n // 2 + 1, D]
    hf = torch.fft.rfft(h[:, :taps], n=n, dim=1).T  # [n // 2 + 1, D]
    return torch.fft.irfft(xf * hf, n=n, dim=1)[:, :L]


def _packed_fft_conv(x: torch.Tensor, h: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """x: [B, T, D], h: [D, L_F], cu_seqlens: int32 [n_docs + 1] -> [B, T, D], one convolution a document."""
    B, T, D = x.shape
    cu = host_offsets(cu_seqlens)
    starts, lengths = cu[:-1], cu[1:] - cu[:-1]
    starts, lengths = starts[lengths > 0], lengths[lengths > 0]  # empty documents hold no token
    buckets = torch.ceil(torch.log2(lengths.double())).long()  # exact on powers of two
    x_flat = x.reshape(B * T, D)
    pieces, tokens = [], []
    for bucket in buckets.unique().tolist():
        s, l = starts[buckets == bucket], lengths[buckets == bucket]
        t = torch.arange(int(l.max()))
        valid = host_to_device(t < l[:, None], torch.bool, x.device)  # [n, L_max]
        # [n, L_max], padding reads token 0
        idx = torch.where(valid, host_to_device(s[:, None] + t, torch.long, x.device), 0)
        xs = torch.where(valid[..., None], x_flat[idx], 0.0)  # [n, L_max, D], padding is zero
        pieces.append(_causal_fft_conv(xs, h)[valid])
        tokens.append(idx[valid])
    order = torch.cat(tokens)  # [B * T]: the token each row of cat(pieces) belongs to
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(B * T, device=x.device)
    return torch.cat(pieces)[inverse].view(B, T, D)


def rubiconv_ref(x: torch.Tensor, h: torch.Tensor, *, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """x: [B, T, D], h: [D, L_F] -> y: [B, T, D], y[t, d] = sum_{j=0}^{min(L_F-1, t-start)} h[d, j] x[t-j, d].

    start is the first token of t's document (of t's row without ``cu_seqlens``: one FFT per row). Half types
    compute in float32, float64 stays float64. Inputs are assumed checked (``kernels.rubiconv.op``).
    """
    dtype = compute_dtype(x)
    with torch.autocast(x.device.type, enabled=False):
        xc, hc = x.to(dtype), h.to(dtype)
        y = _causal_fft_conv(xc, hc) if cu_seqlens is None else _packed_fft_conv(xc, hc, cu_seqlens)
    return y.to(x.dtype)
