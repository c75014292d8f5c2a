import numpy as np
import pytest
from mixlab.tasks import IGNORE, Role, get_task


def rows(data):
    return zip(data.inputs.numpy(), data.targets.numpy(), data.roles.numpy())


@pytest.mark.parametrize("t,k", [(64, 4), (128, 8), (256, 16)], ids=["T64-K4", "T128-K8", "T256-K16"])
def test_targets_exactly_at_query_keys(t, k):
    task = get_task("mqar", seq_len=t, num_kv_pairs=k)
    v = task.vocab_size
    data = task.generate(50, seed=0)
    for inp, tgt, role in rows(data):
        keys, values = inp[0 : 2 * k : 2], inp[1 : 2 * k : 2]
        assert len(set(keys)) == k and len(set(values)) == k
        assert ((keys >= 1) & (keys < v // 2)).all() and ((values >= v // 2) & (values < v)).all()
        mapping = dict(zip(keys, values))
        scored = np.flatnonzero(tgt != IGNORE)
        assert len(scored) == k and (scored >= 2 * k).all()
        assert sorted(inp[scored]) == sorted(keys), "every key is queried exactly once"
        assert all(tgt[p] == mapping[inp[p]] for p in scored)
        assert ((scored - 2 * k) % 2 == 0).all()
        assert (role[scored] == Role.KEY).all() and (role[2 * k :][tgt[2 * k :] == IGNORE] == Role.FILLER).all()


def test_power_law_favours_early_query_slots():
    k, t = 4, 256
    data = get_task("mqar", seq_len=t, num_kv_pairs=k, power_a=0.01).generate(400, seed=0)
    slots = np.concatenate([(np.flatnonzero(tgt != IGNORE) - 2 * k) // 2 for _, tgt, _ in rows(data)])
    uniform_mean = ((t - 2 * k) // 2 - 1) / 2
    assert slots.mean() < 0.5 * uniform_mean
    flat = get_task("mqar", seq_len=t, num_kv_pairs=k, power_a=1.0).generate(400, seed=0)
    flat_slots = np.concatenate([(np.flatnonzero(tgt != IGNORE) - 2 * k) // 2 for _, tgt, _ in rows(flat)])
    assert abs(flat_slots.mean() - uniform_mean) < 0.15 * uniform_mean


@pytest.mark.parametrize(
    "params,name",
    [
        ({"seq_len": 30, "num_kv_pairs": 8}, "seq_len"),
        ({"vocab_size": 16, "num_kv_pairs": 8}, "vocab_size"),
        ({"num_kv_pairs": 0}, "num_kv_pairs"),
        ({"power_a": 0.0}, "power_a"),
    ],
    ids=["too-short", "too-few-keys", "no-pairs", "zero-power"],
)
def test_impossible_settings_name_the_parameter(params, name):
    with pytest.raises(ValueError, match=name):
        get_task("mqar", **params)
