"""How a stack of the batched engine runs its steps: eager, compiled, as CUDA graphs, or picked per stack.

A speed mode changes no result beyond rounding (docs/engine.md "Speed options"). ``auto`` picks for each stack
from its device and its row length: eager on the CPU; on CUDA ``torch.compile`` for rows of at most
``COMPILE_MAX_ROW`` tokens and CUDA graphs for longer rows, where compiled stacks were slower than graphed eager
ones on an H200. The command-line flags ``--compile`` and ``--cuda-graph`` name the same modes (``from_flags``).
"""

from __future__ import annotations

import torch

SPEEDS = ("eager", "compile", "cuda-graph", "compile+graph", "auto")
# Longest row (tokens) that ``auto`` compiles on CUDA; longer rows run as CUDA graphs. From the H200 (2026-12-01,
# BENCHMARKS.md): 18 stacked MAD runs at T=127 trained 28.4M tokens/s compiled against 9.8M as CUDA graphs, while at
# T=256 and 512 compiled stacks trained 6.4-6.6M and 4.2M against 7.9-9.9M and 9.3M as CUDA graphs.
COMPILE_MAX_ROW = 128
# (compile, cuda_graph) of every mode but auto.
_MODES = {"eager": (False, False), "compile": (True, False), "cuda-graph": (False, True),
          "compile+graph": (True, True)}
# How tables name the modes.
LABELS = {"eager": "eager", "compile": "compiled", "cuda-graph": "CUDA graph", "compile+graph": "compiled + CUDA graph",
          "auto": "auto"}
SPEED_HELP = (f"How stacks run: {', '.join(SPEEDS)} (auto: compile for rows of at most {COMPILE_MAX_ROW} tokens and "
              "CUDA graphs for longer ones on CUDA, eager on the CPU). Default: eager, or as --compile/--cuda-graph.")


def check_speed(speed: str) -> str:
    """``speed`` when it names a mode; else ValueError naming it."""
    if speed not in SPEEDS:
        raise ValueError(f"unknown speed {speed!r}; choose from {', '.join(SPEEDS)}")
    return speed


def from_flags(speed: str | None, compile: bool = False, cuda_graph: bool = False) -> str:
    """The mode of a command line: ``speed`` when given (flags that say otherwise raise ValueError), else the
    one the flags name (``--compile --cuda-graph``: compile+graph; neither: eager)."""
    flagged = mode_name(compile, cuda_graph)
    if speed is None:
        return flagged
    if (compile or cuda_graph) and check_speed(speed) != flagged:
        raise ValueError(f"--speed {speed} contradicts --compile/--cuda-graph (they name {flagged})")
    return check_speed(speed)


def stack_modes(speed: str, device: torch.device, row_tokens: int) -> tuple[bool, bool]:
    """(compile, cuda_graph) of a stack on ``device`` whose rows hold ``row_tokens`` tokens."""
    if check_speed(speed) != "auto":
        return _MODES[speed]
    if device.type != "cuda":
        return _MODES["eager"]
    return _MODES["compile" if row_tokens <= COMPILE_MAX_ROW else "cuda-graph"]


def mode_name(compile: bool, cuda_graph: bool) -> str:
    """The mode (not auto) that runs stacks so."""
    return next(name for name, modes in _MODES.items() if modes == (compile, cuda_graph))
