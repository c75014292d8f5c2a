"""How a stack of the batched engine runs its steps: eager, compiled, as CUDA graphs, or picked per stack.

A speed mode changes no result beyond rounding (docs/engine.md "Speed options"). ``auto`` picks for each stack
from its device: eager on the CPU, ``torch.compile`` on CUDA (for MAD stacks on an H200 it was the fastest mode at
every row length measured, 32 to 1024 tokens). The command-line flags ``--compile`` and ``--cuda-graph`` name the
same modes (``from_flags``).
"""

from __future__ import annotations

import torch

SPEEDS = ("eager", "compile", "cuda-graph", "compile+graph", "auto")
# (compile, cuda_graph) of every mode but auto.
_MODES = {"eager": (False, False), "compile": (True, False), "cuda-graph": (False, True),
          "compile+graph": (True, True)}
# How tables name the modes.
LABELS = {"eager": "eager", "compile": "compiled", "cuda-graph": "CUDA graph", "compile+graph": "compiled + CUDA graph",
          "auto": "auto"}
SPEED_HELP = (f"How stacks run: {', '.join(SPEEDS)} (auto: compile on CUDA, eager on the CPU). Default: eager, or as "
              "--compile/--cuda-graph.")


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


def stack_modes(speed: str, device: torch.device) -> tuple[bool, bool]:
    """(compile, cuda_graph) of a stack on ``device``."""
    if check_speed(speed) != "auto":
        return _MODES[speed]
    return _MODES["compile" if device.type == "cuda" else "eager"]


def mode_name(compile: bool, cuda_graph: bool) -> str:
    """The mode (not auto) that runs stacks so."""
    return next(name for name, modes in _MODES.items() if modes == (compile, cuda_graph))
