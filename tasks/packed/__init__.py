"""Packed tasks of the RubiConv paper: several documents per row, with document ids."""

from mixlab.tasks.packed.associative_retrieval import PackedAssociativeRetrieval
from mixlab.tasks.packed.noisy_recall import PackedNoisyRecall

PACKED_TASKS: list = [PackedAssociativeRetrieval, PackedNoisyRecall]
