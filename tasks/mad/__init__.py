"""The six MAD tasks (Poli et al. 2024) and the 66 settings of their difficulty sweep."""

from tasks.mad.compression import Compression
from tasks.mad.fuzzy_recall import FuzzyRecall
from tasks.mad.in_context_recall import InContextRecall
from tasks.mad.memorization import Memorization
from tasks.mad.noisy_recall import NoisyRecall
from tasks.mad.selective_copy import SelectiveCopy
from tasks.mad.sweep import MadSetting, mad_sweep_settings

MAD_TASKS = [InContextRecall, NoisyRecall, FuzzyRecall, SelectiveCopy, Compression, Memorization]

__all__ = [
    "MAD_TASKS",
    "Compression",
    "FuzzyRecall",
    "InContextRecall",
    "MadSetting",
    "Memorization",
    "NoisyRecall",
    "SelectiveCopy",
    "mad_sweep_settings",
]
