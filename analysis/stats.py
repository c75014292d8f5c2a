"""Statistics over seeds for the claims' verdicts (``analysis.claims``; docs/claims.md says how they are read).

- ``bootstrap_median``: the percentile bootstrap interval of a median, from a fixed seeded numpy Generator, so a
  report is the same every time it is made (``scipy.stats.bootstrap(..., method="percentile")`` with the same
  Generator draws the same resamples). For n <= 5 values it is the values' range (the median of a resample
  takes the smallest value with probability above 2.5%), which holds the true median with probability
  1 - 2 * 0.5**n only (75% at 3 seeds, 94% at 5): ``sign_test`` says how much such a handful can show.
- ``sign_test``: the exact one-sided sign test of "the median is above (or below) a value" (values equal to
  it dropped), as ``scipy.stats.binomtest(k, n, 0.5)``.
- ``wilson``: the Wilson score interval of a proportion (k successes of n), as
  ``scipy.stats.binomtest(k, n).proportion_ci(method="wilson")``.
- ``seeds_for_median`` / ``seeds_for_fraction``: how many seeds would likely move an interval clear of the
  values that decide a claim, if the effect and the spread measured so far held.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

CONFIDENCE = 0.95
Z = 1.959963984540054  # the standard normal's 97.5% quantile: a two-sided 95% interval
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
    replacement (indices from ``np.random.default_rng(seed)``, drawn as one [resamples, n] array), the median
    of each, then their 2.5% and 97.5% percentiles (numpy's linear interpolation)."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        raise ValueError("bootstrap_median needs at least one value")
    index = np.random.default_rng(seed).integers(0, data.size, (resamples, data.size))
    medians = np.median(data[index], axis=-1)  # [resamples]
    tail = (1 - CONFIDENCE) / 2
    low, high = np.percentile(medians, [100 * tail, 100 * (1 - tail)])
    return Interval(float(low), float(high))


def sign_test(values: Sequence[float], value: float, above: bool) -> float:
    """Exact one-sided p-value of the sign test that the median of ``values`` lies above ``value`` (``above``)
    or below it: the chance of at least as many values on that side among those not equal to ``value``, each
    side equally likely. 1.0 when every value equals ``value``."""
    data = np.asarray(values, dtype=np.float64)
    wins = int(np.sum(data > value) if above else np.sum(data < value))
    n = int(np.sum(data != value))
    return float(sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n) if n else 1.0


def wilson(successes: int, n: int) -> Interval:
    """The 95% Wilson score interval of the proportion ``successes / n``."""
    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(f"wilson needs 0 <= successes <= n and n > 0, got {successes} of {n}")
    share = successes / n
    centre = (share + Z**2 / (2 * n)) / (1 + Z**2 / n)
    half = Z / (1 + Z**2 / n) * math.sqrt(share * (1 - share) / n + Z**2 / (4 * n**2))
    return Interval(max(0.0, centre - half), min(1.0, centre + half))


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
