"""The kernel tests' tolerance fixture (the rule itself lives in kernel_checks.py)."""

import pytest
from kernel_checks import assert_close


@pytest.fixture
def assert_rel_rms():
    """Returns check(actual, expected, dtype, name): shapes equal, error within RMS_BOUND[dtype]."""
    return assert_close
