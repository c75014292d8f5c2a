"""Variable-length-key MQAR, the dynamic-conv paper's diagnostic for input-dependent local composition.

Token ids: 0 is reserved (never emitted), ``1..max_len`` are the separators ``SEP_L`` that encode a key's length L,
key tokens come from ``[max_len + 1, V/2)``, values from ``[V/2, V)``. A row holds K pairs, each written
``key(L tokens) SEP_L value``. The context lists the K pairs; the query region repeats every pair once, in a
shuffled order, with filler (random key-range tokens) between them. The target is the value at the separator of the
second occurrence, so the model must read key + separator and emit the value; every other target is -100.

Keys are distinct token tuples within a row but share tokens: with probability ``share_prob`` a new key is an
earlier key with its first token dropped or with a token prepended, so one key is often a proper suffix of another
(``b c`` and ``a b c``); only a filter that depends on the separator can tell which tokens form the key. Every key
length of ``key_lengths`` occurs in every row (K >= len(key_lengths) is required).

Worked example, K=2, V=32 (SEP_1..3 = 1..3, keys 4..15, values 16..31), T=16::

    inputs : 7  9  2 20 | 9  1 25 | 13  9  1 25 | 7  9  2 20 | 5
    roles  : k  k  s  v | k  s  v |  f  k  s  v | k  k  s  v | f
    targets: .  .  .  . | .  .  . |  .  . 25  . | .  . 20  . | .
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mixlab.core.fields import PositiveInt
from mixlab.tasks.base import IGNORE, Role, Task, TaskData, require, sample_distinct


@dataclass(frozen=True)
class MQARVarlenParams:
    vocab_size: PositiveInt = 8192
    seq_len: PositiveInt = 256
    num_kv_pairs: PositiveInt = 16
    key_lengths: tuple[PositiveInt, ...] = (1, 2, 3)
    share_prob: float = 0.5


class MQARVarlen(Task):
    name = "mqar_varlen"
    description = "MQAR with 1-3 token keys that share tokens, each closed by a length-encoding separator."
    Params = MQARVarlenParams

    @property
    def max_key_len(self) -> int:
        return max(self.params.key_lengths)

    @property
    def key_token_range(self) -> tuple[int, int]:
        return self.max_key_len + 1, self.params.vocab_size // 2

    def validate(self) -> None:
        p = self.params
        require(len(p.key_lengths) > 0, "key_lengths must not be empty")
        require(
            all(1 <= length <= 8 for length in p.key_lengths) and len(set(p.key_lengths)) == len(p.key_lengths),
            f"key_lengths must be distinct integers in 1..8, got {p.key_lengths}",
        )
        require(
            p.num_kv_pairs >= len(p.key_lengths),
            f"num_kv_pairs={p.num_kv_pairs} must be >= the number of key_lengths ({len(p.key_lengths)}) "
            "so that every length occurs",
        )
        lo, hi = self.key_token_range
        require(
            hi - lo >= 2 * p.num_kv_pairs and p.vocab_size - hi >= p.num_kv_pairs,
            f"vocab_size={p.vocab_size} is too small for {p.num_kv_pairs} distinct keys and values",
        )
        need = 2 * p.num_kv_pairs * (self.max_key_len + 2)
        require(
            p.seq_len >= need,
            f"seq_len={p.seq_len} cannot hold {p.num_kv_pairs} pairs twice with keys up to "
            f"{self.max_key_len} tokens (needs seq_len >= {need})",
        )
        require(0.0 <= p.share_prob <= 1.0, f"share_prob must be in [0, 1], got {p.share_prob}")

    def token_label(self, token: int) -> str:
        if token == 0:
            return "<0>"
        if 1 <= token <= self.max_key_len:
            return f"SEP{token}"
        return str(token)

    def _draw_keys(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys [N, K, max_len] (right-padded with -1) and their lengths [N, K], distinct within a row."""
        p = self.params
        k, m = p.num_kv_pairs, self.max_key_len
        lo, hi = self.key_token_range
        lengths_set = np.array(p.key_lengths)
        # Every length appears once, the rest uniformly; then shuffle the order within each row.
        lengths = np.concatenate(
            [np.broadcast_to(lengths_set, (n, lengths_set.size)),
             rng.choice(lengths_set, size=(n, k - lengths_set.size))], axis=1)
        lengths = np.take_along_axis(lengths, np.argsort(rng.random((n, k)), axis=1), axis=1)
        keys = np.full((n, k, m), -1, dtype=np.int64)
        rows = np.arange(n)
        for i in range(k):
            want = lengths[:, i]
            fresh = rng.integers(lo, hi, size=(n, m))
            new = np.where(np.arange(m)[None, :] < want[:, None], fresh, -1)
            if i > 0:
                # Candidates: earlier keys one token longer (drop its first token) or shorter (prepend a token).
                prev_len = lengths[:, :i]  # [N, i]
                cand = (prev_len == want[:, None] + 1) | (prev_len == want[:, None] - 1)
                share = (rng.random(n) < p.share_prob) & cand.any(axis=1)
                # Pick one candidate uniformly: the argmax of random scores over the allowed ones.
                pick = np.argmax(np.where(cand, rng.random((n, i)), -1.0), axis=1)  # [N]
                src = keys[rows, pick]  # [N, m]
                src_len = prev_len[rows, pick]
                dropped = np.concatenate([src[:, 1:], np.full((n, 1), -1)], axis=1)
                prepended = np.concatenate([rng.integers(lo, hi, size=(n, 1)), src[:, :-1]], axis=1)
                derived = np.where((src_len > want)[:, None], dropped, prepended)
                derived = np.where(np.arange(m)[None, :] < want[:, None], derived, -1)
                new = np.where(share[:, None], derived, new)
            keys[:, i] = new
            # Redraw rows whose new key equals an earlier one (fresh tokens, same length) until all are distinct.
            while i > 0:
                dup = (keys[:, :i] == keys[:, i : i + 1]).all(axis=2).any(axis=1)
                if not dup.any():
                    break
                redraw = rng.integers(lo, hi, size=(int(dup.sum()), m))
                keys[dup, i] = np.where(np.arange(m)[None, :] < want[dup, None], redraw, -1)
        return keys, lengths

    def _generate(self, rng: np.random.Generator, num_examples: int, split: str) -> TaskData:
        p = self.params
        n, k, t, v = num_examples, p.num_kv_pairs, p.seq_len, p.vocab_size
        m = self.max_key_len
        lo, hi = self.key_token_range
        rows = np.arange(n)
        keys, lengths = self._draw_keys(rng, n)  # [N, K, m], [N, K]
        values = sample_distinct(rng, n, k, hi, v)  # [N, K], distinct within a row as in MQAR
        pair_len = lengths + 2  # key tokens + separator + value

        # Query order and filler gaps: F filler tokens split into K+1 gaps around the shuffled queries.
        order = np.argsort(rng.random((n, k)), axis=1)  # [N, K]: query j asks pair order[j]
        context_len = pair_len.sum(axis=1)  # [N]
        n_fill = t - 2 * context_len  # [N]
        cuts = np.sort(np.floor(rng.random((n, k)) * (n_fill[:, None] + 1)).astype(np.int64), axis=1)
        gaps = np.diff(np.concatenate([np.zeros((n, 1), np.int64), cuts, n_fill[:, None]], axis=1), axis=1)

        inputs = rng.integers(lo, hi, size=(n, t))  # filler, overwritten by pairs below
        roles = np.full((n, t), Role.FILLER, dtype=np.uint8)
        targets = np.full((n, t), IGNORE, dtype=np.int64)

        def write_pair(start: np.ndarray, idx: np.ndarray, scored: bool) -> None:
            """Write pair ``idx`` [N] of each row at ``start`` [N]: key tokens, separator, value."""
            length = lengths[rows, idx]
            for j in range(m):
                has = j < length
                pos = np.where(has, start + j, 0)
                inputs[rows[has], pos[has]] = keys[rows, idx, j][has]
                roles[rows[has], pos[has]] = Role.KEY
            sep = start + length
            inputs[rows, sep] = length  # SEP_L has id L
            roles[rows, sep] = Role.SEPARATOR
            inputs[rows, sep + 1] = values[rows, idx]
            roles[rows, sep + 1] = Role.VALUE
            if scored:
                targets[rows, sep] = values[rows, idx]

        start = np.zeros(n, dtype=np.int64)
        for i in range(k):
            write_pair(start, np.full(n, i), scored=False)
            start = start + pair_len[:, i]
        for j in range(k):
            start = start + gaps[:, j]
            idx = order[:, j]
            write_pair(start, idx, scored=True)
            start = start + pair_len[rows, idx]
        return TaskData.from_numpy(inputs, targets, roles, v)
