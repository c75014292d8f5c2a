import json
import re
import subprocess
import sys

import pytest
from cli_run import run_cli
from mixlab.tasks import TASKS, get_task

SMALL = {"packed/associative_retrieval": ["--set", "seq_len=256"], "packed/noisy_recall": ["--set", "seq_len=256"]}


def test_tasks_list_names_every_task(capsys):
    code, out, _ = run_cli(capsys, "tasks", "list")
    assert code == 0
    for name, cls in TASKS.items():
        assert re.search(rf"^{re.escape(name)}$", out, re.M)
        assert cls.description in out


@pytest.mark.parametrize("name", sorted(TASKS), ids=sorted(TASKS))
def test_tasks_show_prints_roles_and_every_scored_position(capsys, name):
    code, out, err = run_cli(capsys, "tasks", "show", name, "--seed", "3", *SMALL.get(name, []))
    assert code == 0, err
    task = get_task(name, **({"seq_len": 256} if name in SMALL else {}))
    data = task.generate(1, seed=3, split="test")
    n_scored = int((data.targets != -100).sum())
    assert f"scored positions: {n_scored}" in out
    assert len(re.findall(r"-> target ", out)) == n_scored
    if data.doc_ids is not None:
        assert out.count("--- document ") == int(data.doc_ids.max()) + 1


def test_tasks_show_sets_parameters_and_split(capsys):
    code, out, _ = run_cli(capsys, "tasks", "show", "mad/in_context_recall", "--set", "seq_len=16", "--split", "train")
    assert code == 0
    assert "seq_len=16" in out and "scored positions: 15" in out


@pytest.mark.parametrize(
    "argv,named",
    [
        (["tasks", "show", "no_such_task"], "no_such_task"),
        (["tasks", "show", "mqar", "--set", "bogus=1"], "bogus"),
        (["tasks", "show", "mqar", "--set", "seq_len=abc"], "abc"),
        (["tasks", "show", "mqar", "--set", "num_kv_pairs=40"], "num_kv_pairs=40"),
        (["tasks", "show", "mad/selective_copy", "--set", "seq_len=33"], "seq_len"),
        (["tasks", "show", "mqar", "--split", "val"], "val"),
        (["tasks", "show", "mqar", "--set", "novalue"], "novalue"),
        (["tasks", "show", "mqar", "--seed", "x"], "seed"),
        (["tasks", "frobnicate"], "frobnicate"),
    ],
    ids=["unknown-task", "unknown-param", "mistyped", "too-many-pairs", "copy-too-short", "bad-split",
         "malformed-set", "bad-seed", "unknown-command"],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, named):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mixlab: error:") and named in lines[0]


def test_console_script_entry_point():
    proc = subprocess.run(
        [sys.executable, "-c", "from runners.cli.main import main; main()", "tasks", "show", "nope"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.startswith("mixlab: error: unknown task 'nope'")


TINY_RUN = ["--set", "seq_len=32", "--set", "num_kv_pairs=4", "--set", "vocab_size=64", "--set", "d_model=16",
            "--set", "n_heads=2", "--set", "n_layers=1", "--set", "num_train=16", "--set", "num_test=8",
            "--set", "batch_size=8"]


def test_run_trains_writes_record_and_prints_summary(capsys, tmp_path):
    code, out, err = run_cli(capsys, "run", "mqar", "--mixer", "static_conv", *TINY_RUN, "--steps", "3",
                         "--device", "cpu", "--out", str(tmp_path), "--no-progress")
    assert code == 0, err
    (record,) = tmp_path.glob("*.json")
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mqar static_conv: acc ") and record.name in lines[0]


def test_mixers_list_names_every_mixer(capsys):
    from mixlab import models

    code, out, _ = run_cli(capsys, "mixers", "list")
    assert code == 0
    names = [line.split()[0] for line in out.strip().splitlines()]
    assert names == list(models.mixer_origins())  # built-ins first, then installed plugins
    assert names[: len(models.MIXERS)] == list(models.MIXERS)


def test_mixers_list_names_the_extra_a_mixer_needs(capsys, monkeypatch):
    from mixlab import models

    fla = {"gla", "gated_delta_net", "retnet", "based", "mamba2"}
    note = "[built-in, needs mixlab[baselines]" + ("]" if models.MIXERS["gla"].available() else ": not installed]")
    _, out, _ = run_cli(capsys, "mixers", "list")
    lines = dict(zip(models.MIXERS, out.splitlines()))
    assert {name for name, line in lines.items() if line.endswith(note)} == fla
    assert all(line.endswith("[built-in]") for name, line in lines.items() if name not in fla)
    monkeypatch.setattr(models.MIXERS["gla"], "available", classmethod(lambda cls: False))
    _, out, _ = run_cli(capsys, "mixers", "list")
    assert dict(zip(models.MIXERS, out.splitlines()))["gla"].endswith(
        "[built-in, needs mixlab[baselines]: not installed]")


@pytest.mark.parametrize(
    "argv,named",
    [
        (["run", "mqar", "--mixer", "lstm"], "lstm"),
        (["run", "mqar", "--set", "vocab_sise=3"], "vocab_sise"),
        (["run", "mqar", "--set", "model.seq_len=3"], "model.seq_len"),
        (["run", "mqar", "--set", "d_model=wide"], "wide"),
        (["run", "mqar", "--set", "qkv_conv=fancy"], "fancy"),
        (["run", "mqar", "--set", "lr=-1"], "lr"),
        (["run", "mqar", "--device", "tpu"], "tpu"),
    ],
    ids=["unknown-mixer", "misspelt-key", "wrong-namespace", "mistyped-model-field", "bad-model-choice",
         "bad-lr", "bad-device"],
)
def test_run_bad_input_is_one_line_and_exit_2(capsys, argv, named):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mixlab: error:") and named in lines[0], err


def test_readme_lists_every_mixer():
    from pathlib import Path

    from mixlab import models

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert all(f"| `{name}` |" in readme for name in models.MIXERS)


@pytest.mark.parametrize("command", [["sweep", "smoke"],
                                     ["mad", "run", "--model", "transformer", "--profile", "smoke"]],
                         ids=["sweep", "mad"])
def test_cuda_devices_must_be_indices(capsys, tmp_path, command):
    code, _, err = run_cli(capsys, *command, "--out", str(tmp_path / "out"), "--workers", "2", "--cuda-devices",
                           "0,gpu1")
    assert code == 2 and "Traceback" not in err
    assert err.strip() == "mixlab: error: --cuda-devices expects comma-separated device indices, got 'gpu1'"
    assert not (tmp_path / "out").exists()


def test_version(capsys):
    from importlib.metadata import version

    code, out, _ = run_cli(capsys, "--version")
    assert code == 0 and out == f"mixlab {version('mixlab')}\n"


def test_mixers_list_prints_whole_first_paragraphs(capsys):
    code, out, _ = run_cli(capsys, "mixers", "list")
    assert code == 0
    summaries = {line.split()[0]: line.split(None, 1)[1].rsplit("  [", 1)[0] for line in out.splitlines()}
    assert summaries["fft_conv_leaky"].endswith("(the negative control for the leakage probes).")
    assert all(s.count("(") == s.count(")") for s in summaries.values()), summaries


@pytest.mark.example_plugin
def test_leakage_all_probes_the_installed_plugins_too(capsys, monkeypatch):
    from mixlab import models
    from mixlab.analysis import leakage

    plugins = [name for name in models.mixer_origins() if name not in models.MIXERS]
    assert "gated_maxpool" in plugins
    probed = []
    monkeypatch.setattr(leakage, "probe_all", lambda names, **settings: probed.extend(names) or [])
    code, _, err = run_cli(capsys, "leakage", "--mixer", "all")
    assert code == 0, err
    assert probed == leakage.mixer_names() + plugins


@pytest.mark.parametrize("length,said", [(["--steps", "3"], "3 steps in epochs of 2"),
                                         (["--epochs", "2"], "2 epochs x 2 steps = 4 steps")],
                         ids=["steps", "epochs"])
def test_run_says_what_it_will_train_before_it_starts(capsys, tmp_path, length, said):
    code, _, err = run_cli(capsys, "run", "mqar", "--mixer", "static_conv", *TINY_RUN, *length, "--device", "cpu",
                       "--out", str(tmp_path))
    assert code == 0, err
    assert re.match(rf"mqar static_conv on cpu: {said}, [\d,]+ parameters\n", err), err


def test_bench_train_shows_progress_on_stderr(capsys, monkeypatch):
    from mixlab.runners.bench import train as bench_train

    report = bench_train.bench_train(n_runs=2, steps=2, device="cpu", task_params={"seq_len": 16}, num_train=16,
                                     num_test=8, batch_size=8, progress=True)
    err = capsys.readouterr().err
    assert "| batched | 2 |" in report and "2/2" in err and "x2" in err, err  # train_run's bar, the stack's
    asked = {}
    monkeypatch.setattr(bench_train, "bench_train", lambda **kwargs: asked.update(kwargs) or "")
    run_cli(capsys, "bench", "train", "--device", "cpu")
    assert asked["progress"] is True, "the command shows progress unless --no-progress"


def test_archive_packs_each_sweep_below_a_folder_and_names_a_bad_one(capsys, tmp_path):
    for name in ("a", "b"):
        (tmp_path / "sweeps" / name / "runs").mkdir(parents=True)
        record = {"name": f"{name}0", "config": {}, "final": {"acc_macro": 1.0}}
        (tmp_path / "sweeps" / name / "runs" / f"{name}0.json").write_text(json.dumps(record))
    code, out, _ = run_cli(capsys, "archive", str(tmp_path / "sweeps"))
    assert code == 0 and out.count("1 records archived, 1 in runs/records.jsonl.xz") == 2
    assert not list((tmp_path / "sweeps").rglob("*.json"))
    code, _, err = run_cli(capsys, "archive", str(tmp_path / "sweeps" / "a" / "runs"))
    assert code == 2 and err.strip().endswith("holds no sweep folder (none with a runs/ folder)")


def test_bench_train_takes_set_like_every_other_command(capsys, monkeypatch):
    from mixlab.runners.bench import train as bench_train_module

    calls = []
    monkeypatch.setattr(bench_train_module, "bench_train", lambda **kwargs: calls.append(kwargs) or "table")
    code, out, err = run_cli(capsys, "bench", "train", "--task", "packed/associative_retrieval", "--model", "hyena",
                         "--set", "query_share=0.5", "--set", "n_heads=8", "--set", "model.d_model=64",
                         "--batch-size", "16")
    assert code == 0 and out == "table\n", err
    (kwargs,) = calls
    assert kwargs["task_params"] == {"query_share": 0.5} and kwargs["model_params"] == {"n_heads": 8, "d_model": 64}
    assert kwargs["batch_size"] == 16
    code, _, err = run_cli(capsys, "bench", "train", "--set", "lr=0.1")
    assert code == 2 and err.startswith("mixlab: error: bench train sets training fields with its own options")
    code, _, err = run_cli(capsys, "bench", "train", "--task-params", "{}")
    assert code == 2 and "--task-params" in err
