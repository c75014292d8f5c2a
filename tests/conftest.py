"""Process-wide test setup that must happen before any test module imports ``kernels``."""

import os

import pytest
import torch

# Triton decides between compiling and interpreting when a kernel is decorated, that is when `kernels` is first
# imported, so TRITON_INTERPRET must be set before any test module imports it. On a machine without CUDA the
# Triton backend then runs in the interpreter (kernel tests at small shapes).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    """A test parametrised over a mixer whose optional dependency is missing (the fla-core baselines without
    fla-core) skips, saying what to install, instead of failing."""
    from mixlab.models import MIXERS

    missing = {name for name, cls in MIXERS.items() if not cls.available()}
    if not missing:
        return
    skip = pytest.mark.skip(reason="the fla-core baselines need pip install 'mixlab[baselines]'")
    for item in items:
        params = getattr(item, "callspec", None)
        if params and any(isinstance(v, str) and v in missing for v in params.params.values()):
            item.add_marker(skip)


@pytest.fixture
def one_torch_thread():
    """Torch on one thread for the test, restored after: tiny CPU runs gain nothing from threads, and on a loaded
    2-core machine two threads per run are many times slower than one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
