"""What the kernel tests share: the one tolerance rule (relative RMS error against a float64 reference), packed
layouts from document lengths, and forward+backward runs of an op, through its public function (autograd) or
through its Triton launchers with explicit launch settings.

The reference is computed in float64 from the very same (already rounded) inputs, so a bound only covers the op's
own arithmetic and the rounding of its result to the input dtype.
"""

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

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


def randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """float64 normal samples of ``gen`` (a CPU generator, so a seed gives the same values on every device), on
    DEVICE."""
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(DEVICE)


def fwd_bwd(op, inputs: dict, upstream: torch.Tensor, backend: str, **kwargs) -> tuple[torch.Tensor, dict]:
    """Leaves from inputs (None entries passed as None), op forward, gradients of every leaf -> (y, grads)."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in inputs.items() if v is not None}
    args = {k: leaves.get(k) for k in inputs}
    y = op(**args, **kwargs, backend=backend)
    grads = torch.autograd.grad(y, list(leaves.values()), upstream.to(y.dtype))
    return y, dict(zip(leaves, grads, strict=True))


def launch_fwd_bwd(triton_op, inputs: dict, upstream: torch.Tensor, cu_seqlens=None, residual: bool = False,
                   fwd: dict | None = None, bwd: dict | None = None) -> tuple[torch.Tensor, dict]:
    """(y, grads) as ``fwd_bwd``'s, through a ``TritonOp``'s launchers (``triton_op.fwd`` and ``.bwd``) called with
    the keyword arguments ``fwd`` and ``bwd`` (launch settings; none: the table's)."""
    args = list(inputs.values())
    y = triton_op.fwd(*args, cu_seqlens, residual, **(fwd or {}))
    grads = triton_op.bwd(upstream.to(y.dtype), *args, cu_seqlens, residual, **(bwd or {}))
    return y, {name: g for (name, v), g in zip(inputs.items(), grads, strict=True) if v is not None}


def assert_matches_reference(op, inputs: dict, upstream: torch.Tensor, y: torch.Tensor, grads: dict,
                             bound: torch.dtype, **kwargs) -> None:
    """A Triton run's (y, grads) of ``op`` (a public op) at inputs and upstream against its float64 reference: the
    dtypes of the output and of every gradient, and each one's error within ``bound``."""
    assert y.dtype == inputs["x"].dtype
    as64 = {k: None if v is None else v.double() for k, v in inputs.items()}
    y_ref, grads_ref = fwd_bwd(op, as64, upstream.double(), "torch", **kwargs)
    assert_close(y, y_ref, bound, "y")
    assert grads.keys() == grads_ref.keys()
    for name, grad in grads.items():
        assert grad.dtype == inputs[name].dtype, f"d{name} is {grad.dtype}"
        assert_close(grad, grads_ref[name], bound, f"d{name}")
