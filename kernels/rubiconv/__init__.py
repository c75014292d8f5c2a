"""RubiConv (``rubiconv``), the document-restarting long convolution, and its plain-torch reference."""

from kernels.rubiconv.naive import rubiconv_ref
from kernels.rubiconv.op import rubiconv

__all__ = ["rubiconv", "rubiconv_ref"]
