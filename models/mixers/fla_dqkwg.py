"""fla-core's gated ``chunk_bwd_dqkwg`` in plain torch, registered as an fla backend where fla refuses its own.

fla-core 0.6 raises instead of running the Triton kernel ``chunk_bwd_dqkwg`` with a per-token gate on Hopper GPUs
with Triton 3.4 to 3.7.0, which compile it wrongly (fla's issue #640); its workaround is a TileLang kernel. The
gated delta rule's chunked backward needs it, so without it the lab trained ``gated_delta_net`` on its torch path
on the H200, a loop over chunks bound by its launches. This module computes the same per-chunk quantities with
batched torch matmuls (no loop, a fixed count of launches whatever the length) and ``register`` hands it to fla's
backend registry (``fla.backends``), so every other kernel of the op's backward stays fla's.

Per chunk of BT tokens (rows of one document: a chunk never crosses a ``cu_seqlens`` boundary), with h, dh the
chunk's entering state and its gradient [K, V], g the chunk-local cumulative gate in log2 units, and
``exp2(g_last)`` its decay to the chunk's end (as fla's kernel reads them):

    dq  = scale (do h^T) * exp2(g)              + ds k
    dk  = (v dh^T) * exp2(g_last - g)           + ds^T q
    ds  = scale (do v^T) * exp2(g_i - g_j)       for j <= i, else 0 (rounded to k's dtype, as the kernel does)
    dw  = -(dv h^T)                              (delta rule only, when ``w`` is given)
    dg  = rowsum(dq * q) - rowsum(dk * k), plus at the chunk's last token
          exp2(g_last) sum(h * dh) + sum(dk_state * k)   (dk_state: dk before its ds^T q term)

Operands are rounded as the kernel rounds them (h, dh and dv to the dtype of the tensor they multiply) and every
product accumulates in fp32. The ungated and ``g_gamma`` forms and grouped value heads are not covered (fla runs
them itself: it refuses only the gated form, and the lab's mixers give every head its own keys).
"""

from __future__ import annotations

import torch

BACKEND_TYPE = "mixlab_torch"


def _chunks(B: int, T: int, BT: int, cu_seqlens: torch.Tensor | None, chunk_indices: torch.Tensor | None,
            device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [NC, BT] on the flattened B*T axis, valid [NC, BT]) of every chunk in fla's order: row by row
    without documents (chunk b * NT + i), else as ``chunk_indices`` lists them (document n, chunk i of it)."""
    offsets = torch.arange(BT, device=device)
    if cu_seqlens is None:
        nt = -(-T // BT)
        row = torch.arange(B, device=device).repeat_interleave(nt) * T
        start, end = row + torch.arange(nt, device=device).repeat(B) * BT, row + T
    else:
        if chunk_indices is None:
            from fla.ops.utils import prepare_chunk_indices

            chunk_indices = prepare_chunk_indices(cu_seqlens, BT)
        doc, i = chunk_indices[:, 0].long(), chunk_indices[:, 1].long()
        cu = cu_seqlens.long()
        start, end = cu[doc] + i * BT, cu[doc + 1]
    tokens = start[:, None] + offsets
    valid = tokens < end[:, None]
    return tokens.clamp(max=B * T - 1), valid


def chunk_bwd_dqkwg_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    do: torch.Tensor,
    h: torch.Tensor,
    dh: torch.Tensor,
    w: torch.Tensor | None = None,
    g: torch.Tensor | None = None,
    g_gamma: torch.Tensor | None = None,
    dv: torch.Tensor | None = None,
    scale: float | None = None,
    state_v_first: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = 64,
    chunk_indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """fla's ``chunk_bwd_dqkwg`` with a gate, its signature and results (module docstring):
    q, k [B, T, H, K]; v, do, dv [B, T, H, V]; h, dh [B, NT, H, K, V] ([.., V, K] with
    ``state_v_first``; NT chunks of each row, or with ``cu_seqlens`` (B = 1) the chunks of every document);
    g [B, T, H] fp32 chunk-local cumulative gate in log2 units; w (delta rule) only says whether dw is wanted.
    -> dq, dk [B, T, H, K] in q's and k's dtype, dw [B, T, H, K] in w's dtype (None without w), dg [B, T, H] fp32.
    """
    accepted, reason = _verifier(q, k, v, do, h, dh, w, g, g_gamma)
    if not accepted:
        raise ValueError(reason)
    B, T, H, K = k.shape
    scale = K ** -0.5 if scale is None else scale
    tokens, valid = _chunks(B, T, chunk_size, cu_seqlens, chunk_indices, q.device)
    NC, BT = tokens.shape

    def gather(t: torch.Tensor) -> torch.Tensor:
        """[B, T, H, D] -> [NC, H, BT, D] fp32, zero at the padding."""
        return (t.reshape(B * T, *t.shape[2:])[tokens].float() * valid[:, :, None, None]).transpose(1, 2)

    def states(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """[B, NT, H, K, V] (or [.., V, K]) -> [NC, H, K, V] fp32, rounded to ``like``'s dtype first."""
        s = t.reshape(NC, H, *t.shape[-2:]).to(like.dtype).float()
        return s.transpose(-1, -2) if state_v_first else s

    qc, kc = gather(q), gather(k)  # [NC, H, BT, K]
    vc, doc = gather(v), gather(do)  # [NC, H, BT, V]
    gc = gather(g[..., None])[..., 0]  # [NC, H, BT]
    h_do, dh_v = states(h, do), states(dh, v)
    dq = doc @ h_do.transpose(-1, -2)  # [NC, H, BT, K]
    dk = vc @ dh_v.transpose(-1, -2)
    ds = doc @ vc.transpose(-1, -2)  # [NC, H, BT, BT]
    dw = None
    if w is not None:
        dw = -(gather(dv) @ states(h, v).transpose(-1, -2))  # dv is rounded to v's dtype, as h is
    last = (valid.sum(1) - 1).clamp(min=0)  # [NC] each chunk's last token
    g_last = gc.gather(2, last[:, None, None].expand(NC, H, 1))  # [NC, H, 1]
    dg_last = (states(h, h) * states(dh, dh)).sum((-1, -2)) * torch.exp2(g_last[..., 0])  # [NC, H]
    dq = dq * torch.exp2(gc)[..., None] * scale
    dk = dk * torch.where(valid[:, None], torch.exp2(g_last - gc), 0.0)[..., None]
    dg_last = dg_last + (dk * kc).sum((-1, -2))
    causal = torch.ones(BT, BT, dtype=torch.bool, device=q.device).tril()
    pairs = causal & valid[:, None, :, None] & valid[:, None, None, :]  # [NC, 1, BT, BT]
    # in place: ds and its decay are the largest tensors here ([NC, H, BT, BT] fp32, 16 KiB a chunk and head at
    # BT 64); exp2 of g_i - g_j above the diagonal may overflow, and the mask zeroes it
    ds.mul_((gc[..., :, None] - gc[..., None, :]).exp2_()).masked_fill_(~pairs, 0.0).mul_(scale)
    ds = ds.to(k.dtype).float()
    dq = dq + ds @ kc
    dk = dk + ds.transpose(-1, -2) @ qc
    dg = (dq * qc).sum(-1) - (dk * kc).sum(-1)  # [NC, H, BT]
    dg = dg.scatter_add(2, last[:, None, None].expand(NC, H, 1), dg_last[..., None])

    # padding slots write to one spare row past the B*T tokens: a boolean-mask index would read the mask on the
    # host, a device sync at every call (16 a training step of a two-layer stack, in the H200 profile)
    target = torch.where(valid, tokens, B * T).flatten()  # [NC * BT]

    def scatter(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[NC, H, BT, ...] at the valid tokens -> [B, T, H, ...] (each token is in exactly one chunk)."""
        x = x.transpose(1, 2).flatten(0, 1)  # [NC * BT, H, ...]
        out = x.new_full((B * T + 1, *x.shape[1:]), float("nan"))  # a token no chunk covers would stay NaN
        out[target] = x
        return out[:-1].unflatten(0, (B, T)).to(dtype)

    dw = None if dw is None else scatter(dw, w.dtype)
    return scatter(dq, q.dtype), scatter(dk, k.dtype), dw, scatter(dg[..., None], torch.float32)[..., 0]


def _verifier(q, k, v, do, h, dh, w=None, g: torch.Tensor | None = None, g_gamma: torch.Tensor | None = None,
              *args, **kwargs) -> tuple[bool, str | None]:
    """fla's verifier protocol: (accepted, why not)."""
    if g is None or g_gamma is not None:
        return False, "the lab's torch chunk_bwd_dqkwg covers the per-token gate only (g given, g_gamma None)"
    if v.shape[2] != k.shape[2]:
        return False, (f"the lab's torch chunk_bwd_dqkwg takes as many value heads as key heads, got {v.shape[2]} "
                       f"and {k.shape[2]}")
    return True, None


_registered = False


def registered() -> bool:
    """Whether this process registered the torch form (records say so: ``runners.train.provenance``)."""
    return _registered


def register() -> None:
    """Make fla's ``chunk_bwd_dqkwg`` dispatch its gated calls to ``chunk_bwd_dqkwg_torch`` (once a process)."""
    global _registered
    if _registered:
        return
    from fla.backends import BaseBackend
    from fla.backends import register as fla_register

    class TorchBackend(BaseBackend):
        backend_type = BACKEND_TYPE
        priority = 4  # before fla's own alternatives (5), which ``fla_ops.gated_backward_refused`` found absent

        def chunk_bwd_dqkwg(self, *args, **kwargs):
            return chunk_bwd_dqkwg_torch(*args, **kwargs)

        def chunk_bwd_dqkwg_verifier(self, *args, **kwargs):
            return _verifier(*args, **kwargs)

    fla_register("common")(TorchBackend)
    _registered = True
