"""What the kernel tests share: the one tolerance rule (relative RMS error against a float64 reference) and
packed layouts from document lengths.

The reference is computed in float64 from the very same (already rounded) inputs, so a bound only covers the op's
own arithmetic and the rounding of its result to the input dtype.
"""

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
    actual, expected = actual.double().cpu(), expected.double().cpu()
    if not torch.isfinite(actual).all():
        return float("inf")
    scale = expected.pow(2).mean().sqrt().item()
    err = (actual - expected).pow(2).mean().sqrt().item()
    if scale == 0.0:
        return 0.0 if err == 0.0 else float("inf")
    return err / scale


def assert_close(actual: torch.Tensor, expected: torch.Tensor, bound: torch.dtype | float, name: str) -> None:
    """Shapes equal and relative RMS error within ``bound``: a float, or a dtype looked up in RMS_BOUND."""
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    limit = RMS_BOUND[bound] if isinstance(bound, torch.dtype) else bound
    err = rel_rms_error(actual, expected)
    assert err <= limit, f"{name}: relative RMS error {err:.3g} > {limit:g} ({bound})"


def cu_from_rows(rows: list[list[int]] | None, T: int, device: torch.device | str = "cpu") -> torch.Tensor | None:
    """Document lengths per row (0 = an empty document) -> int32 cu_seqlens; None stays None."""
    if rows is None:
        return None
    offsets = [0]
    for row in rows:
        assert sum(row) == T, f"row {row} does not sum to T={T}"
        for length in row:
            offsets.append(offsets[-1] + length)
    return torch.tensor(offsets, dtype=torch.int32, device=device)


def assert_stacked_runs_equal_alone(fn, stacked: list[torch.Tensor], upstream: torch.Tensor, *shared) -> None:
    """``fn`` under ``torch.func.vmap`` over inputs stacked on a leading run axis (``shared`` arguments the same
    for every run), as the engine stacks runs: each run's output, and the gradients of its inputs under the random
    ``upstream`` [N, ...], equal ``fn`` on that run alone, bit for bit."""
    leaves = [t.clone().requires_grad_() for t in stacked]
    y = torch.func.vmap(fn, in_dims=(0,) * len(stacked) + (None,) * len(shared))(*leaves, *shared)
    grads = torch.autograd.grad(y, leaves, upstream)
    for n in range(upstream.shape[0]):
        alone = [t[n].clone().requires_grad_() for t in stacked]
        y_n = fn(*alone, *shared)
        assert torch.equal(y[n], y_n), f"run {n}: the output differs from the run alone"
        for i, (stacked_grad, grad) in enumerate(zip(grads, torch.autograd.grad(y_n, alone, upstream[n]),
                                                     strict=True)):
            assert torch.equal(stacked_grad[n], grad), f"run {n}: the gradient of input {i} differs"
