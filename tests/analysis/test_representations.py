import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from mixlab import models
from mixlab.analysis import representations as rep
from mixlab.runners.train.config import RunConfig, TrainConfig
from mixlab.runners.train.run import train_run

VOCAB = 20


def build(seed=0, **fields):
    config = models.ModelConfig(**{"vocab_size": VOCAB, "d_model": 16, "n_layers": 2, "n_heads": 2,
                                   "mlp_hidden": 24, "max_seq_len": 16, **fields})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return models.build_model(config).eval()


def token_batch(rows=5, length=12, seed=0):
    return torch.randint(1, VOCAB, (rows, length), generator=torch.Generator().manual_seed(seed))


def test_find_tokens_skips_position_zero_and_respects_the_mask():
    ids = torch.tensor([[3, 3, 5, 3], [5, 3, 3, 7]])
    rows, positions = rep.find_tokens(ids, [3])
    assert list(zip(rows.tolist(), positions.tolist())) == [(0, 1), (0, 3), (1, 1), (1, 2)]
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[1, 2] = True
    rows, positions = rep.find_tokens(ids, [3, 7], mask=mask)
    assert (rows.tolist(), positions.tolist()) == ([1], [2])


def test_vary_previous_token_changes_only_the_token_before():
    ids = token_batch()
    rows, positions = torch.tensor([3, 0]), torch.tensor([5, 1])
    out, pos, base = rep.vary_previous_token(ids, rows, positions, [7, 8, 9])
    assert out.shape == (6, ids.shape[1]) and pos.tolist() == [5, 5, 5, 1, 1, 1]
    assert base.tolist() == [0, 0, 0, 1, 1, 1]
    for i in range(6):
        source = ids[rows[base[i]]]
        changed = (out[i] != source).nonzero().flatten().tolist()
        assert out[i, pos[i] - 1] == [7, 8, 9][i % 3]
        assert changed in ([], [int(pos[i]) - 1])
    with pytest.raises(ValueError, match="positions must be >= 1"):
        rep.vary_previous_token(ids, torch.tensor([0]), torch.tensor([0]), [1])


def manual_points(model, ids):
    """Residual stream after every sublayer, computed by hand from the Block definition."""
    x = model.embed(ids)
    points = [x]
    for block in model.blocks:
        x = x + block.mixer(block.mixer_norm(x))
        points.append(x)
        if block.mlp is not None:
            x = x + block.mlp(block.mlp_norm(x))
            points.append(x)
    return points


@pytest.mark.parametrize(
    "fields,layers",
    [({}, ["embed", "1.mixer", "1.mlp", "2.mixer", "2.mlp"]),
     ({"mlp_hidden": None, "mixer": "static_conv"}, ["embed", "1.mixer", "2.mixer"])],
    ids=["attention-with-mlp", "static-conv-no-mlp"],
)
def test_collect_states_matches_the_residual_stream_in_the_callers_order(fields, layers):
    model = build(**fields)
    ids = token_batch()
    rows = torch.tensor([4, 0, 4, 2, 0, 1])  # unsorted, repeated rows, split over batches of 2
    positions = torch.tensor([3, 11, 7, 1, 0, 5])
    states = rep.collect_states(model, ids, rows, positions, batch_size=2)
    assert states.layers == layers and states.states.shape == (len(layers), 6, 16)
    with torch.no_grad():
        expected = manual_points(model, ids)
    for i, point in enumerate(expected):
        np.testing.assert_allclose(states.states[i], point[rows, positions].numpy(), rtol=1e-5, atol=1e-6)
    assert states.prev.tolist() == [int(ids[4, 2]), int(ids[0, 10]), int(ids[4, 6]), int(ids[2, 0]), -1,
                                    int(ids[1, 4])]
    assert states.token.tolist() == ids[rows, positions].tolist() and not model.training


def test_collect_states_marks_document_starts_and_restores_training_mode():
    model = build().train()
    ids = token_batch(rows=1)
    doc_ids = torch.tensor([[0] * 4 + [1] * 8])
    states = rep.collect_states(model, ids, torch.tensor([0, 0]), torch.tensor([4, 5]), doc_ids=doc_ids)
    assert states.prev.tolist() == [-1, int(ids[0, 4])]
    assert model.training
    with pytest.raises(ValueError, match="unknown layer"):
        states.layer("3.mlp")


def test_cosine_and_variance_measures_by_hand():
    states = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    within, across = rep.cosine_within_across(states, np.array([0, 0, 1, 1]))
    assert within == pytest.approx((1.0 + np.sqrt(0.5)) / 2)
    assert across == pytest.approx((0 + np.sqrt(0.5) + 0 + np.sqrt(0.5)) / 4)
    grouped = np.array([[0.0, 0.0], [0.0, 0.0], [2.0, 0.0], [2.0, 0.0]])
    assert rep.variance_explained(grouped, np.array([0, 0, 1, 1])) == pytest.approx(1.0)
    assert rep.within_group_share(grouped, np.array([0, 1, 0, 1])) == pytest.approx(1.0)
    assert rep.variance_explained(np.ones((4, 2)), np.array([0, 0, 1, 1])) == 0.0
    assert rep.within_group_share(np.ones((4, 2)), np.array([0, 0, 1, 1])) == 0.0


def test_probe_reads_a_linear_label_and_not_noise():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 50)
    noise = rng.normal(size=(200, 8))
    readable = noise + 3 * np.eye(8)[labels]
    accuracy, chance = rep.probe_accuracy(readable, labels, seed=0)
    assert accuracy == 1.0 and chance == pytest.approx(0.25, abs=0.02)
    accuracy, chance = rep.probe_accuracy(noise, labels, seed=0)
    assert accuracy < chance + 0.15


def test_grouped_probe_is_scored_on_unseen_groups():
    # The state identifies the group, and each group has one label: rows of seen groups are trivially
    # readable, unseen groups are not.
    groups = np.repeat(np.arange(40), 5)
    labels = np.random.default_rng(1).integers(0, 2, size=40)[groups]
    states = np.eye(40)[groups]
    assert rep.probe_accuracy(states, labels, seed=0)[0] == 1.0
    accuracy, chance = rep.probe_accuracy(states, labels, groups=groups, seed=0)
    assert accuracy <= chance
    with pytest.raises(ValueError, match="2 classes"):
        rep.probe_accuracy(states, np.zeros(200), seed=0)


def synthetic_states(context_weight, prev_weight, n_contexts=30, n_prev=4, dim=12):
    rng = np.random.default_rng(0)
    base = np.repeat(np.arange(n_contexts), n_prev)
    prev = np.tile(np.arange(n_prev), n_contexts)
    contexts = rng.normal(size=(n_contexts, dim))
    prevs = rng.normal(size=(n_prev, dim))
    states = 5 + context_weight * contexts[base] + prev_weight * prevs[prev]  # [N, dim]
    return rep.TokenStates(layers=["only"], states=states[None].astype(np.float32), token=np.zeros(len(base)),
                           prev=prev, row=np.arange(len(base)), pos=np.ones(len(base))), base


def test_context_sensitivity_separates_context_from_previous_token():
    blind, base = synthetic_states(context_weight=1.0, prev_weight=0.0)
    (row,) = rep.context_sensitivity(blind, base)
    assert row["cos_same_context"] == pytest.approx(1.0) and row["prev_share"] == pytest.approx(0.0, abs=1e-9)
    assert row["probe_acc"] <= row["chance"] + 0.15 and row["cos_same_prev"] < 1
    only_prev, base = synthetic_states(context_weight=0.0, prev_weight=1.0)
    (row,) = rep.context_sensitivity(only_prev, base)
    assert row["cos_same_prev"] == pytest.approx(1.0) and row["prev_share"] == pytest.approx(1.0)
    assert row["cos_same_context"] < 1 and row["probe_acc"] == 1.0
    with pytest.raises(ValueError, match="base labels"):
        rep.context_sensitivity(only_prev, base[:-1])


def test_embedding_layer_is_blind_to_the_previous_token():
    model = build(qkv_conv="static")
    ids = token_batch(rows=12)
    inputs, pos, base = rep.vary_previous_token(ids, torch.arange(12), torch.full((12,), 6), [2, 5, 11])
    states = rep.collect_states(model, inputs, torch.arange(len(inputs)), pos)
    rows = {r["layer"]: r for r in rep.context_sensitivity(states, base.numpy())}
    assert rows["embed"]["prev_share"] == pytest.approx(0.0, abs=1e-12)
    assert rows["embed"]["cos_same_context"] == pytest.approx(1.0)
    assert rows["1.mixer"]["cos_same_context"] < 1.0 and rows["1.mixer"]["prev_share"] > 0.0


def test_load_run_returns_the_model_and_its_task(tmp_path):
    config = RunConfig(task="mqar_varlen", task_params={"vocab_size": 64, "seq_len": 48, "num_kv_pairs": 4},
                       model={"d_model": 16, "n_heads": 2, "n_layers": 1, "mlp_hidden": 32},
                       train=TrainConfig(steps=1, epochs=None, batch_size=4, num_train=4, num_test=4,
                                         device="cpu"))
    train_run(config, out_dir=tmp_path, run_name="r", progress=False, save=True)
    model, task, meta = rep.load_run(tmp_path / "r.pt")
    assert task.name == "mqar_varlen" and task.params.num_kv_pairs == 4
    assert task.params.key_lengths == (1, 2, 3), "tuples come back as tuples from the JSON-like metadata"
    assert meta["final"]["best_step"] == 1 and model.config.vocab_size == 64
    models.save(model, tmp_path / "bare.pt")
    with pytest.raises(ValueError, match="without a run config"):
        rep.load_run(tmp_path / "bare.pt")


def test_figures_have_one_panel_per_metric_or_model():
    metrics = {"cos_same_context": 1.0, "cos_same_prev": 0.5, "cos_different": 0.4, "prev_share": 0.1,
               "probe_acc": 0.3, "chance": 0.25}
    rows = [{"model": m, "layer": layer, **metrics} for m in ("a", "b") for layer in ("embed", "1")]
    assert isinstance(rep.plot_sensitivity(rows), Figure) and len(rep.plot_sensitivity(rows).axes) == 3
    assert len(rep.plot_cosines(rows).axes) == 2
    coords = np.zeros((4, 2))
    assert len(rep.plot_pca({"a": (coords, [0, 0, 1, 1]), "b": (coords, [0, 1, 0, 1])}).axes) == 2
    with pytest.raises(ValueError, match="no rows"):
        rep.plot_sensitivity([])
