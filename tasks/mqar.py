"""Multi-query associative recall (Zoology's MQAR), vectorised and seeded from one generator.

Layout of one row of length T with K pairs (keys from [1, V/2), values from [V/2, V), token 0 reserved)::

    k1 v1 k2 v2 ... kK vK | q q q q ... (query region of T - 2K tokens)

Each key appears once more in the query region, at an even offset ``2*g`` whose gap index ``g`` is drawn without
replacement from a power law p(g) ∝ a·g^(a-1). The target at that query key's position is its value (the model
emits the value after reading the key); every other target is -100. All other query-region tokens are filler drawn
uniformly from [0, V) by the same generator (Zoology draws them from torch's global RNG).

Worked example, V=16, T=12, K=2 (keys 1..7, values 8..15)::

    inputs : 3 12  5  9 |  4  0  3 14  7 11  5  2
    targets: .  .  .  . |  .  .  12 .  .  .  9  .      (. = -100; keys 3 and 5 sit at query offsets 2 and 6)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mixlab.core.fields import PositiveInt
from mixlab.tasks.base import IGNORE, Role, Task, TaskData, require, sample_distinct


def power_law_slots(rng: np.random.Generator, n_rows: int, n_slots: int, k: int, power_a: float) -> np.ndarray:
    """[n_rows, k] distinct slot indices in [0, n_slots), drawn without replacement with p(g) ∝ a·(g+1)^(a-1).

    Gumbel-top-k: the k largest of log p + Gumbel noise are a draw without replacement, in draw order.
    """
    logp = np.log(power_a) + (power_a - 1.0) * np.log(np.arange(1, n_slots + 1))
    scores = logp[None, :] + rng.gumbel(size=(n_rows, n_slots))
    return np.argsort(-scores, axis=1)[:, :k]


@dataclass(frozen=True)
class MQARParams:
    vocab_size: PositiveInt = 8192
    seq_len: PositiveInt = 64
    num_kv_pairs: PositiveInt = 8
    power_a: float = 0.01


class MQAR(Task):
    name = "mqar"
    description = "Zoology multi-query associative recall: K key-value pairs, then each key queried once."
    Params = MQARParams

    def validate(self) -> None:
        p = self.params
        require(p.vocab_size >= 4, f"vocab_size must be >= 4, got {p.vocab_size}")
        require(
            p.num_kv_pairs <= p.vocab_size // 2 - 1,
            f"num_kv_pairs={p.num_kv_pairs} needs that many distinct keys in [1, vocab_size/2): "
            f"vocab_size={p.vocab_size} is too small",
        )
        require(
            (p.seq_len - 2 * p.num_kv_pairs) // 2 >= p.num_kv_pairs,
            f"num_kv_pairs={p.num_kv_pairs} does not fit in seq_len={p.seq_len}: the pairs and their queries "
            f"need seq_len >= {4 * p.num_kv_pairs}",
        )
        require(p.power_a > 0, f"power_a must be > 0, got {p.power_a}")

    def _generate(self, rng: np.random.Generator, num_examples: int, split: str) -> TaskData:
        p = self.params
        n, k, v, t = num_examples, p.num_kv_pairs, p.vocab_size, p.seq_len
        half = v // 2
        keys = sample_distinct(rng, n, k, 1, half)  # [N, K]
        values = sample_distinct(rng, n, k, half, v)  # [N, K]
        context = 2 * k
        n_slots = (t - context) // 2
        gaps = power_law_slots(rng, n, n_slots, k, p.power_a)  # [N, K]

        inputs = rng.integers(0, v, size=(n, t))  # filler everywhere, overwritten below
        roles = np.full((n, t), Role.FILLER, dtype=np.uint8)
        targets = np.full((n, t), IGNORE, dtype=np.int64)
        inputs[:, 0:context:2], inputs[:, 1:context:2] = keys, values
        roles[:, 0:context:2], roles[:, 1:context:2] = Role.KEY, Role.VALUE
        query_pos = context + 2 * gaps  # [N, K]
        np.put_along_axis(inputs, query_pos, keys, axis=1)
        np.put_along_axis(roles, query_pos, np.uint8(Role.KEY), axis=1)
        np.put_along_axis(targets, query_pos, values, axis=1)
        return TaskData.from_numpy(inputs, targets, roles, v)
