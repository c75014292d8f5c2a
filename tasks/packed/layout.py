"""Document layout of packed rows: lognormal document lengths greedily filling rows of ``seq_len`` tokens."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mixlab.core.fields import PositiveInt
from mixlab.tasks.base import require


@dataclass(frozen=True)
class PackingParams:
    """Parameters every packed task shares (mixed into each task's ``Params``)."""

    seq_len: PositiveInt = 2048
    doc_len_median: PositiveInt = 192
    doc_len_sigma: float = 0.75
    min_doc_len: PositiveInt = 32
    max_doc_len: PositiveInt = 1024


def validate_packing(p, smallest_doc: int, multiple: int = 1) -> None:
    """Check the packing fields of ``p``; ``smallest_doc`` is the shortest document the task can build and every
    length must be a multiple of ``multiple``."""
    for field in ("seq_len", "min_doc_len"):
        value = getattr(p, field)
        require(value % multiple == 0, f"{field}={value} must be a multiple of {multiple}")
    require(p.min_doc_len >= smallest_doc, f"min_doc_len must be >= {smallest_doc}, got {p.min_doc_len}")
    require(p.max_doc_len >= p.min_doc_len, f"max_doc_len={p.max_doc_len} must be >= min_doc_len={p.min_doc_len}")
    require(
        p.min_doc_len <= p.doc_len_median <= p.max_doc_len,
        f"doc_len_median={p.doc_len_median} must lie in [min_doc_len, max_doc_len]",
    )
    require(p.doc_len_sigma >= 0, f"doc_len_sigma must be >= 0, got {p.doc_len_sigma}")
    require(p.seq_len >= p.min_doc_len, f"seq_len={p.seq_len} must be >= min_doc_len={p.min_doc_len}")


def draw_doc_lengths(rng: np.random.Generator, n_rows: int, p, multiple: int = 1) -> list[np.ndarray]:
    """Per row, the lengths of its documents (they sum to ``p.seq_len``), each a multiple of ``multiple``.

    Lengths are lognormal around ``doc_len_median``, clipped to ``[min_doc_len, max_doc_len]``, drawn until the row is
    full. The last document takes the remainder; a draw that would leave less than ``min_doc_len`` tokens is widened
    to take the remainder instead, so no document is shorter than ``min_doc_len`` (the last one may exceed
    ``max_doc_len`` by less than ``min_doc_len``).
    """
    # Draw more lengths than any row can use, in one call, then cut them into rows.
    per_row = p.seq_len // p.min_doc_len + 1
    raw = np.exp(np.log(p.doc_len_median) + p.doc_len_sigma * rng.standard_normal((n_rows, per_row)))
    draws = np.clip(np.rint(raw), p.min_doc_len, p.max_doc_len).astype(np.int64)
    draws -= draws % multiple
    rows = []
    for r in range(n_rows):
        lengths, left = [], p.seq_len
        for length in draws[r]:
            if left - length < p.min_doc_len:
                lengths.append(left)
                break
            lengths.append(int(length))
            left -= int(length)
        rows.append(np.array(lengths, dtype=np.int64))
    return rows


def doc_ids_from_lengths(lengths: np.ndarray, seq_len: int) -> np.ndarray:
    """[seq_len] document index of every token of a row with these document lengths."""
    return np.repeat(np.arange(lengths.size), lengths)[:seq_len]
