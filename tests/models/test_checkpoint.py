import json
import pickle

import pytest
import torch
from mixlab import models
from mixlab.models import checkpoint
from mixlab.runners.cli.main import main
from mixlab.runners.train import run as train_module
from mixlab.runners.train.config import RunConfig, TrainConfig
from mixlab.runners.train.evaluation import evaluate
from mixlab.runners.train.resolved import resolve
from mixlab.runners.train.run import train_run
from torch import nn

BASE = {"vocab_size": 32, "d_model": 16, "n_layers": 2, "n_heads": 2, "mlp_hidden": 24, "max_seq_len": 24}
CONFIGS = {
    "attention": {"mixer": "attention"},
    "attention-qkv-static": {"mixer": "attention", "qkv_conv": "static"},
    "attention-qkv-dynamic-lowrank": {"mixer": "attention", "qkv_conv": "dynamic_lowrank", "conv_rank": 4},
    "dynamic-conv-headwise": {"mixer": "dynamic_conv_headwise", "conv_head_size": 4},
    "rubiconv": {"mixer": "rubiconv"},
    "no-mlp": {"mixer": "static_conv", "mlp_hidden": None},
    "compression": {"mixer": "attention", "objective": "compression"},
}


def build(fields, seed=0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return models.build_model(models.ModelConfig(**{**BASE, **fields}))


def inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, BASE["vocab_size"], (3, 24), generator=g)
    doc_ids = torch.tensor([0] * 5 + [1] * 12 + [2] * 7).repeat(3, 1)
    return ids, doc_ids


@pytest.mark.parametrize("fields", list(CONFIGS.values()), ids=list(CONFIGS))
def test_loaded_model_gives_bitwise_equal_logits(tmp_path, fields):
    model = build(fields).eval()
    with torch.no_grad():  # move every weight off its init so a fresh build cannot pass by accident
        for p in model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    path = models.save(model, tmp_path / "m.pt", metadata={"note": "x"})
    loaded = models.load(path)
    assert loaded.config == model.config and not loaded.training
    ids, doc_ids = inputs()
    with torch.no_grad():
        assert torch.equal(loaded(ids), model(ids))
        assert torch.equal(loaded(ids, doc_ids=doc_ids), model(ids, doc_ids=doc_ids))
    assert not torch.equal(build(fields, seed=5).eval()(ids), model(ids)), "another init must differ"


def test_load_leaves_the_global_rng_alone(tmp_path):
    path = models.save(build(CONFIGS["attention"]), tmp_path / "m.pt")
    before = torch.random.get_rng_state()
    models.load(path)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_metadata_round_trip_and_state_dict_override(tmp_path):
    model = build(CONFIGS["attention"])
    other = build(CONFIGS["attention"], seed=3)
    meta = {"final": {"acc": 0.5, "groups": (1, 2)}, "name": "run"}
    path = models.save(model, tmp_path / "sub" / "m.pt", metadata=meta, state_dict=other.state_dict())
    assert checkpoint.metadata(path) == {"model_config": model.config.to_dict(), "final": {"acc": 0.5,
                                         "groups": [1, 2]}, "name": "run"}
    ids, _ = inputs()
    assert torch.equal(models.load(path)(ids), other.eval()(ids)), "the given state_dict is what is saved"
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["m.pt"], "no temporary file left behind"


def write_text(path):
    path.write_text("not a checkpoint\n")


def write_plain_dict(path):
    torch.save({"state_dict": {}}, path)


class Payload:
    pass


def write_pickle(path):
    with open(path, "wb") as f:
        pickle.dump(Payload(), f, protocol=2)


def write_wrong_version(path):
    payload = checkpoint.read(models.save(build(CONFIGS["attention"]), path))
    torch.save({**payload, "format_version": 99}, path)


def write_misfit_weights(path):
    payload = checkpoint.read(models.save(build(CONFIGS["attention"]), path))
    payload["model_config"]["d_model"] = 32
    payload["model_config"]["mlp_hidden"] = 48
    torch.save(payload, path)


@pytest.mark.parametrize(
    "write,named",
    [(write_text, "not a mixlab checkpoint"), (write_plain_dict, "not a mixlab checkpoint"),
     (write_pickle, "not a mixlab checkpoint"), (write_wrong_version, "format_version 99"),
     (write_misfit_weights, "do not fit")],
    ids=["text-file", "plain-torch-dict", "arbitrary-pickle", "wrong-version", "weights-misfit-config"],
)
def test_load_rejects_other_files_with_one_line(tmp_path, write, named):
    path = tmp_path / "bad.pt"
    write(path)
    with pytest.raises(ValueError) as info:
        models.load(path)
    message = str(info.value)
    assert named in message and str(path) in message and len(message.splitlines()) == 1


def test_load_missing_file_and_save_bad_input(tmp_path):
    with pytest.raises(ValueError, match="no checkpoint file"):
        models.load(tmp_path / "absent.pt")
    with pytest.raises(ValueError, match="Linear"):
        models.save(nn.Linear(2, 2), tmp_path / "x.pt")
    with pytest.raises(ValueError, match="JSON"):
        models.save(build(CONFIGS["attention"]), tmp_path / "x.pt", metadata={"bad": object()})
    assert not list(tmp_path.iterdir())


def tiny_run(**train):
    return RunConfig(task="mqar", task_params={"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2},
                     model={"d_model": 16, "n_heads": 2, "n_layers": 1, "mlp_hidden": 32},
                     train=TrainConfig(**{"steps": 4, "epochs": None, "batch_size": 8, "num_train": 32,
                                          "num_test": 16, "lr": 3e-2, "eval_every": 1, "device": "cpu",
                                          **train}))


def test_train_run_saves_the_weights_of_the_reported_evaluation(tmp_path, monkeypatch, one_torch_thread):
    # Scripted perplexities make the evaluation after step 2 the reported one, whatever the real losses, so
    # the weights after step 4 (the last) must not be what is saved. Other metrics are the real evaluation's.
    scripted = iter([3.0, 1.0, 2.0, 4.0])
    real = evaluate

    def evaluate_with_scripted_ppl(*args, **kwargs):
        return {**real(*args, **kwargs), "test_ppl": next(scripted)}

    monkeypatch.setattr(train_module, "evaluate", evaluate_with_scripted_ppl)
    config = tiny_run()
    record = train_run(config, out_dir=tmp_path, run_name="r", progress=False, save=True)
    assert record["final"]["best_step"] == 2 and record["steps"] == 4
    assert record["checkpoint"] == "r.pt"
    assert json.loads((tmp_path / "r.json").read_text())["checkpoint"] == "r.pt"
    model = models.load(tmp_path / "r.pt")
    task = resolve(config).task
    test_data = task.generate(16, seed=0, split="test")
    again = evaluate(model, test_data, 256, torch.device("cpu"), False, task)
    for key in ("test_loss", "acc_micro", "acc_macro"):
        assert again[key] == record["final"][key], key
    last = [h for h in record["history"] if h["step"] == 4][0]
    assert again["test_loss"] != last["test_loss"], "the last weights would give the last evaluation's loss"
    meta = checkpoint.metadata(tmp_path / "r.pt")
    assert meta["config"] == record["config"] and meta["final"]["best_step"] == 2
    assert meta["model_config"] == record["resolved"]["model"]


def test_train_run_save_needs_an_out_dir():
    with pytest.raises(ValueError, match="out_dir"):
        train_run(tiny_run(), save=True, progress=False)


def test_cli_run_save_writes_a_loadable_checkpoint(tmp_path, capsys, one_torch_thread):
    code = 0
    try:
        main(["run", "mqar", "--set", "vocab_size=32", "--set", "seq_len=16", "--set", "num_kv_pairs=2",
              "--set", "d_model=16", "--set", "n_heads=2", "--set", "n_layers=1", "--set", "mlp_hidden=32",
              "--set", "num_train=16", "--set", "num_test=8", "--set", "batch_size=8", "--steps", "2",
              "--device", "cpu", "--no-progress", "--out", str(tmp_path), "--save"])
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr().out
    (pt,) = tmp_path.glob("*.pt")
    assert code == 0 and f"and {tmp_path}/{pt.name}" in out
    assert models.load(pt).config.vocab_size == 32
    assert (tmp_path / f"{pt.stem}.json").is_file()
