"""Linear-attention and state-space baselines on fla-core's ops (``models.mixers.fla_ops``): each its paper's
layer around the op, in the small form of fla's layer (``fla/layers/*.py``). D = d_model, H = n_heads.

    gla              GLA (Yang et al. 2024), fla ``GatedLinearAttention``: q, k [H, D/(2H)], v [H, D/H];
                     per-channel forget gate gk = logsigmoid(x W_r W_g + b) / 16 (rank-16 map);
                     out(rmsnorm(o) * silu(x W_o)) per head.
    gated_delta_net  Gated DeltaNet (Yang et al. 2025), fla ``GatedDeltaNet``: q, k [H, D/H], v [H, 2D/H],
                     each through a short conv + SiLU; q, k L2-normalised; beta = sigmoid(x W_b);
                     g = -exp(A_log) * softplus(x W_a + dt_bias) per head; output norm and gate as GLA.
    retnet           RetNet retention (Sun et al. 2023), fla ``MultiScaleRetention``: q, k [H, D/H] with rotary
                     positions (restarting at each document), v [H, 2D/H]; fixed decays 1 - 2^(-5-h);
                     output norm and gate as GLA.
    based            Based (Arora et al. 2024), fla ``BasedLinearAttention``: q, k [H, 16], v [H, D/H];
                     Taylor feature map 1 + x + x^2/2 of q.k/4 (fla's parallel form), normalised.
    mamba2           Mamba-2's SSD layer in fla's simple_gla form (one scalar decay per head): x, z [2D],
                     B, C [16] shared by the heads (one group), dt [H] from one projection; x, B, C through a
                     short conv + SiLU; g = -exp(A_log) * softplus(dt + dt_bias); y = SSD(q=C, k=B, v=x*dt)
                     + D_skip * x; out(rmsnorm(y * silu(z))).
Short convs run ``kernels.short_conv`` (exact per document with cu_seqlens). Every mixer needs fla-core for its
op, on the CPU too (fla's naive functions); without it building one raises ValueError naming the install.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from mixlab import kernels
from mixlab.kernels.utils import BACKENDS
from mixlab.models.layers import Linear, Mixer, MixerConfig, RMSNorm, apply_rope, rope_cos_sin
from mixlab.models.mixers.fla_ops import fla_available, kernel_op_name, linear_attention, load_fla, require_fla
from torch import nn

GLA_GATE_RANK = 16  # fla's gate_low_rank_dim
GLA_GATE_NORMALIZER = 16  # fla's gate_logit_normalizer
BASED_FEATURE_DIM = 16  # fla's feature_dim
MAMBA2_STATE = 16  # d_state N
MAMBA2_EXPAND = 2


class SiLUShortConv(nn.Module):
    """silu(depthwise causal conv(u)) on C channels, no bias: fla's ``ShortConvolution(activation='silu')``,
    with nn.Conv1d's default init U(-1/sqrt(W), 1/sqrt(W))."""

    kernel_op = "short_conv"

    def __init__(self, channels: int, width: int, backend: str | None = None) -> None:
        super().__init__()
        self.backend = backend
        bound = 1 / math.sqrt(width)
        self.weight = nn.Parameter(torch.empty(width, channels).uniform_(-bound, bound))  # [W, C]

    def forward(self, u: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        return F.silu(kernels.short_conv(u, self.weight, cu_seqlens=cu_seqlens, backend=self.backend))


class FlaOp(nn.Module):
    """``fla_ops.linear_attention`` of one op, with the backend the leakage probes and configs set."""

    def __init__(self, op: str, backend: str | None) -> None:
        super().__init__()
        self.op = op
        self.kernel_op = kernel_op_name(op)
        self.backend = backend

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor | None,
                **kw: torch.Tensor | float | None) -> torch.Tensor:
        return linear_attention(self.op, q, k, v, cu_seqlens=cu_seqlens, backend=self.backend, **kw)


class GatedHeadNorm(nn.Module):
    """rmsnorm(o) * silu(gate) over each head's V channels: fla's ``FusedRMSNormGated``."""

    def __init__(self, head_dim: int, eps: float) -> None:
        super().__init__()
        self.norm = RMSNorm(head_dim, eps)

    def forward(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return self.norm(o) * F.silu(gate.view_as(o))  # [B, T, H, V]


class FlaMixer(Mixer):
    """Base of the fla baselines: the op ``op``, heads from config.n_heads; stacks on every backend (the
    Triton op's vmap rule folds the runs into one launch, one per run with documents)."""

    name: str  # its registry name, for messages
    op: str
    stacks_on = (None, *BACKENDS)
    # with documents the op reads the layout on the host (per_document's padded layout, fla's varlen chunks)
    # in code with no per-run rule
    stacks_with_documents = False
    # fla's kernels are opaque to torch.compile. On an H200 (BENCHMARKS.md, `mixlab bench train --model gla`, MAD
    # in-context recall) compiled GLA stacks trained no faster than eager ones: 2.29M against 2.30M tokens/s (6
    # runs) and 2.38M against 2.38M (18) on the chunked kernels, 3.78M against 4.57M (6) on the recurrent ones
    auto_compiles = False
    extra = "baselines"

    @classmethod
    def check_config(cls, config: MixerConfig) -> None:
        require_fla(cls.name)
        for part, width in cls.head_widths(config).items():
            if width % config.n_heads or not width:
                raise ValueError(f"ModelConfig.n_heads={config.n_heads} does not divide the {part} width {width} "
                                 f"of mixer {cls.name!r} (d_model={config.d_model})")

    @classmethod
    def available(cls) -> bool:
        return fla_available()

    @classmethod
    def head_widths(cls, config: MixerConfig) -> dict[str, int]:
        """The widths split into config.n_heads heads."""
        return {"key": config.d_model, "value": config.d_model}

    def __init__(self, config: MixerConfig, layer_idx: int) -> None:
        super().__init__()
        require_fla(self.name)
        load_fla()
        self.n_heads = config.n_heads
        self.attend = FlaOp(self.op, config.kernel_backend)

    def heads(self, t: torch.Tensor) -> torch.Tensor:
        """[B, T, H*d] -> [B, T, H, d]."""
        return t.unflatten(-1, (self.n_heads, -1))


class GatedLinearAttention(FlaMixer):
    """Registry `gla`: gated linear attention (GLA, per-channel forget gate) on fla-core's chunk_gla."""

    name = "gla"
    op = "gla"

    @classmethod
    def head_widths(cls, config: MixerConfig) -> dict[str, int]:
        return {"key": config.d_model // 2, "value": config.d_model}

    def __init__(self, config: MixerConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        d, dk = config.d_model, config.d_model // 2
        self.qkvg = nn.Linear(d, 2 * dk + 2 * d, bias=False)  # q, k, v, output gate
        self.split = (dk, dk, d, d)
        self.forget = nn.Sequential(nn.Linear(d, GLA_GATE_RANK, bias=False), Linear(GLA_GATE_RANK, dk))
        self.out_norm = GatedHeadNorm(d // config.n_heads, config.norm_eps)
        self.out = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v, gate = (self.heads(t) for t in self.qkvg(x).split(self.split, dim=-1))
        gk = self.heads(F.logsigmoid(self.forget(x)) / GLA_GATE_NORMALIZER)  # [B, T, H, dk/H]
        o = self.attend(q, k, v, cu_seqlens, g=gk)  # [B, T, H, d/H]
        return self.out(self.out_norm(o, gate).flatten(-2))


def dt_bias_init(n: int) -> torch.Tensor:
    """Mamba's dt bias [n]: softplus^-1 of dt log-uniform in [1e-3, 0.1] (floored at 1e-4)."""
    dt = torch.exp(torch.rand(n) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
    return dt + torch.log(-torch.expm1(-dt))


def dt_step(a: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """Mamba's step size softplus(a + dt_bias) in fp32: a [B, T, H] -> [B, T, H]; the log decay of a step is
    -exp(A_log) * step."""
    return F.softplus(a.float() + dt_bias.float())


class GatedDeltaNet(FlaMixer):
    """Registry `gated_delta_net`: Gated DeltaNet (delta rule, scalar decay per head) on fla-core's ops."""

    name = "gated_delta_net"
    op = "gated_delta_rule"

    @classmethod
    def head_widths(cls, config: MixerConfig) -> dict[str, int]:
        return {"key": config.d_model, "value": 2 * config.d_model}

    def __init__(self, config: MixerConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        d, h = config.d_model, config.n_heads
        self.split = (d, d, 2 * d)
        self.qkv = nn.Linear(d, 4 * d, bias=False)
        self.qkv_conv = SiLUShortConv(4 * d, config.conv_width, config.kernel_backend)
        self.beta_a = nn.Linear(d, 2 * h, bias=False)  # beta and decay logits per head
        self.a_log = nn.Parameter(torch.empty(h).uniform_(0, 16).log())
        self.dt_bias = nn.Parameter(dt_bias_init(h))
        self.gate = nn.Linear(d, 2 * d, bias=False)
        self.out_norm = GatedHeadNorm(2 * d // h, config.norm_eps)
        self.out = nn.Linear(2 * d, d, bias=False)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        qkv = self.qkv_conv(self.qkv(x), cu_seqlens)
        q, k, v = (self.heads(t) for t in qkv.split(self.split, dim=-1))
        q, k = F.normalize(q, dim=-1, eps=1e-6), F.normalize(k, dim=-1, eps=1e-6)
        b, a = self.beta_a(x).chunk(2, dim=-1)  # [B, T, H] each
        g = -self.a_log.float().exp() * dt_step(a, self.dt_bias)
        o = self.attend(q, k, v, cu_seqlens, g=g, beta=b.sigmoid())  # [B, T, H, 2D/H]
        return self.out(self.out_norm(o, self.gate(x)).flatten(-2))


class Retention(FlaMixer):
    """Registry `retnet`: RetNet's multi-scale retention (fixed decay per head) on fla-core's ops."""

    name = "retnet"
    op = "retention"

    @classmethod
    def check_config(cls, config: MixerConfig) -> None:
        super().check_config(config)
        if (config.d_model // config.n_heads) % 2:
            raise ValueError(f"ModelConfig.n_heads={config.n_heads} gives an odd head size "
                             f"{config.d_model // config.n_heads}; rotary embedding needs an even one")

    def __init__(self, config: MixerConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        d = config.d_model
        self.rope_base = config.rope_base
        self.split = (d, d, 2 * d, 2 * d)
        self.qkvg = nn.Linear(d, 6 * d, bias=False)  # q, k, v, output gate
        self.out_norm = GatedHeadNorm(2 * d // config.n_heads, config.norm_eps)
        self.out = nn.Linear(2 * d, d, bias=False)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v, gate = (self.heads(t) for t in self.qkvg(x).split(self.split, dim=-1))
        q, k = self.rotate(q, cu_seqlens), self.rotate(k, cu_seqlens)
        o = self.attend(q, k, v, cu_seqlens)  # [B, T, H, 2D/H]
        return self.out(self.out_norm(o, gate).flatten(-2))

    def rotate(self, t: torch.Tensor, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
        """Rotary embedding of t [B, T, H, dk] at each token's position in its document."""
        B, T = t.shape[:2]
        cos, sin = rope_cos_sin(T, t.shape[-1], self.rope_base, t.device)  # [T, dk]
        if cu_seqlens is None:
            return apply_rope(t, cos, sin)
        pos = kernels.utils.doc_positions(cu_seqlens, B, T).flatten()  # [B*T]
        return apply_rope(t.reshape(1, B * T, *t.shape[2:]), cos[pos], sin[pos]).view_as(t)


class Based(FlaMixer):
    """Registry `based`: Based, linear attention with a Taylor feature map, on fla-core's ops."""

    name = "based"
    op = "based"

    def __init__(self, config: MixerConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        d, f = config.d_model, BASED_FEATURE_DIM * config.n_heads
        self.split = (f, f, d)
        self.qkv = nn.Linear(d, 2 * f + d, bias=False)
        self.out = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = (self.heads(t) for t in self.qkv(x).split(self.split, dim=-1))
        return self.out(self.attend(q, k, v, cu_seqlens).flatten(-2))


class Mamba2(FlaMixer):
    """Registry `mamba2`: Mamba-2's SSD (scalar decay per head, fla's simple_gla form) on fla-core's ops."""

    name = "mamba2"
    op = "simple_gla"

    @classmethod
    def head_widths(cls, config: MixerConfig) -> dict[str, int]:
        return {"inner": MAMBA2_EXPAND * config.d_model}

    def __init__(self, config: MixerConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        d, h, inner = config.d_model, config.n_heads, MAMBA2_EXPAND * config.d_model
        self.split = (inner, MAMBA2_STATE, MAMBA2_STATE)
        self.in_proj = nn.Linear(d, 2 * inner + 2 * MAMBA2_STATE + h, bias=False)  # z, x, B, C, dt
        self.conv = SiLUShortConv(inner + 2 * MAMBA2_STATE, config.conv_width, config.kernel_backend)
        self.a_log = nn.Parameter(torch.empty(h).uniform_(1, 16).log())
        self.dt_bias = nn.Parameter(dt_bias_init(h))
        self.d_skip = nn.Parameter(torch.ones(h))
        self.norm = RMSNorm(inner, config.norm_eps)
        self.out = nn.Linear(inner, d, bias=False)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        inner, h = self.split[0], self.n_heads
        z, xbc, dt = self.in_proj(x).split((inner, inner + 2 * MAMBA2_STATE, h), dim=-1)
        u, b, c = self.conv(xbc, cu_seqlens).split(self.split, dim=-1)
        u = self.heads(u)  # [B, T, H, P]
        step = dt_step(dt, self.dt_bias)  # [B, T, H]
        g = -self.a_log.float().exp() * step
        k, q = (t.unsqueeze(2).expand(*t.shape[:2], h, -1) for t in (b, c))  # [B, T, H, N]: one group
        v = u * step.unsqueeze(-1).to(u.dtype)
        y = self.attend(q, k, v, cu_seqlens, g=g, scale=1.0) + self.d_skip.to(u.dtype)[:, None] * u
        return self.out(self.norm(y.flatten(-2) * F.silu(z)))
