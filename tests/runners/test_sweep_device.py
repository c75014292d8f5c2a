"""Where a sweep trains is not what it is: a folder goes on on the CPU or a GPU under the names its runs were
planned with, a device that is not here fails before anything is written, and folders written by earlier code
(``data/old_sweeps``: the manifests and records of ``mixlab sweep data/old_sweeps/tiny_device.yaml``, once with the
default device, once with ``--device cuda`` on a machine without a GPU, which wrote only the manifest) still
open."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from cli_run import run_cli
from mixlab.runners.sweep.mad import mad_plan
from mixlab.runners.sweep.manifest import plan_for_folder, write_manifest
from mixlab.runners.sweep.spec import load_spec
from mixlab.runners.train.config import config_hash

OLD = Path(__file__).parent / "data" / "old_sweeps"
SPEC = str(OLD / "tiny_device.yaml")
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal of cuda on a machine without one")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def old_folder(tmp_path, which):
    folder = tmp_path / which
    shutil.copytree(OLD / which, folder)
    (folder / "runs").mkdir(exist_ok=True)
    return folder


def test_a_finished_folder_of_the_default_device_is_done_on_the_cpu(capsys, tmp_path):
    folder = old_folder(tmp_path, "auto")
    before = {p.name: p.read_bytes() for p in (folder / "runs").iterdir()}
    code, out, err = run_cli(capsys, "sweep", SPEC, "--device", "cpu", "--out", str(folder), "--no-progress")
    assert code == 0, err
    assert out.startswith("2 runs: 2 already done, 0 run now")
    assert {p.name: p.read_bytes() for p in (folder / "runs").iterdir()} == before


def test_a_folder_planned_for_cuda_trains_here_under_its_names(capsys, tmp_path):
    folder = old_folder(tmp_path, "cuda")
    manifest = json.loads((folder / "sweep.json").read_text())
    planned = {run["hash"] for run in manifest["runs"]}
    code, out, err = run_cli(capsys, "sweep", SPEC, "--device", "cpu", "--out", str(folder), "--no-progress")
    assert code == 0, err
    assert out.startswith("2 runs: 0 already done, 2 run now")
    records = {p.stem: json.loads(p.read_text()) for p in (folder / "runs").glob("*.json")}
    assert set(records) == planned
    assert {r["config"]["train"]["device"] for r in records.values()} == {"cpu"}, "a record says where it trained"
    after = json.loads((folder / "sweep.json").read_text())
    assert after["spec"]["device"] == "cuda", "the manifest keeps the device that names the runs"
    assert all(config_hash_of(run) == run["hash"] for run in after["runs"])
    code, out, _ = run_cli(capsys, "sweep", SPEC, "--out", str(folder), "--no-progress")
    assert code == 0 and out.startswith("2 runs: 2 already done, 0 run now")


def config_hash_of(manifest_run):
    from mixlab.runners.train.config import RunConfig

    return config_hash(RunConfig.from_dict(manifest_run["config"]))


@no_gpu
def test_cuda_without_a_gpu_fails_before_anything_is_written(capsys, tmp_path):
    folder = tmp_path / "new"
    code, _, err = run_cli(capsys, "sweep", SPEC, "--device", "cuda", "--out", str(folder), "--no-progress")
    assert code == 2 and "torch sees no CUDA device" in err and "nothing was written" in err
    assert not folder.exists()
    old = old_folder(tmp_path, "auto")
    before = (old / "sweep.json").read_bytes()
    code, _, err = run_cli(capsys, "mad", "run", "--model", "transformer", "--profile", "smoke", "--device", "cuda",
                          "--out", str(tmp_path / "mad"), "--no-progress")
    assert code == 2 and "torch sees no CUDA device" in err and not (tmp_path / "mad").exists()
    code, _, err = run_cli(capsys, "sweep", SPEC, "--device", "cuda", "--out", str(old), "--no-progress")
    assert code == 2 and (old / "sweep.json").read_bytes() == before


def test_a_run_moved_to_another_device_keeps_its_name():
    run = load_spec(SPEC).plan(device="cuda").runs[0].resolved
    moved = run.on_device("cpu")
    assert moved.hash == run.hash and moved.config.train.device == "cpu"
    assert moved.planned_config == run.config and moved.on_device("cuda").config == run.config
    assert moved.on_device("cuda").named_device is None
    assert moved.with_train(moved.config.train).hash == config_hash(moved.config), "other settings: a new run"


def test_plan_for_folder_names_runs_as_the_manifest_and_trains_them_where_asked(tmp_path):
    spec = load_spec(SPEC)
    assert plan_for_folder(lambda d: spec.plan(device=d), tmp_path, "cpu").spec["device"] == "cpu", "a new folder"
    write_manifest(tmp_path, spec.plan())
    plan = plan_for_folder(lambda d: spec.plan(device=d), tmp_path, "cpu")
    assert [r.hash for r in plan.runs] == [r.hash for r in spec.plan().runs]
    assert {r.config.train.device for r in plan.runs} == {"cpu"} and plan.spec["device"] is None
    mad = tmp_path / "mad"
    write_manifest(mad, mad_plan("transformer", "smoke", device="cuda"))
    moved = plan_for_folder(lambda d: mad_plan("transformer", "smoke", device=d or "auto"), mad, None)
    assert [r.hash for r in moved.runs] == [r.hash for r in mad_plan("transformer", "smoke", device="cuda").runs]
    assert {r.config.train.device for r in moved.runs} == {"auto"}


def test_another_sweep_in_the_folder_is_named_by_what_differs(tmp_path):
    write_manifest(tmp_path, load_spec(SPEC).plan())
    other = load_spec(SPEC).plan(seeds=[0])
    other.spec["models"]["attn"]["d_model"] = 16
    with pytest.raises(ValueError, match="holds a different sweep .*its models differ"):
        plan_for_folder(lambda d: other, tmp_path, None)
