"""Statistics over seeds for the claims' verdicts (``analysis.claims``; docs/claims.md says how they are read).

- ``bootstrap_median``: the percentile bootstrap interval of a median (``scipy.stats.bootstrap``), its resamples
  drawn from a fixed seeded numpy Generator, so a report is the same every time it is made. For n <= 5 values it
  is the values' range (the median of a resample takes the smallest value with probability above 2.5%), which
  holds the true median with probability 1 - 2 * 0.5**n only (75% at 3 seeds, 94% at 5): ``sign_test`` says how
  much such a handful can show.
- ``sign_test``: the exact one-sided sign test of "the median is above (or below) a value" (values equal to
  it dropped): ``scipy.stats.binomtest(k, n, 0.5)``.
- ``wilson``: the Wilson score interval of a proportion (k successes of n):
  ``scipy.stats.binomtest(k, n).proportion_ci(method="wilson")``.
- ``seeds_for_median`` / ``seeds_for_fraction``: how many seeds would likely move an interval clear of the
  values that decide a claim, if the effect and the spread measured so far held.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
MAX_SEEDS = 1000  # seeds_for_fraction looks no further


@dataclasses.dataclass(frozen=True)
class Interval:
    """A two-sided interval [low, high]."""

    low: float
    high: float

    def text(self) -> str:
        return f"[{self.low:.3f}, {self.high:.3f}]"


def bootstrap_median(values: Sequence[float], *, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED
                     ) -> Interval:
    """The 95% percentile bootstrap interval of the median of ``values``: ``resamples`` draws of n values with
    replacement from ``np.random.default_rng(seed)`` (one [resamples, n] batch), the median of each, then their
    2.5% and 97.5% percentiles. One value is its own interval (no resample differs from it)."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        raise ValueError("bootstrap_median needs at least one value")
    if data.size == 1:
        return Interval(float(data[0]), float(data[0]))
    result = stats.bootstrap((data,), np.median, n_resamples=resamples, confidence_level=CONFIDENCE,
                             method="percentile", rng=np.random.default_rng(seed))
    return Interval(float(result.confidence_interval.low), float(result.confidence_interval.high))


def sign_test(values: Sequence[float], value: float, above: bool) -> float:
    """Exact one-sided p-value of the sign test that the median of ``values`` lies above ``value`` (``above``)
    or below it: the chance of at least as many values on that side among those not equal to ``value``, each
    side equally likely. 1.0 when every value equals ``value``."""
    data = np.asarray(values, dtype=np.float64)
    wins = int(np.sum(data > value) if above else np.sum(data < value))
    n = int(np.sum(data != value))
    return float(stats.binomtest(wins, n, 0.5, alternative="greater").pvalue) if n else 1.0


def wilson(successes: int, n: int) -> Interval:
    """The 95% Wilson score interval of the proportion ``successes / n``."""
    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(f"wilson needs 0 <= successes <= n and n > 0, got {successes} of {n}")
    interval = stats.binomtest(successes, n).proportion_ci(confidence_level=CONFIDENCE, method="wilson")
    return Interval(float(interval.low), float(interval.high))


def seeds_for_median(n: int, effect: float, interval: Interval, bounds: Sequence[float]) -> int | None:
    """Seeds that would likely put the interval clear of every value of ``bounds`` (the claim's value, or the
    edges of its tolerance band that the effect must clear): an interval's half-width shrinks as 1/sqrt(n),
    so with the current half-width h toward a bound at distance g, n' = n (h / g)^2 seeds bring it there; the
    largest such n' over ``bounds``, at least n + 1. None when the effect sits on a bound (no number of seeds
    decides it)."""
    needed = n + 1
    for bound in bounds:
        gap = abs(effect - bound)
        if gap == 0:
            return None
        half = effect - interval.low if bound < effect else interval.high - effect
        needed = max(needed, math.floor(n * (half / gap) ** 2) + 1)
    return needed


def seeds_for_fraction(successes: int, n: int, decided: Callable[[Interval], bool]) -> int | None:
    """The fewest seeds n' > n at which the same solve fraction (round(fraction * n') of n') has a Wilson
    interval that ``decided`` accepts; None if none up to MAX_SEEDS does."""
    share = successes / n
    for more in range(n + 1, MAX_SEEDS + 1):
        if decided(wilson(round(share * more), more)):
            return more
    return None
