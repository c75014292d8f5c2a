"""analysis.stats against scipy's implementations of the same statistics, and the seeds-to-decide rules."""

import math

import numpy as np
import pytest
from mixlab.analysis import stats
from scipy import stats as sps

SAMPLES = {
    "three": [0.1, 0.3, 0.2],
    "five": [0.93, 0.94, 0.95, 0.92, 0.96],
    "twelve_with_ties": [0.5, 0.5, 0.7, 0.1, 0.9, 0.3, 0.3, 0.8, 0.2, 0.6, 0.4, 0.5],
    "twenty_normal": list(np.random.default_rng(7).normal(0.02, 0.01, 20)),
}


@pytest.mark.parametrize("values", SAMPLES.values(), ids=SAMPLES.keys())
def test_bootstrap_median_equals_scipys_percentile_bootstrap_with_the_same_generator(values):
    ours = stats.bootstrap_median(values)
    theirs = sps.bootstrap((np.asarray(values),), np.median, method="percentile", n_resamples=stats.RESAMPLES,
                           confidence_level=stats.CONFIDENCE, rng=np.random.default_rng(stats.BOOTSTRAP_SEED),
                           vectorized=True, axis=-1).confidence_interval
    assert (ours.low, ours.high) == pytest.approx((theirs.low, theirs.high), abs=1e-12)


def test_bootstrap_median_of_five_or_fewer_is_their_range_and_repeats_exactly():
    values = [0.4, 0.1, 0.3, 0.2, 0.5]
    assert stats.bootstrap_median(values) == stats.Interval(0.1, 0.5)
    assert stats.bootstrap_median(values) == stats.bootstrap_median(values)  # seeded: the same every time
    wide = list(range(30))
    assert 0 < stats.bootstrap_median(wide).low < stats.bootstrap_median(wide).high < 29


@pytest.mark.parametrize("values, value, above", [
    ([1, 2, 3], 0, True),           # all above: 1/8
    ([1, 2, 3, 4, 5], 0, True),     # 1/32
    ([0.1, -0.2, 0.3, 0.4, 0.0], 0, True),  # a tie dropped: 3 of 4 above
    ([0.1, -0.2, 0.3, 0.4, 0.0], 0, False),
    ([0.2, 0.3, 0.1, 0.6, 0.9, 0.8, 0.7], 0.5, False),
], ids=["three_above", "five_above", "tie_dropped_above", "tie_dropped_below", "seven_below"])
def test_sign_test_equals_scipys_binomtest(values, value, above):
    data = np.asarray(values, dtype=float)
    wins = int(np.sum(data > value) if above else np.sum(data < value))
    n = int(np.sum(data != value))
    assert stats.sign_test(values, value, above) == pytest.approx(sps.binomtest(wins, n, 0.5, "greater").pvalue)


def test_sign_test_of_values_all_on_the_claims_value_is_one():
    assert stats.sign_test([0.5, 0.5], 0.5, above=True) == 1.0


@pytest.mark.parametrize("k, n", [(0, 3), (3, 3), (1, 3), (2, 5), (7, 20), (0, 1)],
                         ids=["none_of_3", "all_of_3", "one_of_3", "two_of_5", "seven_of_20", "none_of_1"])
def test_wilson_equals_scipys(k, n):
    theirs = sps.binomtest(k, n).proportion_ci(confidence_level=stats.CONFIDENCE, method="wilson")
    ours = stats.wilson(k, n)
    assert (ours.low, ours.high) == pytest.approx((theirs.low, theirs.high), abs=1e-12)


def test_wilson_refuses_counts_that_are_no_proportion():
    with pytest.raises(ValueError, match="4 of 3"):
        stats.wilson(4, 3)


def test_seeds_for_median_shrinks_the_half_width_as_one_over_sqrt_n():
    # effect 0.02, interval reaching down to -0.01: half-width 0.03 toward the bound 0 at distance 0.02,
    # so n' > 3 * (0.03 / 0.02)^2 = 6.75
    assert stats.seeds_for_median(3, 0.02, stats.Interval(-0.01, 0.03), [0.0]) == 7
    assert stats.seeds_for_median(3, 0.02, stats.Interval(0.0199, 0.0201), [0.0]) == 4  # at least n + 1
    assert stats.seeds_for_median(3, 0.0, stats.Interval(-0.01, 0.01), [0.0]) is None  # on the bound
    # two bounds (a tolerance band around the effect): the farther-reaching side decides
    assert stats.seeds_for_median(4, 0.1, stats.Interval(0.05, 0.2), [0.05, 0.15]) == math.floor(4 * 4) + 1


def test_seeds_for_fraction_finds_the_first_decisive_count():
    # 0 of 3 solved: Wilson's upper end z^2 / (n + z^2) falls below 0.5 once n > z^2 = 3.84
    assert stats.seeds_for_fraction(0, 3, lambda iv: iv.high < 0.5) == 4
    assert stats.seeds_for_fraction(1, 2, lambda iv: iv.high < 0.5) is None  # a fraction of 1/2 never does
