"""Accuracy by query kind and distance from the document start (analysis/packed_queries.py)."""

import math

import numpy as np
import pytest
import torch
from mixlab.analysis.packed_queries import accuracy_by_distance, predictions, query_distances
from mixlab.runners.train.config import RunConfig, TrainConfig
from mixlab.runners.train.run import load_saved_run, train_run
from mixlab.tasks import IGNORE, get_task
from mixlab.tasks.packed.associative_retrieval import NONE

PARAMS = {"seq_len": 64, "min_doc_len": 8, "doc_len_median": 16, "max_doc_len": 32, "num_keys": 8,
          "keys_per_doc": 2, "num_values": 4, "query_share": 0.5}
EDGES = (0, 8, 16)


@pytest.fixture(scope="module")
def data():
    return get_task("packed/associative_retrieval", **PARAMS).generate(16, seed=0)


def test_distances_count_from_each_document_start(data):
    ids = data.doc_ids.numpy()
    expected = np.zeros_like(ids)
    for r in range(ids.shape[0]):
        for t in range(1, ids.shape[1]):
            expected[r, t] = 0 if ids[r, t] != ids[r, t - 1] else expected[r, t - 1] + 1
    assert np.array_equal(query_distances(data), expected)


def test_accuracy_by_kind_and_bin(data):
    targets = data.targets.numpy()
    perfect = accuracy_by_distance(targets.copy(), data, EDGES)
    assert perfect["bins"] == ["0-7", "8-15", "16+"]
    n_present, n_absent = ((targets != IGNORE) & (targets != NONE)).sum(), (targets == NONE).sum()
    assert sum(perfect["n_present"]) == n_present and sum(perfect["n_absent"]) == n_absent
    assert all(a == 1.0 or math.isnan(a) for a in perfect["present"] + perfect["absent"])
    always_none = accuracy_by_distance(np.full_like(targets, NONE), data, EDGES)
    assert all(a == 0.0 for a, n in zip(always_none["present"], always_none["n_present"]) if n)
    assert all(a == 1.0 for a, n in zip(always_none["absent"], always_none["n_absent"]) if n)
    # a miss only beyond distance 16: the first two bins stay perfect, the last drops
    late = targets.copy()
    late[(query_distances(data) >= 16) & (targets != IGNORE)] = 0
    by_bin = accuracy_by_distance(late, data, EDGES)
    assert by_bin["present"][:2] == perfect["present"][:2] and by_bin["present"][2] == 0.0


def test_predictions_are_the_argmax_of_the_model(data):
    class Echo(torch.nn.Module):
        """Logits peaking at the input token: predicts every position's own input."""

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, doc_ids=None):
            return torch.nn.functional.one_hot(input_ids, 40).float() + self.w

    assert np.array_equal(predictions(Echo(), data, batch_size=5), data.inputs.numpy())


@pytest.mark.parametrize("edges", [(), (8, 0), (-1, 4)], ids=["empty", "decreasing", "negative"])
def test_bad_edges_are_refused(data, edges):
    with pytest.raises(ValueError, match="edges"):
        accuracy_by_distance(data.targets.numpy(), data, edges)


def test_a_checkpoint_is_scored_on_its_own_test_set(tmp_path, one_torch_thread):
    """The table of a saved run counts and scores what the run's own evaluation did (same test rows)."""
    config = RunConfig(task="packed/associative_retrieval", task_params=PARAMS,
                       model={"mixer": "hyena", "d_model": 16, "n_layers": 1, "mlp_hidden": 16},
                       train=TrainConfig(steps=2, epochs=None, batch_size=4, num_train=8, num_test=8, device="cpu"))
    final = train_run(config, out_dir=tmp_path, run_name="r", progress=False, save=True)["final"]
    model, test = load_saved_run(tmp_path / "r.pt")
    table = accuracy_by_distance(predictions(model, test), test, EDGES)
    for kind in ("present", "absent"):
        assert sum(table[f"n_{kind}"]) == final[f"n_{kind}"]
        hits = sum(a * n for a, n in zip(table[kind], table[f"n_{kind}"]) if n)
        assert hits == pytest.approx(final[f"acc_{kind}"] * final[f"n_{kind}"])
