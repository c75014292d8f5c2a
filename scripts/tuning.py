"""What the kernel tuning scripts (``tune_*_gpu.py``) share: timing one candidate, and settling a group of
constants on its best candidate (coordinate descent: each group tuned at the best values of the groups before).
"""

import ast
import math
import time

import torch
import triton
from mixlab.kernels import triton_utils as tu
from mixlab.runners.bench.utils import median_time_ms


def gpu() -> torch.device:
    """The CUDA device, after printing its name and the versions; exits when there is none, or when the kernels
    poison their outputs (``kernels.triton_utils.POISON_OUTPUTS``: extra fills would be timed)."""
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    if tu.POISON_OUTPUTS:
        raise SystemExit("kernels.triton_utils.POISON_OUTPUTS must be False when timing")
    device = torch.device("cuda")
    print(f"# {torch.cuda.get_device_name(device)}; torch {torch.__version__}, Triton {triton.__version__}")
    return device


def warm_up(calls: list, seconds: float) -> None:
    """Run ``calls`` round-robin for about ``seconds`` before anything is timed (compiling each on its first call):
    on the H200 (2026-12-04) the first candidates a fresh process timed varied up to 2x between two interleaved
    rounds (1.5-1.9x) while later ones repeated within 16%, as if the GPU had not reached its working clocks yet."""
    for fn in calls:  # compile first: a compile leaves the GPU idle
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for fn in calls:
            fn()
        torch.cuda.synchronize()


def us(fn, rep: int) -> float:
    """Median microseconds of fn on the GPU (do_bench, rep ms of timed calls)."""
    return 1e3 * median_time_ms(fn, rep, torch.device("cuda"))


def use(module, consts: tuple[str, ...], values: tuple) -> None:
    """Set the constants ``consts`` of ``module`` to ``values`` (one candidate)."""
    for name, value in zip(consts, values, strict=True):
        setattr(module, name, value)


def settle(results: list[tuple[float, float, tuple, str]], bound: float, module, consts: tuple[str, ...]) -> str:
    """Print each candidate's (score, worst error, values, line) of a group, marking those whose error passes
    ``bound`` WRONG and the lowest score of the others ``*``; set the best values on ``module``; return them as
    "NAME = value, ..."."""
    scored = [(score if err <= bound else math.inf, values, line + ("" if err <= bound else "  WRONG"))
              for score, err, values, line in results]
    best = min(scored, key=lambda r: r[0])
    for _score, values, line in scored:
        print(f"{'*' if values == best[1] else ' '} {values}: {line}")
    use(module, consts, best[1])
    return ", ".join(f"{n} = {v}" for n, v in zip(consts, best[1], strict=True))


def set_constants(assignments: list[str], modules: dict) -> str | None:
    """Apply ``MODULE.CONSTANT=VALUE`` assignments (VALUE a Python literal) to ``modules`` (name -> module): a
    setting to check or compile before it ships. Returns the first bad assignment's error, else None."""
    for assignment in assignments:
        name, _, value = assignment.partition("=")
        module, _, constant = name.partition(".")
        if module not in modules or not hasattr(modules[module], constant):
            return f"unknown constant {name!r}; modules: {', '.join(modules)}"
        try:
            setattr(modules[module], constant, ast.literal_eval(value))
        except (ValueError, SyntaxError):
            return f"{name}: {value!r} is not a Python literal"
    return None
