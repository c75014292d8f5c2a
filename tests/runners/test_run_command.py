"""``mixlab run``: a run file (``--config``) saved whole in the record, a run stopped by Ctrl-C that the same
command finishes to the record of a run never stopped, and a finished run not trained twice."""

import json
import os
import shutil
import signal

import pytest
import yaml
from cli_run import run_cli
from mixlab.runners.train import resume
from mixlab.runners.train import run as train_module

TINY = {"seq_len": 32, "num_kv_pairs": 4, "vocab_size": 64, "d_model": 16, "n_heads": 2, "n_layers": 1,
        "num_train": 16, "num_test": 8, "batch_size": 8}
SETS = [arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}")]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def records(folder):
    return {p.name: json.loads(p.read_text()) for p in folder.glob("*.json")}


def test_a_run_file_gives_the_fields_of_set_and_is_saved_in_the_record(capsys, tmp_path):
    code, out, err = run_cli(capsys, "run", "mqar", "--mixer", "static_conv", *SETS, "--set", "lr=0.002", "--steps",
                            "2", "--device", "cpu", "--out", str(tmp_path / "set"), "--no-progress")
    assert code == 0, err
    fields = {"task": "mqar", "mixer": "static_conv", **TINY, "train.lr": 2.0e-3, "steps": 2, "epochs": None,
              "device": "cpu"}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(fields))
    code, out, err = run_cli(capsys, "run", "--config", str(path), "--out", str(tmp_path / "file"), "--no-progress")
    assert code == 0, err
    (name, from_set), = records(tmp_path / "set").items()
    from_file = records(tmp_path / "file")[name]  # the same config: the same name
    assert from_file["config"] == from_set["config"]
    assert from_file["config_file"] == {"path": str(path), "fields": fields}
    code, out, _ = run_cli(capsys, "run", "--config", str(path), "--set", "lr=0.004", "--out", str(tmp_path / "over"),
                          "--no-progress")
    assert code == 0
    (over,) = records(tmp_path / "over").values()
    assert over["config"]["train"]["lr"] == 0.004, "the command line goes over the file"


@pytest.mark.parametrize("text,message", [
    ("lr: fast\nseq_len: 32", "run.yaml: train.lr: cannot read 'fast' as a number"),
    ("task: mqar\nd_modle: 8", "unknown parameter 'd_modle'"),
    ("seq_len: 32", "run.yaml: name the task (task: NAME) or give it on the command line"),
    ("- task: mqar", "must hold a mapping of fields"),
    ("task: mqar\nseq_len: [32", "cannot read"),
], ids=["bad-value", "unknown-key", "no-task", "not-a-mapping", "not-yaml"])
def test_a_bad_run_file_is_one_line(capsys, tmp_path, text, message):
    (tmp_path / "run.yaml").write_text(text)
    argv = ["run", "--config", str(tmp_path / "run.yaml"), "--out", str(tmp_path)]
    if message.startswith("run.yaml: train.lr"):
        argv.insert(1, "mqar")
    code, _, err = run_cli(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0].replace(str(tmp_path) + "/", ""), err


def test_run_stopped_by_ctrl_c_goes_on_to_the_same_record(capsys, tmp_path, monkeypatch):
    argv = ["run", "mqar", *SETS, "--epochs", "3", "--device", "cpu", "--no-progress"]
    assert run_cli(capsys, *argv, "--out", str(tmp_path / "reference"))[0] == 0
    real, calls = train_module.evaluate, []

    def evaluate(*args):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args)

    monkeypatch.setattr(train_module, "evaluate", evaluate)
    resumed = tmp_path / "resumed"
    code, _, err = run_cli(capsys, *argv, "--out", str(resumed))
    assert code == 130 and f"its state is in {resumed}/partial/; resume with: mixlab run mqar" in err
    assert records(resumed) == {} and list((resumed / resume.PARTIAL).glob("*.pt"))
    shutil.copytree(tmp_path / "reference", tmp_path / "both" / "done")
    shutil.copytree(resumed, tmp_path / "both" / "stopped")
    code, out, _ = run_cli(capsys, "report", str(tmp_path / "both"))
    assert code == 0 and "warning" not in out, "a checkpoint's files are not records"
    monkeypatch.undo()
    code, out, _ = run_cli(capsys, *argv, "--out", str(resumed))
    assert code == 0 and "trained before" not in out
    (name, want), = records(tmp_path / "reference").items()
    got = records(resumed)[name]
    assert (got["history"], got["final"], got["steps"]) == (want["history"], want["final"], want["steps"])
    assert not list((resumed / resume.PARTIAL).glob("*"))
    code, out, _ = run_cli(capsys, *argv, "--out", str(resumed))
    assert code == 0 and out.strip().endswith("trained before: its record is kept (delete it to train again)")
    assert records(resumed)[name] == got
