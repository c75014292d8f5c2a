"""analysis.stats: the intervals and p-values behind the reports' verdicts, and the seeds-to-decide rules."""

import math

import numpy as np
import pytest
from mixlab.analysis import stats

SAMPLES = {
    "three": [0.1, 0.3, 0.2],
    "five": [0.93, 0.94, 0.95, 0.92, 0.96],
    "twelve_with_ties": [0.5, 0.5, 0.7, 0.1, 0.9, 0.3, 0.3, 0.8, 0.2, 0.6, 0.4, 0.5],
    "twenty_normal": list(np.random.default_rng(7).normal(0.02, 0.01, 20)),
}


# The intervals the lab's own percentile bootstrap gave before it called scipy (the figures of the committed reports
# and CLAIMS.md were made with them): scipy's, drawn from the same seeded Generator, must give them again.
BOOTSTRAP_INTERVALS = {
    "three": (0.1, 0.3),
    "five": (0.92, 0.96),
    "twelve_with_ties": (0.3, 0.65),
    "twenty_normal": (0.012444666307113928, 0.020827789257976688),
}


@pytest.mark.parametrize("name", SAMPLES.keys())
def test_bootstrap_median_gives_the_reports_intervals(name):
    ours = stats.bootstrap_median(SAMPLES[name])
    assert (ours.low, ours.high) == pytest.approx(BOOTSTRAP_INTERVALS[name], abs=1e-12)


def test_bootstrap_median_of_one_value_is_that_value():
    assert stats.bootstrap_median([0.25]) == stats.Interval(0.25, 0.25)


def test_bootstrap_median_of_five_or_fewer_is_their_range_and_repeats_exactly():
    values = [0.4, 0.1, 0.3, 0.2, 0.5]
    assert stats.bootstrap_median(values) == stats.Interval(0.1, 0.5)
    assert stats.bootstrap_median(values) == stats.bootstrap_median(values)  # seeded: the same every time
    wide = list(range(30))
    assert 0 < stats.bootstrap_median(wide).low < stats.bootstrap_median(wide).high < 29


@pytest.mark.parametrize("values, value, above, p", [
    ([1, 2, 3], 0, True, 1 / 8),                       # all three above
    ([1, 2, 3, 4, 5], 0, True, 1 / 32),
    ([0.1, -0.2, 0.3, 0.4, 0.0], 0, True, 5 / 16),     # the tie dropped: 3 of 4 above
    ([0.1, -0.2, 0.3, 0.4, 0.0], 0, False, 15 / 16),   # 1 of 4 below
    ([0.2, 0.3, 0.1, 0.6, 0.9, 0.8, 0.7], 0.5, False, 99 / 128),  # 3 of 7 below
], ids=["three_above", "five_above", "tie_dropped_above", "tie_dropped_below", "seven_below"])
def test_sign_test_is_the_binomial_tail(values, value, above, p):
    assert stats.sign_test(values, value, above) == pytest.approx(p, rel=1e-12)


def test_sign_test_of_values_all_on_the_claims_value_is_one():
    assert stats.sign_test([0.5, 0.5], 0.5, above=True) == 1.0


# Wilson score intervals, from the closed form (centre and half-width at z = 1.96)
WILSON = {(0, 3): (0.0, 0.5614970317550455), (3, 3): (0.43850296824495455, 1.0),
          (1, 3): (0.06149194472039615, 0.7923403991979523), (2, 5): (0.11762077423264783, 0.769275718723987),
          (7, 20): (0.18119182410108206, 0.5671457233147638), (0, 1): (0.0, 0.7934506856227626)}


@pytest.mark.parametrize("k, n", WILSON.keys(), ids=["none_of_3", "all_of_3", "one_of_3", "two_of_5", "seven_of_20",
                                                     "none_of_1"])
def test_wilson_interval(k, n):
    ours = stats.wilson(k, n)
    assert (ours.low, ours.high) == pytest.approx(WILSON[k, n], abs=1e-12)


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
