import hashlib

import numpy as np
import pytest
from mixlab.tasks import IGNORE, Role, get_task
from mixlab.tasks.packed.associative_retrieval import BOS, NONE, QUERY


def documents(data, r):
    """[(start, end)] of every document of row r, from doc_ids."""
    ids = data.doc_ids[r].numpy()
    bounds = np.flatnonzero(np.diff(ids)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [ids.size]])
    return list(zip(starts.tolist(), ends.tolist()))


@pytest.fixture(scope="module", params=["packed/associative_retrieval", "packed/noisy_recall"])
def packed(request):
    task = get_task(request.param, seq_len=1024)
    return task, task.generate(40, seed=0)


def test_doc_ids_non_decreasing_from_zero_and_lengths_bounded(packed):
    task, data = packed
    p = task.params
    ids = data.doc_ids.numpy()
    assert (ids[:, 0] == 0).all()
    steps = np.diff(ids, axis=1)
    assert ((steps == 0) | (steps == 1)).all(), "doc ids go up by one at each boundary"
    lengths = np.concatenate([np.bincount(row) for row in ids])
    assert lengths.min() >= p.min_doc_len
    assert lengths.max() < p.max_doc_len + p.min_doc_len
    assert ids.max(axis=1).mean() > 1, "rows hold several documents"


def test_every_document_starts_with_bos(packed):
    task, data = packed
    bos = BOS if task.name.endswith("associative_retrieval") else task.bos
    for r in range(len(data)):
        for start, end in documents(data, r):
            assert data.inputs[r, start] == bos and data.roles[r, start] == Role.BOUNDARY
            assert (data.inputs[r, start + 1 : end] != bos).all()


@pytest.mark.parametrize("sigma", [0.75, 0.25, 0.0], ids=["default", "narrow", "fixed"])
def test_document_length_distribution_is_lognormal_around_the_median(sigma):
    """Every document but a row's last (the remainder) is a clipped lognormal draw: its log length has the
    median's log as median and doc_len_sigma as spread (the clip at [32, 1024] sits beyond 2.2 sigma)."""
    task = get_task("packed/associative_retrieval", doc_len_sigma=sigma)
    data = task.generate(200, seed=0)
    lengths = np.concatenate([np.bincount(row)[:-1] for row in data.doc_ids.numpy()])
    logs = np.log(lengths)
    assert abs(np.median(logs) - np.log(task.params.doc_len_median)) < 0.05 + 0.1 * sigma
    assert abs(logs.std() - sigma) < 0.05 * sigma + 1e-3


def test_associative_retrieval_scores_only_the_query():
    task = get_task("packed/associative_retrieval", seq_len=1024)
    data = task.generate(60, seed=1)
    first_value = 4 + task.params.num_keys
    n_absent = n_prev = n_docs = n_absent_after_first = 0
    for r in range(len(data)):
        inp, tgt = data.inputs[r].numpy(), data.targets[r].numpy()
        prev_keys = None
        for start, end in documents(data, r):
            doc, dtgt = inp[start:end], tgt[start:end]
            n_docs += 1
            assert np.flatnonzero(dtgt != IGNORE).tolist() == [end - start - 2], "one score, at the query key"
            assert doc[-3] == QUERY and dtgt[-2] == doc[-1], "the answer follows the query key"
            body = doc[1:-3]
            keys, values = body[0 : len(body) - len(body) % 2 : 2], body[1 : len(body) - len(body) % 2 : 2]
            assert (keys >= 4).all() and (keys < first_value).all() and (values >= first_value).all()
            mapping = {}
            for k, v in zip(keys, values):
                assert mapping.setdefault(k, v) == v, "one value per key within a document"
            assert len(mapping) <= task.params.keys_per_doc
            query, answer = doc[-2], doc[-1]
            if answer == NONE:
                n_absent += 1
                assert query not in mapping
                n_absent_after_first += prev_keys is not None
                if prev_keys is not None and set(prev_keys) - set(mapping):
                    assert query in prev_keys, "absent keys come from the previous document"
                    n_prev += 1
            else:
                assert mapping[query] == answer
            prev_keys = set(mapping)
    assert 0.4 < n_absent / n_docs < 0.6
    assert n_prev > 0.9 * n_absent_after_first, "the neighbour almost always has a key this document lacks"


def test_noisy_recall_scores_repeated_keys_within_each_document():
    task = get_task("packed/noisy_recall", seq_len=1024)
    data = task.generate(20, seed=2)
    num_keys = (task.params.vocab_size - task.params.noise_vocab_size) // 2
    for r in range(len(data)):
        inp, tgt, role = data.inputs[r].numpy(), data.targets[r].numpy(), data.roles[r].numpy()
        for start, end in documents(data, r):
            seen = {}
            expected = np.full(end - start, IGNORE)
            for pos in range(start + 1, end):
                if role[pos] == Role.KEY:
                    key = inp[pos]
                    assert key < num_keys
                    if key in seen:
                        expected[pos - start] = seen[key]
                    elif pos + 1 < end:
                        seen[key] = inp[pos + 1]
            # The probe key is the last token; its value is cut off, so recompute it from the first showing.
            assert np.array_equal(tgt[start:end], expected)
            assert (role[start:end][tgt[start:end] != IGNORE] == Role.KEY).all()
            assert not (role[start:end][tgt[start:end] != IGNORE] == Role.NOISE).any()


def test_absent_key_previous_last_asks_the_neighbours_last_shown_key():
    """Absent queries ask the previous document's key shown nearest the boundary (among those this document
    lacks); the default mode draws the same bytes as before the option existed (it keeps its sorted draw)."""
    task = get_task("packed/associative_retrieval", seq_len=512, absent_key="previous_last")
    data = task.generate(30, seed=2)
    checked = 0
    for r in range(len(data)):
        inp = data.inputs[r].numpy()
        prev_order = None  # the previous document's keys, ordered by their last showing
        for start, end in documents(data, r):
            doc = inp[start:end]
            body = doc[1:-3]
            keys = body[0 : len(body) - len(body) % 2 : 2]
            if doc[-1] == NONE and prev_order is not None:
                lacking = [k for k in prev_order if k not in set(keys)]
                if lacking:
                    assert doc[-2] == lacking[-1]
                    checked += 1
            prev_order = sorted(set(keys), key=lambda k: np.flatnonzero(keys == k).max())
    assert checked > 30
    plain = get_task("packed/associative_retrieval", seq_len=512).generate(30, seed=2)
    assert not np.array_equal(plain.inputs.numpy(), data.inputs.numpy())
    digest = hashlib.sha256(b"".join(t.numpy().tobytes() for t in (plain.inputs, plain.targets, plain.doc_ids)))
    assert digest.hexdigest() == "b6586bda13f374a9ae64900f3dfe2f196aa12b17e3e1d6971a137542c5da1e17", \
        "the default mode's bytes, as generated before absent_key existed"


def sha(data) -> str:
    """First 16 hex digits of the sha256 of a split's inputs, targets, roles and doc_ids."""
    h = hashlib.sha256()
    for t in (data.inputs, data.targets, data.roles, data.doc_ids):
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


SMALL = {"seq_len": 128, "min_doc_len": 8, "doc_len_median": 24, "max_doc_len": 64, "doc_len_sigma": 0.8,
         "num_keys": 16, "keys_per_doc": 4, "num_values": 4, "absent_prob": 0.5, "absent_key": "previous_last"}


@pytest.mark.parametrize(("params", "digest"), [({}, "544757d39e9e4f70"), (SMALL, "d0c6dec13fdfcc9f"),
                                                ({**SMALL, "query_share": 0.0}, "d0c6dec13fdfcc9f")],
                         ids=["defaults", "packed_small", "packed_small-share-0"])
def test_one_query_per_document_keeps_its_bytes(params, digest):
    """query_share 0 (the default) draws the bytes the committed one-query records trained on (digests taken
    from the generator before query_share existed)."""
    assert sha(get_task("packed/associative_retrieval", **params).generate(8, seed=3, split="test")) == digest


def test_many_queries_per_document():
    """query_share 0.5: Q = max(1, round(0.5 * S)) queries after P = S - Q pairs, every query scored at its key
    with its answer next, present keys answered by the document's own map, absent ones (NONE) asking the
    previous document's keys; both kinds occur and their order within a document is mixed."""
    task = get_task("packed/associative_retrieval", **{**SMALL, "absent_key": "previous", "query_share": 0.5})
    data = task.generate(40, seed=4)
    first_value = 4 + task.params.num_keys
    counts = {"present": 0, "absent": 0, "absent_from_previous": 0, "mixed_docs": 0}
    for r in range(len(data)):
        inp, tgt = data.inputs[r].numpy(), data.targets[r].numpy()
        prev_keys = None
        for start, end in documents(data, r):
            doc, dtgt, length = inp[start:end], tgt[start:end], end - start
            slots = (length - 2) // 2
            n_queries = max(1, round(0.5 * slots))
            n_pairs = slots - n_queries
            assert task.slots(length) == (n_pairs, n_queries)
            first_query = length - 2 * n_queries
            assert doc[first_query - 1] == QUERY
            assert np.flatnonzero(dtgt != IGNORE).tolist() == list(range(first_query, length, 2))
            assert np.array_equal(dtgt[first_query::2], doc[first_query + 1 :: 2]), "the answer is the next input"
            keys, values = doc[1 : 1 + 2 * n_pairs : 2], doc[2 : 2 + 2 * n_pairs : 2]
            assert (keys >= 4).all() and (keys < first_value).all() and (values >= first_value).all()
            mapping = dict(zip(keys.tolist(), values.tolist()))
            assert all(mapping[k] == v for k, v in zip(keys.tolist(), values.tolist())), "one value per key"
            answers = doc[first_query + 1 :: 2]
            for query, answer in zip(doc[first_query::2].tolist(), answers.tolist()):
                if answer == NONE:
                    counts["absent"] += 1
                    assert query not in mapping
                    counts["absent_from_previous"] += prev_keys is not None and query in prev_keys
                else:
                    counts["present"] += 1
                    assert mapping[query] == answer
            counts["mixed_docs"] += (answers == NONE).any() and (answers != NONE).any()
            prev_keys = set(mapping)
    assert 0.4 < counts["absent"] / (counts["absent"] + counts["present"]) < 0.6
    assert counts["absent_from_previous"] > 0.7 * counts["absent"]
    assert counts["mixed_docs"] > 50
    again = task.generate(40, seed=4)
    assert sha(again) == sha(data), "same seed, same bytes"
    assert sha(task.generate(40, seed=5)) != sha(data)


@pytest.mark.parametrize(
    "name,params,bad",
    [
        ("packed/associative_retrieval", {"keys_per_doc": 32}, "keys_per_doc"),
        ("packed/associative_retrieval", {"min_doc_len": 4}, "min_doc_len"),
        ("packed/associative_retrieval", {"doc_len_median": 5000}, "doc_len_median"),
        ("packed/associative_retrieval", {"absent_prob": 2.0}, "absent_prob"),
        ("packed/associative_retrieval", {"absent_key": "nearest"}, "absent_key"),
        ("packed/associative_retrieval", {"absent_key": 1}, "absent_key"),
        ("packed/associative_retrieval", {"query_share": 1.0}, "query_share"),
        ("packed/associative_retrieval", {"min_doc_len": 6, "query_share": 0.75}, "query_share"),
        ("packed/noisy_recall", {"seq_len": 1023}, "seq_len"),
        ("packed/noisy_recall", {"frac_noise": 1.0}, "frac_noise"),
    ],
    ids=["all-keys-active", "tiny-docs", "median-out-of-range", "bad-prob", "unknown-absent-key",
         "absent-key-not-a-string", "share-one", "share-leaves-no-pair", "odd-row", "all-noise"],
)
def test_impossible_settings_name_the_parameter(name, params, bad):
    with pytest.raises(ValueError, match=bad):
        get_task(name, **params)
