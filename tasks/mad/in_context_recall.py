"""MAD in-context recall, multi-query (mad-lab ``generate_in_context_recall_instance``, ``multi_query=True``).

A row is ``T/2 - 1`` key-value pairs followed by a probe pair whose key was already shown; the last token is
dropped, so the returned length is ``T - 1``. Keys are ``0..V/2-1`` drawn uniformly with replacement; the first
time a key appears it draws a value from ``V/2..V-1``, later appearances reuse it (two keys may share a value).

Worked example (V=8, T=12; keys 0..3, values 4..7; ``.`` = -100)::

    sequence      1 5 3 4 1 5 2 7 3 4 | 3 4     (five pairs, then the probe pair "3 4")
    inputs        1 5 3 4 1 5 2 7 3 4   3       (T - 1 = 11 tokens)
    test targets  . . . . 5 . . . 4 .   4       (at a repeated key: its value; the probe is always scored)
    train targets 5 3 4 1 5 2 7 3 4 3   4       (plain next token, every position)

Test scoring counts ``(T/2 - 1) - distinct_keys + 1`` positions: 56 per row at V=16, T=128 once all eight keys
have appeared. The noisy variant (``noisy_recall.py``) reuses this generator with a noise vocabulary on top.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mixlab.core.fields import PositiveInt
from mixlab.tasks.base import IGNORE, Role, Task, TaskData, require


def first_occurrence(codes: np.ndarray) -> np.ndarray:
    """For codes [N, P], the index (along P) of the first position in the same row holding the same code."""
    n, p = codes.shape
    order = np.argsort(codes, axis=1, kind="stable")  # [N, P]; stable, so each group starts at its earliest index
    ranked = np.take_along_axis(codes, order, axis=1)
    new_group = np.ones((n, p), dtype=bool)
    new_group[:, 1:] = ranked[:, 1:] != ranked[:, :-1]
    # Sorted index of the start of each element's group, carried forward across the group.
    group_start = np.maximum.accumulate(np.where(new_group, np.arange(p), 0), axis=1)
    first_sorted = np.take_along_axis(order, group_start, axis=1)
    out = np.empty_like(order)
    np.put_along_axis(out, order, first_sorted, axis=1)
    return out


class InContextRecall(Task):
    name = "mad/in_context_recall"
    description = "MAD multi-query associative recall: emit a key's value each time the key repeats."
    split_dependent = True  # test scores only repeated keys; train is plain next-token prediction

    @dataclass(frozen=True)
    class Params:
        vocab_size: PositiveInt = 16
        seq_len: PositiveInt = 128

    def _noise(self) -> tuple[int, float]:
        """(noise_vocab_size, frac_noise); the noisy variant overrides this."""
        return 0, 0.0

    def validate(self) -> None:
        p = self.params
        noise_vocab_size, _ = self._noise()
        require(
            p.vocab_size - noise_vocab_size >= 2,
            f"vocab_size={p.vocab_size} must leave at least one key and one value token"
            + (f" above noise_vocab_size={noise_vocab_size}" if noise_vocab_size else ""),
        )
        require(p.seq_len >= 4 and p.seq_len % 2 == 0, f"seq_len={p.seq_len} must be an even number >= 4")

    def _generate(self, rng: np.random.Generator, num_examples: int, split: str) -> TaskData:
        p = self.params
        noise_vocab_size, frac_noise = self._noise()
        n, seq_len = num_examples, p.seq_len
        content = p.vocab_size - noise_vocab_size  # keys and values; noise ids sit above them
        num_keys = content // 2
        num_slots = seq_len // 2 - 1  # pairs before the probe
        rows = np.arange(n)[:, None]

        keys = rng.integers(0, num_keys, size=(n, num_slots))  # [N, S]
        # A key's value, drawn once per row and key: the same law as drawing it when the key is first seen.
        value_of = rng.integers(num_keys, content, size=(n, num_keys))  # [N, num_keys]
        values = value_of[rows, keys]  # [N, S]

        is_noise = np.zeros((n, num_slots), dtype=bool)
        if frac_noise > 0:
            is_noise = rng.random((n, num_slots)) < frac_noise
            # One pair slot per row is protected, so every row shows a key for the probe to ask about.
            is_noise[np.arange(n), rng.integers(0, num_slots, size=n)] = False
            noise = rng.integers(content, p.vocab_size, size=(n, num_slots, 2))  # [N, S, 2]
            keys = np.where(is_noise, noise[..., 0], keys)
            values = np.where(is_noise, noise[..., 1], values)

        # Noise slots get codes of their own, so they never count as a shown or repeated key.
        codes = np.where(is_noise, num_keys + np.arange(num_slots), keys)
        repeated = (first_occurrence(codes) != np.arange(num_slots)) & ~is_noise  # [N, S]

        # Probe: uniform over the distinct keys shown in the row.
        shown = np.zeros((n, num_keys), dtype=bool)
        shown[np.broadcast_to(rows, keys.shape)[~is_noise], keys[~is_noise]] = True
        probe_key = np.argmax(np.where(shown, rng.random((n, num_keys)), -1.0), axis=1)  # [N]
        probe_value = value_of[np.arange(n), probe_key]

        seq = np.empty((n, seq_len), dtype=np.int64)
        seq[:, 0:-2:2], seq[:, 1:-2:2] = keys, values
        seq[:, -2], seq[:, -1] = probe_key, probe_value
        roles = np.empty((n, seq_len), dtype=np.uint8)
        roles[:, 0:-2:2] = np.where(is_noise, Role.NOISE, Role.KEY)
        roles[:, 1:-2:2] = np.where(is_noise, Role.NOISE, Role.VALUE)
        roles[:, -2], roles[:, -1] = Role.KEY, Role.VALUE

        if split == "train":
            targets = seq[:, 1:]
        else:
            # Scored at the key's own position: the model emits the value right after reading the key.
            targets = np.full((n, seq_len - 1), IGNORE, dtype=np.int64)
            targets[:, 0:-1:2] = np.where(repeated, values, IGNORE)
            targets[:, -1] = probe_value
        return TaskData.from_numpy(seq[:, :-1], targets, roles[:, :-1], p.vocab_size)
