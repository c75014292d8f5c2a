"""Plain-torch reference of causal softmax attention: the [T, T] scores materialised, softmax in fp32."""

import torch
from mixlab.kernels.utils import compute_dtype


def causal_attention_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """o[t] = sum_{s <= t} softmax_s(scale * q[t] . k[s]) v[s]; q, k, v: [B, H, T, hd] -> o: [B, H, T, hd].

    ``scale`` defaults to hd ** -0.5. Half types compute in float32, float32 and float64 in their own precision.
    Inputs are assumed checked (``kernels.attention.op``).
    """
    T, hd = q.shape[-2:]
    scale = hd**-0.5 if scale is None else scale
    dtype = compute_dtype(q)
    with torch.autocast(q.device.type, enabled=False):
        qc, kc, vc = (t.to(dtype) for t in (q, k, v))
        scores = scale * qc @ kc.transpose(-1, -2)  # [B, H, T, T]
        future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)  # key after query
        probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
        o = probs @ vc  # [B, H, T, hd]
    return o.to(q.dtype)
