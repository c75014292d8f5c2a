"""How a stack of the batched engine runs its steps: eager, compiled, as CUDA graphs, or picked per stack.

A speed mode changes no result beyond rounding (docs/engine.md "Speed options"). ``auto`` picks for each stack
from its device and row length: eager on the CPU; on CUDA ``torch.compile``, with the compiled step also captured
as a CUDA graph for rows of at most ``GRAPH_MAX_ROW`` tokens, whose steps are too short to hide their launches;
eager for models with a mixer that says compiling does not help it (``Mixer.auto_compiles``: the fla baselines).
The command-line flags ``--compile`` and ``--cuda-graph`` name the same modes (``from_flags``).
"""

from __future__ import annotations

import torch

SPEEDS = ("eager", "compile", "cuda-graph", "compile+graph", "auto")
# Longest row (tokens) whose stacks ``auto`` compiles and captures on CUDA; longer rows are compiled only. From an
# H200 (BENCHMARKS.md), 18 stacked MAD runs, train tokens/s compiled against compiled + CUDA graph:
# transformer compression T=32 9.5M against 16.1M; in-context recall T=127 transformer 28.4M against 25.6M,
# static_conv_qkv 24.0M against 21.9M, dynamic_conv_qkv 18.6M against 16.9M. 64-token rows were not measured.
GRAPH_MAX_ROW = 32
# (compile, cuda_graph) of every mode but auto.
MODES = {"eager": (False, False), "compile": (True, False), "cuda-graph": (False, True),
         "compile+graph": (True, True)}
# How tables name the modes.
LABELS = {"eager": "eager", "compile": "compiled", "cuda-graph": "CUDA graph", "compile+graph": "compiled + CUDA graph",
          "auto": "auto"}
SPEED_HELP = (f"How stacks run: {', '.join(SPEEDS)} (auto: on CUDA compile, and capture rows of at most "
              f"{GRAPH_MAX_ROW} tokens as CUDA graphs too; eager on the CPU and for the fla baselines). Default: "
              "eager, or as --compile/--cuda-graph.")


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


def stack_modes(speed: str, device: torch.device, row_tokens: int, compiles: bool = True) -> tuple[bool, bool]:
    """(compile, cuda_graph) of a stack on ``device`` whose rows hold ``row_tokens`` tokens; ``compiles`` False:
    a model auto leaves eager (``runners.train.engine.auto_compiles``)."""
    if check_speed(speed) != "auto":
        return MODES[speed]
    if device.type != "cuda" or not compiles:
        return MODES["eager"]
    return MODES["compile+graph" if row_tokens <= GRAPH_MAX_ROW else "compile"]


def mode_name(compile: bool, cuda_graph: bool) -> str:
    """The mode (not auto) that runs stacks so."""
    return next(name for name, modes in MODES.items() if modes == (compile, cuda_graph))
