"""Packed noisy recall (RubiConv paper): every document is one MAD noisy in-context recall instance.

A document of (even) length L is ``BOS`` followed by a MAD noisy-recall row generated for ``seq_len = L`` (which
returns L - 1 tokens). Content ids are those of the MAD task (keys, values, then ``noise_vocab_size`` noise ids) and
BOS is the one extra id ``vocab_size`` (so the model's vocabulary is ``vocab_size + 1``). Scoring is the MAD test
rule in both splits: the value at every repeated key, per document, so a key shown only in an earlier document of the
row is a fresh key here and a mixer that reads across the boundary is misled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mixlab.core.fields import NonNegativeInt, PositiveInt
from mixlab.tasks.base import IGNORE, Role, Task, TaskData
from mixlab.tasks.mad.noisy_recall import NoisyRecall
from mixlab.tasks.packed.layout import PackingParams, doc_ids_from_lengths, draw_doc_lengths, validate_packing

MIN_DOC = 4  # BOS, one pair, and the probe key


@dataclass(frozen=True)
class PackedNoisyRecallParams(PackingParams):
    vocab_size: PositiveInt = 32
    noise_vocab_size: NonNegativeInt = 16
    frac_noise: float = 0.2


class PackedNoisyRecall(Task):
    name = "packed/noisy_recall"
    description = "Packed documents, each a MAD noisy-recall instance; recall must not cross document boundaries."
    Params = PackedNoisyRecallParams

    @property
    def vocab_size(self) -> int:
        return self.params.vocab_size + 1

    @property
    def bos(self) -> int:
        return self.params.vocab_size

    def _doc_task(self, length: int) -> NoisyRecall:
        p = self.params
        return NoisyRecall(
            vocab_size=p.vocab_size, seq_len=length, noise_vocab_size=p.noise_vocab_size, frac_noise=p.frac_noise
        )

    def validate(self) -> None:
        validate_packing(self.params, MIN_DOC, multiple=2)
        self._doc_task(self.params.min_doc_len)  # the document parameters are checked by the MAD task

    def token_label(self, token: int) -> str:
        return "<bos>" if token == self.bos else str(token)

    def _generate(self, rng: np.random.Generator, num_examples: int, split: str) -> TaskData:
        t = self.params.seq_len
        lengths = draw_doc_lengths(rng, num_examples, self.params, multiple=2)
        inputs = np.full((num_examples, t), self.bos, dtype=np.int64)
        targets = np.full((num_examples, t), IGNORE, dtype=np.int64)
        roles = np.full((num_examples, t), Role.BOUNDARY, dtype=np.uint8)
        doc_ids = np.stack([doc_ids_from_lengths(row, t) for row in lengths])
        # (row, start) of every document, grouped by length so each length is one vectorised MAD call.
        docs: dict[int, list[tuple[int, int]]] = {}
        for r, row in enumerate(lengths):
            starts = np.concatenate([[0], np.cumsum(row)[:-1]])
            for start, length in zip(starts.tolist(), row.tolist()):
                docs.setdefault(length, []).append((r, start))
        for length in sorted(docs):
            where = docs[length]
            # The test rule scores repeated keys only, the packed paper's loss; the split still picks the stream.
            data = self._doc_task(length)._generate(rng, len(where), "test")
            for i, (r, start) in enumerate(where):
                inputs[r, start + 1 : start + length] = data.inputs[i].numpy()
                targets[r, start + 1 : start + length] = data.targets[i].numpy()
                roles[r, start + 1 : start + length] = data.roles[i].numpy()
        return TaskData.from_numpy(inputs, targets, roles, self.vocab_size, doc_ids=doc_ids)
