"""What the runners leave on disk and say when they stop: output folders checked before training, write errors
as one line naming the file, files as readable as the umask allows, and Ctrl-C on a sweep as one line that
counts its records and gives the command that resumes it."""

import concurrent.futures
import errno
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from cli_run import one_error_line, run_cli
from mixlab import models
from mixlab.core.atomic import write_json_atomic
from mixlab.core.records import finished_hashes
from mixlab.runners.sweep import local_backend
from mixlab.runners.train import run as train

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY_RUN = ["mqar", "--set", "seq_len=32", "--set", "num_kv_pairs=4", "--set", "vocab_size=64", "--set",
            "d_model=16", "--set", "n_heads=2", "--set", "n_layers=1", "--set", "num_train=16", "--set",
            "num_test=8", "--set", "batch_size=8", "--steps", "3", "--device", "cpu", "--no-progress"]

# 24 tiny CPU runs, one per job: a sweep of a few seconds on two workers, with records early.
TINY_SWEEP = {
    "name": "tiny",
    "tasks": [{"task": "mqar", "params": {"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2}}],
    "models": {"attn": {"mixer": "attention", "n_layers": 1, "n_heads": 2, "mlp_hidden": 0},
               "conv": {"mixer": "attention", "n_layers": 1, "n_heads": 2, "mlp_hidden": 0, "qkv_conv": "static"}},
    "model_grid": {"d_model": [8, 16]},
    "train": {"steps": 30, "epochs": None, "batch_size": 8, "num_train": 16, "num_test": 8, "eval_every": 1,
              "device": "cpu"},
    "train_grid": {"lr": [1.0e-3, 1.0e-2]},
    "seeds": 3,
}


def refuse(*args, **kwargs):
    raise AssertionError("the work started before its output folder was checked")


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if a run starts to train (its model is built)."""
    monkeypatch.setattr(train, "initial_model", refuse)
    monkeypatch.setattr(local_backend, "run_jobs", refuse)


def bad_outputs(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    outs = {"file": (str(a_file), "is a file"), "under-a-file": (str(a_file / "sub"), "Not a directory")}
    if Path("/proc/self").is_dir():  # a place where no folder can be made
        outs["proc"] = ("/proc/mixlab-out", "No such file or directory")
    return outs


@pytest.mark.parametrize("kind", ["file", "under-a-file", "proc"])
def test_run_with_a_bad_out_fails_before_training_in_one_line(capsys, tmp_path, no_training, kind):
    if kind not in bad_outputs(tmp_path):
        pytest.skip("no /proc")
    out, reason = bad_outputs(tmp_path)[kind]
    code, _, err = run_cli(capsys, "run", *TINY_RUN, "--out", out, "--save")
    assert code == 2
    line = one_error_line(err)
    assert repr(out) in line and reason in line


def test_sweep_with_a_file_as_out_fails_before_training_in_one_line(capsys, tmp_path, no_training):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(TINY_SWEEP))
    out, reason = bad_outputs(tmp_path)["file"]
    for command in (["sweep", str(spec)], ["mad", "run", "--model", "transformer", "--profile", "smoke"]):
        code, _, err = run_cli(capsys, *command, "--out", out)
        assert code == 2 and repr(out) in one_error_line(err) and reason in err


def test_leakage_plot_in_a_bad_folder_fails_before_the_probes(capsys, tmp_path, monkeypatch):
    from mixlab.analysis import leakage

    monkeypatch.setattr(leakage, "probe_all", refuse)
    folder, reason = bad_outputs(tmp_path)["under-a-file"]
    code, _, err = run_cli(capsys, "leakage", "--mixer", "none", "--plot", f"{folder}/leakage.png")
    assert code == 2 and repr(folder) in one_error_line(err) and reason in err


def test_a_failed_write_is_one_line_naming_the_file(capsys, tmp_path, monkeypatch):
    def disk_full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)
    code, _, err = run_cli(capsys, "run", *TINY_RUN, "--out", str(tmp_path))
    assert code == 2
    line = one_error_line(err)
    assert re.fullmatch(rf"mixlab: error: {re.escape(str(tmp_path))}/mqar_attention_\w+\.json: No space left on "
                        "device", line), line
    assert list(tmp_path.iterdir()) == [], "no temporary file left behind"


@pytest.fixture(params=[0o022, 0o002, 0o077], ids=["022", "002", "077"])
def umask(request):
    before = os.umask(request.param)
    yield request.param
    os.umask(before)


def test_written_files_get_the_permissions_of_the_umask(tmp_path, umask):
    write_json_atomic(tmp_path / "record.json", {"a": 1})
    config = models.ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2, mlp_hidden=0, max_seq_len=8)
    models.save(models.build_model(config), tmp_path / "model.pt")
    for path in tmp_path.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path.name


def wait_until(condition, proc, what):
    """Poll ``condition`` until it holds; fail if ``proc`` ends first (a sweep always ends, so this does)."""
    while True:
        ended = proc.poll() is not None  # before the check: a sweep that got there and ended passes
        if condition():
            return
        assert not ended, f"the sweep ended before {what}: {proc.stderr.read().decode()[-2000:]}"
        time.sleep(0.02)


@pytest.mark.parametrize("whom", ["sweep-process", "process-group", "sigterm", "timeout"])
def test_ctrl_c_on_a_pool_sweep_is_one_line_with_the_resume_command(tmp_path, whom):
    spec, out = tmp_path / "tiny.yaml", tmp_path / "out"
    spec.write_text(yaml.safe_dump(TINY_SWEEP))
    args = ["sweep", str(spec), "--out", str(out), "--workers", "2", "--max-stack", "1", "--no-progress"]
    proc = subprocess.Popen([sys.executable, "-m", "mixlab.runners.cli.main", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            start_new_session=True)
    try:
        wait_until(lambda: finished_hashes(out), proc, "a record")
        if whom == "sweep-process":
            proc.send_signal(signal.SIGINT)
        elif whom == "sigterm":  # kill, timeout's default, a batch scheduler: as Ctrl-C
            proc.send_signal(signal.SIGTERM)
        elif whom == "timeout":  # `timeout -s INT`: the signal to the command, then to its whole group at once
            proc.send_signal(signal.SIGINT)
            os.killpg(proc.pid, signal.SIGINT)
        else:  # what Ctrl-C in a terminal does: every process of the foreground group gets SIGINT
            os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate()  # a sweep that ignored Ctrl-C ends too, with status 0
    finally:
        proc.kill()
    assert proc.returncode == 130
    done = len(finished_hashes(out))
    assert err.decode().splitlines() == [
        f"mixlab: interrupted: {done} of 24 runs have records, {24 - done} remain; resume with: mixlab "
        + " ".join(args)]
    assert 1 <= done < 24


def test_stop_signals_during_a_pool_wait_raise_once_between_waits():
    # `timeout -s INT` signals the command and then its group: two SIGINTs at once must end the wait with one
    # KeyboardInterrupt raised by the pool, not inside concurrent.futures' locks
    never = concurrent.futures.Future()
    before = {sig: signal.getsignal(sig) for sig in local_backend.STOP_SIGNALS}
    with local_backend._stop_requests() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            local_backend._wait_first([never], stop)
        assert stop.requested
    assert {sig: signal.getsignal(sig) for sig in local_backend.STOP_SIGNALS} == before
    done = concurrent.futures.Future()
    done.set_result(0)
    with local_backend._stop_requests() as stop:
        assert local_backend._wait_first([never, done], stop) == {done}


# Sends a second SIGINT at the n-th line the pool's stop handler runs (its callees' lines included), for each n:
# under load, timeout's second signal can land while the handler of its first still runs, which runs the handler
# again inside itself. Prints how many second signals were sent once every wait has raised.
NESTED_STOP_SIGNAL = r"""
import concurrent.futures, signal, sys
from mixlab.runners.sweep import local_backend

sent = 0
for n in range(1, 9):
    with local_backend._stop_requests() as stop:
        handler = signal.getsignal(signal.SIGINT)
        code, depth, lines = getattr(handler, "__func__", handler).__code__, 0, 0

        def trace_line(frame, event, arg):
            global depth, lines, sent
            if event == "line":
                lines += 1
                if lines == n:
                    sent += 1
                    signal.raise_signal(signal.SIGINT)
            elif event == "return":
                depth -= 1
            return trace_line

        def trace_call(frame, event, arg):
            global depth
            if depth or frame.f_code is code:
                depth += 1
                return trace_line
            return None

        sys.settrace(trace_call)
        signal.raise_signal(signal.SIGINT)
        sys.settrace(None)
        try:
            local_backend._wait_first([concurrent.futures.Future()], stop)
        except KeyboardInterrupt:
            pass
print(sent)
"""


def test_a_stop_signal_inside_the_stop_handler_does_not_hang_the_pool():
    # the pool's stop handler ran again inside itself (a second stop signal landing mid-handler) must not block:
    # a handler that took a lock (threading.Event.set) waited forever on the lock its first call held, so a
    # sweep on a busy GPU host ignored `timeout -s INT` until timeout killed it, its workers still training
    try:
        proc = subprocess.run([sys.executable, "-c", NESTED_STOP_SIGNAL], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("a second stop signal inside the stop handler hung the pool's wait")
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) >= 1  # the handler ran at least one line, where the second signal landed
