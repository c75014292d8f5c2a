"""Tasks from outside mixlab: an import path or an installed entry point resolves wherever a task name is taken,
and ``check-task`` holds a task to the contract the runners rely on (the helper tasks of byo_tasks.py)."""

import importlib.metadata
from pathlib import Path

import pytest
from cli_run import run_cli
from mixlab import tasks
from mixlab.runners.check import TASK_CHECKS, check_task
from mixlab.runners.sweep.spec import SweepSpec

HERE = Path(__file__).resolve().parent
GOOD = "byo_tasks:FirstToken"


@pytest.fixture(autouse=True)
def helper_modules(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))


@pytest.mark.parametrize("name", [*tasks.TASKS, GOOD])
def test_every_built_in_task_and_the_helper_keep_the_contract(name):
    params = {"seq_len": 512} if name.startswith("packed/") else {}
    report = check_task(name, params)
    assert report.passed, report.format()
    assert [c.name for c in report.checks] == list(TASK_CHECKS)


@pytest.mark.parametrize("name,failed", [("byo_tasks:GlobalRandom", ["seeded", "global_rng"]),
                                         ("byo_tasks:OutOfVocabulary", ["vocabulary"]),
                                         ("byo_tasks:LongerTests", ["lengths"])],
                         ids=["global-rng", "out-of-vocabulary", "longer-tests"])
def test_check_task_names_what_a_task_breaks(name, failed):
    assert check_task(name).failed == failed


def test_check_task_reports_a_task_whose_parameters_do_not_build():
    report = check_task(GOOD, {"vocab_size": 1})
    assert report.failed == ["build"] and "vocab_size=1 must be >= 2" in report.checks[0].detail


@pytest.mark.parametrize("name,message", [
    ("byo tasks:X", "is not an import path of the form package.module:TaskClass"),
    ("no_such_module_xyz:Task", "cannot import 'no_such_module_xyz'"),
    ("byo_tasks:Missing", "'byo_tasks' has no attribute 'Missing'"),
    ("byo_tasks:NOT_A_TASK", "3 is not a subclass of mixlab.tasks.Task"),
    ("no_such_task", "unknown task 'no_such_task'"),
], ids=["malformed", "no-module", "no-attribute", "not-a-task", "unknown-name"])
def test_a_task_that_does_not_load_is_one_line(name, message):
    with pytest.raises(ValueError, match=message):
        tasks.task_class(name)


class FakeEntryPoint:
    def __init__(self, name, value):
        self.name, self.value, self.dist = name, value, None


def test_entry_points_resolve_by_name_and_two_of_one_name_are_refused(monkeypatch):
    found = {"first_token": [FakeEntryPoint("first_token", GOOD)],
             "twice": [FakeEntryPoint("twice", GOOD), FakeEntryPoint("twice", "byo_tasks:LongerTests")],
             "mqar": [FakeEntryPoint("mqar", GOOD)]}
    monkeypatch.setattr(tasks, "entry_points", lambda: found)
    assert tasks.task_class("first_token").__name__ == "FirstToken"
    assert tasks.task_class("mqar") is tasks.TASKS["mqar"], "a built-in name wins"
    with pytest.raises(ValueError, match="registered by several packages"):
        tasks.task_class("twice")
    origins = tasks.task_origins()
    assert origins["first_token"] == f"entry point ({GOOD})" and origins["mqar"].startswith("built-in (ignored")


def test_the_real_entry_point_group_is_read(monkeypatch):
    seen = []
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: seen.append(group) or [])
    assert tasks.entry_points() == {} and seen == ["mixlab.tasks"]


def test_cli_checks_shows_trains_and_sweeps_a_plugin_task(capsys, tmp_path, one_torch_thread):
    code, out, _ = run_cli(capsys, "check-task", GOOD, "--set", "seq_len=8")
    assert code == 0 and out.startswith(f"check-task {GOOD}  [import path]") and "all 10 checks passed" in out
    code, out, _ = run_cli(capsys, "check-task", "byo_tasks:LongerTests")
    assert code == 1 and out.strip().endswith("FAILED: lengths")
    code, out, _ = run_cli(capsys, "tasks", "show", GOOD, "--set", "seq_len=6")
    assert code == 0 and "scored positions: 1" in out
    code, out, err = run_cli(capsys, "run", GOOD, "--set", "d_model=16", "--set", "n_heads=2", "--set", "n_layers=1",
                            "--set", "num_train=16", "--set", "num_test=8", "--set", "batch_size=8", "--steps", "2",
                            "--device", "cpu", "--out", str(tmp_path), "--no-progress")
    assert code == 0, err
    assert out.startswith(f"{GOOD} attention: acc ")
    spec = SweepSpec.from_dict({"name": "plugin", "tasks": [{"task": GOOD, "params": {"seq_len": 8}}],
                                "models": {"attn": {"mixer": "attention", "n_layers": 1, "d_model": 16, "n_heads": 2}}})
    assert spec.plan().runs[0].config.task == GOOD
