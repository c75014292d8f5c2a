"""``mixlab bench tune OP``: time candidate launch settings of the Triton kernels' tables (short convs, attention,
RubiConv) on the GPU.

Each kernel module keeps its launch settings in one table of frozen dataclass rows (``CONFIGS``, read by its
``config_for``). A tune group varies one row: its candidates are the row itself, then the row with some fields
replaced (``dataclasses.replace``). Each candidate is timed by calling the launcher the row serves directly with
that setting (no autograd, no custom op, no input checks), ``triton.testing.do_bench`` medians (wall clock on a
CPU), on the group's cases, and checked against the reference of the whole op at those settings: a candidate over
its error bound cannot win (WRONG). Groups run one after the other, each at the winners of those before it
(coordinate descent). Each group prints its candidates with their timings, the winner marked ``*``; the end lists
the rows to set in the modules' tables.

Cases: ``shortconv`` B=4, T=4096, D=2048, bf16, residual, static_w, without and with 64 documents (the score: the
mean of the two medians), the static conv at W=4 (streaming) and W=12 (tiled), head-wise at head sizes 1 and 16
(streaming), 2 (tiled) and 1 at W=12 (its own tiled backward), low-rank R=16; ``attention`` a stack of 18 MAD runs
(2,304 sequences, 16 heads of 8, bf16, [B, T, H, hd] layout) at T=127 and 1023 (the score: time per token summed);
``rubiconv`` ``mixlab bench rubiconv``'s row (65,536 tokens in lognormal documents, D=1024, fp32) at k=64 and 128
(the score: the stage's launches in one forward and backward, summed). ``smoke`` shrinks every shape to a check
of the code path (the CPU's Triton interpreter), not a measurement.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from mixlab.kernels import triton_utils as tu
from mixlab.kernels.attention import triton as attention
from mixlab.kernels.attention.naive import causal_attention_ref
from mixlab.kernels.dynamic_conv import triton_headwise as headwise
from mixlab.kernels.dynamic_conv import triton_lowrank as lowrank
from mixlab.kernels.dynamic_conv.naive import dynamic_conv_headwise_ref, dynamic_conv_lowrank_ref
from mixlab.kernels.rubiconv import gemm
from mixlab.kernels.rubiconv import triton as rubiconv
from mixlab.kernels.rubiconv.naive import rubiconv_ref
from mixlab.kernels.short_conv import triton as short
from mixlab.kernels.short_conv.naive import short_conv_ref
from mixlab.runners.bench.shortconv import doc_layout
from mixlab.runners.bench.utils import device_line, error_line, median_time_ms, rel_rms


@dataclass(frozen=True)
class Group:
    """Candidates of one table row: ``module.CONFIGS[key]`` first, then that row with each of ``changes``' field
    replacements, timed on ``cases`` (names of the op's cases)."""

    name: str
    module: object
    key: object
    changes: tuple[dict, ...]
    cases: tuple[str, ...]

    def candidates(self) -> list:
        row = self.module.CONFIGS[self.key]
        return [row, *(dataclasses.replace(row, **change) for change in self.changes)]


def _fields(names: str, *rows: tuple) -> tuple[dict, ...]:
    """Field replacements from rows of values: ``_fields("BT BD", (16, 64))`` -> ({"BT": 16, "BD": 64},)."""
    return tuple(dict(zip(names.split(), row, strict=True)) for row in rows)


GROUPS: dict[str, list[Group]] = {
    "shortconv": [
        Group("static fwd stream", short, ("fwd", "stream"), _fields(
            "CH U BD warps", (64, 16, 128, 1), (128, 16, 128, 1), (64, 8, 128, 1), (64, 16, 64, 1), (64, 8, 64, 1),
            (64, 16, 256, 2), (32, 8, 64, 1), (128, 16, 64, 1)), ("static",)),
        Group("static bwd stream", short, ("bwd", "stream"), _fields(
            "CH U BD warps", (128, 8, 256, 2), (96, 4, 256, 2), (160, 4, 256, 2), (128, 4, 512, 4)), ("static",)),
        Group("static fwd tiled", short, ("fwd", "tiled"), _fields(
            "BT BD warps", (16, 128, 4), (64, 128, 4), (64, 128, 8), (32, 256, 8), (16, 256, 4)), ("static W12",)),
        Group("static bwd tiled", short, ("bwd", "tiled"), _fields(
            "BT BD warps programs", (64, 64, 4, 4096), (16, 64, 4, 4096), (16, 32, 2, 4096), (16, 32, 2, 2048),
            (16, 64, 4, 1024), (32, 64, 4, 2048)), ("static W12",)),
        Group("head-wise fwd stream hs1", headwise, ("fwd", "stream", "hs1"), _fields(
            "CH U BD", (32, 8, 64), (32, 8, 128), (64, 8, 64), (32, 8, 32), (32, 4, 128), (32, 2, 64)), ("hs1",)),
        Group("head-wise fwd stream wide", headwise, ("fwd", "stream", "wide"), _fields(
            "CH U BD warps", (32, 8, 128, 1), (64, 8, 128, 1), (32, 16, 128, 1), (32, 8, 256, 2), (128, 8, 128, 1),
            (64, 4, 128, 1)), ("hs16",)),
        Group("head-wise bwd stream hs1", headwise, ("bwd", "stream", "hs1"), _fields(
            "CH U BD", (128, 4, 64), (256, 4, 64), (128, 8, 64), (64, 4, 64), (128, 2, 64), (128, 4, 128)), ("hs1",)),
        Group("head-wise bwd stream wide", headwise, ("bwd", "stream", "wide"), _fields(
            "CH U BD warps", (128, 4, 128, 1), (256, 4, 128, 1), (64, 2, 128, 1), (128, 4, 256, 2), (64, 4, 128, 1)),
            ("hs16",)),
        Group("head-wise fwd tiled hs1", headwise, ("fwd", "tiled", "hs1"), _fields(
            "tile channels warps", (1024, 128, 4), (2048, 32, 4), (2048, 64, 4), (1024, 32, 4), (2048, 32, 8),
            (4096, 64, 8)), ("hs1 W12",)),
        Group("head-wise fwd tiled", headwise, ("fwd", "tiled", "wide"), _fields(
            "tile channels warps", (512, 128, 4), (2048, 128, 4), (256, 128, 4), (2048, 128, 8), (512, 64, 2)),
            ("hs2",)),
        Group("head-wise bwd tiled hs1", headwise, ("bwd", "tiled", "hs1"), _fields(
            "tile channels", (512, 64), (512, 32), (1024, 64), (1024, 128), (512, 256), (256, 128)), ("hs1 W12",)),
        Group("head-wise bwd tiled", headwise, ("bwd", "tiled", "wide"), _fields(
            "tile channels warps programs", (512, 128, 4, 4096), (2048, 128, 4, 4096), (2048, 128, 8, 4096),
            (1024, 128, 8, 4096), (1024, 128, 4, 2048), (1024, 128, 4, 8192), (1024, 64, 4, 4096),
            (1024, 256, 4, 4096)), ("hs2",)),
        Group("low-rank fwd", lowrank, "fwd", _fields(
            "BT BD warps stages", (32, 128, 4, 3), (32, 64, 4, 3), (32, 32, 1, 3), (32, 64, 2, 3), (32, 64, 4, 2),
            (32, 64, 4, 4), (32, 32, 1, 4)), ("lowrank",)),
        Group("low-rank bwd dx", lowrank, "dx", _fields(
            "BT BD warps stages", (64, 64, 8, 1), (64, 128, 8, 1), (32, 128, 4, 1), (32, 64, 4, 2), (32, 64, 4, 3),
            (32, 64, 4, 4)), ("lowrank",)),
        Group("low-rank bwd dz", lowrank, "dz", _fields(
            "BT BD warps stages splits", (64, 32, 4, 1, 8), (64, 64, 4, 1, 8), (64, 32, 4, 1, 16), (128, 64, 8, 1, 8),
            (32, 64, 4, 1, 2), (32, 64, 4, 1, 1), (32, 64, 4, 2, 8), (32, 64, 4, 3, 8)), ("lowrank",)),
        Group("low-rank bwd dU", lowrank, "du", _fields(
            "BT BD warps stages programs", (32, 64, 4, 1, 1024), (64, 64, 4, 1, 2048), (32, 128, 8, 1, 1024),
            (128, 64, 8, 1, 1024), (64, 64, 4, 2, 1024), (64, 64, 4, 3, 1024), (32, 64, 4, 2, 1024),
            (32, 64, 4, 3, 1024)), ("lowrank",)),
    ],
    "attention": [
        Group("fwd", attention, "fwd", _fields(
            "BT warps stages pair_rows", (64, 4, 2, 512), (128, 4, 2, 128), (32, 2, 2, 256), (64, 2, 2, 512)),
            ("T=127", "T=1023")),
        Group("bwd", attention, "bwd", _fields(
            "BT warps stages pair_rows", (64, 4, 1, 256), (64, 4, 1, 64), (64, 4, 1, 512), (128, 4, 1, 512)),
            ("T=127", "T=1023")),
    ],
    "rubiconv": [
        # half columns x column values a program, document columns a dot
        Group("block fwd", rubiconv, ("block_fwd", 16), _fields(
            "BC BB BN warps stages", (32, 32, 128, 4, 3), (16, 32, 128, 4, 3), (32, 32, 64, 4, 3), (32, 16, 128, 4, 3),
            (32, 32, 128, 8, 3), (32, 32, 256, 8, 3), (64, 32, 128, 8, 3), (32, 32, 128, 4, 2)), ("k=64", "k=128")),
        # the last candidate takes all k rows in one chunk, so each program reads its column of Z once
        Group("spectrum", rubiconv, ("spectrum", 16), _fields(
            "rows inner acc wide warps stages", (16, 32, 8192, 128, 8, 3), (16, 32, 4096, 128, 8, 3),
            (16, 16, 8192, 128, 8, 3), (32, 32, 8192, 128, 8, 3), (16, 32, 8192, 64, 8, 3), (16, 32, 8192, 128, 8, 2),
            (16, 64, 8192, 128, 8, 3), (16, 16, 4096, 128, 8, 2), (128, 32, 4096, 128, 8, 3)), ("k=64",)),
        Group("spectrum large k", rubiconv, ("spectrum", 128), _fields(
            "rows acc warps", (16, 8192, 8), (16, 4096, 8), (16, 4096, 4), (128, 4096, 8)), ("k=128",)),
        # output columns x column values a program, half columns a dot
        Group("block inv", rubiconv, ("block_inv", 16), _fields(
            "BB BC BN warps stages", (32, 32, 128, 8, 3), (32, 32, 128, 4, 3), (64, 32, 128, 8, 3), (32, 32, 256, 8, 3),
            (16, 32, 128, 4, 3), (32, 32, 64, 4, 3), (32, 32, 128, 8, 2)), ("k=64", "k=128")),
    ],
}
# Relative RMS error a candidate may have against the reference: the kernel tests' bf16 bound (short convs and
# attention, bf16 inputs against an fp32 reference), RubiConv's fp32 GEMM-form bound (tf32 dots)
BOUNDS = {"shortconv": 1e-2, "attention": 2e-2, "rubiconv": 1e-3}


# ---- the cases: one op at one shape, its launches at the settings chosen so far ----
# ``chosen``: (module name, row key) -> the setting that row's launches take (a group's candidate for its own row,
# the winners of the groups before it, the table's rows for the rest).


def _row(chosen: dict, module, key):
    return chosen.get((module.__name__, key), module.CONFIGS[key])


def _key(module, row) -> object:
    """The key of a row of ``module.CONFIGS`` (the object ``config_for`` returned)."""
    return next(key for key, value in module.CONFIGS.items() if value is row)


class _ShortConvCase:
    """One short conv at the target shape: its launchers at the GPU's routing of its rows, with and without
    documents, and the fp32 reference of its output and every gradient (with documents)."""

    def __init__(self, name: str, device: torch.device, smoke: bool) -> None:
        B, T, D, R, n_docs = (1, 32, 16, 4, 2) if smoke else (4, 4096, 2048, 16, 64)
        kind, _, width = name.partition(" W")
        W = int(width or 4)
        gen = torch.Generator(device=device).manual_seed(0)

        def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
            return (scale * torch.randn(*shape, generator=gen, device=device)).to(torch.bfloat16)

        x, s = randn(B, T, D), randn(W, D, scale=W**-0.5)
        self.dy = randn(B, T, D)
        if kind == "static":
            self.args, ref, self.module = [x, s], short_conv_ref, short
            self.triton_op = short.short_conv_triton
            self.rows = {"fwd": short.config_for(False, W, False), "config": short.config_for(True, W, False)}
        elif kind.startswith("hs"):
            H = D // int(kind[2:])
            self.args = [x, randn(B, T, H, W, scale=W**-0.5), s]
            ref, self.module, self.triton_op = dynamic_conv_headwise_ref, headwise, headwise.headwise_triton
            self.rows = {"fwd": headwise.config_for(False, H, D, W, False),
                         "config": headwise.config_for(True, H, D, W, False)}
        else:
            self.args = [x, randn(B, T, R), randn(R, W * D, scale=(R * W) ** -0.5), s]
            ref, self.module, self.triton_op = dynamic_conv_lowrank_ref, lowrank, lowrank.lowrank_triton
            self.rows = {"fwd": lowrank.config_for("fwd"), "dx_config": lowrank.config_for("dx"),
                         "dz_config": lowrank.config_for("dz"), "du_config": lowrank.config_for("du")}
        self.rows = {name: _key(self.module, row) for name, row in self.rows.items()}  # launch keyword -> row key
        self.cu = doc_layout(B, T, n_docs, device)
        leaves = [a.float().requires_grad_() for a in self.args]
        y = ref(*leaves, cu_seqlens=self.cu, residual=True)
        self.want = [y.detach(), *torch.autograd.grad(y, leaves, self.dy.float())]

    def _launch(self, backward: bool, chosen: dict, cu) -> Callable[[], object]:
        settings = {name: _row(chosen, self.module, key) for name, key in self.rows.items()}
        fwd = settings.pop("fwd")
        if backward:
            return lambda: self.triton_op.bwd(self.dy, *self.args, cu, True, **settings)
        return lambda: self.triton_op.fwd(*self.args, cu, True, config=fwd)

    def calls(self) -> list[Callable[[], object]]:
        return [self._launch(backward, {}, None) for backward in (False, True)]

    def score(self, group: Group, chosen: dict, rep: int, device: torch.device) -> tuple[float, str]:
        """The launcher that takes the group's row: the forward's, or the backward's (all its launches)."""
        backward = not (group.key == "fwd" or group.key[0] == "fwd")  # keys "fwd" (low-rank) or ("fwd", ...)
        plain, docs = (1e3 * median_time_ms(self._launch(backward, chosen, cu), rep, device) for cu in (None, self.cu))
        return (plain + docs) / 2, f"{plain:8.1f} / {docs:8.1f} µs docs"

    def error(self, chosen: dict) -> float:
        got = [self._launch(False, chosen, self.cu)(), *self._launch(True, chosen, self.cu)()]
        return max(rel_rms(a, b) for a, b in zip(got, self.want, strict=True))


class _AttentionCase:
    """One length: inputs in the mixers' [B, T, H, hd] layout, the fp32 reference on CHECKED sequences."""

    CHECKED = 8  # sequences checked against the reference (its [T, T] scores would not fit for all of them)

    def __init__(self, name: str, device: torch.device, smoke: bool) -> None:
        B, H, hd = (2, 2, 8) if smoke else (18 * 128, 16, 8)
        T = 17 if smoke else int(name.removeprefix("T="))
        gen = torch.Generator(device=device).manual_seed(T)
        self.q, self.k, self.v, self.do = (
            torch.randn(B, T, H, hd, generator=gen, device=device).to(torch.bfloat16).transpose(1, 2)
            for _ in range(4))
        self.scale, self.tokens = hd**-0.5, B * T
        self.o, self.lse = attention._attention_fwd(self.q, self.k, self.v, self.scale)
        leaves = [t[: self.CHECKED].float().requires_grad_() for t in (self.q, self.k, self.v)]
        o = causal_attention_ref(*leaves, self.scale)
        self.want = [o.detach(), *torch.autograd.grad(o, leaves, self.do[: self.CHECKED].float())]

    def _launch(self, backward: bool, chosen: dict) -> Callable[[], object]:
        if backward:
            config = _row(chosen, attention, "bwd")
            return lambda: attention._attention_bwd(self.do, self.q, self.k, self.v, self.o, self.lse, self.scale,
                                                    config=config)
        config = _row(chosen, attention, "fwd")
        return lambda: attention._attention_fwd(self.q, self.k, self.v, self.scale, config=config)

    def calls(self) -> list[Callable[[], object]]:
        return [self._launch(backward, {}) for backward in (False, True)]

    def score(self, group: Group, chosen: dict, rep: int, device: torch.device) -> tuple[float, str]:
        us = 1e3 * median_time_ms(self._launch(group.key == "bwd", chosen), rep, device)
        return us / self.tokens, f"{us:9.1f} µs"

    def error(self, chosen: dict) -> float:
        o, lse = attention._attention_fwd(self.q, self.k, self.v, self.scale, config=_row(chosen, attention, "fwd"))
        grads = attention._attention_bwd(self.do, self.q, self.k, self.v, o, lse, self.scale,
                                         config=_row(chosen, attention, "bwd"))
        return max(rel_rms(g[: self.CHECKED], w) for g, w in zip((o, *grads), self.want, strict=True))


class _RubiConvCase:
    """One block k on the benchmark's row: every launch of a forward and backward as a closure of its stage's
    setting, on inputs made once at the table's settings, and the float64 reference of the whole op."""

    def __init__(self, name: str, device: torch.device, smoke: bool) -> None:
        from mixlab.runners.bench.rubiconv import lognormal_layout

        tokens, d = (128, 2) if smoke else (65536, 1024)
        self.block = block = 16 if smoke else int(name.removeprefix("k="))
        gen = torch.Generator(device=device).manual_seed(0)
        self.cu = lognormal_layout(tokens, 0, device, median=64 if smoke else None)
        self.x = torch.randn(1, tokens, d, generator=gen, device=device)
        self.h = torch.randn(d, tokens, generator=gen, device=device) / math.sqrt(tokens)
        self.dy = torch.randn(1, tokens, d, generator=gen, device=device)
        xl, hl = self.x.double().requires_grad_(), self.h.double().requires_grad_()
        y = rubiconv_ref(xl, hl, cu_seqlens=self.cu)
        self.want = [y.detach(), *torch.autograd.grad(y, (xl, hl), self.dy.double())]
        self.plan = plan = gemm.get_plan(self.cu, 1, tokens, tokens, block, device)
        self.t = t = rubiconv._tables(plan, "fp32")
        self.rows = {stage: _key(rubiconv, rubiconv.config_for(stage, plan.k))
                     for stage in ("block_fwd", "spectrum", "block_inv")}
        x, dy = self.x.view(-1, d), self.dy.view(-1, d)
        taps = self.h[:, : plan.max_taps].T.contiguous()
        zf = rubiconv._block_fwd(taps, plan, t, filters=True)
        hs = rubiconv._spectrum(rubiconv.MODE_SPECTRUM, zf, plan, t)
        zx, zg = rubiconv._block_fwd(x, plan, t, filters=False), rubiconv._block_fwd(dy, plan, t, filters=False)
        sx, sg = (torch.empty(zx.shape, dtype=torch.float32, device=device) for _ in "xg")
        o = rubiconv._spectrum(rubiconv.MODE_CONV, zx, plan, t, hs=hs, s=sx)
        og = rubiconv._spectrum(rubiconv.MODE_CONV, zg, plan, t, hs=hs, conj_h=True, s=sg)
        corr = rubiconv._spectrum(rubiconv.MODE_CORRELATE, zg, plan, t, zx=sx, s=sg)
        y_out, dh = torch.empty_like(x), torch.empty(plan.max_taps, d, dtype=torch.float32, device=device)
        # stage -> its launches in one forward and backward, each a function of the stage's setting
        self.launches = {
            "block_fwd": [lambda c: rubiconv._block_fwd(taps, plan, t, filters=True, config=c),
                          lambda c: rubiconv._block_fwd(x, plan, t, filters=False, config=c),
                          lambda c: rubiconv._block_fwd(dy, plan, t, filters=False, config=c)],
            "spectrum": [lambda c: rubiconv._spectrum(rubiconv.MODE_SPECTRUM, zf, plan, t, config=c),
                         lambda c: rubiconv._spectrum(rubiconv.MODE_CONV, zx, plan, t, hs=hs, s=sx, config=c),
                         lambda c: rubiconv._spectrum(rubiconv.MODE_CONV, zg, plan, t, hs=hs, conj_h=True, s=sg,
                                                      config=c),
                         lambda c: rubiconv._spectrum(rubiconv.MODE_CORRELATE, zg, plan, t, zx=sx, s=sg, config=c)],
            "block_inv": [lambda c: rubiconv._block_inv(o, plan, t, y_out, reduce=False, config=c),
                          lambda c: rubiconv._block_inv(og, plan, t, y_out, reduce=False, config=c),
                          lambda c: rubiconv._block_inv(corr, plan, t, dh, reduce=True, config=c)],
        }

    def _settings(self, chosen: dict) -> dict:
        return {stage: _row(chosen, rubiconv, key) for stage, key in self.rows.items()}

    def calls(self) -> list[Callable[[], object]]:
        settings = self._settings({})
        return [lambda fn=fn, c=settings[stage]: fn(c) for stage, fns in self.launches.items() for fn in fns]

    def score(self, group: Group, chosen: dict, rep: int, device: torch.device) -> tuple[float, str]:
        """The launches of the group's stage in one forward and backward, summed."""
        stage = group.key[0]
        config = self._settings(chosen)[stage]
        ms = sum(median_time_ms(lambda fn=fn: fn(config), rep, device) for fn in self.launches[stage])
        return ms, f"{ms:8.3f} ms"

    def error(self, chosen: dict) -> float:
        """Worst relative RMS of y, dx and dh of the whole op at these settings against the float64 reference."""
        configs = self._settings(chosen)
        y, sx, hs = rubiconv._forward(self.x, self.h, self.plan, self.t, save_spectra=True, configs=configs)
        dx, dh = rubiconv._backward(self.dy, sx, hs, self.h, self.plan, self.t, need_dx=True, configs=configs)
        return max(rel_rms(a, b) for a, b in zip((y, dx, dh), self.want, strict=True))


CASES = {"shortconv": _ShortConvCase, "attention": _AttentionCase, "rubiconv": _RubiConvCase}
# the cases each op's groups may name
CASE_NAMES = {"shortconv": ("static", "static W12", "hs1", "hs1 W12", "hs2", "hs16", "lowrank"),
              "attention": ("T=127", "T=1023"), "rubiconv": ("k=64", "k=128")}


def select(op: str, names: list[str] | None = None) -> list[Group]:
    """The op's groups, all of them or those named (in the op's order); ValueError names an unknown op or group."""
    if op not in GROUPS:
        raise ValueError(f"unknown op {op!r}; choose from {', '.join(GROUPS)}")
    known = {g.name for g in GROUPS[op]}
    unknown = sorted(set(names or ()) - known)
    if unknown:
        raise ValueError(f"unknown {op} tune group {unknown[0]!r}; choose from {', '.join(sorted(known))}")
    return [g for g in GROUPS[op] if not names or g.name in names]


def warm_up(calls: list[Callable[[], object]], seconds: float, device: torch.device) -> None:
    """Run ``calls`` round-robin for about ``seconds`` before anything is timed (compiling each on its first call):
    the first candidates a fresh process times can run before the GPU reaches its working clocks."""
    for fn in calls:
        fn()
    start = time.perf_counter()
    while device.type == "cuda" and time.perf_counter() - start < seconds:
        for fn in calls:
            fn()
        torch.cuda.synchronize()


def time_candidate(cases: dict, group: Group, chosen: dict, rep: int,
                   device: torch.device) -> tuple[float, float, str]:
    """(score summed over the group's cases, worst error, cells) of the settings ``chosen`` (the candidate under
    its row's key); a candidate that fails (to compile, say) scores inf."""
    score, worst, cells = 0.0, 0.0, []
    for name in group.cases:
        try:
            value, cell = cases[name].score(group, chosen, rep, device)
            err = cases[name].error(chosen)
        except Exception as exc:  # noqa: BLE001 - a candidate that fails is reported, not fatal
            value, err, cell = math.inf, math.inf, f"FAILED {error_line(exc, 100)}"
        score, worst = score + value, max(worst, err)
        cells.append(f"{name} {cell}")
    return score, worst, "; ".join(cells)


def tune(op: str, groups: list[str] | None = None, rep: int = 100, rounds: int = 1, device: str | None = None,
         smoke: bool = False, warm_up_seconds: float = 10.0, out: Callable[[str], None] = print) -> dict:
    """Tune ``op``'s groups (all, or those named) in turn and return {group name: winning setting}; each group's
    candidates and the winner go to ``out`` as they are timed, the rows to set at the end.

    ``rep``: do_bench's rep, ms of timed calls per measurement. ``rounds``: time every candidate of a group this
    many times, interleaved (a drift of the GPU's clocks then reaches every candidate alike), and score the median.
    ``device``: default CUDA when available; ``smoke``: tiny shapes, a check of the code path.
    """
    chosen_groups = select(op, groups)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if tu.POISON_OUTPUTS:
        raise ValueError("kernels.triton_utils.POISON_OUTPUTS is set: the NaN fills would be timed")
    out(f"# tune {op}\n\n{device_line(dev)}" + (" (smoke: tiny shapes, not a measurement)" if smoke else ""))
    cases = {name: CASES[op](name, dev, smoke) for name in dict.fromkeys(c for g in chosen_groups for c in g.cases)}
    warm_up([call for case in cases.values() for call in case.calls()], warm_up_seconds, dev)
    chosen, winners = {}, {}
    for group in chosen_groups:
        row, candidates = (group.module.__name__, group.key), group.candidates()
        out(f"\n## {group.name}: {group.module.__name__}.CONFIGS[{group.key!r}] on {', '.join(group.cases)}"
            + (f" (median of {rounds} rounds, candidates interleaved)" if rounds > 1 else ""))
        timed = [[time_candidate(cases, group, {**chosen, row: c}, rep, dev) for c in candidates]
                 for _ in range(rounds)]
        scores = [float(np.median([timed[r][i][0] for r in range(rounds)])) for i in range(len(candidates))]
        errors = [max(timed[r][i][1] for r in range(rounds)) for i in range(len(candidates))]
        best = min(range(len(candidates)), key=lambda i: scores[i] if errors[i] <= BOUNDS[op] else math.inf)
        for i, (err, (_, _, cells)) in enumerate(zip(errors, timed[-1], strict=True)):
            change = "the table's row" if i == 0 else ", ".join(f"{k}={v}" for k, v in group.changes[i - 1].items())
            out(f"{'*' if i == best else ' '} {change}: {cells} (err {err:.1e})"
                + ("" if err <= BOUNDS[op] else "  WRONG"))
        chosen[row] = winners[group.name] = candidates[best]
    out("\n## rows to set")
    for group in chosen_groups:
        out(f"{group.module.__name__}.CONFIGS[{group.key!r}] = {winners[group.name]!r}")
    return winners
