"""Triton when it is installed, else a stand-in so that the kernel modules still import.

pyproject installs Triton on Linux only: on a laptop without it the plain-torch references must keep working.
The stand-in turns ``@triton.jit`` (and any other decorator or attribute of ``triton`` / ``tl``) into a no-op,
so the kernel functions exist but are never launched: no op registers a Triton backend (``HAS_TRITON`` is False)
and ``backend="triton"`` raises a clear error (``kernels.triton_utils.use_triton``).
"""

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False

    class _Missing:
        """Every attribute is itself; called on a single function (a decorator) it returns that function."""

        def __getattr__(self, name: str) -> "_Missing":
            return self

        def __call__(self, *args, **kwargs):
            if len(args) == 1 and callable(args[0]) and not kwargs:
                return args[0]
            return self

    triton = tl = _Missing()

__all__ = ["HAS_TRITON", "tl", "triton"]
