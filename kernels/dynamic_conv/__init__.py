"""Dynamic short causal convolutions (head-wise and low-rank weights) and their plain-torch references."""

from mixlab.kernels.dynamic_conv.naive import dynamic_conv_headwise_ref, dynamic_conv_lowrank_ref
from mixlab.kernels.dynamic_conv.op import dynamic_conv_headwise, dynamic_conv_lowrank

__all__ = [
    "dynamic_conv_headwise",
    "dynamic_conv_headwise_ref",
    "dynamic_conv_lowrank",
    "dynamic_conv_lowrank_ref",
]
