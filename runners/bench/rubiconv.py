"""``mixlab bench rubiconv``: RubiConv against the long-convolution baselines on one packed row (docs/rubiconv.md).

One row of ``n_tokens`` tokens cut into documents of lognormal lengths (seeded), D channels, a filter as long
as the row. Rows of the table:
    leaky single FFT       one FFT over the whole row: the fastest exact-looking answer, and it leaks
    per-doc FFT loop       one FFT convolution per document (the reference's FFT on each document)
    pad to longest         every document zero-padded to the longest, one batched FFT
    pow2 buckets           the "torch" backend: documents bucketed by ceil(log2 L), one FFT per bucket
    gemm / triton          the GEMM form (docs/rubiconv.md), precision fp32 and bf16, automatic k (and ``blocks``)
    ..., sizes shared      the triton rows again with documents' padded sizes shared (``gemm.MERGE_FILTER_COST`` at
                           MERGE_TRIED): fewer filter spectra for more padding. These last rows are what
                           ``kernels.rubiconv`` runs by default; the rows before them turn the setting off.
Forward and forward+backward (dx and dh) medians of ``triton.testing.do_bench``, and the relative RMS error of
y, dx and dh against the float64 "torch" backend. A row over its error bound gets no timings (the correctness
gate); the leaky row's error is its leak. The GPU name and versions go on top. Public long convs
(``runners.bench.anchors``, fla-core's FFT conv) get rows of their own when they import; they leak as the leaky
row does, so they are timed without a gate.
"""

import datetime
import math
from collections.abc import Callable
from contextlib import contextmanager
from typing import Literal

import numpy as np
import torch
from mixlab import kernels
from mixlab.core.fields import PositiveInt, check
from mixlab.kernels.rubiconv import gemm
from mixlab.kernels.rubiconv.naive import _causal_fft_conv, rubiconv_ref
from mixlab.kernels.utils import compute_dtype
from mixlab.runners.bench.anchors import Anchor, long_conv_anchors
from mixlab.runners.bench.utils import device_line, median_time_ms, rel_rms

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# Relative RMS error the gate allows: exact FFT baselines, then the GEMM form per precision; with
# bfloat16 activations, rounding y, dx and dh to bfloat16 alone costs ~2e-3, so no bound is below IO_BOUND.
BOUND_EXACT, BOUND, IO_BOUND = 1e-5, {"fp32": 1e-3, "bf16": 2e-2}, {"fp32": 0.0, "bf16": 1e-2}
# Lognormal document lengths: median e^6.7 ~ 810 tokens, mean ~1340: about 49 documents in 65,536 tokens.
LOG_MEAN, LOG_STD = 6.7, 1.0
# The price of a filter half column (against a document's) that the "sizes shared" rows try (docs/rubiconv.md)
MERGE_TRIED = 0.4


def lognormal_layout(n_tokens: int, seed: int, device: torch.device, median: float | None = None) -> torch.Tensor:
    """cu_seqlens of one row of n_tokens cut into lognormal document lengths (the last one cut to fit), of median
    ``median`` tokens (default e^LOG_MEAN)."""
    rng = np.random.default_rng(seed)
    log_mean = LOG_MEAN if median is None else math.log(median)
    offsets = [0]
    while offsets[-1] < n_tokens:
        length = max(1, int(rng.lognormal(log_mean, LOG_STD)))
        offsets.append(min(n_tokens, offsets[-1] + length))
    return torch.tensor(offsets, dtype=torch.int32, device=device)


def _docs(cu: torch.Tensor) -> list[tuple[int, int]]:
    offsets = cu.tolist()
    return list(zip(offsets[:-1], offsets[1:], strict=True))


def per_doc_fft_loop(x: torch.Tensor, h: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """x: [1, T, D] -> one FFT convolution per document, concatenated (half types in float32)."""
    xc, hc = x.to(compute_dtype(x)), h.to(compute_dtype(x))
    return torch.cat([_causal_fft_conv(xc[:, s:e], hc) for s, e in _docs(cu)], dim=1).to(x.dtype)


def pad_to_longest(x: torch.Tensor, h: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """x: [1, T, D] -> every document padded to the longest, one batched FFT convolution (half types in
    float32)."""
    dtype, x, h = x.dtype, x.to(compute_dtype(x)), h.to(compute_dtype(x))
    starts, ends = cu[:-1].long(), cu[1:].long()
    lengths = ends - starts
    t = torch.arange(int(lengths.max()), device=x.device)
    valid = t < lengths[:, None]  # [n_docs, L_max]
    idx = torch.where(valid, starts[:, None] + t, 0)
    xs = torch.where(valid[..., None], x[0][idx], 0.0)  # [n_docs, L_max, D]
    return _causal_fft_conv(xs, h)[valid].unsqueeze(0).to(dtype)  # documents in order: token order


@contextmanager
def _settings(merge_filter_cost: float):
    """RubiConv's shared padded sizes (``gemm.MERGE_FILTER_COST``) for one call, the shipped ones back after it."""
    shipped = gemm.MERGE_FILTER_COST
    gemm.MERGE_FILTER_COST = merge_filter_cost
    try:
        yield
    finally:
        gemm.MERGE_FILTER_COST = shipped


def _gmac(work: dict[str, int], label: str) -> str:
    return f"{work[label] / 1e9:.0f}" if label in work else "—"


def _grads(fn: Callable, x: torch.Tensor, h: torch.Tensor, upstream: torch.Tensor) -> list[torch.Tensor]:
    x, h = x.detach().requires_grad_(), h.detach().requires_grad_()
    y = fn(x, h)
    return [y, *torch.autograd.grad(y, (x, h), upstream.to(y.dtype))]


def bench_rubiconv(
    n_tokens: int = 65536,
    d: int = 1024,
    dtype: str = "fp32",
    repeats: int = 100,
    blocks: tuple[int, ...] = (),
    seed: int = 0,
    device: str | None = None,
    median_length: int | None = None,
) -> str:
    """Benchmark RubiConv on one packed row of ``n_tokens`` tokens and ``d`` channels; returns markdown.

    ``dtype``: fp32 or bf16 activations and filter. ``repeats``: do_bench's rep, milliseconds of timed runs
    per measurement. ``blocks``: extra block sizes k for the gemm and triton rows. ``device``: default CUDA
    when available (a CPU run needs TRITON_INTERPRET=1 for the triton rows and tiny sizes). ``median_length``:
    the documents' median length (default e^LOG_MEAN, about 812 tokens); rows of short documents favour a small k.
    """
    check("dtype", dtype, Literal[tuple(DTYPES)])
    for name, value in (("n_tokens", n_tokens), ("d", d), ("repeats", repeats)):
        check(name, value, PositiveInt)
    if median_length is not None:
        check("median_length", median_length, PositiveInt)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch_dtype = DTYPES[dtype]
    cu = lognormal_layout(n_tokens, seed, dev, median_length)
    gen = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(1, n_tokens, d, generator=gen, device=dev).to(torch_dtype)
    h = (torch.randn(d, n_tokens, generator=gen, device=dev) / math.sqrt(n_tokens)).to(torch_dtype)
    upstream = torch.randn(1, n_tokens, d, generator=gen, device=dev)
    want = _grads(lambda a, b: rubiconv_ref(a, b, cu_seqlens=cu), x.double(), h.double(), upstream.double())
    with _settings(0.0):  # the layout's own sizes; the shared ones are described beside them
        plan = gemm.get_plan(cu, 1, n_tokens, n_tokens, None, dev)

    methods: list[tuple[str, Callable, float | None]] = [
        ("leaky single FFT (leaks)", lambda a, b: rubiconv_ref(a, b), None),
        ("per-doc FFT loop", lambda a, b: per_doc_fft_loop(a, b, cu), BOUND_EXACT),
        ("pad to longest", lambda a, b: pad_to_longest(a, b, cu), BOUND_EXACT),
        ("pow2 buckets (torch backend)", lambda a, b: rubiconv_ref(a, b, cu_seqlens=cu), BOUND_EXACT),
    ]
    notes = []
    work: dict[str, int] = {}  # label -> modeled multiply-adds of a forward (gemm.RubiPlan.work)
    for anchor in long_conv_anchors():
        if isinstance(anchor, Anchor):
            methods.append((f"anchor: {anchor.name} (leaks)", anchor.fn, None))
            notes.append(f"anchor: {anchor.name}: {anchor.note}")
        else:
            notes.append(f"anchor: {anchor.name}: skipped, {anchor.reason}")
    for backend, merge in (("gemm", 0.0), ("triton", 0.0), ("triton", MERGE_TRIED)):
        for block in (None, *blocks):
            for precision in ("fp32", "bf16"):
                label = f"{backend} {precision}, k={plan.k if block is None else block}"
                label += ", sizes shared" if merge else ""

                def run(a, b, backend=backend, block=block, precision=precision, merge=merge):
                    kwargs = {"block": block, "backend": backend, "precision": precision}
                    # the setting is read when the forward plans, and the backward follows that plan
                    with _settings(merge):
                        return kernels.rubiconv(a, b, cu_seqlens=cu, **kwargs)

                methods.append((label, run, BOUND[precision]))
                with _settings(merge):
                    work[label] = gemm.get_plan(cu, 1, n_tokens, n_tokens, block, dev).work() * d
    with _settings(MERGE_TRIED):
        shared = gemm.get_plan(cu, 1, n_tokens, n_tokens, None, dev)

    lengths = (cu[1:] - cu[:-1]).cpu()
    lines = [
        f"# RubiConv, {datetime.date.today().isoformat()}",
        "",
        device_line(dev, cpu_name="CPU"),
        f"- one packed row of {n_tokens:,} tokens, {len(lengths)} lognormal documents (seed {seed}, median "
        f"{int(lengths.median()):,}, longest {int(lengths.max()):,}), D={d}, L_F={n_tokens:,}, {dtype} activations "
        "and filter",
        f"- automatic block k={plan.k}: {plan.n_groups} column counts m, padded tokens "
        f"{int((plan.cols * plan.k).sum()):,}, half spectra of {plan.n_cols} (documents) + "
        f"{plan.n_filter_cols} (filters) columns; sizes shared (a filter half column priced {MERGE_TRIED:g}): "
        f"{shared.n_groups} column counts, padded tokens {int((shared.cols * shared.k).sum()):,}, half spectra of "
        f"{shared.n_cols} + {shared.n_filter_cols}",
        f"- median of do_bench (rep {repeats} ms); errors: relative RMS against the float64 torch backend; GMAC: "
        "the GEMM form's modeled multiply-adds of a forward at its block (a model, not a timing)",
        "",
        "| method | fwd ms | fwd+bwd ms | err y | err dx | err dh | gate | GMAC |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, fn, bound in methods:
        try:
            got = _grads(fn, x, h, upstream)
        except Exception as err:  # noqa: BLE001 - one broken method must not hide the other rows
            first_line = str(err).splitlines()[0][:120] if str(err) else ""
            notes.append(f"{label}: {type(err).__name__}: {first_line}")
            lines.append(f"| {label} | — | — | — | — | — | error | {_gmac(work, label)} |")
            continue
        errs = [rel_rms(a, b) for a, b in zip(got, want, strict=True)]
        bound = None if bound is None else max(bound, IO_BOUND[dtype])
        ok = bound is None or max(errs) <= bound
        gate = "leaks" if bound is None else ("PASS" if ok else f"FAIL (> {bound:g})")
        fwd = total = "—"
        if ok:

            def forward(fn=fn):
                with torch.no_grad():
                    return fn(x, h)

            fwd = f"{median_time_ms(forward, repeats, x.device):.3f}"
            total = f"{median_time_ms(lambda fn=fn: _grads(fn, x, h, upstream), repeats, x.device):.3f}"
        err_cells = " | ".join(f"{e:.1e}" for e in errs)
        lines.append(f"| {label} | {fwd} | {total} | {err_cells} | {gate} | {_gmac(work, label)} |")
    return "\n".join(lines + [""] + [f"- {n}" for n in notes])
