"""A researcher's mixer module whose import fails: it needs a package that is not installed."""

from mixlab_test_missing_dependency import FastKernel


class Broken(FastKernel):
    """Never reached."""
