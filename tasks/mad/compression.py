"""MAD compression (mad-lab ``generate_compression_instance``).

``T - 1`` tokens uniform over ``0..V-2`` followed by the compression token ``V-1``; the target at every
position is the input itself. The model (docs/mad.md) encodes the row, keeps only the last position's state and
must decode every position's token from it, so the task measures how much a mixer can pack into one state.

Worked example (V=5, T=6; compression token ``Z``)::

    inputs   3 0 3 1 2 Z
    targets  3 0 3 1 2 Z
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mixlab.core.fields import PositiveInt
from mixlab.tasks.base import Role, Task, TaskData, require


class Compression(Task):
    name = "mad/compression"
    description = "MAD compression: reconstruct the whole row from the state at its last (compression) token."
    objective = "compression"

    @dataclass(frozen=True)
    class Params:
        vocab_size: PositiveInt = 16
        seq_len: PositiveInt = 32

    def validate(self) -> None:
        p = self.params
        require(p.vocab_size >= 2, f"vocab_size={p.vocab_size} must be >= 2 (content and compression tokens)")
        require(p.seq_len >= 2, f"seq_len={p.seq_len} must be >= 2")

    def token_label(self, token: int) -> str:
        return "<compress>" if token == self.params.vocab_size - 1 else str(token)

    def _generate(self, rng: np.random.Generator, num_examples: int, split: str) -> TaskData:
        p = self.params
        compress = p.vocab_size - 1
        inputs = np.full((num_examples, p.seq_len), compress, dtype=np.int64)
        inputs[:, :-1] = rng.integers(0, compress, size=(num_examples, p.seq_len - 1))
        roles = np.full((num_examples, p.seq_len), Role.OTHER, dtype=np.uint8)
        roles[:, -1] = Role.SPECIAL
        return TaskData.from_numpy(inputs, inputs.copy(), roles, p.vocab_size)
