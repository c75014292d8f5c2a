"""Packed tasks of the RubiConv paper: several documents per row, with document ids."""

from tasks.packed.associative_retrieval import PackedAssociativeRetrieval
from tasks.packed.noisy_recall import PackedNoisyRecall

PACKED_TASKS: list = [PackedAssociativeRetrieval, PackedNoisyRecall]
