"""MAD selective copying (mad-lab ``generate_selective_copying_instance``).

``n = num_tokens_to_copy`` content tokens (uniform over ``0..V-3``, with replacement) with ``T - 2n - 1`` blanks
(``V-2``) scattered among them, each blank inserted before a to-copy token chosen uniformly (so the last
to-copy token always sits just before the copy token); then the copy token (``V-1``) and ``n`` blanks. The
targets are the ``n`` tokens, in order, at the last ``n`` positions; everything else is -100. Not
autoregressive: the model reads all blanks and writes all copies at once.

Worked example (V=6: content 0..3, blank ``_``, copy ``C``; T=10, n=3; ``.`` = -100)::

    inputs   _ 2 _ _ 0 3 C _ _ _
    targets  . . . . . . . 2 0 3

mad-lab draws the blank positions from the global numpy RNG; here they come from the task's own generator.
Before mad-lab commit 35772e8 (2024-12-09, its PR #8) its configs never passed n to the generator, which then
copied its default of 16 in every setting, so the sweep's ``num_tokens_to_copy`` variations (32, 64, 96) were
the baseline's task again. ``ignore_num_tokens_to_copy=True`` reproduces that: 16 tokens, whatever n says.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mixlab.core.fields import PositiveInt, added_field
from mixlab.tasks.base import IGNORE, Role, Task, TaskData, require

# What mad-lab's generator copies when it is not told how many (before its commit 35772e8, always).
MAD_LAB_DEFAULT_COPY = 16


class SelectiveCopy(Task):
    name = "mad/selective_copy"
    description = "MAD selective copying: after the copy token, emit the non-blank tokens in order."

    @dataclass(frozen=True)
    class Params:
        vocab_size: PositiveInt = 16
        seq_len: PositiveInt = 256
        num_tokens_to_copy: PositiveInt = 16
        ignore_num_tokens_to_copy: bool = added_field(False)

    def validate(self) -> None:
        p = self.params
        require(p.vocab_size >= 3, f"vocab_size={p.vocab_size} must be >= 3 (content, blank and copy tokens)")
        n = self.copied()
        copies = "num_tokens_to_copy" if n == p.num_tokens_to_copy else f"{n} (ignore_num_tokens_to_copy)"
        require(p.seq_len > 2 * n + 1, f"seq_len={p.seq_len} must exceed 2 * {copies} + 1 = {2 * n + 1}")

    def copied(self) -> int:
        """How many tokens a row copies: num_tokens_to_copy, or 16 with ignore_num_tokens_to_copy."""
        p = self.params
        return MAD_LAB_DEFAULT_COPY if p.ignore_num_tokens_to_copy else p.num_tokens_to_copy

    def token_label(self, token: int) -> str:
        labels = {self.params.vocab_size - 1: "<copy>", self.params.vocab_size - 2: "<blank>"}
        return labels.get(token, str(token))

    def _generate(self, rng: np.random.Generator, num_examples: int, split: str) -> TaskData:
        p = self.params
        n, seq_len, num_copy = num_examples, p.seq_len, self.copied()
        copy, blank = p.vocab_size - 1, p.vocab_size - 2
        num_blanks = seq_len - 2 * num_copy - 1

        to_copy = rng.integers(0, blank, size=(n, num_copy))  # [N, n]
        # Each blank goes before a uniformly chosen to-copy token; count how many land before each one.
        before = rng.integers(0, num_copy, size=(n, num_blanks)) + np.arange(n)[:, None] * num_copy
        blanks_before = np.bincount(before.reshape(-1), minlength=n * num_copy).reshape(n, num_copy)
        pos = np.arange(num_copy) + np.cumsum(blanks_before, axis=1)  # [N, n] where each to-copy token sits

        inputs = np.full((n, seq_len), blank, dtype=np.int64)
        roles = np.full((n, seq_len), Role.FILLER, dtype=np.uint8)
        rows = np.arange(n)[:, None]
        inputs[rows, pos] = to_copy
        roles[rows, pos] = Role.OTHER
        inputs[:, -num_copy - 1] = copy
        roles[:, -num_copy - 1] = Role.SPECIAL
        targets = np.full((n, seq_len), IGNORE, dtype=np.int64)
        targets[:, -num_copy:] = to_copy
        return TaskData.from_numpy(inputs, targets, roles, p.vocab_size)
