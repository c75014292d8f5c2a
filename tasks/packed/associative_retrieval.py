"""Packed associative retrieval (RubiConv paper): several documents per row, each its own key->value map.

Token ids: 0 filler, 1 BOS, 2 ``=>`` (query marker), 3 NONE, keys ``4 .. 4+num_keys-1``, then values.
One document of length L::

    BOS k v k v ... k v [filler] => q a q a ... q a

After BOS and ``=>`` the document has S = (L - 2) // 2 two-token slots (one filler token pads an odd length):
Q = max(1, round(``query_share`` * S)) query-answer slots at the end and P = S - Q key-value pairs before them.
``query_share`` 0 (the default) gives one query per document; a positive share gives several queries per document,
as MQAR has, so a step scores many more answers. The pairs' keys come from the document's own active subset of
``keys_per_doc`` keys of the shared key set, each mapped to a value by the document's own map. Each query ``q`` is,
with probability 1 - ``absent_prob``, a key shown in this document (answer: its value) and otherwise a key absent
from this document but shown in the previous document of the row (answer: NONE; the first document of a row, or
one whose neighbour shares all its keys, takes any key it does not show). The targets sit at the query keys (the
model emits the answer after reading the query key; the answer is the next input); nothing else is scored. A mixer
that reads the previous document answers absent queries with that document's value instead of NONE.

``absent_key`` picks which of the previous document's keys an absent query asks: ``"previous"`` (the default) any
of them; ``"previous_last"`` the one shown last (nearest the boundary). Then the absent key's latest occurrence
sits just before this document's BOS, no farther from the query than a present key shown early in a long
document: a leaky mixer cannot tell absent from present by distance (a learned decay of its filter), since
document lengths vary; only the boundary separates them.

Worked example (one document, keys 4.., values 4+num_keys..; num_keys=8, L=10, one query)::

    inputs : 1  5 14  7 12  5 14  2  7 12
    targets: .  .  .  .  .  .  .  . 12  .

With ``query_share`` 0.5 the same length holds S = 4 slots: Q = 2 queries after P = 2 pairs, here one present key
(7 -> 12) and one absent key (9, shown in the previous document, answer NONE = 3)::

    inputs : 1  5 14  7 12  2  7 12  9  3
    targets: .  .  .  .  .  . 12  .  3  .
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mixlab.core.fields import PositiveInt, added_field
from mixlab.tasks.base import IGNORE, Role, Task, TaskData, require
from mixlab.tasks.packed.layout import PackingParams, doc_ids_from_lengths, draw_doc_lengths, validate_packing

FILLER, BOS, QUERY, NONE = 0, 1, 2, 3
FIRST_KEY = 4
MIN_DOC = 6  # BOS, one pair, =>, query, answer
ABSENT_KEYS = ("previous", "previous_last")


@dataclass(frozen=True)
class AssociativeRetrievalParams(PackingParams):
    num_keys: PositiveInt = 32
    num_values: PositiveInt = 32
    keys_per_doc: PositiveInt = 8
    absent_prob: float = 0.5
    absent_key: str = "previous"
    query_share: float = added_field(0.0)


class PackedAssociativeRetrieval(Task):
    name = "packed/associative_retrieval"
    description = "Packed documents of key-value pairs and queries; absent keys (seen next door) answer NONE."
    Params = AssociativeRetrievalParams

    @property
    def vocab_size(self) -> int:
        return FIRST_KEY + self.params.num_keys + self.params.num_values

    def validate(self) -> None:
        p = self.params
        validate_packing(p, MIN_DOC)
        require(p.num_keys >= 2, f"num_keys must be >= 2, got {p.num_keys}")
        require(
            1 <= p.keys_per_doc < p.num_keys,
            f"keys_per_doc must be in [1, num_keys) so absent keys exist, got {p.keys_per_doc}",
        )
        require(0.0 <= p.absent_prob <= 1.0, f"absent_prob must be in [0, 1], got {p.absent_prob}")
        require(0.0 <= p.query_share < 1.0, f"query_share must be in [0, 1), got {p.query_share}")
        # P = S - round(share * S) grows with S once S * (1 - share) > 1/2, so the shortest document decides
        shortest = (p.min_doc_len - 2) // 2
        require(self.slots(p.min_doc_len)[0] >= 1 and shortest * (1 - p.query_share) > 0.5,
                f"query_share={p.query_share} leaves a document of min_doc_len={p.min_doc_len} tokens no pair")
        require(p.absent_key in ABSENT_KEYS,
                f"absent_key must be one of {', '.join(ABSENT_KEYS)}, got {p.absent_key!r}")

    def token_label(self, token: int) -> str:
        special = {FILLER: "<fill>", BOS: "<bos>", QUERY: "=>", NONE: "NONE"}
        if token in special:
            return special[token]
        if token < FIRST_KEY + self.params.num_keys:
            return f"k{token - FIRST_KEY}"
        return f"v{token - FIRST_KEY - self.params.num_keys}"

    def score_groups(self, targets):
        """Present-key queries (answer: a value) and absent-key queries (answer: NONE)."""
        return {"present": (targets != IGNORE) & (targets != NONE), "absent": targets == NONE}

    def slots(self, length: int) -> tuple[int, int]:
        """(pairs P, queries Q) of a document of ``length`` tokens (module docstring)."""
        slots = (length - 2) // 2  # two-token slots after BOS and =>
        n_queries = max(1, round(self.params.query_share * slots))
        return slots - n_queries, n_queries

    def _generate(self, rng: np.random.Generator, num_examples: int, split: str) -> TaskData:
        p = self.params
        t = p.seq_len
        inputs = np.zeros((num_examples, t), dtype=np.int64)
        targets = np.full((num_examples, t), IGNORE, dtype=np.int64)
        roles = np.zeros((num_examples, t), dtype=np.uint8)
        doc_ids = np.zeros((num_examples, t), dtype=np.int64)
        for r, lengths in enumerate(draw_doc_lengths(rng, num_examples, p)):
            doc_ids[r] = doc_ids_from_lengths(lengths, t)
            prev_keys = np.zeros(0, dtype=np.int64)  # the previous document's keys, in order of last showing
            start = 0
            for length in lengths:
                keys = self._write_document(rng, length, prev_keys, inputs[r, start : start + length],
                                            targets[r, start : start + length], roles[r, start : start + length])
                # keys by their last showing: unique over the reversed pairs gives each key's last index
                _, last = np.unique(keys[::-1], return_index=True)
                prev_keys = keys[::-1][np.sort(last)][::-1]
                start += length
        return TaskData.from_numpy(inputs, targets, roles, self.vocab_size, doc_ids=doc_ids)

    def _write_document(self, rng: np.random.Generator, length: int, prev_keys: np.ndarray, doc: np.ndarray,
                        target: np.ndarray, role: np.ndarray) -> np.ndarray:
        """Draw one document into the views doc, target, role [length]; return the keys of its pairs.

        ``prev_keys``: the previous document's keys by last showing (empty for a row's first document).
        """
        p = self.params
        n_pairs, n_queries = self.slots(length)
        active = rng.choice(p.num_keys, size=p.keys_per_doc, replace=False)
        mapping = rng.integers(0, p.num_values, size=p.keys_per_doc)  # value of active[i]
        which = rng.integers(0, p.keys_per_doc, size=n_pairs)
        first_value = FIRST_KEY + p.num_keys
        keys, values = active[which] + FIRST_KEY, mapping[which] + first_value
        absent = rng.random(n_queries) < p.absent_prob  # [Q]
        queries, answers = np.empty(n_queries, dtype=np.int64), np.empty(n_queries, dtype=np.int64)
        if absent.any():
            shown = np.unique(keys)
            candidates = np.setdiff1d(prev_keys, shown)  # sorted
            if candidates.size == 0:
                candidates = np.setdiff1d(np.arange(p.num_keys) + FIRST_KEY, shown)
            elif p.absent_key == "previous_last":
                candidates = prev_keys[~np.isin(prev_keys, shown)][-1:]
            queries[absent], answers[absent] = rng.choice(candidates, size=int(absent.sum())), NONE
        if not absent.all():
            pick = rng.integers(0, n_pairs, size=int((~absent).sum()))
            queries[~absent], answers[~absent] = keys[pick], values[pick]

        end_pairs, first_query = 1 + 2 * n_pairs, length - 2 * n_queries
        doc[0], role[0] = BOS, Role.BOUNDARY
        doc[1:end_pairs:2], role[1:end_pairs:2] = keys, Role.KEY
        doc[2:end_pairs:2], role[2:end_pairs:2] = values, Role.VALUE
        role[end_pairs : first_query - 1] = Role.FILLER  # one token when L is odd
        doc[first_query - 1], role[first_query - 1] = QUERY, Role.SPECIAL
        doc[first_query::2], role[first_query::2] = queries, Role.KEY
        doc[first_query + 1 :: 2], role[first_query + 1 :: 2] = answers, Role.VALUE
        target[first_query::2] = answers  # the answer is emitted at its query key
        return keys
