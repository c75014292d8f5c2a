"""Records in TensorBoard (``--log tensorboard DIR``): a ``mixlab run``'s evaluations, a sweep's runs named by
their labels, logged as records appear and once only (through a writer that keeps what it is given: the
tensorboard package is an optional extra), and a missing package said in one line before anything trains."""

import json
import shutil
import time
from pathlib import Path

import pytest
from cli_run import run_cli
from mixlab.analysis import tensorboard

OLD = Path(__file__).parent / "data" / "old_sweeps"
TINY = {"seq_len": 32, "num_kv_pairs": 4, "vocab_size": 64, "d_model": 16, "n_heads": 2, "n_layers": 1,
        "num_train": 16, "num_test": 8, "batch_size": 8}
SETS = [arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}")]


class KeptWriter:
    """A SummaryWriter's add_scalar and close, kept in ``logged`` by log folder."""

    logged: dict = {}

    def __init__(self, log_dir):
        self.log_dir = log_dir
        KeptWriter.logged[log_dir] = []

    def add_scalar(self, tag, value, global_step):
        KeptWriter.logged[self.log_dir].append((tag, value, global_step))

    def close(self):
        pass


@pytest.fixture
def kept_writer(monkeypatch):
    KeptWriter.logged = {}
    monkeypatch.setattr(tensorboard, "writer_class", lambda: KeptWriter)
    return KeptWriter


def records(folder):
    return {p.name: json.loads(p.read_text()) for p in folder.glob("*.json")}


def test_a_sweep_logs_each_run_once_under_its_labels(capsys, tmp_path, kept_writer, one_torch_thread):
    spec, folder, logs = str(OLD / "tiny_device.yaml"), tmp_path / "sweep", tmp_path / "tb"
    code, _, err = run_cli(capsys, "sweep", spec, "--out", str(folder), "--log", "tensorboard", str(logs),
                          "--no-progress")
    assert code == 0, err
    manifest = json.loads((folder / "sweep.json").read_text())
    expected = {str(logs / "mqar" / run["meta"]["model"] / f"seed=0 {run['hash']}") for run in manifest["runs"]}
    assert set(kept_writer.logged) == expected
    for folder_logged, scalars in kept_writer.logged.items():
        record = json.loads((folder / "runs" / f"{folder_logged.rsplit(' ', 1)[1]}.json").read_text())
        assert [(v, s) for t, v, s in scalars if t == "test/acc_macro"] == [(h["acc_macro"], h["step"])
                                                                           for h in record["history"]]
    kept_writer.logged = {}
    code, _, _ = run_cli(capsys, "sweep", spec, "--out", str(folder), "--log", "tensorboard", str(logs),
                        "--no-progress")
    assert code == 0 and kept_writer.logged == {}, "a run is logged once"


def test_records_are_logged_while_the_sweep_trains(tmp_path, kept_writer):
    folder = tmp_path / "sweep"
    shutil.copytree(OLD / "auto", folder)
    runs = sorted((folder / "runs").glob("*.json"))
    later = runs[1].read_bytes()
    runs[1].unlink()
    with tensorboard.logging_sweep(folder, tmp_path / "tb", every_s=0.01):
        deadline = time.monotonic() + 10
        while len(kept_writer.logged) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(kept_writer.logged) == 1, "the record there is logged while the block runs"
        runs[1].write_bytes(later)  # a run finishes
        while len(kept_writer.logged) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(kept_writer.logged) == 2
    assert sorted(name.rsplit(" ", 1)[1] for name in kept_writer.logged) == [p.stem for p in runs]


def test_log_takes_tensorboard_only(capsys, tmp_path, kept_writer):
    code, _, err = run_cli(capsys, "sweep", str(OLD / "tiny_device.yaml"), "--out", str(tmp_path / "s"), "--log",
                          "wandb", str(tmp_path / "tb"))
    assert code == 2 and err.strip() == "mixlab: error: --log takes tensorboard and a folder, got 'wandb'"
    assert not (tmp_path / "s").exists()


def test_run_logs_its_evaluations_to_tensorboard(capsys, tmp_path, kept_writer, one_torch_thread):
    code, out, err = run_cli(capsys, "run", "mqar", *SETS, "--steps", "4", "--set", "eval_every=2", "--device", "cpu",
                            "--out", str(tmp_path / "runs"), "--no-progress", "--log", "tensorboard",
                            str(tmp_path / "tb"))
    assert code == 0, err
    (name, record), = records(tmp_path / "runs").items()
    (folder, logged), = kept_writer.logged.items()
    assert folder == str(tmp_path / "tb" / name[: -len(".json")])
    assert {tag for tag, _, _ in logged} == {"test/acc_macro", "test/acc_micro", "test/loss", "test/ppl",
                                             "train/loss", "train/lr"}
    assert [(v, s) for tag, v, s in logged if tag == "test/loss"] == [(h["test_loss"], h["step"])
                                                                     for h in record["history"]]
    assert [s for tag, _, s in logged if tag == "test/loss"] == [2, 4]


def test_tensorboard_missing_is_one_line_before_anything_trains(capsys, tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith("torch.utils.tensorboard") or name == "tensorboard":
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    code, _, err = run_cli(capsys, "run", "mqar", *SETS, "--steps", "2", "--device", "cpu", "--out",
                          str(tmp_path / "runs"), "--log", "tensorboard", str(tmp_path / "tb"))
    assert code == 2
    assert err.strip() == ("mixlab: error: --log tensorboard needs the tensorboard package: pip install "
                           "'mixlab[tensorboard]'")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "tb").exists()
