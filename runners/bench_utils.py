"""What every benchmark shares: median timing and the error measure of its correctness gate."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch


def median_time_ms(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Median time of fn in ms: do_bench on CUDA (``repeats`` is its rep, in ms), wall clock of 3 calls on a CPU."""
    if device.type == "cuda":
        import triton  # only a CUDA machine times with do_bench; Triton is optional elsewhere

        return triton.testing.do_bench(fn, warmup=25, rep=repeats, return_mode="median")
    fn()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def rel_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Relative RMS error in float64; inf when ``actual`` is not finite."""
    actual, expected = actual.double(), expected.double()
    if not torch.isfinite(actual).all():
        return math.inf
    scale = expected.pow(2).mean().sqrt().item()
    err = (actual - expected).pow(2).mean().sqrt().item()
    if scale == 0.0:
        return 0.0 if err == 0.0 else math.inf
    return err / scale
