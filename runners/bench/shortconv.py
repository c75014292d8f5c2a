"""``mixlab bench shortconv``: time the short-convolution kernels against the torch reference.

One markdown table per kernel (static, head-wise head size 1 and 16, low-rank R=16): the Triton kernel without
and with ``cu_seqlens`` (``n_docs`` documents), the plain-torch reference and ``torch.compile`` of it; forward
and forward+backward medians of ``triton.testing.do_bench``, the same two with each call captured once as a
CUDA graph and replayed (the kernels' time without the host's launch and autograd overhead, which an eager call
of a 100-200 µs op can exceed), forward and ``.backward()`` as a model calls the op (leaf inputs, gradients
accumulated into ``.grad``: what autograd adds after the op's own backward), achieved forward bandwidth and the
ratio to the byte floor. The GPU name and
versions go on top. Before timing, each Triton kernel is checked at the benchmark shape (with documents)
against the float64 reference, output and every input gradient; a kernel that fails gets no Triton timings (the
correctness gate).

Public anchors (``runners.bench.anchors``: fla-core's and causal-conv1d's static convs, the dynamic-conv paper's
kernels) are timed in the same table when they import, after the same kind of check of their output against our
float64 reference; the lines under each table give our Triton time over each anchor's (below 1: ours is faster).

Byte floor: the bytes an op must move at least, divided by the device's measured copy bandwidth (a large
``copy_``, read + write). With N = B*T tokens, s the bytes of an activation element, s_w of a weight element:
    static      fwd  2 N D s                fwd+bwd  5 N D s                (x, y; then x, dy, dx)
    head-wise   fwd  2 N D s + N H W s_w    fwd+bwd  5 N D s + 3 N H W s_w  (+ weight; weight, dweight)
    low-rank    fwd  2 N D s + N R s_w      fwd+bwd  5 N D s + 3 N R s_w    (+ z; z, dz)
plus the [W, D] and [R, W*D] parameters, read once and (backward) written once; ``cu_seqlens`` is negligible.
The low-rank floor counts the [B, T, W, D] weights as never written: the kernels form them on chip.
"""

import dataclasses
import datetime
import os
import sys
from collections.abc import Callable
from typing import Literal

import numpy as np
import torch
from mixlab import kernels
from mixlab.core.fields import PositiveInt, check
from mixlab.kernels.dynamic_conv.naive import dynamic_conv_headwise_ref, dynamic_conv_lowrank_ref
from mixlab.kernels.short_conv.naive import short_conv_ref
from mixlab.runners.bench.anchors import Anchor, short_conv_anchors
from mixlab.runners.bench.utils import (
    backward_call,
    copy_bandwidth,
    device_line,
    error_line,
    fwd_bwd_call,
    fwd_call,
    measure_graphed,
    measure_one,
    measure_pair,
    rel_rms,
)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Relative RMS error the correctness gate allows, per activation dtype (the kernel tests' bounds).
RMS_BOUND = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


# The kernels' short names (``kernels=`` picks some): static, head-wise at head size 1 and 16, low-rank R=16.
KERNEL_KEYS = ("static", "hs1", "hs16", "lowrank")


@dataclasses.dataclass
class BenchKernel:
    """One short conv as the benchmarks call it: its public op, its reference, its inputs and its byte floors."""

    key: str  # one of KERNEL_KEYS
    name: str
    kind: str  # static, headwise or lowrank: which anchors apply
    op: Callable  # the public op, kernels.*
    ref: Callable  # its plain-torch reference, naive.*
    inputs: dict  # name -> tensor (None: absent), the op's leading arguments
    bytes_fwd: int
    bytes_fwd_bwd: int


def bench_kernels(B: int, T: int, D: int, W: int, dtype: torch.dtype, device: torch.device) -> list[BenchKernel]:
    """The benchmark's kernels (``KERNEL_KEYS``, head size 16 only where it divides D) on seeded inputs: x [B, T, D]
    shared by all, static weights [W, D], head-wise weights [B, T, D / hs, W], low-rank z [B, T, 16], U [16, W*D]."""
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (scale * torch.randn(*shape, generator=gen, device=device)).to(dtype)

    N, s = B * T, torch.tensor([], dtype=dtype).element_size()
    x, static_w = randn(B, T, D), randn(W, D, scale=W**-0.5)
    params = 2 * W * D * s  # static_w read once, its gradient written once
    static = {"x": x, "weight": static_w}
    out = [
        BenchKernel(
            "static",
            "static",
            "static",
            kernels.short_conv,
            short_conv_ref,
            static,
            2 * N * D * s + params,
            5 * N * D * s + params,
        )
    ]
    for hs in (1, 16):
        if D % hs:
            continue
        H = D // hs
        inputs = {"x": x, "weight": randn(B, T, H, W, scale=W**-0.5), "static_w": static_w}
        fwd, fwd_bwd = 2 * N * D * s + N * H * W * s + params, 5 * N * D * s + 3 * N * H * W * s + params
        name = f"head-wise, head size {hs}"
        out.append(
            BenchKernel(f"hs{hs}", name, "headwise", kernels.dynamic_conv_headwise, dynamic_conv_headwise_ref,
                        inputs, fwd, fwd_bwd)
        )
    R = 16
    inputs = {"x": x, "z": randn(B, T, R), "U": randn(R, W * D, scale=(R * W) ** -0.5), "static_w": static_w}
    params += 2 * R * W * D * s
    fwd, fwd_bwd = 2 * N * D * s + N * R * s + params, 5 * N * D * s + 3 * N * R * s + params
    out.append(
        BenchKernel(
            "lowrank", f"low-rank, R={R}", "lowrank", kernels.dynamic_conv_lowrank, dynamic_conv_lowrank_ref, inputs,
            fwd, fwd_bwd,
        )
    )
    return out


def doc_layout(B: int, T: int, n_docs: int, device: torch.device) -> torch.Tensor:
    """cu_seqlens of n_docs documents of random lengths (seeded), every row cut into about n_docs / B."""
    if n_docs < B or n_docs > B * T:
        raise ValueError(f"n_docs={n_docs} must lie between B={B} and B*T={B * T}")
    rng = np.random.default_rng(0)
    offsets = [0]
    for row in range(B):
        n_row = n_docs // B + (row < n_docs % B)
        cuts = np.sort(rng.choice(np.arange(1, T), size=n_row - 1, replace=False)) if n_row > 1 else []
        offsets += [row * T + int(c) for c in cuts] + [(row + 1) * T]
    return torch.tensor(offsets, dtype=torch.int32, device=device)


def _gate(kernel: BenchKernel, cu: torch.Tensor, upstream: torch.Tensor) -> float:
    """Worst relative RMS error of the Triton output and input gradients (with documents) against float64."""
    got = fwd_bwd_call(kernel.op, kernel.inputs, upstream, cu_seqlens=cu, residual=True, backend="triton")()
    as64 = {k: None if v is None else v.double() for k, v in kernel.inputs.items()}
    want = fwd_bwd_call(kernel.ref, as64, upstream.double(), cu_seqlens=cu, residual=True)()
    return max(rel_rms(a, b) for a, b in zip(got, want, strict=True))


def _anchor_error(kernel: BenchKernel, anchor: Anchor, cu: torch.Tensor | None) -> float:
    """Relative RMS error of an anchor's output against our float64 reference of the same function."""
    with torch.no_grad():
        got = anchor.fn(**anchor.inputs)
        ours = kernel.inputs if anchor.ours is None else anchor.ours
        want = kernel.ref(**{k: None if v is None else v.double() for k, v in ours.items()}, cu_seqlens=cu,
                          residual=True)
    return rel_rms(got, want)


def _measure(fn: Callable, inputs: dict, upstream: torch.Tensor, repeats: int, device: torch.device,
             **kwargs) -> tuple[tuple[float | None, ...], list[str]]:
    """((fwd, fwd+bwd, the two as CUDA graphs, fwd + ``.backward()`` into leaves' ``.grad``) µs, notes) of one
    implementation; a timing that fails is None and noted."""
    closures = (fwd_call(fn, inputs, **kwargs), fwd_bwd_call(fn, inputs, upstream, **kwargs))
    fwd_us, total_us, note = measure_pair(*closures, repeats, device)
    graph_fwd, graph_total, graph_note = measure_graphed(*closures, repeats, device)
    leaf_us, leaf_note = measure_one(backward_call(fn, inputs, upstream, **kwargs), repeats, device)
    notes = [note, graph_note, leaf_note and f".backward(): {leaf_note}"]
    return (fwd_us, total_us, graph_fwd, graph_total, leaf_us), [n for n in notes if n]


def _ratio_note(label: str, ours: tuple, theirs: tuple, extra: str) -> str:
    """Our times over an anchor's, each where both sides have one: fwd, fwd+bwd, as CUDA graphs, ``.backward()``."""
    parts = [f"fwd {ours[0] / theirs[0]:.2f}x, fwd+bwd {ours[1] / theirs[1]:.2f}x"]
    if None not in (ours[3], theirs[3]):
        parts.append(f"as CUDA graphs fwd+bwd {ours[3] / theirs[3]:.2f}x")
    if None not in (ours[4], theirs[4]):
        parts.append(f"with .backward() {ours[4] / theirs[4]:.2f}x")
    return f"{label}: {'; '.join(parts)} (below 1: ours faster){extra}"


def _anchor_rows(kernel: BenchKernel, cases: list[tuple[torch.Tensor | None, str]],
                 timed: dict[str, tuple[float | None, ...]], upstream: torch.Tensor, repeats: int,
                 bw: float) -> tuple[list[str], list[str]]:
    """Table rows and notes of the public anchors of ``kernel`` for each (cu_seqlens, label suffix) case; each
    ratio is our time (``timed["Triton" + suffix]``, as ``_measure`` gives them) over the anchor's."""
    lines, notes = [], []
    bound = RMS_BOUND[kernel.inputs["x"].dtype]
    for docs, suffix in cases:
        ours = timed.get(f"Triton{suffix}")
        for anchor in short_conv_anchors(kernel.kind, kernel.inputs, docs):
            label = f"anchor: {anchor.name}{suffix}"
            if not isinstance(anchor, Anchor):
                notes.append(f"{label}: skipped, {anchor.reason}")
                continue
            try:
                error = _anchor_error(kernel, anchor, docs)
            except Exception as err:  # noqa: BLE001 - a broken anchor install must not end the benchmark
                notes.append(f"{label}: failed, {error_line(err)}")
                continue
            if error > bound:
                notes.append(f"{label}: not timed, disagrees with our reference (relative RMS {error:.2e})")
                continue
            theirs, failed = _measure(anchor.fn, anchor.inputs, upstream, repeats, upstream.device)
            lines.append(_row(label, theirs, kernel, bw))
            notes += [f"{label}: {n}" for n in failed]
            if ours and None not in ours[:2] + theirs[:2]:
                extra = f" ({anchor.note})" if anchor.note else ""
                notes.append(_ratio_note(f"Triton{suffix} / {anchor.name}", ours, theirs, extra))
    return lines, notes


def _row(label: str, times: tuple[float | None, ...], kernel: BenchKernel, bw: float) -> str:
    """A table row from ``_measure``'s times (None: not timed)."""

    def us(v: float | None) -> str:
        return "—" if v is None else f"{v:.1f}"

    fwd_us, total_us, graph_fwd, graph_total, leaf_us = times
    floor_fwd, floor_total = 1e6 * kernel.bytes_fwd / bw, 1e6 * kernel.bytes_fwd_bwd / bw
    tbs = "—" if fwd_us is None else f"{kernel.bytes_fwd / (fwd_us * 1e-6) / 1e12:.2f}"
    r_fwd = "—" if fwd_us is None else f"{fwd_us / floor_fwd:.2f}"
    r_total = "—" if total_us is None else f"{total_us / floor_total:.2f}"
    return (f"| {label} | {us(fwd_us)} | {us(total_us)} | {us(graph_fwd)} | {us(graph_total)} | {us(leaf_us)} "
            f"| {tbs} | {r_fwd} | {r_total} |")


def bench_shortconv(
    shape: tuple[int, int, int, int] = (4, 4096, 2048, 4),
    dtype: str = "bf16",
    n_docs: int = 64,
    repeats: int = 100,
    device: str | None = None,
    progress: bool = False,
    only: tuple[str, ...] = KERNEL_KEYS,
) -> str:
    """Benchmark the short convolutions at ``shape`` = (B, T, D, W); returns a markdown report.

    ``dtype``: fp32, bf16 or fp16 for activations and weights. ``n_docs``: documents of the packed variant.
    ``repeats``: do_bench's rep, milliseconds of timed runs per measurement. ``device``: default CUDA when
    available; a CPU run needs TRITON_INTERPRET=1 and a tiny shape (its timings mean little), else ValueError.
    ``progress``: also write the header and then each kernel's section to stderr as soon as it is done. ``only``:
    the kernels to time, of ``KERNEL_KEYS``.
    """
    check("dtype", dtype, Literal[tuple(DTYPES)])
    if len(check("shape", shape, tuple[PositiveInt, ...])) != 4:
        raise ValueError(f"shape must be four positive integers B,T,D,W, got {shape!r}")
    check("repeats", repeats, PositiveInt)
    bad = [key for key in check("only", only, tuple[str, ...]) if key not in KERNEL_KEYS]
    if bad or not only:
        raise ValueError(f"unknown kernel {bad[0] if bad else ''!r}; choose from {', '.join(KERNEL_KEYS)}")
    B, T, D, W = shape
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("bench shortconv times Triton kernels on a GPU, and torch sees no CUDA device here (on a CPU "
                         "the kernels run only in the Triton interpreter, TRITON_INTERPRET=1, at tiny shapes)")
    torch_dtype = DTYPES[dtype]
    cu = doc_layout(B, T, n_docs, dev)
    bw = copy_bandwidth(dev, repeats)
    lines = [
        f"# Short-convolution kernels, {datetime.date.today().isoformat()}",
        "",
        device_line(dev),
        f"- shape B={B}, T={T}, D={D}, W={W}, {dtype}; packed variant: {n_docs} documents of random length; "
        f"residual on, static_w on for the dynamic kernels",
        f"- median of do_bench (rep {repeats} ms); copy bandwidth {bw / 1e12:.2f} TB/s (read + write), "
        "the byte floor's denominator",
        "",
    ]
    if progress:
        print("\n".join(lines), file=sys.stderr, flush=True)
    for kernel in [k for k in bench_kernels(B, T, D, W, torch_dtype, dev) if k.key in only]:
        done = len(lines)
        x = kernel.inputs["x"]
        upstream = torch.randn(x.shape, generator=torch.Generator(device=dev).manual_seed(2), device=dev)
        upstream = upstream.to(torch_dtype)
        worst = _gate(kernel, cu, upstream)
        ok = worst <= RMS_BOUND[torch_dtype]
        lines += [
            f"## {kernel.name}",
            "",
            f"byte floor: fwd {kernel.bytes_fwd / 1e6:.1f} MB = {1e6 * kernel.bytes_fwd / bw:.1f} µs, "
            f"fwd+bwd {kernel.bytes_fwd_bwd / 1e6:.1f} MB = {1e6 * kernel.bytes_fwd_bwd / bw:.1f} µs. "
            f"Correctness gate (Triton with documents vs float64, output and every gradient): "
            f"{'PASS' if ok else 'FAIL'}, worst relative RMS {worst:.2e} (bound {RMS_BOUND[torch_dtype]:g}).",
            "",
            "| implementation | fwd µs | fwd+bwd µs | fwd µs, graph | fwd+bwd µs, graph | fwd+bwd µs, .backward() "
            "| fwd TB/s | fwd / floor | fwd+bwd / floor |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        compiled_ref = torch.compile(kernel.ref)
        variants = [
            ("Triton", kernel.op, {"backend": "triton"}, None, ok),
            (f"Triton, {n_docs} documents", kernel.op, {"backend": "triton"}, cu, ok),
            ("torch reference", kernel.ref, {}, None, True),
            ("torch.compile(reference)", compiled_ref, {}, None, True),
        ]
        notes, timed = [], {}
        for label, fn, extra, docs, allowed in variants:
            if not allowed:
                lines.append(_row(f"{label} (gate failed)", (None,) * 5, kernel, bw))
                continue
            timed[label], failed = _measure(fn, kernel.inputs, upstream, repeats, dev, cu_seqlens=docs,
                                            residual=True, **extra)
            lines.append(_row(label, timed[label], kernel, bw))
            notes += [f"{label}: {n}" for n in failed]
        anchor_lines, anchor_notes = _anchor_rows(kernel, [(None, ""), (cu, f", {n_docs} documents")], timed,
                                                  upstream, repeats, bw)
        lines += anchor_lines
        notes += anchor_notes
        plain, packed = timed.get("Triton"), timed.get(f"Triton, {n_docs} documents")
        if plain and packed and None not in plain[:2] + packed[:2]:
            lines += ["", f"documents cost: fwd {100 * (packed[0] / plain[0] - 1):+.1f}%, fwd+bwd "
                          f"{100 * (packed[1] / plain[1] - 1):+.1f}%"]  # fmt: skip
        lines += [""] + [f"- {n}" for n in notes] + ([""] if notes else [])
        if progress:  # each kernel's section as soon as it is timed (stderr): a run cut short keeps what it measured
            print("\n".join(lines[done:]), file=sys.stderr, flush=True)
    return "\n".join(lines)
