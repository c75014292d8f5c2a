"""The MIXERS registry: name -> factory(config, layer_idx) -> Mixer.

The CLI choices, the parametrised tests and the docs all read this dict, so a new mixer is one module plus
one line here.
"""

from collections.abc import Callable

from models.layers import Mixer
from models.mixers.attention import Attention
from models.mixers.identity import IdentityMixer
from models.mixers.long_conv import GatedLongConv, LeakyFFTConv
from models.mixers.short_conv import dynamic_conv, dynamic_conv_headwise, static_conv

MIXERS: dict[str, Callable[..., Mixer]] = {
    "attention": Attention,
    "static_conv": static_conv,
    "dynamic_conv": dynamic_conv,
    "dynamic_conv_headwise": dynamic_conv_headwise,
    "rubiconv": GatedLongConv,
    "fft_conv_leaky": LeakyFFTConv,
    "none": IdentityMixer,
}

__all__ = ["MIXERS"]
