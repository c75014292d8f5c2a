"""The kernel tests' fixtures: the tolerance rule (its code lives in kernel_checks.py) and poisoned outputs."""

import pytest
from kernel_checks import assert_close
from mixlab.kernels import triton_utils as tu


@pytest.fixture
def assert_rel_rms():
    """Returns check(actual, expected, dtype, name): shapes equal, error within RMS_BOUND[dtype]."""
    return assert_close


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Every launcher buffer (outputs and fp32 partials) starts full of NaN: an unwritten element fails."""
    monkeypatch.setattr(tu, "POISON_OUTPUTS", True)
