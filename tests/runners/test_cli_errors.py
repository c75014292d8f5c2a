"""Errors that name the real cause: a sweep folder whose ``runs/`` cannot be read, a negative length, a kernel
benchmark on a machine without a GPU. Each is one line and exit status 2."""

import errno
import os
import shutil
from pathlib import Path

import pytest
import torch
from cli_run import one_error_line, run_cli

OLD = Path(__file__).parent / "data" / "old_sweeps"


@pytest.fixture
def unreadable_runs(tmp_path, monkeypatch):
    """A finished sweep folder whose runs/ folder cannot be listed or searched, as after ``chmod 000 runs`` (the
    operating system's answers are made up here: the tests may run as root, whom no mode stops)."""
    folder = tmp_path / "sweep"
    shutil.copytree(OLD / "auto", folder)
    runs = str(folder / "runs")
    listdir, scandir, stat = os.listdir, os.scandir, os.stat

    def denied(path):
        return PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))

    def fake_listdir(path="."):
        if os.fspath(path) == runs:
            raise denied(path)
        return listdir(path)

    def fake_scandir(path="."):
        if os.fspath(path) == runs:
            raise denied(path)
        return scandir(path)

    def fake_stat(path, *args, **kwargs):
        if os.path.dirname(os.fspath(path)) == runs:
            raise denied(path)
        return stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "listdir", fake_listdir)
    monkeypatch.setattr(os, "scandir", fake_scandir)
    monkeypatch.setattr(os, "stat", fake_stat)
    return folder


@pytest.mark.parametrize("command", [["report"], ["claims"], ["sweep", str(OLD / "tiny_device.yaml"), "--out"]],
                         ids=["report", "claims", "sweep"])
def test_an_unreadable_runs_folder_is_named(capsys, unreadable_runs, command):
    code, _, err = run_cli(capsys, *command, str(unreadable_runs))
    line = one_error_line(err)
    assert code == 2
    assert line == f"mixlab: error: {unreadable_runs / 'runs'}: Permission denied"


@pytest.mark.parametrize("task", ["mqar", "mqar_varlen", "mad/in_context_recall", "mad/selective_copy"])
def test_a_negative_length_is_named_as_such(capsys, task):
    code, _, err = run_cli(capsys, "run", task, "--set", "seq_len=-5")
    assert code == 2
    assert one_error_line(err) == f"mixlab: error: {task}.seq_len must be a positive integer, got -5"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_bench_shortconv_without_a_gpu_says_it_needs_one(capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    code, out, err = run_cli(capsys, "bench", "shortconv", "--shape", "1,16,8,2")
    line = one_error_line(err)
    assert code == 2 and out == ""
    assert line.startswith("mixlab: error: bench shortconv times Triton kernels on a GPU, and torch sees no CUDA "
                           "device here")
