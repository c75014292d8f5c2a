import numpy as np
import pytest
from mixlab.tasks import IGNORE, Role, get_task


def parse_pairs(inp, role):
    """[(start, key tuple, sep position, value)] in order of appearance, read from the roles alone."""
    pairs, key = [], []
    for pos, (tok, r) in enumerate(zip(inp.tolist(), role.tolist())):
        if r == Role.KEY:
            key.append(tok)
        elif r == Role.SEPARATOR:
            pairs.append((pos - len(key), tuple(key), pos, int(inp[pos + 1])))
            key = []
        else:
            assert not key, "key tokens are always closed by a separator"
    return pairs


@pytest.fixture(scope="module")
def default_data():
    task = get_task("mqar_varlen")
    return task, task.generate(200, seed=0, split="test")


def test_pairs_appear_twice_and_second_separator_is_scored(default_data):
    task, data = default_data
    k = task.params.num_kv_pairs
    for inp, tgt, role in zip(data.inputs.numpy(), data.targets.numpy(), data.roles.numpy()):
        pairs = parse_pairs(inp, role)
        assert len(pairs) == 2 * k
        context, queries = pairs[:k], pairs[k:]
        assert len({key for _, key, _, _ in context}) == k, "keys are distinct within a row"
        mapping = {key: value for _, key, _, value in context}
        assert {key for _, key, _, _ in queries} == set(mapping), "every pair is repeated once"
        assert context[0][0] == 0 and all(a[2] + 2 == b[0] for a, b in zip(context, context[1:]))
        expected = np.full_like(tgt, IGNORE)
        for _, key, sep, value in queries:
            assert value == mapping[key]
            expected[sep] = value
        assert np.array_equal(tgt, expected), "scored only at the separator of the second occurrence"


def test_separators_encode_key_length_and_every_length_occurs(default_data):
    task, data = default_data
    for inp, role in zip(data.inputs.numpy(), data.roles.numpy()):
        pairs = parse_pairs(inp, role)
        assert all(inp[sep] == len(key) for _, key, sep, _ in pairs)
        assert {len(key) for _, key, _, _ in pairs} == {1, 2, 3}


def test_keys_share_tokens_as_proper_suffixes(default_data):
    task, data = default_data
    with_suffix = 0
    for inp, role in zip(data.inputs.numpy(), data.roles.numpy()):
        keys = {key for _, key, _, _ in parse_pairs(inp, role)}
        with_suffix += any(a != b and len(a) < len(b) and b[-len(a):] == a for a in keys for b in keys)
    assert with_suffix >= 0.9 * len(data)


def test_no_sharing_when_share_prob_is_zero():
    task = get_task("mqar_varlen", share_prob=0.0, vocab_size=8192)
    data = task.generate(50, seed=0)
    shared = 0
    for inp, role in zip(data.inputs.numpy(), data.roles.numpy()):
        keys = {key for _, key, _, _ in parse_pairs(inp, role)}
        shared += any(a != b and len(a) < len(b) and b[-len(a):] == a for a in keys for b in keys)
    assert shared <= 2, "suffix keys only by chance from a 4000-token key range"


def test_token_ranges(default_data):
    task, data = default_data
    lo, hi = task.key_token_range
    inp, role = data.inputs.numpy(), data.roles.numpy()
    keys = inp[(role == Role.KEY) | (role == Role.FILLER)]
    assert ((keys >= lo) & (keys < hi)).all()
    assert ((inp[role == Role.VALUE] >= hi) & (inp[role == Role.VALUE] < task.vocab_size)).all()
    assert set(np.unique(inp[role == Role.SEPARATOR])) == {1, 2, 3}
    assert not (inp == 0).any()


@pytest.mark.parametrize(
    "params,name",
    [
        ({"seq_len": 100}, "seq_len"),
        ({"key_lengths": ()}, "key_lengths"),
        ({"key_lengths": (0, 2)}, "key_lengths"),
        ({"num_kv_pairs": 2}, "num_kv_pairs"),
        ({"share_prob": 1.5}, "share_prob"),
        ({"vocab_size": 40}, "vocab_size"),
    ],
    ids=["too-short", "no-lengths", "zero-length", "fewer-pairs-than-lengths", "bad-prob", "tiny-vocab"],
)
def test_impossible_settings_name_the_parameter(params, name):
    with pytest.raises(ValueError, match=name):
        get_task("mqar_varlen", **params)
