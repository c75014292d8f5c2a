"""Causal multi-head attention with rotary embedding on all head dims and an optional short conv on Q, K, V.

With documents (cu_seqlens) attention is exactly blind to other documents without a dense [T, T] mask: a
masked score still enters P @ V as 0 * v, and 0 * NaN = NaN, so one poisoned document would reach the others.
Instead every document is copied into its own row of a zero-padded [n_docs, L_max, ...] batch (padding is
zeros, never another document), causal attention runs per row with positions restarting at 0, and the valid
positions are read back. Padding sits after each document's end, so the causal mask hides it. Each token has
exactly one slot, so both copies and their gradients are plain one-to-one index ops: gathering the padding
from one shared zero row instead made the backward an accumulate onto that row from every padded slot, which
serialised on the GPU (4.3 of 4.6 s of CUDA time in 20 packed steps, ``mixlab bench profile run``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from mixlab import kernels
from mixlab.kernels.attention.triton import MAX_HEAD_DIM
from mixlab.kernels.triton_utils import TRITON_DTYPES, per_run
from mixlab.models.layers import Linear, Mixer, MixerConfig, apply_rope, rope_cos_sin
from mixlab.models.mixers.short_conv import check_conv_unit, make_conv_unit

# Runs stacked under ``torch.func.vmap`` in a model built with ``fold_runs`` (``models.build_model``) call
# ``causal_sdpa_stacked``, whose vmap rule folds the run axis into the batch axis and calls the fused kernels on
# plain tensors, instead of the fused SDPA batch rules, which failed in backward on an H200 (torch 2.11, "LSE is not
# correctly aligned") and whose only alternative, the math backend, made a stack of runs 3x slower. Gradients are
# unchanged: the fold only reshapes, so every run's rows meet the same kernels as when it trains alone.


@torch.library.custom_op("mixlab::causal_sdpa_stacked", mutates_args=())
def causal_sdpa_stacked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal SDPA, q, k, v [N, H, L, hd] -> [N, H, L, hd], as an op with its own vmap rule (fold)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@causal_sdpa_stacked.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(q)


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv for upstream grad [N, H, L, hd]: the forward is recomputed (cheap at the lab's lengths) so
    the fused backward kernel runs as in a plain autograd pass. vmap has folded the runs by now: the graph
    recorded the op on the folded tensors."""
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in ctx.saved_tensors]
        out = F.scaled_dot_product_attention(*leaves, is_causal=True)
        dq, dk, dv = torch.autograd.grad(out, leaves, grad)
    return dq, dk, dv


causal_sdpa_stacked.register_autograd(_backward, setup_context=_setup_context)


def _fold(info, in_dims, tensors) -> list[torch.Tensor]:
    """Each [R, N, ...] (run axis at its in_dim, or absent) -> [R * N, ...]."""
    out = []
    for t, dim in zip(tensors, in_dims):
        t = t.movedim(dim, 0) if dim is not None else t.expand(info.batch_size, *t.shape)
        out.append(t.reshape(-1, *t.shape[2:]))
    return out


@causal_sdpa_stacked.register_vmap
def _(info, in_dims, q, k, v):
    folded = _fold(info, in_dims, (q, k, v))
    return causal_sdpa_stacked(*folded).unflatten(0, (info.batch_size, -1)), 0


def document_slots(cu_seqlens: torch.Tensor, n_tokens: int) -> tuple[torch.Tensor, int, int]:
    """Padded per-document layout of the flattened token axis.

    Returns slot [n_tokens] (Long): each token's row-major position in a padded [n_docs, L_max] layout (document
    d, offset o -> d * L_max + o), unique and increasing, plus n_docs and L_max. Empty documents hold no token
    and get no row, so padding a layout with them changes nothing. Computed on the host from the offsets' host
    copy (``kernels.utils.host_offsets``: no device sync when the caller kept one) and copied to the device.
    """
    cu = kernels.utils.host_offsets(cu_seqlens)
    starts, lengths = cu[:-1], cu[1:] - cu[:-1]  # [n_docs]
    keep = lengths > 0
    starts, lengths = starts[keep], lengths[keep]
    n_docs, max_len = len(lengths), int(lengths.max())
    doc = torch.repeat_interleave(torch.arange(n_docs), lengths, output_size=n_tokens)  # [n_tokens]
    slot = doc * max_len + torch.arange(n_tokens) - starts[doc]
    return kernels.utils.host_to_device(slot, torch.long, cu_seqlens.device), n_docs, max_len


class Attention(Mixer):
    """Fused qkv projection -> optional residual conv on [Q, K, V] -> RoPE -> causal attention -> out projection;
    both projections biased with ``proj_bias`` (config). With ``fold_runs`` (``Mixer``), rows without documents
    go through ``causal_sdpa_stacked`` on the SDPA path.

    qkv_conv (config): "none", or a conv unit (models.mixers.short_conv) on the 3D channels of [Q, K, V]
    after the projection and before RoPE; dynamic weights are generated from the mixer's input x.
    The attention itself: with the kernel backend resolving to "triton" (auto on CUDA), the tiny-head Triton
    kernel (``kernels.causal_attention``: at the MAD head size of 8 it beats every fused SDPA backend); else
    torch's fused SDPA, which is this mixer's plain-torch path (the CPU default, float64, heads over the
    kernel's largest).
    """

    takes_qkv_conv = True
    kernel_op = "causal_attention"

    @classmethod
    def check_config(cls, config: MixerConfig) -> None:
        """D must divide by n_heads into an even head size (rotary embedding), and the qkv conv must fit D."""
        if config.d_model % config.n_heads:
            raise ValueError(f"ModelConfig.d_model={config.d_model} is not divisible by "
                             f"n_heads={config.n_heads}")
        if (config.d_model // config.n_heads) % 2:
            raise ValueError(f"ModelConfig.n_heads={config.n_heads} gives an odd head size "
                             f"{config.d_model // config.n_heads}; rotary embedding needs an even one")
        check_conv_unit(config.qkv_conv, config)

    def __init__(self, config: MixerConfig, layer_idx: int) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.head_dim = config.d_model // config.n_heads
        self.rope_base = config.rope_base
        self.backend = config.kernel_backend
        self.qkv = Linear(config.d_model, 3 * config.d_model, bias=config.proj_bias)
        self.qkv_conv = None
        if config.qkv_conv != "none":
            self.qkv_conv = make_conv_unit(config.qkv_conv, config, 3 * config.d_model)
        self.out = Linear(config.d_model, config.d_model, bias=config.proj_bias)
        # RoPE tables [max_seq_len, hd] (fp32), made once: made in the forward, they were fused into compiled
        # stacks' RoPE kernels, which then computed cos and sin for every element of q and k (BENCHMARKS.md)
        cos, sin = rope_cos_sin(config.max_seq_len, self.head_dim, config.rope_base, torch.device("cpu"))
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def rope_tables(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [length, hd] for positions 0..length-1: the module's rows, or made anew for a length past
        max_seq_len (the mixer called on its own; a language model refuses such rows)."""
        if length <= self.rope_cos.shape[0]:
            return self.rope_cos[:length], self.rope_sin[:length]
        return rope_cos_sin(length, self.head_dim, self.rope_base, self.rope_cos.device)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        B, T, D = x.shape
        H, hd = self.n_heads, self.head_dim
        qkv = self.qkv(x)  # [B, T, 3D]
        if self.qkv_conv is not None:
            qkv = self.qkv_conv(qkv, x, cu_seqlens=cu_seqlens)
        if cu_seqlens is None:
            cos, sin = self.rope_tables(T)
            out = causal_attention(qkv.view(B, T, 3, H, hd), cos, sin, self.backend,
                                   fold_runs=self.fold_runs)  # [B, T, H, hd]
            return self.out(out.reshape(B, T, D))
        return self.out(_document_attention_per_run(qkv, cu_seqlens, H, self.rope_base, self.backend))


def causal_attention(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backend: str | None, *,
                     fold_runs: bool = False) -> torch.Tensor:
    """qkv [N, L, 3, H, hd], one sequence per row starting at position 0 -> [N, L, H, hd]: RoPE by the tables
    cos, sin [L, hd] (``rope_cos_sin``), then causal attention by the Triton kernel (``_on_kernel``) or torch's
    fused SDPA, through ``causal_sdpa_stacked`` when ``fold_runs`` (under vmap over stacked runs, the runs fold
    into its batch)."""
    q, k, v = qkv.unbind(2)  # [N, L, H, hd] each
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [N, H, L, hd]
    if _on_kernel(q, backend):
        # the kernel takes the transposed layout without a copy; its custom op folds stacked runs itself
        return kernels.causal_attention(q, k, v, backend="triton").transpose(1, 2)
    if fold_runs:
        return causal_sdpa_stacked(q, k, v).transpose(1, 2)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)


def _on_kernel(q: torch.Tensor, backend: str | None) -> bool:
    """Whether the Triton kernel runs: the backend resolves to "triton" and the kernel takes q's dtype and
    head size (under auto, anything else stays on SDPA; an explicit "triton" then fails in the kernel)."""
    if kernels.resolve_backend(backend, q, Attention.kernel_op) != "triton":
        return False
    return backend == "triton" or (q.dtype in TRITON_DTYPES and q.shape[-1] <= MAX_HEAD_DIM)


def document_attention(qkv: torch.Tensor, cu_seqlens: torch.Tensor, n_heads: int, rope_base: float,
                       backend: str | None) -> torch.Tensor:
    """qkv [B, T, 3D] of packed documents -> [B, T, D]: each document attends within itself, in its own row of a
    zero-padded [n_docs, L_max] batch (module docstring)."""
    B, T, D3 = qkv.shape
    hd = D3 // (3 * n_heads)
    slot, n_docs, max_len = document_slots(cu_seqlens, B * T)
    flat = qkv.reshape(B * T, 3, n_heads, hd)
    padded = flat.new_zeros(n_docs * max_len, 3, n_heads, hd).index_copy(0, slot, flat)
    cos, sin = rope_cos_sin(max_len, hd, rope_base, qkv.device)
    out = causal_attention(padded.view(n_docs, max_len, 3, n_heads, hd), cos, sin, backend)  # [n_docs, L_max, H, hd]
    return out.reshape(n_docs * max_len, n_heads * hd).index_select(0, slot).view(B, T, D3 // 3)


# Stacked runs (torch.func.vmap) each have their own layout, read on the host: one call per run.
_document_attention_per_run = per_run(
    "document_attention", document_attention,
    lambda qkv, *args: qkv.new_empty(*qkv.shape[:-1], qkv.shape[-1] // 3))
