"""``mixlab bench fla``: fla-core's two kernels of each linear-attention op at the lab's shapes.

fla ships GLA, simple_gla (the ``mamba2`` mixer's op) and retention as chunked kernels (about ten launches each
way, built for long rows and wide heads) and as fused recurrent ones (one launch each way, a loop over the
tokens); ``models.mixers.fla_ops`` runs rows of at most ``RECURRENT_MAX_T[op]`` tokens on the recurrent one. This
benchmark times both at the MAD models' shape: 16 heads of key size 8 and value size 16 (RetNet at the MAD
width; GLA's 4 and 8 and Mamba-2's 16 and 16 reach fla as the same 16 and 16: the mixers pad heads to
``fla_ops.MIN_KERNEL_DIM``), rows of T tokens, stacked runs folded into the batch. For each T the batch B is
chosen so that a call holds about ``tokens`` tokens (default 18 stacked runs of batch 128 at T=128). One
markdown table per op and T: forward and forward+backward medians of ``triton.testing.do_bench``, eager and
with each call captured once as a CUDA graph and replayed (the kernels alone, without the host's launches),
tokens per second and achieved bandwidth of the graphed call (of the eager one where no graph was captured:
off CUDA). The GPU name and versions go on top.

Bytes (for the bandwidth column): with N = B*T tokens and s the bytes of an activation element, the forward
reads q, k, v and the gate (fp32: H K per token for GLA, H for simple_gla, none for retention) and writes o; the
backward reads them again with do and writes their gradients. The kernels' own intermediates (chunk states,
the recurrent kernels' re-reads) are not counted, so this is a floor on what moves.

Correctness gate, before a form is timed: its output and the gradients of q, k, v and the gate on the first
GATE_ROWS rows of the benchmark call, against the float64 torch path (``fla_ops.naive``); a failing form gets
no timings.
"""

import datetime
from typing import Literal

import torch
import torch.nn.functional as F
from mixlab.core.fields import PositiveInt, check
from mixlab.models.mixers import fla_ops
from mixlab.runners.bench.attention import CPU_MAX_TOKENS, GATE_ROWS, MAD_TOKENS
from mixlab.runners.bench.shortconv import DTYPES, RMS_BOUND
from mixlab.runners.bench.utils import (
    device_line,
    error_line,
    fwd_bwd_call,
    fwd_call,
    measure_graphed,
    measure_pair,
    rel_rms,
)
from mixlab.runners.train.provenance import package_versions


def _inputs(op: str, B: int, T: int, H: int, K: int, V: int, dtype: torch.dtype, gen: torch.Generator,
            device: torch.device) -> dict[str, torch.Tensor]:
    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen, device=device)

    inputs = {"q": randn(B, T, H, K).to(dtype), "k": randn(B, T, H, K).to(dtype), "v": randn(B, T, H, V).to(dtype)}
    if op == "gla":  # the mixer's gate: logsigmoid / 16, mostly slow decays
        inputs["g"] = F.logsigmoid(randn(B, T, H, K)) / 16
    if op == "simple_gla":
        inputs["g"] = F.logsigmoid(randn(B, T, H))
    return inputs


def _call(op: str, form: str):
    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        return fla_ops.fla_kernel(op, form, q, k, v, g=g)

    return run


def _torch_path(op: str):
    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        return fla_ops.naive(op, q, k, v, g, None, q.shape[-1] ** -0.5)

    return run


def _gate(op: str, form: str, inputs: dict, upstream: torch.Tensor) -> float:
    """Worst relative RMS error of the form's output and gradients on the first GATE_ROWS rows."""
    first = {name: t[:GATE_ROWS] for name, t in inputs.items()}
    got = fwd_bwd_call(_call(op, form), first, upstream[:GATE_ROWS])()
    want = fwd_bwd_call(_torch_path(op), {n: t.double() for n, t in first.items()}, upstream[:GATE_ROWS].double())()
    return max(rel_rms(a, b) for a, b in zip(got, want, strict=True))


def _cell(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def bench_fla(
    seq_lens: tuple[int, ...] = (128, 256, 512, 1024),
    ops: tuple[str, ...] = fla_ops.RECURRENT_OPS,
    n_heads: int = 16,
    head_dim: int = 8,
    value_dim: int = 16,
    tokens: int = MAD_TOKENS,
    dtype: str = "bf16",
    repeats: int = 100,
    device: str | None = None,
) -> str:
    """Benchmark fla's chunked and fused recurrent kernels of each op of ``ops`` at each T of ``seq_lens``,
    B = tokens // T rows of ``n_heads`` heads (keys of ``head_dim``, values of ``value_dim``); returns markdown.

    ``dtype``: fp32, bf16 or fp16 for q, k, v (the gates are fp32). ``repeats``: do_bench's rep, milliseconds of
    timed runs per measurement. ``device``: default CUDA when available; a CPU run needs TRITON_INTERPRET=1 and
    at most CPU_MAX_TOKENS tokens (its timings mean little). fla-core must be installed.
    """
    check("dtype", dtype, Literal[tuple(DTYPES)])
    for name, value in [*(("seq_lens", t) for t in seq_lens), ("n_heads", n_heads), ("head_dim", head_dim),
                        ("value_dim", value_dim), ("tokens", tokens), ("repeats", repeats)]:
        check(name, value, PositiveInt)
    if not seq_lens or not ops:
        raise ValueError("seq_lens and ops must each name at least one")
    for op in ops:
        if op not in fla_ops.RECURRENT_OPS:
            raise ValueError(f"op {op!r} has one kernel form only; choose from {', '.join(fla_ops.RECURRENT_OPS)}")
    fla_ops.require_fla("bench fla")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type != "cuda" and tokens > CPU_MAX_TOKENS:
        raise ValueError(f"tokens={tokens} is too many for the Triton interpreter on a CPU; use at most "
                         f"{CPU_MAX_TOKENS}")
    fla_ops.load_fla()
    torch_dtype = DTYPES[dtype]
    size = torch.tensor([], dtype=torch_dtype).element_size()
    lines = [
        f"# fla kernels: chunked against fused recurrent, {datetime.date.today().isoformat()}",
        "",
        device_line(dev, f", fla-core {package_versions()['fla-core']}; fla autotune {fla_ops.autotune_mode()} "
                         "(MIXLAB_FLA_AUTOTUNE)"),
        f"- H={n_heads} heads, keys of {head_dim}, values of {value_dim} (padded to at least "
        f"{fla_ops.MIN_KERNEL_DIM} for fla), q, k, v {dtype}, gates fp32; about {tokens:,} tokens a call "
        "(B = tokens // T rows)",
        f"- median of do_bench (rep {repeats} ms); shipped: rows of at most these many tokens take the recurrent "
        f"form: {', '.join(f'{op} {t}' for op, t in fla_ops.RECURRENT_MAX_T.items())}",
        "",
    ]
    gen = torch.Generator(device=dev).manual_seed(0)
    for op in ops:
        gate_width = {"gla": head_dim, "simple_gla": 1, "retention": 0}[op]  # fp32 gate elements a head and token
        for T in seq_lens:
            B = max(1, tokens // T)
            n = B * T
            inputs = _inputs(op, B, T, n_heads, head_dim, value_dim, torch_dtype, gen, dev)
            upstream = torch.randn(B, T, n_heads, value_dim, generator=gen, device=dev).to(torch_dtype)
            per_token = n_heads * ((2 * head_dim + value_dim) * size + 4 * gate_width)  # q, k, v, gate
            fwd_bytes = n * (per_token + n_heads * value_dim * size)
            total_bytes = n * (3 * per_token + 2 * n_heads * value_dim * size)  # + read again, grads; o, do
            lines += [
                f"## {op}, T = {T}: B = {B:,} rows, {n:,} tokens",
                "",
                f"bytes at least: fwd {fwd_bytes / 1e6:.1f} MB, fwd+bwd {total_bytes / 1e6:.1f} MB",
                "",
                "| form | gate (rel. RMS) | fwd µs | fwd+bwd µs | fwd µs, graph | fwd+bwd µs, graph "
                "| fwd+bwd M tokens/s, graph | fwd+bwd TB/s, graph |",
                "|---|---|---|---|---|---|---|---|",
            ]
            notes = []
            for form in fla_ops.FORMS:
                try:
                    worst = _gate(op, form, inputs, upstream)
                except Exception as err:  # noqa: BLE001 - a form fla cannot run here (the chunked kernels fail in
                    # the CPU's Triton interpreter) gets a row that says why; the other form is still timed
                    lines.append(f"| {form} | {error_line(err)} | — | — | — | — | — | — |")
                    continue
                if not worst <= RMS_BOUND[torch_dtype]:
                    lines.append(f"| {form} | FAIL {worst:.1e} | — | — | — | — | — | — |")
                    continue
                closures = fwd_call(_call(op, form), inputs), fwd_bwd_call(_call(op, form), inputs, upstream)
                fwd_us, total_us, note = measure_pair(*closures, repeats, dev)
                graph_fwd, graph_total, graph_note = measure_graphed(*closures, repeats, dev)
                notes += [f"{form}: {text}" for text in (note, graph_note) if text]
                best = graph_total or total_us  # the kernels' own time where a graph was captured (CUDA)
                lines.append(
                    f"| {form} | {worst:.1e} | {_cell(fwd_us, '.1f')} | {_cell(total_us, '.1f')} | "
                    f"{_cell(graph_fwd, '.1f')} | {_cell(graph_total, '.1f')} | "
                    f"{_cell(None if best is None else n / best, ',.1f')} | "
                    f"{_cell(None if best is None else total_bytes / best / 1e6, '.2f')} |"
                )
            lines += [""] + [f"- {text}" for text in notes] + ([""] if notes else [])
    return "\n".join(lines)
