"""Process-wide test setup that must happen before any test module imports ``kernels``."""

import os

import torch

# Triton decides between compiling and interpreting when a kernel is decorated, that is when `kernels` is first
# imported, so TRITON_INTERPRET must be set before any test module imports it. On a machine without CUDA the
# Triton backend then runs in the interpreter (kernel tests at small shapes).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
