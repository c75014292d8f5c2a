"""Causal softmax attention for tiny heads (``causal_attention``) and its plain-torch reference."""

from mixlab.kernels.attention.naive import causal_attention_ref
from mixlab.kernels.attention.op import causal_attention

__all__ = ["causal_attention", "causal_attention_ref"]
