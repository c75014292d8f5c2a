"""MAD fuzzy in-context recall (mad-lab ``generate_fuzzy_in_context_recall_instance``, ``multi_query=True``).

Keys are tuples of 1..k_motif_size distinct tokens from ``0..(V-1)//2-1``, values tuples of 1..v_motif_size
distinct tokens from ``(V-1)//2..V-2``; pad is ``V-1``. There is no separator: where a key ends must be read
from the content. Train key and value sizes are uniform; **test keys always have k_motif_size tokens** (value
sizes stay uniform). Pairs are drawn until the row is long enough; a key seen before (same tokens, same size)
repeats its value. One probe pair is inserted at a random pair boundary and repeated at the end of the row;
the row is then left-padded so that, after dropping its last token, it is ``T`` tokens long.

Test targets (teacher forced): for every pair whose key was seen before, and for the final probe, the last key
token predicts ``v[0]`` and ``v[i]`` predicts ``v[i+1]``; everything else is -100. Train targets are plain
next-token at every position, pads included, as in mad-lab.

Worked example (V=9: keys 0..3, values 4..7, pad 8; T=22, test split, so keys have 3 tokens; ``.`` = -100)::

    sequence   8 8 8 | 1 2 3 4 | 1 2 3 4 | 0 1 3 7 5 4 | 0 1 3 7 5 4     (a pair, its key repeated, the
    inputs     8 8 8   1 2 3 4   1 2 3 4   0 1 3 7 5 4   0 1 3 7 5         probe "0 1 3 -> 7 5 4", the
    targets    . . .   . . . .   . . 4 .   . . . . . .   . . 7 5 4         probe again; last token dropped)

Where the probe goes (``probe_anywhere``): mad-lab draws its position over ``[0, T - 2*len(probe))``, which can
lie past the point where pairs stop; then the probe is never inserted and, unless a random pair drew its key,
the final copy asks for a key that was never shown (about 2.5% of test rows at T=128, 1% at T=256, none at
T>=512). ``probe_anywhere=True`` does the same (the MAD sweep's settings use it). The default draws the position
over the range where pairs may start and rounds it down to the last pair boundary when it falls inside the last
pair, so every probe is shown before its final copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mixlab.core.fields import PositiveInt, added_field
from mixlab.tasks.base import IGNORE, Role, Task, TaskData, require
from mixlab.tasks.mad.in_context_recall import first_occurrence

# Rows are generated in blocks of about this many tokens, bounding the [rows, pairs, motif] work arrays
# (12,800 rows at T=1024 would otherwise peak near 1.5 GB).
BLOCK_TOKENS = 2**22


def _key_codes(tokens: np.ndarray, sizes: np.ndarray, num_keys: int) -> np.ndarray:
    """One integer per key tuple: tokens [..., K] of which the first ``sizes`` [...] count -> codes [...]."""
    width = tokens.shape[-1]
    # Digit 0 marks an unused place, so tuples of different sizes never share a code.
    digits = np.where(np.arange(width) < sizes[..., None], tokens + 1, 0)
    return (digits * (num_keys + 1) ** np.arange(width, dtype=np.int64)).sum(axis=-1)


def _distinct_tuples(rng: np.random.Generator, shape: tuple, width: int, low: int, high: int) -> np.ndarray:
    """Uniform ordered tuples of ``width`` distinct integers from [low, high): int64 [*shape, width].

    The i-th token is the x-th of the values not yet taken, x uniform in [0, high - low - i): memory stays
    O(width) per tuple however large the range (a per-tuple permutation would be O(range)).
    """
    out = np.empty((*shape, width), dtype=np.int64)
    for i in range(width):
        x = rng.integers(0, high - low - i, size=shape)
        for taken in np.sort(out[..., :i], axis=-1).transpose(-1, *range(len(shape))):
            x += x >= taken  # step over taken values in increasing order
        out[..., i] = x
    return out + low


class FuzzyRecall(Task):
    name = "mad/fuzzy_recall"
    description = "MAD fuzzy recall: keys and values are 1-3-token tuples with no separator between them."
    split_dependent = True  # test keys are always k_motif_size tokens; test scores only repeated keys

    @dataclass(frozen=True)
    class Params:
        vocab_size: PositiveInt = 16
        seq_len: PositiveInt = 128
        k_motif_size: PositiveInt = 3
        v_motif_size: PositiveInt = 3
        probe_anywhere: bool = added_field(False)

    def validate(self) -> None:
        p = self.params
        num_keys = (p.vocab_size - 1) // 2
        num_values = p.vocab_size - 1 - num_keys
        require(
            num_keys >= p.k_motif_size and num_values >= p.v_motif_size,
            f"vocab_size={p.vocab_size} gives {num_keys} key and {num_values} value tokens, too few for "
            f"k_motif_size={p.k_motif_size} and v_motif_size={p.v_motif_size} distinct tokens",
        )
        require(
            (num_keys + 1) ** p.k_motif_size < 2**62,
            f"k_motif_size={p.k_motif_size} is too large to index keys of a vocabulary of {p.vocab_size}",
        )
        longest = 2 * (p.k_motif_size + p.v_motif_size)
        require(p.seq_len > longest, f"seq_len={p.seq_len} must exceed 2 * (k_motif_size + v_motif_size) = {longest}")

    def token_label(self, token: int) -> str:
        return "<pad>" if token == self.params.vocab_size - 1 else str(token)

    def _generate(self, rng: np.random.Generator, num_examples: int, split: str) -> TaskData:
        block = max(1, BLOCK_TOKENS // self.params.seq_len)
        parts = [self._rows(rng, min(block, num_examples - i), split) for i in range(0, num_examples, block)]
        inputs, targets, roles = (np.concatenate(arrays) for arrays in zip(*parts))
        return TaskData.from_numpy(inputs, targets, roles, self.params.vocab_size)

    def _rows(self, rng: np.random.Generator, n: int, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """inputs, targets, roles [n, T] of n rows."""
        p = self.params
        seq_len, kmax, vmax = p.seq_len, p.k_motif_size, p.v_motif_size
        pad = p.vocab_size - 1
        num_keys = pad // 2  # keys 0..num_keys-1, values num_keys..pad-1

        def key_sizes(shape):
            if split == "test":
                return np.full(shape, kmax, dtype=np.int64)
            return rng.integers(1, kmax + 1, size=shape)

        # The probe pair.
        probe_ks = key_sizes(n)  # [N]
        probe_vs = rng.integers(1, vmax + 1, size=n)  # [N]
        probe_k = _distinct_tuples(rng, (n,), kmax, 0, num_keys)  # [N, K]; the first probe_ks tokens count
        probe_v = _distinct_tuples(rng, (n,), vmax, num_keys, pad)  # [N, W]
        probe_len = probe_ks + probe_vs
        # A new pair starts only while the row is shorter than `stop` (mad-lab's loop condition).
        stop = seq_len - probe_len - kmax - vmax  # [N], >= 1 by validate
        probe_at = rng.integers(0, seq_len - 2 * probe_len if p.probe_anywhere else stop)  # [N]

        # Candidate pairs, more than can fit: every pair is >= 2 tokens and none starts at or after stop.
        num_pairs = (seq_len - kmax - vmax) // 2 + 1
        ks = key_sizes((n, num_pairs))  # [N, P]
        vs_new = rng.integers(1, vmax + 1, size=(n, num_pairs))  # [N, P], used where the key is new
        ktok = _distinct_tuples(rng, (n, num_pairs), kmax, 0, num_keys)  # [N, P, K]
        vtok_new = _distinct_tuples(rng, (n, num_pairs), vmax, num_keys, pad)  # [N, P, W]

        # A repeated key reuses the value drawn at its first appearance; the probe key always has the probe value.
        codes = _key_codes(ktok, ks, num_keys)  # [N, P]
        is_probe = codes == _key_codes(probe_k, probe_ks, num_keys)[:, None]
        first = first_occurrence(codes)
        vs = np.where(is_probe, probe_vs[:, None], np.take_along_axis(vs_new, first, axis=1))
        vtok = np.where(
            is_probe[..., None], probe_v[:, None, :], np.take_along_axis(vtok_new, first[..., None], axis=1)
        )  # [N, P, W]

        # The probe goes in at the first pair boundary at or past probe_at; past the last boundary before stop it
        # goes in there (default) or nowhere (probe_anywhere, as mad-lab).
        length = ks + vs
        start = np.cumsum(length, axis=1) - length  # [N, P] pair starts, probe not yet inserted
        pair = np.arange(num_pairs)
        before_stop = (start < stop[:, None]).sum(axis=1)  # >= 1: the first pair starts at 0
        slot = (start < probe_at[:, None]).sum(axis=1)  # [N]
        reached = slot < before_stop if p.probe_anywhere else np.ones(n, dtype=bool)
        slot = np.minimum(slot, before_stop - 1)
        probe_start = start[np.arange(n), slot]
        # As in mad-lab, a random pair that draws the probe key before that boundary stands in for the probe
        # (unreached: any pair of the row, all of which start before it).
        slot = np.where(reached, slot, num_pairs)
        inserted = reached & ~(is_probe & (pair < slot[:, None])).any(axis=1)  # [N]
        start = start + np.where(inserted[:, None] & (pair >= slot[:, None]), probe_len[:, None], 0)
        keep = start < stop[:, None]
        end = (length * keep).sum(axis=1) + np.where(inserted, probe_len, 0)  # [N] tokens before the final probe
        scored = (first != pair) | (is_probe & inserted[:, None])

        # Assemble rows of T + 1 tokens, left-padded, on flat views; positions relative to the first real token.
        row_len = seq_len + 1
        seq = np.full((n, row_len), pad, dtype=np.int64)
        tgt = np.full((n, row_len), IGNORE, dtype=np.int64)
        roles = np.full((n, row_len), Role.PAD, dtype=np.uint8)
        flat_seq, flat_tgt, flat_roles = seq.reshape(-1), tgt.reshape(-1), roles.reshape(-1)
        first_real = np.arange(n) * row_len + row_len - (end + probe_len)  # [N] flat index

        def place(start, ksz, vsz, keys, values, live, score):
            """Write pairs: start/ksz/vsz/live/score [N, M], keys [N, M, K], values [N, M, W]."""
            base = first_real[:, None] + start
            for i in range(kmax):
                m = live & (i < ksz)
                flat_seq[base[m] + i] = keys[..., i][m]
                flat_roles[base[m] + i] = Role.KEY
            for i in range(vmax):
                m = live & (i < vsz)
                at = base[m] + ksz[m] + i
                flat_seq[at] = values[..., i][m]
                flat_roles[at] = Role.VALUE
                ms = m & score
                flat_tgt[base[ms] + ksz[ms] + i] = values[..., i][ms]

        one = np.ones((n, 1), dtype=bool)
        pk, pv, pks, pvs = probe_k[:, None], probe_v[:, None], probe_ks[:, None], probe_vs[:, None]
        place(start, ks, vs, ktok, vtok, keep, scored)
        place(probe_start[:, None], pks, pvs, pk, pv, inserted[:, None], ~one)  # first showing: not scored
        place(end[:, None], pks, pvs, pk, pv, one, one)  # the repeat at the end: always scored

        targets = seq[:, 1:] if split == "train" else tgt[:, 1:]
        return seq[:, :-1], targets, roles[:, :-1]
