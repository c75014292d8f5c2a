"""``mixlab bench attention``: the Triton causal-attention kernel against torch SDPA with each backend forced.

The MAD models' attention: 16 heads of size 8, rows of T tokens, stacked runs folded into the batch. For each T
the batch B is chosen so that a call holds about ``tokens`` tokens (default 18 stacked runs of batch 128 at
T=128). One markdown table per T: forward and forward+backward medians of ``triton.testing.do_bench`` for the
Triton kernel (contiguous [B, H, T, hd], and the mixers' transposed [B, T, H, hd] layout) and for
``F.scaled_dot_product_attention`` under each forced backend (cuDNN, flash, memory-efficient, math; on a CPU
only math); tokens per second (N = B*T tokens a call, all heads), the byte-floor bandwidth achieved and the
ratio to the floor. A backend that refuses the shape or runs out of memory gets a note instead of timings. The
GPU name and versions go on top.

Byte floor: the bytes the op must move at least, divided by the device's measured copy bandwidth. With s the
bytes of an element: forward reads q, k, v and writes o, 4 N H hd s; forward+backward also reads q, k, v, o, do
and writes dq, dk, dv, 12 N H hd s in all. The kernels' fp32 row statistics (lse, delta: 4 N H bytes each) are
not counted.

Correctness gate, before any timing: the Triton output and q, k, v gradients of the benchmark call, on its
first GATE_ROWS sequences (each sequence is independent), against the float64 reference; a failing kernel gets
no Triton timings.
"""

import datetime
from collections.abc import Callable

import torch
import torch.nn.functional as F
from mixlab import kernels
from mixlab.kernels.attention.naive import causal_attention_ref
from mixlab.runners.bench.shortconv import DTYPES, RMS_BOUND
from mixlab.runners.bench.utils import copy_bandwidth, device_line, fwd_bwd_call, fwd_call, measure_pair, rel_rms
from torch.nn.attention import SDPBackend, sdpa_kernel

MAD_TOKENS = 18 * 128 * 128  # 18 stacked runs of batch 128 at T=128
GATE_ROWS = 8
# The Triton interpreter on a CPU manages a few thousand tokens a call in reasonable time.
CPU_MAX_TOKENS = 4096
SDPA_BACKENDS = {
    "cuDNN": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}


def _sdpa(backend: SDPBackend) -> Callable[..., torch.Tensor]:
    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return run


def _triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return kernels.causal_attention(q, k, v, backend="triton")


def _gate(inputs: dict, upstream: torch.Tensor) -> float:
    """Worst relative RMS error of the Triton output and gradients on the first GATE_ROWS sequences."""
    got = fwd_bwd_call(_triton, inputs, upstream)()
    first = {name: t[:GATE_ROWS].double() for name, t in inputs.items()}
    want = fwd_bwd_call(causal_attention_ref, first, upstream[:GATE_ROWS].double())()
    return max(rel_rms(a[:GATE_ROWS], b) for a, b in zip(got, want, strict=True))


def _heads_inner(t: torch.Tensor) -> torch.Tensor:
    """[B, H, T, hd] -> the same values laid out as a contiguous [B, T, H, hd], seen as [B, H, T, hd]."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def _row(label: str, fwd_us: float | None, total_us: float | None, n_tokens: int, floor: tuple[int, int],
         bw: float) -> str:
    def cell(v: float | None, fmt: str) -> str:
        return "—" if v is None else format(v, fmt)

    def rate(us: float | None) -> float | None:
        return None if us is None else n_tokens / us  # tokens per µs = millions per second

    floor_us = [1e6 * b / bw for b in floor]
    cells = [
        cell(fwd_us, ".1f"),
        cell(total_us, ".1f"),
        cell(rate(fwd_us), ",.1f"),
        cell(rate(total_us), ",.1f"),
        cell(None if total_us is None else floor[1] / total_us / 1e6, ".2f"),
        cell(None if fwd_us is None else fwd_us / floor_us[0], ".1f"),
        cell(None if total_us is None else total_us / floor_us[1], ".1f"),
    ]
    return f"| {label} | " + " | ".join(cells) + " |"


def _check_args(seq_lens, n_heads, head_dim, tokens, dtype, repeats) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if not seq_lens:
        raise ValueError("seq_lens must name at least one length")
    for name, value in [*(("seq_lens", t) for t in seq_lens), ("n_heads", n_heads), ("head_dim", head_dim),
                        ("tokens", tokens), ("repeats", repeats)]:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def bench_attention(
    seq_lens: tuple[int, ...] = (128, 256, 512, 1024),
    n_heads: int = 16,
    head_dim: int = 8,
    tokens: int = MAD_TOKENS,
    dtype: str = "bf16",
    repeats: int = 100,
    device: str | None = None,
) -> str:
    """Benchmark causal attention at each T of ``seq_lens``, B = tokens // T sequences; returns markdown.

    ``dtype``: fp32, bf16 or fp16 for q, k, v. ``repeats``: do_bench's rep, milliseconds of timed runs per
    measurement. ``device``: default CUDA when available; a CPU run needs TRITON_INTERPRET=1 and at most
    CPU_MAX_TOKENS tokens (its timings mean little).
    """
    _check_args(seq_lens, n_heads, head_dim, tokens, dtype, repeats)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type != "cuda" and tokens > CPU_MAX_TOKENS:
        raise ValueError(f"tokens={tokens} is too many for the Triton interpreter on a CPU; use at most "
                         f"{CPU_MAX_TOKENS}")
    torch_dtype = DTYPES[dtype]
    size = torch.tensor([], dtype=torch_dtype).element_size()
    bw = copy_bandwidth(dev, repeats)
    on_cuda = dev.type == "cuda"
    sdpa = SDPA_BACKENDS if on_cuda else {"math": SDPBackend.MATH}
    lines = [
        f"# Causal attention, {datetime.date.today().isoformat()}",
        "",
        device_line(dev, f", cuDNN {torch.backends.cudnn.version() if on_cuda else None}"),
        f"- H={n_heads} heads of size {head_dim}, {dtype}, causal; about {tokens:,} tokens a call (B = tokens // T "
        "sequences); tokens/s count the B*T tokens of a call, all heads",
        f"- median of do_bench (rep {repeats} ms); copy bandwidth {bw / 1e12:.2f} TB/s (read + write), "
        "the byte floor's denominator",
        *([] if on_cuda else ["- cuDNN, flash and efficient SDPA: CUDA only"]),
        "",
    ]
    gen = torch.Generator(device=dev).manual_seed(0)
    for T in seq_lens:
        B = max(1, tokens // T)
        n_tokens = B * T
        inputs = {name: torch.randn(B, n_heads, T, head_dim, generator=gen, device=dev).to(torch_dtype)
                  for name in ("q", "k", "v")}
        upstream = torch.randn(B, n_heads, T, head_dim, generator=gen, device=dev).to(torch_dtype)
        worst = _gate(inputs, upstream)
        ok = worst <= RMS_BOUND[torch_dtype]
        floor = (4 * n_tokens * n_heads * head_dim * size, 12 * n_tokens * n_heads * head_dim * size)
        lines += [
            f"## T = {T}: B = {B:,} sequences, {n_tokens:,} tokens",
            "",
            f"byte floor: fwd {floor[0] / 1e6:.1f} MB = {1e6 * floor[0] / bw:.1f} µs, fwd+bwd "
            f"{floor[1] / 1e6:.1f} MB = {1e6 * floor[1] / bw:.1f} µs. Correctness gate (Triton, first "
            f"{GATE_ROWS} sequences vs float64, output and every gradient): {'PASS' if ok else 'FAIL'}, worst "
            f"relative RMS {worst:.2e} (bound {RMS_BOUND[torch_dtype]:g}).",
            "",
            "| implementation | fwd µs | fwd+bwd µs | fwd M tokens/s | fwd+bwd M tokens/s | fwd+bwd TB/s "
            "| fwd / floor | fwd+bwd / floor |",
            "|---|---|---|---|---|---|---|---|",
        ]
        bthd = {name: _heads_inner(t) for name, t in inputs.items()}
        variants = [
            ("Triton", _triton, inputs, upstream, ok),
            ("Triton, [B, T, H, hd] layout", _triton, bthd, _heads_inner(upstream), ok),
            *((f"SDPA {label}", _sdpa(backend), inputs, upstream, True) for label, backend in sdpa.items()),
        ]
        notes = []
        for label, fn, args, grad, allowed in variants:
            if not allowed:
                lines.append(_row(f"{label} (gate failed)", None, None, n_tokens, floor, bw))
                continue
            fwd_us, total_us, note = measure_pair(fwd_call(fn, args), fwd_bwd_call(fn, args, grad), repeats, dev)
            lines.append(_row(label, fwd_us, total_us, n_tokens, floor, bw))
            if note:
                notes.append(f"{label}: {note}")
                if on_cuda:
                    torch.cuda.empty_cache()  # a backend out of memory must not starve the next one
        lines += [""] + [f"- {n}" for n in notes] + ([""] if notes else [])
    return "\n".join(lines)
