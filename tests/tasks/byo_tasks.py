"""Tasks written outside mixlab, loaded by import path (``byo_tasks:FirstToken``) in the tests: one that keeps the
task contract (``runners.check.check_task``) and three that break one part of it each."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mixlab.core.fields import PositiveInt
from mixlab.tasks import IGNORE, Role, Task, TaskData
from mixlab.tasks.base import require


class FirstToken(Task):
    """Recall the row's first token at its last position: ``a x x x ... x -> a``."""

    name = "first_token"
    description = "Recall the first token of the row at its last position."

    @dataclass(frozen=True)
    class Params:
        vocab_size: PositiveInt = 16
        seq_len: PositiveInt = 12

    def validate(self) -> None:
        require(self.params.vocab_size >= 2, f"vocab_size={self.params.vocab_size} must be >= 2")

    def _tokens(self, rng: np.random.Generator, num_examples: int, split: str) -> np.ndarray:
        return rng.integers(0, self.params.vocab_size, size=(num_examples, self.params.seq_len))

    def _generate(self, rng: np.random.Generator, num_examples: int, split: str) -> TaskData:
        inputs = self._tokens(rng, num_examples, split)  # [N, T]
        targets = np.full(inputs.shape, IGNORE)
        targets[:, -1] = inputs[:, 0]
        roles = np.full(inputs.shape, Role.FILLER, dtype=np.uint8)
        roles[:, 0], roles[:, -1] = Role.KEY, Role.SPECIAL
        return TaskData.from_numpy(inputs, targets, roles, self.params.vocab_size)


class GlobalRandom(FirstToken):
    """Draws from numpy's global generator: the same seed gives other bytes."""

    def _tokens(self, rng: np.random.Generator, num_examples: int, split: str) -> np.ndarray:
        return np.random.randint(0, self.params.vocab_size, size=(num_examples, self.params.seq_len))


class OutOfVocabulary(FirstToken):
    """Its last input token is vocab_size itself."""

    def _tokens(self, rng: np.random.Generator, num_examples: int, split: str) -> np.ndarray:
        tokens = super()._tokens(rng, num_examples, split)
        tokens[:, -1] = self.params.vocab_size
        return tokens


class LongerTests(FirstToken):
    """Its test rows are one token longer than its training rows."""

    def _tokens(self, rng: np.random.Generator, num_examples: int, split: str) -> np.ndarray:
        extra = int(split == "test")
        return rng.integers(0, self.params.vocab_size, size=(num_examples, self.params.seq_len + extra))


NOT_A_TASK = 3
