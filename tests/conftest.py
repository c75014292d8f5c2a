"""Process-wide test setup that must happen before any test module imports ``kernels``."""

import importlib.metadata
import os
import signal

import pytest
import torch

# Triton decides between compiling and interpreting when a kernel is decorated, that is when `kernels` is first
# imported, so TRITON_INTERPRET must be set before any test module imports it. On a machine without CUDA the
# Triton backend then runs in the interpreter (kernel tests at small shapes).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# A shell without job control starts background commands with SIGINT ignored, and Python keeps an ignored
# SIGINT ignored: the tests that stop a sweep or a stack with SIGINT (and the sweeps they start in child
# processes, which inherit the disposition) would then run to the end. Ctrl-C is restored here, so they test
# the code and not how the suite was started.
signal.signal(signal.SIGINT, signal.default_int_handler)

EXAMPLE_PLUGIN = "mixlab-maxpool"


def example_plugin_installed() -> bool:
    try:
        importlib.metadata.distribution(EXAMPLE_PLUGIN)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def pytest_configure(config):
    config.addinivalue_line("markers", "example_plugin: needs the example plugin examples/mixlab-maxpool "
                                       "installed; skipped with the install command otherwise")
    config.addinivalue_line("markers", "slow: takes over 20 s on a CPU (still runs in CI)")


def pytest_runtest_setup(item):
    """Tests marked ``example_plugin`` skip, naming the install command, where the example is not installed (the
    README's test command installs it); tests marked ``gpu`` skip without a CUDA device."""
    if item.get_closest_marker("example_plugin") and not example_plugin_installed():
        pytest.skip(f"example plugin {EXAMPLE_PLUGIN} not installed: pip install -e examples/mixlab-maxpool")
    if item.get_closest_marker("gpu") and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


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
