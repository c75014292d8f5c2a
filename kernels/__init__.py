"""Sequence-mixing ops: document-aware short causal convolutions (static, head-wise, low-rank) and RubiConv, and
causal softmax attention for tiny heads.

The convolutions take ``cu_seqlens`` (int32 [n_docs + 1], see ``kernels.utils``); every op takes a ``backend``:
"torch" is the plain-torch reference (``naive.py`` beside each op), "triton" its Triton kernels, None picks one
(``kernels.utils.BACKENDS``). Each op's folder holds ``naive.py`` (the reference), its Triton modules (kernels,
launchers, autograd; RubiConv also ``gemm.py``) and ``op.py`` (the input checks and the public function).
"""

from mixlab.kernels.attention import causal_attention
from mixlab.kernels.dynamic_conv import dynamic_conv_headwise, dynamic_conv_lowrank
from mixlab.kernels.rubiconv import rubiconv
from mixlab.kernels.short_conv import short_conv
from mixlab.kernels.utils import (
    cu_seqlens_to_doc_ids,
    doc_ids_to_cu_seqlens,
    positions_in_doc,
    resolve_backend,
    validate_cu_seqlens,
)

__all__ = [
    "causal_attention",
    "cu_seqlens_to_doc_ids",
    "doc_ids_to_cu_seqlens",
    "dynamic_conv_headwise",
    "dynamic_conv_lowrank",
    "positions_in_doc",
    "resolve_backend",
    "rubiconv",
    "short_conv",
    "validate_cu_seqlens",
]
