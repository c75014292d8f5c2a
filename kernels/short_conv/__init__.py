"""Static short causal convolution (``short_conv``) and its plain-torch reference."""

from mixlab.kernels.short_conv.naive import short_conv_ref
from mixlab.kernels.short_conv.op import short_conv

__all__ = ["short_conv", "short_conv_ref"]
