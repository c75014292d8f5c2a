"""Public kernels the convolution benchmarks time beside ours, in the same process, when they can be imported.

An anchor is another project's kernel for the same op: the benchmark reports its time and our time over it, so a
claim that a mixlab kernel is fast is always relative to the best public one measured on the same card minutes
apart. None of them is a dependency; each is looked up at run time and skipped, with the reason, when absent:

    fla causal_conv1d  fla-core's Triton short conv (``pip install 'mixlab[anchors]'``): static, with documents
    causal-conv1d      the Mamba authors' CUDA short conv (``pip install causal-conv1d``, builds CUDA code):
                       static, with documents through its ``seq_idx``
    dynamic-conv1d     the dynamic-conv paper's Triton kernels (a clone of its repository on ``PYTHONPATH``, its
                       modules ``headwise`` and ``lowrank``): head-wise and low-rank, no documents
    fla fft_conv       fla-core's FFT long conv, one FFT over the whole row (leaks across documents, like
                       our leaky baseline): the long-conv anchor

Each anchor takes our inputs (``x [B, T, D]``, static weights ``[W, D]``, dynamic weights ``[B, T, H, W]``,
low-rank ``z [B, T, R]`` and ``U [R, W*D]``) and turns them into its own layout once, outside the timed call.
Its output is checked against our float64 reference before it is timed: an anchor that computes something else
(another tap order, a missing residual) is reported as disagreeing, not timed against us.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable

import torch


@dataclasses.dataclass(frozen=True)
class Anchor:
    """One public kernel prepared for one benchmark case: ``fn(**inputs)`` gives the op's ``[B, T, D]`` output;
    ``inputs`` are its differentiable tensors in its own layout (the long-conv anchors take the bench's ``(x, h)``
    instead); ``ours``, when set, the arguments of our op that define the same function (else the case's own);
    ``note`` says what differs from our call."""

    name: str
    fn: Callable[..., torch.Tensor]
    inputs: dict[str, torch.Tensor]
    note: str = ""
    ours: dict[str, torch.Tensor | None] | None = None


@dataclasses.dataclass(frozen=True)
class Missing:
    """An anchor that could not be prepared here, and why (not installed, no documents support, ...)."""

    name: str
    reason: str


def _module(name: str, attribute: str):
    """``module.attribute`` when the module imports and has it, else None."""
    try:
        return getattr(importlib.import_module(name), attribute, None)
    except Exception:  # noqa: BLE001 - a broken optional install (wrong CUDA build) is as absent as a missing one
        return None


def _fla_short_conv(x: torch.Tensor, weight: torch.Tensor, cu: torch.Tensor | None) -> Anchor | Missing:
    conv = _module("fla.modules.causal_conv1d", "causal_conv1d")
    if conv is None:
        return Missing("fla causal_conv1d", "not installed: pip install 'mixlab[anchors]'")
    B, T, D = x.shape
    w = weight.flip(0).t().contiguous()  # ours [W, D], tap w at lag w; fla's [D, W], its last tap at lag 0
    if cu is None:
        return Anchor("fla causal_conv1d", lambda x, w: conv(x, w, residual=x)[0], {"x": x, "w": w})
    cu64 = cu.long()  # fla flattens the batch: one row of B*T tokens, documents by cu_seqlens

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(1, B * T, D)
        return conv(flat, w, residual=flat, cu_seqlens=cu64)[0].view(B, T, D)

    return Anchor("fla causal_conv1d", fn, {"x": x, "w": w})


def _seq_idx(cu: torch.Tensor, B: int, T: int) -> torch.Tensor:
    """[B, T] int32 document index of every token, as causal-conv1d's ``seq_idx`` wants it."""
    token = torch.arange(B * T, device=cu.device)
    return (torch.searchsorted(cu[1:].long(), token, right=True)).to(torch.int32).view(B, T)


def _causal_conv1d(x: torch.Tensor, weight: torch.Tensor, cu: torch.Tensor | None) -> Anchor | Missing:
    conv = _module("causal_conv1d", "causal_conv1d_fn")
    if conv is None:
        return Missing("causal-conv1d", "not installed: pip install causal-conv1d (compiles CUDA code)")
    B, T, _ = x.shape
    w = weight.flip(0).t().contiguous()  # [D, W], last tap at lag 0
    seq_idx = None if cu is None else _seq_idx(cu, B, T)

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        # x.transpose is its channel-last layout ([B, D, T] with D contiguous), read without a copy
        y = conv(x.transpose(1, 2), w, seq_idx=seq_idx).transpose(1, 2)
        return x + y

    return Anchor("causal-conv1d", fn, {"x": x, "w": w}, note="residual added outside the kernel")


def _dynamic_conv1d(module: str, function: str, cu: torch.Tensor | None) -> Callable | Missing:
    """The dynamic-conv paper's kernel ``module.function``, or why it cannot be an anchor here."""
    conv = _module(module, function)
    if conv is None:
        return Missing("dynamic-conv1d", "not on the path: clone its repository and add it to PYTHONPATH")
    if cu is not None:
        return Missing("dynamic-conv1d", "no document support")
    return conv


def _dynamic_conv1d_headwise(x: torch.Tensor, weight: torch.Tensor, static_w: torch.Tensor,
                             cu: torch.Tensor | None) -> Anchor | Missing:
    conv = _dynamic_conv1d("headwise", "headwise_dynamic_convolution", cu)
    if isinstance(conv, Missing):
        return conv
    return Anchor("dynamic-conv1d", lambda x, weight, static_w: conv(x, weight, static_w=static_w, residual=True),
                  {"x": x, "weight": weight, "static_w": static_w})


def _dynamic_conv1d_lowrank(x: torch.Tensor, z: torch.Tensor, U: torch.Tensor, static_w: torch.Tensor,
                            cu: torch.Tensor | None) -> Anchor | Missing:
    conv = _dynamic_conv1d("lowrank", "lowrank_dynamic_convolution", cu)
    if isinstance(conv, Missing):
        return conv
    # its static_w is fused as one more rank and rank + 1 must be a power of two: it runs rank R - 1 + static
    # (the same R-rank generator work as ours, one rank of it the static filter) - said in the note
    R = z.shape[-1]
    inputs = {"x": x, "z": z[..., : R - 1].contiguous(), "U": U[: R - 1].contiguous(), "static_w": static_w}
    return Anchor("dynamic-conv1d", lambda x, z, U, static_w: conv(x, z, U, static_w=static_w, residual=True),
                  inputs, note=f"rank {R - 1} + static_w fused as rank {R}; checked against ours at that rank",
                  ours=inputs)


def short_conv_anchors(kernel: str, inputs: dict[str, torch.Tensor | None],
                       cu: torch.Tensor | None) -> list[Anchor | Missing]:
    """The anchors of one short-conv case of ``mixlab bench shortconv``: ``kernel`` is static, headwise or
    lowrank; ``inputs`` are the case's arguments of our op (x, weight / z, U, static_w); ``cu`` its documents."""
    x = inputs["x"]
    if kernel == "static":
        return [_fla_short_conv(x, inputs["weight"], cu), _causal_conv1d(x, inputs["weight"], cu)]
    if kernel == "headwise":
        return [_dynamic_conv1d_headwise(x, inputs["weight"], inputs["static_w"], cu)]
    if kernel == "lowrank":
        return [_dynamic_conv1d_lowrank(x, inputs["z"], inputs["U"], inputs["static_w"], cu)]
    raise ValueError(f"unknown short-conv kernel {kernel!r}; choose from static, headwise, lowrank")


def long_conv_anchors() -> list[Anchor | Missing]:
    """Anchors of ``mixlab bench rubiconv``: ``fn(x, h)`` on x [1, T, D] and a filter h [D, L] -> [1, T, D], the
    bench's own call; fla's FFT conv over the whole row."""
    fft_conv = _module("fla.modules.long_conv", "fft_conv")
    if fft_conv is None:
        return [Missing("fla fft_conv", "not installed: pip install 'mixlab[anchors]'")]

    def fn(x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        # channels first, [B, D, T]; no gelu, no dropout; it adds its skip term x, taken off again here
        return fft_conv(x.transpose(1, 2), h, None, gelu=False).transpose(1, 2) - x

    return [Anchor("fla fft_conv", fn, {}, note="one FFT over the whole row (leaks); its skip term x is "
                   "subtracted after it, one elementwise op more than the leaky row")]
