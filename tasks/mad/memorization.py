"""MAD memorization (mad-lab ``generate_memorization_instance``).

One fixed dictionary per vocabulary size maps each key ``0..(V-1)//2-1`` one-to-one onto a value token from
``(V-1)//2..V-2``; it comes from a generator seeded 12345, independent of the data seed, so every seed and
split shares it. A row is ``T/2`` pairs ``key <insert>`` (keys uniform with replacement, insert token ``V-1``);
the target at each insert position is the key's value, which never appears in any input: the model can only
answer from its weights. Train and test differ only by stream. The sweep trains on 256 rows, so at large V
some test keys were never seen in training.

Worked example (V=9: keys 0..3, values 4..7, insert ``I``; a dictionary {0: 6, 1: 4, 2: 7, 3: 5}; ``.`` = -100)::

    inputs   2 I 0 I 2 I 3 I
    targets  . 7 . 6 . 7 . 5
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from mixlab.core.fields import PositiveInt
from mixlab.tasks.base import IGNORE, Role, Task, TaskData, require

DICTIONARY_SEED = 12345


@functools.cache
def memorization_dictionary(vocab_size: int) -> np.ndarray:
    """The fixed key -> value table for a vocabulary size: int64 [(V-1)//2], read-only.

    Both halves are shuffled by one generator seeded 12345 and paired in order (as mad-lab's
    ``generate_kv_map`` does), so the table is the same in every process.
    """
    num_keys = (vocab_size - 1) // 2
    rng = np.random.default_rng(DICTIONARY_SEED)
    keys = np.arange(num_keys)
    values = np.arange(num_keys, vocab_size - 1)
    rng.shuffle(keys)
    rng.shuffle(values)
    table = np.empty(num_keys, dtype=np.int64)
    table[keys] = values[:num_keys]
    table.setflags(write=False)
    return table


class Memorization(Task):
    name = "mad/memorization"
    description = "MAD memorization: recall a fixed key-to-value dictionary whose values never appear in the input."

    @dataclass(frozen=True)
    class Params:
        vocab_size: PositiveInt = 256
        seq_len: PositiveInt = 32

    def validate(self) -> None:
        p = self.params
        require(p.vocab_size >= 3, f"vocab_size={p.vocab_size} must be >= 3 (a key, a value and the insert token)")
        require(p.seq_len >= 2 and p.seq_len % 2 == 0, f"seq_len={p.seq_len} must be an even number >= 2")

    def token_label(self, token: int) -> str:
        return "<insert>" if token == self.params.vocab_size - 1 else str(token)

    def _generate(self, rng: np.random.Generator, num_examples: int, split: str) -> TaskData:
        p = self.params
        table = memorization_dictionary(p.vocab_size)
        insert = p.vocab_size - 1
        keys = rng.integers(0, len(table), size=(num_examples, p.seq_len // 2))  # [N, T/2]

        inputs = np.full((num_examples, p.seq_len), insert, dtype=np.int64)
        inputs[:, 0::2] = keys
        targets = np.full((num_examples, p.seq_len), IGNORE, dtype=np.int64)
        targets[:, 1::2] = table[keys]
        roles = np.full((num_examples, p.seq_len), Role.SPECIAL, dtype=np.uint8)
        roles[:, 0::2] = Role.KEY
        return TaskData.from_numpy(inputs, targets, roles, p.vocab_size)
