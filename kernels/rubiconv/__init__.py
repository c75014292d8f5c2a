"""RubiConv (``rubiconv``), the document-restarting long convolution, and its plain-torch reference."""

from mixlab.kernels.rubiconv.naive import rubiconv_ref
from mixlab.kernels.rubiconv.op import rubiconv

__all__ = ["rubiconv", "rubiconv_ref"]
