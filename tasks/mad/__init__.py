"""The six MAD tasks (Poli et al. 2024) and the 66 settings of their difficulty sweep."""

from mixlab.tasks.mad.compression import Compression
from mixlab.tasks.mad.fuzzy_recall import FuzzyRecall
from mixlab.tasks.mad.in_context_recall import InContextRecall
from mixlab.tasks.mad.memorization import Memorization
from mixlab.tasks.mad.noisy_recall import NoisyRecall
from mixlab.tasks.mad.selective_copy import SelectiveCopy
from mixlab.tasks.mad.sweep import MadSetting, mad_sweep_settings

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
