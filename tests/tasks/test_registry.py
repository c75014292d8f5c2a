"""Properties every registered task must have, read from the registry so a new task is covered automatically."""

import numpy as np
import pytest
import torch
from mixlab import tasks
from mixlab.tasks import IGNORE, TASKS, Role, get_task

# Small but valid settings so the whole registry runs in seconds; tasks absent here use their defaults.
SMALL = {
    "packed/associative_retrieval": {"seq_len": 512},
    "packed/noisy_recall": {"seq_len": 512},
}


def make(name):
    return get_task(name, **SMALL.get(name, {}))


@pytest.fixture(params=sorted(TASKS), ids=sorted(TASKS))
def task(request):
    return make(request.param)


@pytest.mark.parametrize("split", ["train", "test"])
def test_shapes_dtypes_and_ranges(task, split):
    data = task.generate(6, seed=1, split=split)
    n, t = data.inputs.shape
    assert n == 6 and t > 1
    assert data.inputs.dtype == torch.int64 and data.targets.dtype == torch.int64
    assert data.roles.dtype == torch.uint8 and data.roles.shape == data.inputs.shape
    assert data.vocab_size == task.vocab_size
    assert int(data.inputs.min()) >= 0 and int(data.inputs.max()) < data.vocab_size
    scored = data.targets != IGNORE
    assert bool(scored.any(dim=1).all()), "every row has at least one scored position"
    assert int(data.targets[scored].min()) >= 0 and int(data.targets[scored].max()) < data.vocab_size
    assert set(data.roles.unique().tolist()) <= {int(r) for r in Role}
    if name_is_packed(task):
        assert data.doc_ids is not None and data.doc_ids.shape == data.inputs.shape
    else:
        assert data.doc_ids is None


def name_is_packed(task):
    return task.name.startswith("packed/")


def test_same_seed_same_bytes_other_seed_differs(task):
    a, b, c = task.generate(4, seed=7), task.generate(4, seed=7), task.generate(4, seed=8)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets) and torch.equal(a.roles, b.roles)
    assert not torch.equal(a.inputs, c.inputs)


def test_train_and_test_streams_differ(task):
    train, test = task.generate(4, seed=3, split="train"), task.generate(4, seed=3, split="test")
    assert not torch.equal(train.inputs, test.inputs)


def test_global_rng_untouched(task):
    np_state, torch_state = np.random.get_state(), torch.get_rng_state()
    task.generate(3, seed=0)
    after = np.random.get_state()
    assert all(np.array_equal(x, y) for x, y in zip(np_state[1:2], after[1:2])) and np_state[2] == after[2]
    assert torch.equal(torch_state, torch.get_rng_state())


def test_unknown_parameter_is_named(task):
    with pytest.raises(ValueError, match="no_such_param"):
        type(task)(no_such_param=1)


def test_defaults_parse_back_from_text(task):
    cls = type(task)
    text = {k: ",".join(map(str, v)) if isinstance(v, tuple) else str(v) for k, v in cls.defaults().items()}
    assert cls.parse_params(text) == cls.defaults()


def test_unknown_task_is_named():
    with pytest.raises(ValueError, match="'nope'"):
        get_task("nope")


@pytest.mark.parametrize("value", ["x", 1.5, True, None], ids=["str", "float", "bool", "none"])
def test_mistyped_integer_parameter_is_named(value):
    with pytest.raises(ValueError, match="seq_len"):
        get_task("mqar", seq_len=value)


@pytest.mark.parametrize("seed", [-1, 1.0, "0"], ids=["negative", "float", "str"])
def test_bad_seed(seed):
    with pytest.raises(ValueError, match="seed"):
        get_task("mqar").generate(2, seed=seed)


def test_bad_split_and_count():
    with pytest.raises(ValueError, match="split"):
        get_task("mqar").generate(2, seed=0, split="val")
    with pytest.raises(ValueError, match="num_examples"):
        get_task("mqar").generate(0, seed=0)


def test_registry_lists_every_spec_task():
    expected = {
        "mqar", "mqar_varlen",
        "mad/in_context_recall", "mad/noisy_recall", "mad/fuzzy_recall",
        "mad/selective_copy", "mad/compression", "mad/memorization",
        "packed/associative_retrieval", "packed/noisy_recall",
    }
    assert set(tasks.TASKS) == expected
    assert all(cls.description and len(cls.description.splitlines()) == 1 for cls in TASKS.values())


def test_readme_lists_every_task():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert all(f"| `{name}` |" in readme for name in TASKS)
