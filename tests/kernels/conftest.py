"""The kernel tests' one tolerance rule: relative RMS error against a float64 reference.

The reference is computed in float64 from the very same (already rounded) inputs, so the bound only covers the
op's own arithmetic and the rounding of its result to the input dtype.
"""

import pytest
import torch

# Relative RMS error allowed for a result whose inputs have this dtype.
RMS_BOUND = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,
    torch.float16: 2e-3,  # 11-bit mantissa: result rounding alone is ~3e-4
    torch.bfloat16: 1e-2,  # 8-bit mantissa: result rounding alone is ~2e-3
}


def rel_rms_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """sqrt(mean((actual - expected)^2)) / sqrt(mean(expected^2)), in float64; inf on a non-finite actual."""
    actual, expected = actual.double(), expected.double()
    if not torch.isfinite(actual).all():
        return float("inf")
    scale = expected.pow(2).mean().sqrt().item()
    err = (actual - expected).pow(2).mean().sqrt().item()
    if scale == 0.0:
        return 0.0 if err == 0.0 else float("inf")
    return err / scale


@pytest.fixture
def assert_rel_rms():
    """Returns check(actual, expected, dtype, name): shapes equal, error within RMS_BOUND[dtype]."""

    def check(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, name: str) -> None:
        assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
        err, bound = rel_rms_error(actual, expected), RMS_BOUND[dtype]
        assert err <= bound, f"{name}: relative RMS error {err:.3g} > {bound:g} ({dtype})"

    return check
