"""The Ray backend on a real Ray instance started here (one node, 2 CPUs, no GPU): the local backend's
records, a worker killed mid-run whose job is retried without a duplicate, errors, and Ray as an optional
extra."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import ray
import torch
from mixlab.runners.cli.main import main
from mixlab.runners.sweep.jobs import plan_jobs
from mixlab.runners.sweep.ray_backend import RayOptions, job_resources, store_records
from mixlab.runners.sweep.run import SweepOptions, run_sweep
from mixlab.runners.sweep.spec import SweepSpec

# vmap of CPU attention loops over the runs (no batching rule for the CPU flash kernel): slower, same numbers.
pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop because we have not yet")

LAYER = {"mixer": "attention", "n_layers": 1, "n_heads": 2, "mlp_hidden": 32, "d_model": 16}
# 2 models x 2 learning rates x 2 seeds = 8 runs of 10 steps; with max_stack 2, four jobs of two runs.
GRID = {
    "name": "ray",
    "tasks": [{"task": "mqar", "params": {"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2}}],
    "models": {"attn": LAYER, "conv": {**LAYER, "qkv_conv": "static"}},
    "train": {"steps": 10, "epochs": None, "batch_size": 8, "num_train": 32, "num_test": 16, "eval_every": 5,
              "device": "cpu"},
    "train_grid": {"lr": [1e-3, 1e-2]},
    "seeds": 2,
}
MAX_STACK = 2
# The step of a job's stack at which a worker stops to be killed (of 10).
KILL_AT_STEP = 4
# Fields that only say how long a run took.
TIME_FIELDS = ("wall_time_s", "train_time_s", "steps_per_s")


def records(folder):
    """hash -> record without its time fields, for every file of a sweep's runs folder (each must be one)."""
    return {p.stem: {k: v for k, v in json.loads(p.read_text()).items() if k not in TIME_FIELDS}
            for p in (folder / "runs").iterdir()}


def kill_point(trigger, driver, at_step=KILL_AT_STEP):
    """A Ray worker setup hook. Once ``<trigger>/armed`` exists, a job's stack reaching step ``at_step``
    writes ``<trigger>/<pid>.pid`` and waits until ``<trigger>/killed`` exists (or the test process ``driver``
    is gone): the test kills one such worker, then lets the others, and the retried job, go on."""

    def install():
        import os
        import time
        from pathlib import Path

        def driver_alive():
            try:
                os.kill(driver, 0)
            except ProcessLookupError:
                return False
            return True

        import mixlab.runners.train.engine as engine

        folder = Path(trigger)
        step = engine._Stack.step

        def step_or_wait(self, *args, **kwargs):
            self.steps_taken = getattr(self, "steps_taken", 0) + 1
            armed = (folder / "armed").exists() and not (folder / "killed").exists()
            if self.steps_taken == at_step and armed:
                pid = os.getpid()
                (folder / f".{pid}").write_text(str(pid))
                os.replace(folder / f".{pid}", folder / f"{pid}.pid")
                while not (folder / "killed").exists() and driver_alive():
                    time.sleep(0.02)
            return step(self, *args, **kwargs)

        engine._Stack.step = step_or_wait

    return install


@pytest.fixture(scope="module")
def trigger(tmp_path_factory):
    return tmp_path_factory.mktemp("kill_point")


@pytest.fixture(scope="module")
def local_ray(trigger):
    """A one-node Ray instance started on this machine for the module's tests, shut down after them. (Ray
    binds the machine's address, not 127.0.0.1: it replaces a loopback ``_node_ip_address`` on purpose.)"""
    with pytest.MonkeyPatch.context() as env:
        # no usage reporting, and no token file in the home folder for a throwaway loopback instance
        env.setenv("RAY_USAGE_STATS_ENABLED", "0")
        env.setenv("RAY_AUTH_MODE", "disabled")
        env.delenv("RAY_ADDRESS", raising=False)
        ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, object_store_memory=200 * 1024**2,
                 log_to_driver=False, logging_level="ERROR",
                 runtime_env={"worker_process_setup_hook": kill_point(str(trigger), os.getpid())})
        try:
            yield
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory):
    """The sweep's records from the local backend, torch on one thread as in the Ray tasks."""
    folder = tmp_path_factory.mktemp("local")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_sweep(SweepSpec.from_dict(GRID).plan(), folder, SweepOptions(progress=False, max_stack=MAX_STACK))
    finally:
        torch.set_num_threads(threads)
    reference = records(folder)
    assert len(reference) == 8 and len({json.dumps(r["history"]) for r in reference.values()}) == 8
    return reference


def test_ray_backend_equals_local_backend(tmp_path, capsys, local_ray, local_reference):
    spec = tmp_path / "ray.yaml"
    spec.write_text(json.dumps(GRID))  # JSON is YAML
    out = tmp_path / "out"
    argv = ["sweep", str(spec), "--out", str(out), "--backend", "ray", "--max-stack", str(MAX_STACK),
            "--no-progress"]
    main(argv)
    assert "8 runs: 0 already done, 8 run now" in capsys.readouterr().out
    assert records(out) == local_reference, "every field but time: the driver's argv, the worker's device"
    main(argv)
    assert "8 runs: 8 already done, 0 run now" in capsys.readouterr().out


def test_killed_worker_job_is_retried_without_duplicates(tmp_path, trigger, local_ray, local_reference):
    killed, sweep_over = [], threading.Event()

    def kill_first_waiting_worker():
        try:  # a worker waits at the kill point until "killed" exists, so the sweep cannot end before this
            while not (waiting := sorted(trigger.glob("*.pid"))) and not sweep_over.is_set():
                time.sleep(0.02)
            if waiting:
                pid = int(waiting[0].read_text())
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        finally:
            (trigger / "killed").touch()  # the other waiting workers, and the retried job, go on

    (trigger / "armed").touch()
    killer = threading.Thread(target=kill_first_waiting_worker, daemon=True)
    killer.start()
    try:
        result = run_sweep(SweepSpec.from_dict(GRID).plan(), tmp_path,
                           SweepOptions(progress=False, backend="ray", max_stack=MAX_STACK))
    finally:
        sweep_over.set()
        killer.join()
        (trigger / "armed").unlink()
    assert len(killed) == 1, "a worker stopped mid-run and was killed"
    with pytest.raises(ProcessLookupError):
        os.kill(killed[0], 0)
    assert (result.skipped, result.ran) == (0, 8)
    files = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert files == sorted(f"{h}.json" for h in local_reference), "one record per run, nothing else"
    assert records(tmp_path) == local_reference, "the retried job's runs equal the local backend's"


def test_training_error_in_a_task_stops_the_sweep_with_its_message(tmp_path, local_ray):
    with pytest.raises(ValueError, match="speed='cuda-graph' needs runs on a CUDA device"):
        run_sweep(SweepSpec.from_dict(GRID).plan(), tmp_path,
                  SweepOptions(progress=False, backend="ray", speed="cuda-graph"))
    assert not list((tmp_path / "runs").iterdir())


def test_cuda_runs_on_a_cluster_without_gpus_are_refused(tmp_path, local_ray):
    with pytest.raises(ValueError, match="device 'cuda'.*has none"):
        run_sweep(SweepSpec.from_dict(GRID).plan(device="cuda"), tmp_path, SweepOptions(progress=False, backend="ray"))


def job_on(device):
    (job,) = plan_jobs(SweepSpec.from_dict(GRID).plan(device=device).runs[:1])
    return job


@pytest.mark.parametrize(
    ("device", "cluster_gpus", "gpus"),
    [("cuda", 4, 0.5), ("auto", 4, 0.5), ("auto", 0, 0), ("cpu", 4, 0)],
    ids=["cuda", "auto-on-a-gpu-cluster", "auto-on-a-cpu-cluster", "cpu"],
)
def test_job_resources(device, cluster_gpus, gpus):
    options = RayOptions(cpus_per_job=3, gpus_per_job=0.5)
    assert job_resources(job_on(device), options, cluster_gpus) == {"num_cpus": 3, "num_gpus": gpus}


@pytest.mark.parametrize(
    ("fields", "named"),
    [({"cpus_per_job": 0}, "cpus_per_job"), ({"gpus_per_job": 0}, "gpus_per_job"),
     ({"gpus_per_job": 2}, "one GPU"), ({"max_retries": -1}, "max_retries")],
    ids=["no-cpus", "no-gpus", "two-gpus", "negative-retries"],
)
def test_bad_ray_options_name_the_value(fields, named):
    with pytest.raises(ValueError, match=named):
        RayOptions(**fields)


def test_driver_writes_each_record_once(tmp_path, monkeypatch):
    job = job_on("cpu")
    (name,) = job.hashes
    monkeypatch.setattr(sys, "argv", ["mixlab", "sweep", "grid.yaml", "--backend", "ray"])
    returned = {"name": name, "final": {"acc_micro": 0.5}, "argv": ["default_worker.py"]}
    assert store_records([returned], job, tmp_path) == 1
    written = json.loads((tmp_path / f"{name}.json").read_text())
    assert written == {**returned, "argv": ["mixlab", "sweep", "grid.yaml", "--backend", "ray"]}
    assert store_records([{**returned, "final": {"acc_micro": 0.9}}], job, tmp_path) == 0
    assert json.loads((tmp_path / f"{name}.json").read_text()) == written, "a record is never overwritten"
    with pytest.raises(ValueError, match="not one of its runs"):
        store_records([{**returned, "name": "0123456789ab"}], job, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [f"{name}.json"]


NO_RAY = """
import sys
from mixlab.runners.cli import main as cli
assert "ray" not in sys.modules, "importing the CLI imported ray"
sys.modules["ray"] = None  # `import ray` now fails as it does without the package
for argv in sys.argv[1:]:
    try:
        cli.main(argv.split())
    except SystemExit as exc:
        print(f"exit status {exc.code}")
"""


def test_without_ray_the_ray_backend_is_a_one_line_error(tmp_path):
    spec = tmp_path / "ray.yaml"
    spec.write_text(json.dumps(GRID))
    commands = [f"sweep {spec} --out {tmp_path / 'sweep'} --backend ray",
                f"mad run --model transformer --profile smoke --out {tmp_path / 'mad'} --backend ray"]
    proc = subprocess.run([sys.executable, "-c", NO_RAY, *commands], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert re.findall(r"^exit status (\d+)$", proc.stdout, re.M) == ["2", "2"], proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == ["mixlab: error: the ray backend needs Ray, which is not installed: "
                     "pip install 'mixlab[ray]'"] * 2
    assert [p.name for p in tmp_path.iterdir()] == ["ray.yaml"], "refused before anything is written"
