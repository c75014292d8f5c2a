"""Time candidate tile/warp/chunk constants of the short-convolution Triton kernels on a GPU (issue #4).

Usage, on the GPU box from the checkout: ``PYTHONPATH=. python scripts/tune_shortconv_gpu.py`` (about 5 minutes
on an H200; ``--rep 50`` halves it). Shape B=4, T=4096, D=2048, W=4, bf16, residual on, static_w on for the
dynamic kernels; with and without 64 documents of random length (``runners.bench_shortconv``'s layout).

The candidates are groups of module-level constants (``GROUPS``); the groups are tuned one after the other,
each at the best values of the groups before it (coordinate descent). A candidate is timed by calling its
launcher directly (a ``TritonOp``'s ``fwd`` and ``bwd``: no autograd, no custom op, no input checks),
as the mean of the medians without and with documents, and checked against the fp32 torch reference (relative
RMS of the output and every gradient, with documents). One line per candidate, the best marked ``*``; then
the constants to set, and a table at the best constants of every path: raw launchers, the public op (eager
``autograd.Function``), and the custom op (what torch.compile graphs call), so host overhead is visible.
"""

import argparse
import math

import numpy as np
import torch
from mixlab import kernels
from mixlab.kernels.dynamic_conv import triton_headwise as headwise
from mixlab.kernels.dynamic_conv import triton_lowrank as lowrank
from mixlab.kernels.dynamic_conv.naive import dynamic_conv_headwise_ref, dynamic_conv_lowrank_ref
from mixlab.kernels.short_conv import triton as short
from mixlab.kernels.short_conv.naive import short_conv_ref
from mixlab.runners.bench.utils import rel_rms
from tuning import gpu, settle, us, use, warm_up

B, T, D, W, R, N_DOCS = 4, 4096, 2048, 4, 16, 64
DTYPE = torch.bfloat16
RMS_BOUND = 1e-2  # the bf16 bound of the kernel tests

# (group name, kernels it serves, module, constant names, candidate values); the first candidate of each group
# is the value the repository ships.
GROUPS = [
    # the tiled forms' groups lead with the streaming form as shipped (FWD_STREAM / BWD_STREAM True), then the
    # tiled candidates (False)
    ("static fwd", ["static"], short, ("FWD_STREAM", "FWD_BT", "FWD_BD", "FWD_WARPS"),
     [(True, 32, 128, 4), (False, 32, 128, 4), (False, 16, 128, 4), (False, 64, 128, 4), (False, 64, 128, 8),
      (False, 32, 256, 8), (False, 16, 256, 4), (False, 8, 256, 4)]),
    # registers (scripts/kernel_resources.py, Triton 3.6): 64x64 4 warps 168 (18.75% occupancy), 32x64 4 warps
    # 128 (25%), 32x64 and 64x32 8 warps 100-109 (25%), 16x128 8 warps 99-108 (25%). DW_DEFER (True): dw summed
    # once a chunk in a [BT, BD] sum per tap; compiled for sm_90a (Triton 3.9, 2026-12-04) no shuffles and no
    # barriers in its loop (the shipped kernel 128 shuffles and 16 barriers a tile, 128 registers + 256 spilled
    # bytes): 16x64 4 warps 96 registers (31% occupancy), 32x64 8 warps 95 (25%), 16x32 2 warps 96 (31%), 32x64
    # 4 warps 168, none spilling. (Its first form, one [BT, WP, BD] sum, timed 173 µs at best on 2026-12-03.)
    # Timed on the H200 (2026-12-04, one round): 16x64 2,048 programs 105.5 µs, the per-tile form at 64x64 138.7;
    # two interleaved rounds the same day: the first three candidates timed 1.5-1.9x apart between rounds, the
    # rest within 16% (hence the warm-up before the first group), the closing table at 16x64 1,024 programs 102.2
    # (109.9 with documents).
    ("static bwd", ["static"], short,
     ("BWD_STREAM", "BWD_BT", "BWD_BD", "BWD_WARPS", "BWD_STAGES", "BWD_PROGRAMS", "BWD_MAXNREG", "BWD_DW_DEFER"),
     [(True, 16, 64, 4, 1, 2048, None, True), (False, 16, 64, 4, 1, 2048, None, True),
      (False, 64, 64, 4, 1, 4096, 128, False), (False, 16, 64, 4, 1, 4096, None, True),
      (False, 16, 32, 2, 1, 4096, None, True), (False, 16, 32, 2, 1, 2048, None, True),
      (False, 16, 64, 4, 1, 1024, None, True), (False, 32, 64, 4, 1, 2048, None, True),
      (False, 16, 64, 4, 1, 2048, 80, True)]),
    # the streaming forms (True) against the tiled (False): one program per row, CH positions walked U a step,
    # BD channels. Compiled for sm_90a (scripts/kernel_resources.py, Triton 3.9, 2026-12-04), 1 warp at 128
    # channels: fwd U=8 64 registers, U=16 85, U=4 60; bwd U=8 128, U=16 206 (255 + spills with documents), U=4 96;
    # 256 channels in 1 warp 116 / 205, in 2 warps as 128 in 1. No layout moves, no shuffles, 8-byte loads.
    # Timed on the H200 (2026-12-04): BENCHMARKS.md gives both tunes' candidates; each list starts at the best.
    ("static fwd stream", ["static"], short,
     ("FWD_STREAM", "STREAM_FWD_CH", "STREAM_FWD_U", "STREAM_FWD_BD", "STREAM_FWD_WARPS"),
     [(True, 32, 16, 128, 1), (False, 32, 16, 128, 1), (True, 64, 16, 128, 1), (True, 128, 16, 128, 1),
      (True, 64, 8, 128, 1), (True, 64, 16, 64, 1), (True, 64, 8, 64, 1), (True, 64, 16, 256, 2),
      (True, 32, 8, 64, 1), (True, 128, 16, 64, 1)]),
    ("static bwd stream", ["static"], short,
     ("BWD_STREAM", "STREAM_BWD_CH", "STREAM_BWD_U", "STREAM_BWD_BD", "STREAM_BWD_WARPS"),
     [(True, 128, 4, 256, 2), (True, 128, 8, 256, 2), (True, 96, 4, 256, 2), (True, 160, 4, 256, 2),
      (True, 128, 4, 512, 4)]),
    # the next step's rows loaded before each step's work (STREAM_*_PREFETCH): compiled for sm_90a (Triton 3.6,
    # 2026-12-04) fwd U=16 154 registers, U=8 96 (119 with documents); bwd U=4 156, U=8 166 (255 with documents).
    ("static fwd prefetch", ["static"], short, ("STREAM_FWD_PREFETCH", "STREAM_FWD_CH", "STREAM_FWD_U"),
     [(False, 32, 16), (True, 32, 16), (True, 32, 8), (True, 64, 8), (True, 128, 8), (True, 64, 4)]),
    ("static bwd prefetch", ["static"], short, ("STREAM_BWD_PREFETCH", "STREAM_BWD_CH", "STREAM_BWD_U"),
     [(False, 128, 4), (True, 128, 4), (True, 256, 4), (True, 128, 2), (True, 64, 4), (True, 256, 2)]),
    # fewer channels a tile, longer in tokens (at head size 1, 128 channels leave 4-8 tokens): registers at
    # head size 1 / 16 (scripts/kernel_resources.py, Triton 3.6) fwd 2048x32 138/80, 2048x64 136/80, 1024x32
    # 72/44, 2048x32 8 warps 78/44; bwd 1024x32 168/112, 1024x64 168/88, 512x32 96/80, 2048x64 8 warps 153/112
    # weights tap by tap (last value True): head size 16 then needs no layout move at all (scripts/kernel_resources)
    ("head-wise fwd", ["hs1", "hs16"], headwise, ("HW_FWD_TILE", "HW_FWD_WARPS", "HW_FWD_CHANNELS", "HW_FWD_TAP_LOADS"),
     [(512, 4, 128, False), (1024, 4, 128, False), (1024, 4, 128, True), (2048, 4, 32, False), (2048, 4, 32, True),
      (2048, 4, 64, False), (1024, 4, 32, False), (2048, 8, 32, False), (4096, 8, 64, False)]),
    # the forward's tile at head size 16 alone (HW_FWD_TILE_WIDE; the group above then serves head size 1). Compiled
    # for sm_90a (Triton 3.6, 2026-12-04), head size 16: 256 30 registers, 512 32, 1024 44, 2048 80, no spills.
    ("head-wise fwd wide heads", ["hs16"], headwise, ("HW_FWD_TILE_WIDE",), [(1024,), (512,), (2048,), (256,)]),
    # the streaming forward of wide heads (shipped, first) against the tiled one at the warps and channels the
    # dynamic-conv1d anchor's autotuning spans (2-8 warps, 32-128 channels), its weights read tap by tap (no layout
    # move at head size 16). Compiled for sm_90a (Triton 3.6, 2026-12-05 session 33), head size 16: 1024 elements at
    # 4 warps 44 registers, 2048 at 8 warps 44, 512 at 2 warps of 64 channels 44, 2048 at 4 warps 76
    ("head-wise fwd wide tiled", ["hs16"], headwise,
     ("HW_FWD_STREAM_WIDE", "HW_FWD_TILE_WIDE", "HW_FWD_WARPS", "HW_FWD_CHANNELS", "HW_FWD_TAP_LOADS"),
     [(True, 1024, 4, 128, False), (False, 1024, 4, 128, True), (False, 2048, 8, 128, True), (False, 512, 2, 64, True),
      (False, 1024, 2, 64, True), (False, 4096, 8, 128, True)]),
    # dweight as one tile (DW_TILE True): head size 1 at 512x128 128 registers, 1024x32 168, 512x32 118.
    # DS_DEFER (True): dstatic_w summed once a chunk, now from one [BT, NH, HSP] sum per tap (its first form, one
    # [WP, BT, NH, HSP] sum updated whole at every tap, timed on the H200 (2026-12-03) at head size 16 280 µs
    # against the shipped 197). Timed on the H200 (2026-12-04, two interleaved rounds), head size 16: 1024x128
    # deferred 175.1 µs (191.6 with documents), 512x128 deferred 205.2, every tile 196.9 (221.4), 256x128 268.6;
    # head size 1 takes its own kernel (the next group) and stays at 493 in all of them.
    # the streaming forms (``kernels.short_conv.triton`` explains them) against the tiled (False).
    # Compiled for sm_90a (scripts/kernel_resources.py, Triton 3.9, 2026-12-04), 1 warp, 128 channels: head size 16
    # fwd 74 registers, no layout move, bwd 146 (16 moves, 48 shuffles: dweight's sum over a head's channels);
    # head size 1 fwd 132, bwd 254 (27-35 moves).
    # HW_FWD_STREAM_HS: the head sizes up to which the forward streams on this layout (0 never; head size 16 streams
    # on the taps-aligned layout below while HW_FWD_STREAM_WIDE is on)
    ("head-wise fwd stream", ["hs1", "hs16"], headwise,
     ("HW_FWD_STREAM_HS", "HW_STREAM_FWD_CH", "HW_STREAM_FWD_U", "HW_STREAM_FWD_BD", "HW_STREAM_FWD_WARPS"),
     [(1, 32, 4, 64, 1), (0, 32, 8, 64, 1), (1, 32, 8, 64, 1), (1, 32, 8, 128, 1), (1, 64, 8, 64, 1),
      (1, 32, 8, 32, 1)]),
    # the streaming forward's weights read as one [heads, W] row a position (HW_FWD_STREAM_W_ROWS; head size 1 here,
    # head size 16 streams on the taps-aligned layout): compiled for sm_90a (Triton 3.6, 2026-12-05) at U=4, 64
    # channels, 15 wider loads against 39, but 12 layout moves and 32 shuffles a step
    ("head-wise fwd stream rows", ["hs1"], headwise, ("HW_FWD_STREAM_W_ROWS", "HW_STREAM_FWD_U", "HW_STREAM_FWD_BD"),
     [(True, 4, 64), (False, 4, 64), (True, 8, 64), (True, 4, 128), (True, 2, 64)]),
    # the streaming forward of heads wider than one channel on its own tiles, a head's channels as [groups, padded
    # width] so each thread reads its head's taps as one vector (HW_FWD_STREAM_WIDE; head size 1 stays as the group
    # above leaves it). Compiled for sm_90a (Triton 3.6, 2026-12-05), head size 16, no layout moves or shuffles,
    # registers without (with) 64 documents: U=8 128 channels a warp 68 (125), U=4 59 (71), U=16 94 (190).
    ("head-wise fwd wide stream", ["hs16"], headwise,
     ("HW_FWD_STREAM_WIDE", "HW_STREAM_FWD_WIDE_CH", "HW_STREAM_FWD_WIDE_U", "HW_STREAM_FWD_WIDE_BD",
      "HW_STREAM_FWD_WIDE_WARPS"),
     [(True, 32, 4, 128, 1), (False, 32, 8, 128, 1), (True, 32, 8, 128, 1), (True, 64, 8, 128, 1),
      (True, 32, 16, 128, 1), (True, 32, 8, 256, 2), (True, 128, 8, 128, 1), (True, 64, 4, 128, 1)]),
    # and its backward (HW_BWD_STREAM_WIDE): compiled for sm_90a (Triton 3.6, 2026-12-05), head size 16, no layout
    # moves, registers without (with) 64 documents: U=4 128 channels a warp 128 (168), U=2 96 (127), 256 channels
    # on 2 warps 139 (182, 12 barriers a step)
    ("head-wise bwd wide stream", ["hs16"], headwise,
     ("HW_BWD_STREAM_WIDE", "HW_STREAM_BWD_WIDE_CH", "HW_STREAM_BWD_WIDE_U", "HW_STREAM_BWD_WIDE_BD",
      "HW_STREAM_BWD_WIDE_WARPS"),
     [(True, 128, 2, 128, 1), (False, 128, 4, 128, 1), (True, 128, 4, 128, 1), (True, 256, 4, 128, 1),
      (True, 64, 2, 128, 1), (True, 128, 4, 256, 2), (True, 64, 4, 128, 1)]),
    # HW_BWD_STREAM_HS: the head sizes up to which the backward streams (0 never, 16 both cases here)
    # the streaming backward carrying the rows it shares with the next step in registers (HW_STREAM_BWD_*PREFETCH),
    # x, dy and, on the taps-aligned layout, the weights. Compiled for sm_90a (Triton 3.6, 2026-12-05), registers
    # without (with) 64 documents and global loads a step: head size 16, U=2 149 (157), 6 x 8 B against 96 (127),
    # 15 x 8 B; U=1 95 (127), 3 x 8 B; U=4 168 (220), 12 x 8 B. Head size 1 (weights as rows), U=4 74 (95), 8 x 2 B
    # and 7 x 8 B; U=2 58 (57)
    # and the streaming forward's (HW_STREAM_FWD_*PREFETCH, x's rows): compiled for sm_90a (Triton 3.6, 2026-12-05),
    # registers without (with) 64 documents and global loads a step: head size 16, U=4 84 (103), 8 x 8 B against
    # 59 (71), 11 x 8 B; head size 1 (weights as rows) 66 (93), 4 x 4 B and 8 x 8 B against 63 (96), 7 x 4 B and 8 x 8 B
    ("head-wise fwd wide prefetch", ["hs16"], headwise,
     ("HW_STREAM_FWD_WIDE_PREFETCH", "HW_STREAM_FWD_WIDE_U", "HW_STREAM_FWD_WIDE_CH"),
     [(False, 4, 32), (True, 4, 32), (True, 8, 32), (True, 4, 64), (True, 2, 32)]),
    ("head-wise fwd stream prefetch", ["hs1"], headwise,
     ("HW_STREAM_FWD_PREFETCH", "HW_STREAM_FWD_U", "HW_STREAM_FWD_CH"),
     [(False, 4, 32), (True, 4, 32), (True, 8, 32), (True, 4, 64)]),
    ("head-wise bwd wide prefetch", ["hs16"], headwise,
     ("HW_STREAM_BWD_WIDE_PREFETCH", "HW_STREAM_BWD_WIDE_U", "HW_STREAM_BWD_WIDE_CH"),
     [(False, 2, 128), (True, 2, 128), (True, 1, 128), (True, 4, 128), (True, 2, 256)]),
    ("head-wise bwd stream prefetch", ["hs1"], headwise,
     ("HW_STREAM_BWD_PREFETCH", "HW_STREAM_BWD_U", "HW_STREAM_BWD_CH"),
     [(False, 4, 128), (True, 4, 128), (True, 2, 128), (True, 4, 256)]),
    ("head-wise bwd stream", ["hs1", "hs16"], headwise,
     ("HW_BWD_STREAM_HS", "HW_STREAM_BWD_CH", "HW_STREAM_BWD_U", "HW_STREAM_BWD_BD", "HW_STREAM_BWD_WARPS"),
     [(1, 128, 4, 32, 1), (1, 128, 4, 64, 1), (0, 128, 4, 64, 1), (16, 128, 4, 64, 1), (1, 256, 4, 64, 1),
      (1, 128, 8, 64, 1), (1, 64, 4, 64, 1), (1, 128, 2, 64, 1)]),
    # dweight stored as one [heads, W] tile a position (HW_STREAM_BWD_DW_TILE): at head size 1, 4 layout moves and 16
    # shuffles a step against 16 and 32 (Triton 3.6)
    # the weights read as one [NH, W] row a position and split into taps (HW_STREAM_BWD_W_ROWS, last value): no
    # 2-byte loads left (14 of 8 bytes a step), but 17 layout moves and 56 shuffles with the joined dweight, 29 and
    # 72 without it (Triton 3.6)
    ("head-wise bwd stream dweight", ["hs1"], headwise,
     ("HW_STREAM_BWD_DW_TILE", "HW_STREAM_BWD_BD", "HW_STREAM_BWD_W_ROWS"),
     [(True, 32, True), (False, 64, False), (True, 64, False), (True, 128, False), (True, 32, False), (True, 64, True),
      (False, 64, True)]),
    ("head-wise bwd", ["hs1", "hs16"], headwise,
     ("HW_BWD_STREAM_HS", "HW_BWD_TILE", "HW_BWD_WARPS", "HW_BWD_STAGES", "HW_BWD_PROGRAMS", "HW_BWD_MAXNREG",
      "HW_BWD_CHANNELS", "HW_BWD_DW_TILE", "HW_BWD_DS_DEFER"),
     [(1, 1024, 4, 1, 4096, None, 128, True, True), (1, 512, 4, 1, 4096, None, 128, True, False),
      (1, 2048, 4, 1, 4096, None, 128, True, True), (1, 2048, 8, 1, 4096, None, 128, True, True),
      (1, 1024, 8, 1, 4096, None, 128, True, True), (1, 1024, 4, 1, 2048, None, 128, True, True),
      (1, 1024, 4, 1, 8192, None, 128, True, True), (1, 1024, 4, 1, 4096, None, 64, True, True),
      (1, 1024, 4, 1, 4096, None, 256, True, True), (1, 1024, 4, 1, 4096, 128, 128, True, True),
      (0, 1024, 4, 1, 4096, None, 128, True, True)]),
    # head size 1 only: the backward with the taps as the tile's third axis, on its own tile, against the kernel of
    # every head size (False); its dstatic_w summed every tile or once a chunk (DS_DEFER: in the loop's PTX 48 ->
    # 32 shuffles, 14 -> 6 barriers). Timed on the H200 (2026-12-03): 512 x 128 summed once a chunk fastest (631
    # µs; 512 x 64 668, every tile 821; the other kernel 906). GATHER: weight and dy rows read as stored, each
    # output's taps gathered in the tile; compiled for sm_90a (scripts/kernel_resources.py) its loop has no 2-byte
    # loads (16 before) and at 512 x 64 128 registers, 32 shuffles and 10 barriers. Timed on the H200 (2026-12-03):
    # 512 x 128 with GATHER 492 µs (537 with documents), 512 x 64 617, 512 x 32 703, 256 x 64 854; shipped
    ("head-wise bwd taps axis", ["hs1"], headwise,
     ("HW_BWD_STREAM_HS", "HW_HS1_BWD_TAPS_AXIS", "HW_HS1_BWD_TILE", "HW_HS1_BWD_CHANNELS", "HW_HS1_BWD_DS_DEFER",
      "HW_HS1_BWD_GATHER"),
     [(1, True, 512, 128, True, True), (0, True, 512, 128, True, True), (0, True, 512, 128, True, False),
      (0, True, 512, 64, True, True), (0, True, 512, 32, True, True), (0, True, 1024, 64, True, True),
      (0, True, 1024, 128, True, True), (0, True, 512, 256, True, True), (0, True, 256, 128, True, True),
      (0, False, 512, 128, False, False)]),
    # the taps as a loop (last value True; kernels/dynamic_conv/triton_lowrank.py): compiled for sm_90a (Triton 3.6,
    # 2026-12-04) 32x128 4 warps 122 registers against 168 unrolled, 32x64 4 warps 91, 32x32 1 warp 126 (the
    # dynamic-conv1d anchor's own forward tile), 64x64 4 warps 124.
    # the loop's pipelining stages last (LR_FWD_STAGES; compiled for sm_90a, Triton 3.6, 2026-12-05, at 32x64 4
    # warps: 2 stages 94 registers (72 with documents) and 5 KB of shared memory, 3 stages 91 (94) and 7 KB, 4 stages
    # 91 (93) and 9 KB; 32x32 1 warp at 4 stages 126 (127))
    ("low-rank fwd", ["lowrank"], lowrank,
     ("LR_FWD_BT", "LR_FWD_BD", "LR_FWD_WARPS", "LR_FWD_TAP_LOOP", "LR_FWD_STAGES"),
     [(64, 64, 4, True, 3), (32, 128, 4, False, 3), (32, 128, 4, True, 3), (32, 64, 4, True, 3), (32, 32, 1, True, 3),
      (32, 64, 2, True, 3), (16, 128, 4, False, 3), (32, 128, 8, False, 3), (64, 128, 8, False, 3),
      (32, 64, 4, False, 3), (16, 64, 4, False, 3), (128, 64, 8, False, 3), (32, 64, 4, True, 2), (32, 64, 4, True, 4),
      (32, 32, 1, True, 4)]),
    # x of the next tap loaded by hand before this tap's dot (LR_FWD_PREFETCH, first value); compiled for sm_90a
    # (Triton 3.6, 2026-12-05 session 33), registers without (with) 64 documents: 64x64 4 warps 153 (164) against
    # 124 (128) without it, 32x64 112 (114), 32x128 156 (164). Last, the dynamic-conv1d anchor's own forward tile:
    # 32x32, one warp, the taps unrolled (166 registers)
    ("low-rank fwd prefetch", ["lowrank"], lowrank,
     ("LR_FWD_PREFETCH", "LR_FWD_TAP_LOOP", "LR_FWD_BT", "LR_FWD_BD", "LR_FWD_WARPS"),
     [(False, True, 64, 64, 4), (True, True, 64, 64, 4), (True, True, 32, 64, 4), (True, True, 32, 128, 4),
      (False, False, 32, 32, 1)]),
    ("low-rank bwd dx+dz", ["lowrank"], lowrank,
     ("LR_DX_BT", "LR_DX_BD", "LR_DX_WARPS", "LR_DZ_SPLITS", "LR_DX_MAXNREG"),
     [(32, 64, 4, 8, None), (64, 64, 8, 4, 128), (64, 128, 8, 4, None), (64, 128, 8, 4, 128), (64, 64, 8, 4, None),
      (32, 64, 4, 4, None), (32, 64, 4, 2, None), (16, 64, 4, 4, None), (16, 64, 4, 8, None), (64, 128, 8, 2, None),
      (32, 64, 4, 1, None)]),
    # where dz is summed (LR_DZ_FORM, kernels/dynamic_conv/triton_lowrank.py): in the dx kernel, a dz-only
    # second launch of it ("own", shipped), one fused backward kernel that forms dx, dz, dU and dstatic_w ("fused",
    # its own tiles LR_FU_*), or that kernel without dx beside a dx launch ("with-du"). Compiled for sm_90a (Triton 3.6,
    # 2026-12-04): the dx launch without dz 90 registers at the 128 cap (78 without), no spills; "own"'s dz launch
    # 124 (102 with documents); fused 16x64 4 warps 214 (218), 16x32 201 (223), neither spilling, 32x64 8 warps 255
    # and 8 bytes spilled, 16x64 with a 128 cap 692 bytes spilled; without dx 16x64 203 (168), 32x64 8 warps 168.
    ("low-rank bwd dz", ["lowrank"], lowrank,
     ("LR_DZ_FORM", "LR_DX_BT", "LR_DX_BD", "LR_DX_WARPS", "LR_DX_MAXNREG", "LR_FU_BT", "LR_FU_BD", "LR_FU_WARPS",
      "LR_FU_STAGES", "LR_FU_PROGRAMS", "LR_FU_MAXNREG"),
     [("own", 32, 64, 4, None, 16, 64, 4, 1, 1024, None), ("dx", 64, 64, 8, 128, 16, 64, 4, 1, 1024, None),
      ("own", 64, 64, 8, 128, 16, 64, 4, 1, 1024, None), ("own", 64, 64, 8, None, 16, 64, 4, 1, 1024, None),
      ("own", 64, 128, 8, None, 16, 64, 4, 1, 1024, None), ("own", 32, 128, 4, None, 16, 64, 4, 1, 1024, None),
      ("fused", 64, 64, 8, 128, 16, 64, 4, 1, 1024, None), ("fused", 64, 64, 8, 128, 16, 32, 4, 1, 2048, None),
      ("fused", 64, 64, 8, 128, 32, 64, 8, 1, 1024, None), ("fused", 64, 64, 8, 128, 32, 64, 8, 3, 1024, None),
      ("fused", 64, 64, 8, 128, 16, 64, 4, 1, 1024, 128), ("fused", 64, 64, 8, 128, 16, 64, 4, 2, 512, None),
      ("with-du", 64, 64, 8, 128, 16, 64, 4, 1, 1024, None), ("with-du", 64, 64, 8, 128, 32, 64, 8, 1, 1024, None),
      ("with-du", 32, 64, 4, None, 16, 64, 4, 1, 1024, None), ("with-du", 64, 128, 8, None, 16, 64, 4, 1, 1024, None)]),
    # DS_DEFER (last value): dstatic_w summed once a chunk from a [BT, WP * BD] sum. Timed on the H200 (2026-12-04,
    # two interleaved rounds), the whole backward: 32x32 1,024 programs deferred 510.6 µs (484.4 with documents),
    # 64x16 2,048 every tile 516.6 (568.2), 64x16 deferred 515.3 (513.4), 32x32 every tile 568.4 (621.7).
    # (the "wide" form's tiles, the shipped form first)
    ("low-rank bwd dU", ["lowrank"], lowrank,
     ("LR_DU_FORM", "LR_DU_BT", "LR_DU_BD", "LR_DU_WARPS", "LR_DU_STAGES", "LOWRANK_BWD_PROGRAMS", "LR_DU_DS_DEFER"),
     [("taps-t", 64, 64, 4, 1, 1024, True), ("wide", 32, 32, 4, 1, 1024, True), ("wide", 64, 16, 4, 1, 2048, False),
      ("wide", 32, 32, 4, 1, 512, True), ("wide", 32, 32, 4, 1, 2048, True), ("wide", 16, 32, 4, 1, 1024, True),
      ("wide", 64, 32, 8, 1, 1024, True), ("wide", 32, 64, 8, 1, 1024, True), ("wide", 16, 64, 4, 1, 1024, True),
      ("wide", 32, 32, 8, 1, 1024, True), ("wide", 32, 32, 4, 2, 1024, True)]),
    # g = dy * x[t - k] rounded to the inputs' half type before the dz and dU dots (LR_G_HALF), as the dynamic-conv1d
    # anchor forms it, and dstatic_w summed in the dz launch (LR_DZ_DS), so that dU needs no 17th rank (R=16 padded
    # to 32); before the tile groups below, which then tune at the winner. Compiled for sm_90a (Triton 3.6,
    # 2026-12-05 session 33), bf16, registers without (with) 64 documents: the dz launch 93, with g in bf16 72
    # (mma.sync instructions 8 -> 4), with dstatic_w 127 / 125 (102 / 106; 20 shuffles and 11 barriers in its loop
    # against none and 6); dU "taps-t" 64x64 184, with g in bf16 168 (wgmma instructions 32 -> 16), without the
    # extra rank 160 / 94 (167 / 128)
    ("low-rank bwd g and dstatic", ["lowrank"], lowrank, ("LR_G_HALF", "LR_DZ_DS"),
     [(False, False), (True, False), (False, True), (True, True)]),
    # the dU kernel's form (LR_DU_FORM): one [BT, WP * BD] tile of g ("wide") or one [BT, BD] tile a tap, plain
    # ("taps") or transposed so that the dot has BD rows ("taps-t": a warpgroup's dot from 64 rows on). Compiled for
    # sm_90a (Triton 3.6, 2026-12-05), registers without documents: wide 32x32 154; taps 32x32 194, 32x64 174;
    # taps-t 32x32 164, 32x64 140 (wgmma), 64x64 184 (177 with documents), 32x128 at 8 warps 128, 64x128 spills
    ("low-rank bwd dU form", ["lowrank"], lowrank,
     ("LR_DU_FORM", "LR_DU_BT", "LR_DU_BD", "LR_DU_WARPS", "LOWRANK_BWD_PROGRAMS"),
     [("taps-t", 64, 64, 4, 1024), ("wide", 32, 32, 4, 1024), ("taps-t", 32, 64, 4, 1024), ("taps-t", 64, 64, 4, 2048),
      ("taps-t", 32, 128, 8, 1024), ("taps-t", 128, 64, 8, 1024)]),
    # pipelining stages of the dU kernel's loop over its chunk's tiles (LR_DU_STAGES): from 2 on every load of the
    # loop goes through cp.async. Compiled for sm_90a (Triton 3.6, 2026-12-05), "taps-t" at 64 x 64: 184 / 183 / 177
    # registers at 1 / 2 / 3 stages, 16 / 52 / 96 KB of shared memory, barriers in the loop 10 / 3 / 3; 32 x 64 at 2
    # or 3 stages 139 registers, 26 / 48 KB
    ("low-rank bwd dU stages", ["lowrank"], lowrank, ("LR_DU_STAGES", "LR_DU_BT"),
     [(1, 64), (2, 64), (3, 64), (2, 32), (3, 32)]),
    # pipelining stages of the dx and dz launches' tap loops (LR_DX_STAGES, LR_DZ_STAGES; cp.async from 2 on):
    # compiled for sm_90a (Triton 3.6, 2026-12-05) dx 114 / 92 / 78 / 80 registers at 1 / 2 / 3 / 4 stages, dz 93 /
    # 94 / 106 / 108
    ("low-rank bwd stages", ["lowrank"], lowrank, ("LR_DX_STAGES", "LR_DZ_STAGES"),
     [(1, 1), (3, 1), (3, 3), (2, 2), (4, 4), (1, 3), (3, 2)]),
    # the next tap's dy loaded by hand before this tap's dot in the dx launch (LR_DX_PREFETCH), at the stages chosen
    # above. Compiled for sm_90a (Triton 3.6, 2026-12-05 session 33), 32x64, registers without documents: 114 ->
    # 140 at 1 stage, 78 -> 110 at 3
    ("low-rank bwd dx prefetch", ["lowrank"], lowrank, ("LR_DX_PREFETCH",), [(False,), (True,)]),
    # the dz-only launch's own tiles (LR_DZ_*; "own"): its dot g @ U^T has BT rows, a warpgroup's from 64 on at 4 warps.
    # Compiled for sm_90a (Triton 3.6, 2026-12-05), registers without documents: 32x64 93 (mma.sync), 64x32 80 and
    # 64x64 119 (wgmma), 64x128 225, 128x64 at 8 warps 122. Last, fewer splits of the channel blocks (the anchor has
    # none: one program a token tile walks them all): 2, or 1, which stores dz itself, with no fp32 partials to sum
    ("low-rank bwd dz tiles", ["lowrank"], lowrank,
     ("LR_DZ_BT", "LR_DZ_BD", "LR_DZ_WARPS", "LR_DZ_SPLITS"),
     [(32, 64, 4, 8), (64, 32, 4, 8), (64, 64, 4, 8), (64, 32, 4, 16), (128, 64, 8, 8), (32, 64, 4, 2),
      (32, 64, 4, 1)]),
]


def _doc_layout(device: torch.device) -> torch.Tensor:
    """N_DOCS documents of random length (seed 0), N_DOCS / B cuts in every row."""
    rng = np.random.default_rng(0)
    offsets = [0]
    for row in range(B):
        cuts = np.sort(rng.choice(np.arange(1, T), size=N_DOCS // B - 1, replace=False))
        offsets += [row * T + int(c) for c in cuts] + [(row + 1) * T]
    return torch.tensor(offsets, dtype=torch.int32, device=device)


class _Case:
    """One kernel at the target shape: raw launchers, public op, custom op and its fp32 reference."""

    def __init__(self, name: str, device: torch.device) -> None:
        gen = torch.Generator(device=device).manual_seed(0)

        def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
            return (scale * torch.randn(*shape, generator=gen, device=device)).to(DTYPE)

        self.name = name
        x, s = randn(B, T, D), randn(W, D, scale=W**-0.5)
        self.dy = randn(B, T, D)
        if name == "static":
            self.args, self.op, self.ref = [x, s], kernels.short_conv, short_conv_ref
            triton_op = short.short_conv_triton
        elif name.startswith("hs"):
            hs = int(name[2:])
            self.args = [x, randn(B, T, D // hs, W, scale=W**-0.5), s]
            self.op, self.ref = kernels.dynamic_conv_headwise, dynamic_conv_headwise_ref
            triton_op = headwise.headwise_triton
        else:
            self.args = [x, randn(B, T, R), randn(R, W * D, scale=(R * W) ** -0.5), s]
            self.op, self.ref = kernels.dynamic_conv_lowrank, dynamic_conv_lowrank_ref
            triton_op = lowrank.lowrank_triton
        self.fwd, self.bwd, self.custom = triton_op.fwd, triton_op.bwd, triton_op.op
        self.cu = _doc_layout(device)
        leaves = [a.float().requires_grad_() for a in self.args]
        y = self.ref(*leaves, cu_seqlens=self.cu, residual=True)
        self.want = [y.detach(), *torch.autograd.grad(y, leaves, self.dy.float())]

    def raw_fwd(self, cu):
        return lambda: self.fwd(*self.args, cu, True)

    def raw_bwd(self, cu):
        return lambda: self.bwd(self.dy, *self.args, cu, True)

    def error(self) -> float:
        got = [self.fwd(*self.args, self.cu, True), *self.bwd(self.dy, *self.args, self.cu, True)]
        return max(rel_rms(a, b) for a, b in zip(got, self.want, strict=True))

    def public(self, cu, backward: bool, custom: bool = False):
        fn = self.custom if custom else self.op
        leaves = [a.detach().clone().requires_grad_(backward) for a in self.args]
        if custom:
            def call():
                return fn(*leaves, cu, True)
        else:
            def call():
                return fn(*leaves, cu_seqlens=cu, residual=True, backend="triton")
        if not backward:
            def run():
                with torch.no_grad():
                    call()
            return run
        return lambda: torch.autograd.grad(call(), leaves, self.dy)




def _time_candidate(cases: dict[str, _Case], names: list[str], backward: bool, values: tuple,
                    rep: int) -> dict[str, tuple[float, float, float]]:
    """case name -> (µs without documents, µs with, error) of the candidate already set on its module."""
    out = {}
    for case_name in names:
        case = cases[case_name]
        make = case.raw_bwd if backward else case.raw_fwd
        try:
            out[case_name] = (us(make(None), rep), us(make(case.cu), rep), case.error())
        except Exception as exc:  # noqa: BLE001 - a candidate that fails to compile is reported, not fatal
            print(f"  {values}: {case_name} FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
            out[case_name] = (math.inf, math.inf, math.inf)
    return out


def _tune(cases: dict[str, _Case], rep: int, rounds: int) -> list[str]:
    settings = []
    for group, names, module, consts, candidates in GROUPS:
        backward = "bwd" in group
        print(f"\n## {group}: {', '.join(consts)}  (raw {'backward' if backward else 'forward'} launcher, µs"
              + (f"; median of {rounds} rounds, candidates interleaved" if rounds > 1 else "") + ")")
        # [round][candidate] -> case -> (plain, docs, err): each round times every candidate once, so a drift of
        # the GPU's clocks over the group reaches every candidate alike
        timed = []
        for _ in range(rounds):
            timed.append([])
            for values in candidates:
                use(module, consts, values)
                timed[-1].append(_time_candidate(cases, names, backward, values, rep))
        results = []
        for i, values in enumerate(candidates):
            cells, score, worst = [], 0.0, 0.0
            for case_name in names:
                runs = [timed[r][i][case_name] for r in range(rounds)]
                plain, docs = (float(np.median([run[j] for run in runs])) for j in (0, 1))
                err = max(run[2] for run in runs)
                spread = "" if rounds == 1 else f" [plain {min(r[0] for r in runs):.1f}-{max(r[0] for r in runs):.1f}]"
                cells.append(f"{case_name} {plain:7.1f} / {docs:7.1f} docs (err {err:.1e}){spread}")
                score += (plain + docs) / 2
                worst = max(worst, err)
            results.append((score, worst, values, "; ".join(cells)))
        settings.append(f"{module.__name__}: {settle(results, RMS_BOUND, module, consts)}")
        # at once, so that a run cut short by a time limit still tells the groups it finished
        print(f"settled {settings[-1]}", flush=True)
    return settings


def _table(cases: dict[str, _Case], rep: int) -> None:
    print("\n## at the best constants (µs; docs = 64 documents)")
    print("| kernel | raw fwd | raw fwd docs | raw bwd | raw bwd docs | op fwd | op fwd docs | op fwd+bwd "
          "| op fwd+bwd docs | custom op fwd | custom op fwd+bwd |")
    print("|---|" + "---|" * 10)
    for name, case in cases.items():
        cells = [
            us(case.raw_fwd(None), rep), us(case.raw_fwd(case.cu), rep),
            us(case.raw_bwd(None), rep), us(case.raw_bwd(case.cu), rep),
            us(case.public(None, False), rep), us(case.public(case.cu, False), rep),
            us(case.public(None, True), rep), us(case.public(case.cu, True), rep),
            us(case.public(None, False, custom=True), rep), us(case.public(None, True, custom=True), rep),
        ]
        print(f"| {name} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rep", type=int, default=100, help="do_bench's rep, ms of timed runs per measurement")
    parser.add_argument("--only", default="", help="comma-separated group names to tune (default: all)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time every candidate of a group this many times, interleaved; report medians")
    parser.add_argument("--warm-up", type=float, default=10.0,
                        help="seconds of the shipped kernels run before the first candidate is timed")
    args = parser.parse_args()
    device = gpu()
    print(f"shape B={B}, T={T}, D={D}, W={W}, R={R}, bf16, residual, static_w; docs: {N_DOCS} documents")
    if args.only:
        wanted = set(args.only.split(","))
        GROUPS[:] = [g for g in GROUPS if g[0] in wanted]
    cases = {name: _Case(name, device) for name in ("static", "hs1", "hs16", "lowrank")}
    warm_up([c.raw_fwd(None) for c in cases.values()] + [c.raw_bwd(None) for c in cases.values()], args.warm_up)
    settings = _tune(cases, args.rep, args.rounds)
    print("\n## constants to set")
    for line in settings:
        print(line)
    _table(cases, args.rep)


if __name__ == "__main__":
    main()
