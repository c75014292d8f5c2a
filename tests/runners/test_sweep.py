import dataclasses
import json
import multiprocessing
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from mixlab.analysis.aggregate import grid_summary, load_sweep
from mixlab.core.records import ARCHIVE, archive_records, finished_hashes, read_record
from mixlab.runners.cli.main import main
from mixlab.runners.sweep import local_backend
from mixlab.runners.sweep.jobs import plan_jobs
from mixlab.runners.sweep.local_backend import JobOutOfMemory
from mixlab.runners.sweep.mad import mad_plan
from mixlab.runners.sweep.manifest import write_manifest
from mixlab.runners.sweep.plan import Resolver
from mixlab.runners.sweep.run import SweepOptions, run_sweep
from mixlab.runners.sweep.spec import SweepSpec, load_spec, preset_names
from mixlab.runners.train.config import config_hash

# A grid of tiny CPU runs (a fraction of a second each).
TINY = {
    "name": "tiny",
    "tasks": [{"task": "mqar", "params": {"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2}}],
    "models": {
        "attn": {"mixer": "attention", "n_layers": 1, "n_heads": 2, "mlp_hidden": 0},
        "conv": {"mixer": "attention", "n_layers": 1, "n_heads": 2, "mlp_hidden": 0, "qkv_conv": "static"},
    },
    "model_grid": {"d_model": [8, 16]},
    "train": {"steps": 3, "epochs": None, "batch_size": 8, "num_train": 16, "num_test": 8, "eval_every": 1,
              "device": "cpu"},
    "train_grid": {"lr": [1e-3, 1e-2]},
    "seeds": 2,
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny(**changes):
    return SweepSpec.from_dict({**TINY, **changes})


def records_by_hash(folder):
    return {p.stem: json.loads(p.read_text()) for p in (folder / "runs").glob("*.json")}


def metrics(folder):
    """hash -> (history, final) of every record: what must not change between a resumed and a clean sweep."""
    return {h: (r["history"], r["final"]) for h, r in records_by_hash(folder).items()}


@pytest.mark.parametrize(
    "changes,named",
    [
        ({"modles": {}}, "modles"),
        ({"tasks": [{"task": "mqar", "parms": {}}]}, "parms"),
        ({"tasks": [{"task": "mqr"}]}, "mqr"),
        ({"models": {"a": {"mixer": "attention", "dmodel": 8}}}, "dmodel"),
        ({"models": {"a": {"preset": "transfomer"}}}, "transfomer"),
        ({"train": {"lrr": 1e-3}}, "lrr"),
        ({"train": {"init_seed": 3}}, "init_seed"),
        ({"train_grid": {"lr": 1e-3}}, "lr"),
        ({"model_grid": {"vocab_size": [8]}}, "vocab_size"),
        ({"seeds": 0}, "seeds"),
        ({"seeds": [1, 1]}, "seeds"),
        ({"metric": "loss"}, "loss"),
        ({"train_grid": {"lr": ["fast"]}}, "fast"),
        ({"reference": {"sorce": "paper"}}, "sorce"),
        ({"reference": {"values": [{"task": "mqar", "model": "atn", "value": 1.0}]}}, "atn"),
        ({"reference": {"values": [{"task": "mqar", "model": "attn", "value": "high"}]}}, "high"),
    ],
    ids=["top-level-typo", "task-entry-typo", "unknown-task", "model-field-typo", "unknown-preset",
         "train-field-typo", "seed-field-in-train", "grid-not-a-list", "task-fixed-model-field", "zero-seeds",
         "repeated-seed", "unknown-metric", "text-for-a-number", "reference-typo", "reference-unknown-model",
         "reference-text-value"],
)
def test_spec_rejects_bad_input_naming_it(changes, named):
    with pytest.raises(ValueError, match=named):
        tiny(**changes)


@pytest.mark.parametrize(
    "yaml_text,message",
    [
        ("train: {lr: [1.0e-3]}", "train.lr must be a positive number, got [0.001]"),
        ("train_grid: {lr: [[1.0e-3]]}", "train_grid.lr must be a positive number, got [0.001]"),
        ("train_grid: {epochs: [many]}", "train_grid.epochs must be a positive integer, got 'many'"),
        ("tasks: [{task: mqar, params: {seq_len: [16]}}]",
         "tasks[0].params.seq_len must be a positive integer, got [16]"),
        ("tasks: [{task: mqar, grid: {num_kv_pairs: [[2]]}}]",
         "tasks[0].grid.num_kv_pairs must be a positive integer, got [2]"),
        ("tasks: [{task: mqar, train: {batch_size: 0}}]",
         "tasks[0].train.batch_size must be a positive integer, got 0"),
        ("models: {attn: {mixer: attention, d_model: [8]}}", "models.attn.d_model must be a positive integer, got [8]"),
        ("model_grid: {d_model: [wide]}", "model_grid.d_model must be a positive integer, got 'wide'"),
    ],
    ids=["train", "train_grid", "train_grid-text", "task-params", "task-grid", "task-train", "models",
         "model_grid"],
)
def test_a_bad_value_is_named_by_its_place_in_the_file(tmp_path, yaml_text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**TINY, **yaml.safe_load(yaml_text)}))
    with pytest.raises(ValueError) as info:
        load_spec(path)
    assert str(info.value) == message


def test_numbers_written_as_yaml_reads_them():
    grid = yaml.safe_load("lr: [1e-3, 1.0e-2]")
    assert grid["lr"][0] == "1e-3", "PyYAML reads 1e-3 as text"
    assert {r.config.train.lr for r in tiny(train_grid=grid).plan().runs} == {1e-3, 1e-2}


def test_bad_values_fail_at_planning_before_training():
    spec = tiny(models={"a": {"mixer": "attention", "n_heads": 3}})
    with pytest.raises(ValueError, match="n_heads"):
        spec.plan()
    with pytest.raises(ValueError, match="num_kv_pairs|seq_len"):
        tiny(tasks=[{"task": "mqar", "params": {"seq_len": 4, "num_kv_pairs": 8}}]).plan()


def test_expansion_counts_labels_and_seeds():
    spec = tiny(tasks=[{"task": "mqar", "params": {"vocab_size": 32, "seq_len": 16},
                        "grid": {"num_kv_pairs": [2, 3]}}], seeds=[0, 5])
    runs = spec.plan().runs
    assert len(runs) == 2 * 2 * 2 * 2 * 2 and len({r.hash for r in runs}) == len(runs)
    assert [r.meta["seed"] for r in runs] == [0] * 16 + [5] * 16, "seeds outermost"
    first = runs[0]
    assert first.meta == {"task": "mqar", "setting": "num_kv_pairs=2", "model": "attn",
                          "model_grid": {"d_model": 8}, "train_grid": {"lr": 1e-3}, "seed": 0}
    assert {(r.config.train.init_seed, r.config.train.data_seed) for r in runs} == {(0, 0), (5, 5)}
    fixed = tiny(vary_data_seed=False, train={**TINY["train"], "data_seed": 7}).plan().runs
    assert {(r.config.train.init_seed, r.config.train.data_seed) for r in fixed} == {(0, 7), (1, 7)}


def test_hash_is_of_the_resolved_config():
    implicit = tiny().plan().runs
    spelled_out = {k: {**v, "conv_width": 4, "rope_base": 10000.0, "init": "normal", "proj_bias": False}
                   for k, v in TINY["models"].items()}
    explicit = tiny(tasks=[{"task": "mqar", "params": {"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 2,
                                                       "power_a": 0.01}}], models=spelled_out)
    assert [r.hash for r in implicit] == [r.hash for r in explicit.plan().runs]
    other = tiny(tasks=[{"task": "mqar", "params": {"vocab_size": 32, "seq_len": 16, "num_kv_pairs": 3}}])
    assert not {r.hash for r in implicit} & {r.hash for r in other.plan().runs}
    config = implicit[0].config
    assert config.task_params["power_a"] == 0.01 and config.model["conv_width"] == 4
    assert "vocab_size" not in config.model, "the task fixes vocab_size"


REPO = Path(__file__).resolve().parents[2]
# Committed sweeps (grid and MAD): their records are found by these hashes, so planning must keep them.
COMMITTED = ["mqar_varlen/mqar_varlen_small", "packed/packed_small", "mad/transformer-paper"]


@pytest.mark.parametrize("sweep", COMMITTED, ids=COMMITTED)
def test_committed_runs_keep_their_hashes(sweep):
    """Planning a committed manifest's run again names it as before: fields that ModelConfig or a task gained
    since then (held at their defaults) stay out of the hashed config."""
    manifest = json.loads((REPO / "reproductions" / sweep / "sweep.json").read_text())
    for run in manifest["runs"][:3]:
        config = run["config"]
        again = Resolver().run(config["task"], config["task_params"], config["model"], config["train"])
        assert again.hash == config_hash(again.config) == run["hash"]


def test_added_fields_leave_the_resolved_config_at_their_default():
    """A field added after records existed (core.fields.added_field: ModelConfig.hyena_order, packed AR's
    query_share) is not in a resolved config while at its default, so those records keep their hashes; away
    from it, it is. The hash is the one of a committed packed_small record (reproductions/packed)."""
    packed = {"seq_len": 128, "min_doc_len": 8, "doc_len_median": 24, "max_doc_len": 64, "doc_len_sigma": 0.8,
              "num_keys": 16, "keys_per_doc": 4, "num_values": 4, "absent_prob": 0.5, "absent_key": "previous_last"}
    spec = {"name": "old", "tasks": [{"task": "packed/associative_retrieval", "params": packed}],
            "models": {"rubiconv": {"mixer": "rubiconv", "n_layers": 2}},
            "model_grid": [{"d_model": 64, "mlp_hidden": 176}],
            "train": {"steps": 1500, "epochs": None, "batch_size": 32, "num_train": 8192, "num_test": 512, "lr": 3e-3,
                      "beta2": 0.95, "weight_decay": 0.01, "schedule": "cosine_step", "warmup_steps": 100,
                      "eval_every": 250, "early_stop_acc": 0.999, "device": "cpu"},
            "seeds": 1}
    (old,) = SweepSpec.from_dict(spec).plan().runs
    assert old.hash == "0c6fb89d6d33"
    assert "hyena_order" not in old.config.model and "query_share" not in old.config.task_params
    spelled = {**spec, "tasks": [{"task": "packed/associative_retrieval", "params": {**packed, "query_share": 0.0}}],
               "models": {"rubiconv": {"mixer": "rubiconv", "n_layers": 2, "hyena_order": 2}}}
    assert SweepSpec.from_dict(spelled).plan().runs[0].hash == old.hash
    new = {**spec, "tasks": [{"task": "packed/associative_retrieval", "params": {**packed, "query_share": 0.5}}],
           "models": {"hyena": {"mixer": "hyena", "n_layers": 2, "hyena_order": 3}}}
    (run,) = SweepSpec.from_dict(new).plan().runs
    assert run.config.model["hyena_order"] == 3 and run.config.task_params["query_share"] == 0.5


def test_packaged_presets_load():
    assert {"smoke", "mqar_varlen_fig2"} <= set(preset_names())
    fig2 = load_spec("mqar_varlen_fig2")
    runs = fig2.plan().runs
    assert len(runs) == 3 * 4 * 3 * 5
    assert sorted({r.config.model["d_model"] for r in runs}) == [32, 64, 128, 256]
    assert {r.config.model["qkv_conv"] for r in runs} == {"none", "static", "dynamic_lowrank"}
    for run in runs:
        model, train = run.config.model, run.config.train
        assert (model["n_layers"], model["n_heads"], model["conv_width"], model["conv_rank"]) == (1, 1, 4, 16)
        assert train.num_train == 100_000 and run.config.task == "mqar_varlen"
    assert sorted({r.meta["seed"] for r in runs}) == [0, 1, 2, 3, 4]
    # its one-learning-rate third: the same runs (same record names), so their records serve both sweeps
    third = load_spec("mqar_varlen_fig2_lr1e-3").plan().runs
    assert len(third) == 60 and {r.config.train.lr for r in third} == {1e-3}
    assert {r.hash for r in third} == {r.hash for r in runs if r.config.train.lr == 1e-3}



def test_baselines_mqar_mid_is_part_of_baselines_mqar():
    """The GPU cut: lengths 64 and 128, widths 64-256, lr 3e-3, every mixer, 3 seeds; each of its runs is a run of
    the full preset (same record name), so its records count there."""
    mid = load_spec("baselines_mqar_mid").plan().runs
    assert len(mid) == 11 * 2 * 3 * 3
    assert sorted({r.config.task_params["seq_len"] for r in mid}) == [64, 128]
    assert sorted({r.config.model["d_model"] for r in mid}) == [64, 128, 256]
    assert {r.config.train.lr for r in mid} == {3e-3}
    full = {r.hash for r in load_spec("baselines_mqar").plan().runs}
    assert {r.hash for r in mid} <= full

def test_mad_init_ab_preset_is_the_protocol_with_three_inits():
    """mad_init_ab: 3 settings x 3 inits x 6 grid points x 3 seeds; its mad-lab-init runs are the paper
    profile's runs of those settings (same hashes, so records serve both); the other two arms are the same runs
    but for init and biases: mixlab's (N(0, 0.02), no biases), and PyTorch's default init with mad-lab's biases."""
    runs = load_spec("mad_init_ab").plan().runs
    assert len(runs) == 3 * 3 * 6 * 3
    paper = {r.hash: r for r in mad_plan("transformer", "paper", seeds=3).runs}
    labels = ("mad_lab_init", "mixlab_init", "torch_default_init")
    by_model = {label: [r for r in runs if r.meta["model"] == label] for label in labels}
    settings = {(paper[r.hash].meta["task"], paper[r.hash].meta["setting"]) for r in by_model["mad_lab_init"]}
    assert settings == {("mad/in_context_recall", "vocab_size=64"), ("mad/in_context_recall", "num_train=800"),
                        ("mad/noisy_recall", "vocab_size=80")}
    arms = {"mixlab_init": {}, "torch_default_init": {"init": "torch_linear", "proj_bias": True}}
    for mad_lab, *others in zip(*by_model.values(), strict=True):
        assert mad_lab.hash in paper and mad_lab.config.model["proj_bias"] is True
        assert "init" not in mad_lab.config.model, "the default init, N(0, 0.02)"
        for other, label in zip(others, labels[1:], strict=True):
            assert other.hash not in paper
            assert other.config.train == mad_lab.config.train
            assert other.config.task_params == mad_lab.config.task_params
            same = {k: v for k, v in mad_lab.config.model.items() if k != "proj_bias"}
            assert other.config.model == {**same, **arms[label]}


def test_yaml_file_and_unknown_preset(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(TINY))
    assert load_spec(path) == tiny()
    with pytest.raises(ValueError, match="no-such-preset"):
        load_spec("no-such-preset")
    path.write_text("name: [unclosed")
    with pytest.raises(ValueError, match="YAML"):
        load_spec(path)


def test_a_folder_named_like_a_preset_does_not_hide_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smoke").mkdir()  # e.g. the sweep's own output folder
    assert load_spec("smoke").name == "smoke"
    (tmp_path / "smoke.yaml").write_text(yaml.safe_dump(TINY))
    assert load_spec("smoke.yaml") == tiny()


def test_resume_skips_finished_runs(tmp_path):
    plan = tiny(seeds=1).plan()
    first = run_sweep(plan, tmp_path, SweepOptions(limit=3, progress=False))
    assert (first.total, first.skipped, first.ran) == (8, 0, 3)
    before = records_by_hash(tmp_path)
    assert set(before) == {r.hash for r in plan.runs[:3]}
    second = run_sweep(plan, tmp_path, SweepOptions(progress=False))
    assert (second.skipped, second.ran) == (3, 5)
    after = records_by_hash(tmp_path)
    assert set(after) == {r.hash for r in plan.runs}
    assert all(after[h] == before[h] for h in before), "finished records are not rerun"
    assert run_sweep(plan, tmp_path, SweepOptions(progress=False)).ran == 0


def test_an_archived_sweep_reads_as_before_and_goes_on_over_its_archive(tmp_path):
    """mixlab archive packs the records into runs/records.jsonl.xz: the report's data, the finished runs and each
    record read as from the files; a sweep run again trains only the missing runs and writes them beside the
    archive; archiving again merges them; the same records give the same bytes."""
    plan = tiny(seeds=1).plan()
    folder = tmp_path / "sweep"
    run_sweep(plan, folder, SweepOptions(limit=3, progress=False))
    (folder / "runs" / "notes.json").write_text(json.dumps({"note": "not a record"}))
    twin = shutil.copytree(folder, tmp_path / "twin")
    before, data = records_by_hash(folder), load_sweep(folder)
    del before["notes"]
    assert archive_records(folder) == (3, 3)
    assert sorted(p.name for p in (folder / "runs").iterdir()) == sorted(["notes.json", ARCHIVE])
    assert finished_hashes(folder) == set(before)
    assert all(read_record(folder / "runs", h) == before[h] for h in before)
    archived = load_sweep(folder)
    assert archived.records == data.records and archived.rows == data.rows
    archive_records(twin)
    assert (twin / "runs" / ARCHIVE).read_bytes() == (folder / "runs" / ARCHIVE).read_bytes()
    assert run_sweep(plan, folder, SweepOptions(progress=False)).ran == 5
    assert set(records_by_hash(folder)) == {r.hash for r in plan.runs} - set(before) | {"notes"}
    assert archive_records(folder) == (5, 8)
    assert finished_hashes(folder) == {r.hash for r in plan.runs}
    assert len(load_sweep(folder).records) == 8
    assert run_sweep(plan, folder, SweepOptions(progress=False)).ran == 0


def test_manifest_refuses_another_sweep_and_keeps_seeds(tmp_path):
    write_manifest(tmp_path, tiny().plan(seeds=[0]))
    write_manifest(tmp_path, tiny().plan(seeds=[1]))
    manifest = json.loads((tmp_path / "sweep.json").read_text())
    assert len(manifest["runs"]) == 16 and {r["meta"]["seed"] for r in manifest["runs"]} == {0, 1}
    assert manifest["spec"]["seeds"] == [0, 1]
    with pytest.raises(ValueError, match="different sweep"):
        write_manifest(tmp_path, tiny(train_grid={"lr": [3e-3]}).plan())
    # the words around a sweep (description, the paper's values) may change; the runs stay the same sweep
    reference = {"source": "a paper", "values": [{"task": "mqar", "model": "conv", "note": "> 90%"}]}
    write_manifest(tmp_path, tiny(description="new words", reference=reference).plan(seeds=[0]))
    assert json.loads((tmp_path / "sweep.json").read_text())["spec"]["reference"]["source"] == "a paper"


def test_manifest_of_a_mad_profile_survives_reworded_summaries(tmp_path):
    """A MAD profile's summary (and the paragraph made from it) are words: a folder written before they were
    reworded still resumes; a changed number in the profile is another sweep."""
    plan = mad_plan("transformer", "smoke", device="cpu")
    write_manifest(tmp_path, plan)
    path = tmp_path / "sweep.json"
    manifest = json.loads(path.read_text())
    manifest["spec"]["profile"]["summary"] = "older words"
    manifest["spec"]["profile_text"] = "older paragraph"
    path.write_text(json.dumps(manifest))
    write_manifest(tmp_path, plan)
    manifest["spec"]["profile"]["max_epochs"] = 3
    path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="different sweep"):
        write_manifest(tmp_path, plan)


def test_tasks_option_trains_only_those_tasks(tmp_path):
    spec = tiny(seeds=1, tasks=[*TINY["tasks"], {"task": "mad/in_context_recall", "params": {"seq_len": 16}}])
    plan = spec.plan()
    with pytest.raises(ValueError, match="'mad/bogus'"):
        run_sweep(plan, tmp_path, SweepOptions(tasks=["mad/bogus"], progress=False))
    first = run_sweep(plan, tmp_path, SweepOptions(tasks=["mqar"], progress=False))
    assert first.ran == 8 and {r["config"]["task"] for r in records_by_hash(tmp_path).values()} == {"mqar"}
    assert load_sweep(tmp_path).missing == 8, "the manifest keeps the whole plan"
    assert run_sweep(plan, tmp_path, SweepOptions(progress=False)).ran == 8


def test_models_option_trains_only_those_models(tmp_path):
    plan = tiny(seeds=1).plan()
    with pytest.raises(ValueError, match="model 'bogus' is not in this sweep; its models: attn, conv"):
        run_sweep(plan, tmp_path, SweepOptions(models=["bogus"], progress=False))
    first = run_sweep(plan, tmp_path, SweepOptions(models=["conv"], progress=False))
    trained = records_by_hash(tmp_path).values()
    assert first.ran == 4 and {r["config"]["model"].get("qkv_conv") for r in trained} == {"static"}
    assert run_sweep(plan, tmp_path, SweepOptions(models=["conv"], progress=False)).ran == 0
    assert run_sweep(plan, tmp_path, SweepOptions(progress=False)).ran == 4


def test_settings_option_trains_only_those_settings(tmp_path):
    task = {"task": "mqar", "params": {"vocab_size": 32, "num_kv_pairs": 2}, "grid": {"seq_len": [16, 24]}}
    plan = tiny(seeds=1, tasks=[task]).plan()
    with pytest.raises(ValueError, match="setting 'seq_len=99' is not in this sweep; its settings: seq_len=16, "
                                         "seq_len=24"):
        run_sweep(plan, tmp_path, SweepOptions(settings=["seq_len=99"], progress=False))
    assert run_sweep(plan, tmp_path, SweepOptions(settings=["seq_len=24"], progress=False)).ran == 8
    assert {r["config"]["task_params"]["seq_len"] for r in records_by_hash(tmp_path).values()} == {24}
    assert run_sweep(plan, tmp_path, SweepOptions(progress=False)).ran == 8


def out_of_memory_once(job, runs_dir, engine):
    """A worker whose target job (named in <out>/oom-target) runs out of memory on its first try, or on every
    try when <out>/oom-always exists."""
    out = Path(runs_dir).parent
    if job.hashes[0] == (out / "oom-target").read_text():
        tried = out / "oom-tried"
        if (out / "oom-always").exists() or not tried.exists():
            tried.touch()
            raise JobOutOfMemory("CUDA out of memory. Tried to allocate 9.00 GiB (test)")
    return local_backend.run_in_worker(job, runs_dir, engine)


def stubborn_or_quick(job, runs_dir, engine):
    """A worker whose target job (named in <out>/stubborn) ignores SIGTERM and sleeps, after saying so in
    <out>/ignoring; the others wait for that, then return having trained nothing."""
    out = Path(runs_dir).parent
    if job.hashes[0] == (out / "stubborn").read_text():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        (out / "ignoring").touch()
        time.sleep(60)
    while not (out / "ignoring").exists():
        time.sleep(0.05)
    return 0


def test_a_worker_that_does_not_stop_is_killed_after_the_grace_period_and_said_so(monkeypatch, tmp_path, capsys):
    jobs = plan_jobs(tiny(seeds=1).plan().runs, 8)
    (tmp_path / "stubborn").write_text(jobs[0].hashes[0])
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    # long enough for the quick worker to exit on SIGTERM on a loaded 2-core machine (at 1 s it once did not)
    monkeypatch.setattr(local_backend, "STOP_GRACE_S", 5.0)

    def stop(job, trained):
        raise KeyboardInterrupt  # as a Ctrl-C once the first job is done

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        local_backend.run_pool(jobs, runs_dir, 2, {}, stop, lambda: True, run=stubborn_or_quick)
    assert time.monotonic() - started < 50, "the stubborn worker was not killed"
    assert "1 of 2 workers had not stopped 5 s after the stop and were killed" in capsys.readouterr().out


def test_a_worker_reports_out_of_memory_in_one_line(monkeypatch, tmp_path):
    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.50 GiB.\nthe allocator's advice")

    monkeypatch.setattr(local_backend, "run_job", out_of_memory)
    job = plan_jobs(tiny(seeds=1).plan().runs, 8)[0]
    with pytest.raises(JobOutOfMemory) as caught:
        local_backend.run_in_worker(job, str(tmp_path), {"batch": True})
    assert str(caught.value) == "CUDA out of memory. Tried to allocate 4.50 GiB."


@pytest.mark.parametrize("always", [False, True], ids=["once", "always"])
def test_a_job_out_of_memory_beside_others_runs_again_alone(tmp_path, always):
    jobs = plan_jobs(tiny(seeds=1).plan().runs, 8)
    assert len(jobs) == 4
    (tmp_path / "oom-target").write_text(jobs[0].hashes[0])
    if always:
        (tmp_path / "oom-always").touch()
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    done = []

    def pool():
        local_backend.run_pool(jobs, runs_dir, 2, {"batch": True, "speed": "eager"},
                               lambda job, trained: done.append((job, trained)), lambda: True,
                               run=out_of_memory_once)

    if always:
        with pytest.raises(JobOutOfMemory, match="Tried to allocate 9.00 GiB"):
            pool()
        assert sorted(job.hashes for job, _ in done) == sorted(job.hashes for job in jobs[1:]), \
            "the others finished first; alone, it failed again"
        assert not set(jobs[0].hashes) & finished_hashes(tmp_path)
        return
    pool()
    assert done[-1][0] == jobs[0], "run again after the others"
    assert sorted(job.hashes for job, _ in done) == sorted(job.hashes for job in jobs)
    assert all(trained == 2 for _, trained in done)
    assert finished_hashes(tmp_path) == {h for job in jobs for h in job.hashes}


SCRIPT = """
import sys
from mixlab.runners.sweep.run import SweepOptions, run_sweep
from mixlab.runners.sweep.spec import SweepSpec
spec = SweepSpec.from_dict({spec!r})
run_sweep(spec.plan(), sys.argv[1], SweepOptions(workers={workers}, progress=False))
"""


def start_sweep(folder, spec, workers=1):
    return subprocess.Popen([sys.executable, "-c", SCRIPT.format(spec=spec, workers=workers), str(folder)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def wait_for_records(proc, folder, n=1):
    """Until the sweep has written ``n`` records; fails if the sweep ends first (it always ends, so this does)."""
    while True:
        ended = proc.poll() is not None  # before counting: a sweep that wrote its records and ended passes
        if len(list((folder / "runs").glob("*.json"))) >= n:
            return
        assert not ended, f"sweep ended before {n} records: {proc.stderr.read().decode()[-2000:]}"
        time.sleep(0.01)


def test_kill_9_mid_sweep_loses_nothing(tmp_path):
    spec = {**TINY, "seeds": 1, "train": {**TINY["train"], "steps": 6}}
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    proc = start_sweep(killed, spec)
    wait_for_records(proc, killed)
    proc.kill()  # SIGKILL: no cleanup runs
    proc.wait()
    plan = SweepSpec.from_dict(spec).plan()
    partial = records_by_hash(killed)  # every *.json parses: no half-written record
    assert 1 <= len(partial) < len(plan.runs)
    assert set(partial) <= {r.hash for r in plan.runs}

    resumed = run_sweep(plan, killed, SweepOptions(progress=False))
    assert resumed.skipped == len(partial) and resumed.ran == len(plan.runs) - len(partial)
    assert sorted(p.stem for p in (killed / "runs").glob("*.json")) == sorted(r.hash for r in plan.runs)
    assert {h: r for h, r in records_by_hash(killed).items() if h in partial} == partial

    run_sweep(plan, clean, SweepOptions(progress=False))
    assert metrics(killed) == metrics(clean)
    assert grid_summary(load_sweep(killed)) == grid_summary(load_sweep(clean))


def process_state(pid):
    """(parent pid, state letter, start time in clock ticks) of a process from /proc, or None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), fields[0], int(fields[19])


def children(pid, command=""):
    """{pid: start time} of the processes whose parent is ``pid`` and whose command line holds ``command``."""
    found = {}
    for entry in Path("/proc").iterdir():
        state = process_state(entry.name) if entry.name.isdigit() else None
        if state and state[0] == pid and command.encode() in read_bytes(entry / "cmdline"):
            found[int(entry.name)] = state[2]
    return found


def read_bytes(path):
    try:
        return path.read_bytes()
    except OSError:
        return b""


def running(processes):
    """Those of ``processes`` ({pid: start time}) that still run: neither gone nor a zombie, and not a new
    process that reuses the pid."""
    return [pid for pid, start in processes.items()
            if (state := process_state(pid)) and state[2] == start and state[1] != "Z"]


def wait_for_exit(processes, guard_s=600.0):
    """Block until every one of ``processes`` has exited: each pid's pidfd becomes readable when it does (an
    event from the kernel, no polling). ``guard_s`` only turns a process that never exits into a failure
    instead of a hung test."""
    for pid in running(processes):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            ready, _, _ = select.select([fd], [], [], guard_s)
        finally:
            os.close(fd)
        assert ready, f"process {pid} never exited"


@pytest.mark.skipif(not Path("/proc/self/stat").exists() or not hasattr(os, "pidfd_open"),
                    reason="reads child processes from /proc, waits on pidfds")
def test_pool_stops_on_ctrl_c_and_on_kill_9_and_resumes(tmp_path):
    spec = {**TINY, "seeds": 2, "train": {**TINY["train"], "steps": 8}}
    plan = SweepSpec.from_dict(spec).plan()
    folder, clean = tmp_path / "interrupted", tmp_path / "clean"

    proc = start_sweep(folder, spec, workers=2)
    wait_for_records(proc, folder)
    workers = children(proc.pid, "spawn_main")  # the pool's workers, not the resource tracker
    assert workers
    proc.send_signal(signal.SIGINT)
    assert proc.wait() != 0, "stopped by Ctrl-C, not finished"
    assert not running(workers), "Ctrl-C stopped the workers before the sweep exited: no record comes later"
    done = finished_hashes(folder)
    assert 1 <= len(done) < len(plan.runs) and set(records_by_hash(folder)) == done, "every record is whole"

    proc = start_sweep(folder, spec, workers=2)
    wait_for_records(proc, folder, n=len(done) + 1)
    left_behind = children(proc.pid)  # the workers and the resource tracker
    proc.kill()
    proc.wait()
    wait_for_exit(left_behind)  # each notices its sweep is gone and exits
    done = finished_hashes(folder)
    assert set(records_by_hash(folder)) == done

    result = run_sweep(plan, folder, SweepOptions(workers=2, progress=False))
    assert (result.skipped, result.ran) == (len(done), len(plan.runs) - len(done))
    run_sweep(plan, clean, SweepOptions(progress=False))
    assert metrics(folder) == metrics(clean), "runs in worker processes give the in-process results"


def test_bad_runner_arguments(tmp_path):
    with pytest.raises(ValueError, match="workers"):
        run_sweep(tiny().plan(), tmp_path, SweepOptions(workers=0))
    with pytest.raises(ValueError, match="limit"):
        run_sweep(tiny().plan(), tmp_path, SweepOptions(limit=-1))
    with pytest.raises(ValueError, match="stop_after"):
        run_sweep(tiny().plan(), tmp_path, SweepOptions(stop_after=-1.0))
    with pytest.raises(ValueError, match="stop_after"):
        run_sweep(tiny().plan(), tmp_path, SweepOptions(stop_after=5, backend="ray"))


@pytest.mark.parametrize("workers", [1, 2])
def test_stop_after_starts_no_job_past_the_deadline_and_resumes(tmp_path, workers):
    plan = tiny(seeds=1).plan()
    past = run_sweep(plan, tmp_path, SweepOptions(workers=workers, stop_after=0, progress=False))
    assert (past.ran, past.not_started) == (0, 8) and not records_by_hash(tmp_path)
    rest = run_sweep(plan, tmp_path, SweepOptions(workers=workers, stop_after=600, progress=False))
    assert (rest.ran, rest.not_started) == (8, 0) and len(records_by_hash(tmp_path)) == 8


def test_smoke_preset_runs(tmp_path):
    plan = load_spec("smoke").plan(seeds=[0])
    result = run_sweep(plan, tmp_path, SweepOptions(progress=False))
    assert result.ran == len(plan.runs) == 12
    summary = grid_summary(load_sweep(tmp_path))
    assert {(r["model"], r["model_grid"]) for r in summary} == {
        (m, f"d_model={d}") for m in ("no_conv", "static_conv", "dynamic_conv") for d in (16, 32)}
    assert all(r["n"] == 1 and 0 <= r["median"] <= 1 for r in summary)


def test_packed_mq_small_runs_short_and_scores_each_query_kind(tmp_path):
    """The CPU-size packed preset cut to a few steps, as CI can afford it: every model (the two positive controls,
    the leaky twins, the order-1 convs) trains on both packed tasks through the sweep, and each retrieval record
    scores present-key and absent-key (NONE) queries apart."""
    spec = load_spec("packed_mq_small")
    short = dataclasses.replace(spec, train={**spec.train, "steps": 4, "num_train": 64, "num_test": 32,
                                             "eval_every": 2, "warmup_steps": 1}, train_grid=({"lr": 3e-3},))
    plan = short.plan(seeds=[0])
    result = run_sweep(plan, tmp_path, SweepOptions(progress=False))
    assert result.ran == len(plan.runs) == 10
    records = list(records_by_hash(tmp_path).values())
    assert {r["config"]["model"]["mixer"] for r in records} == set(spec.models)
    retrieval = [r for r in records if r["config"]["task"] == "packed/associative_retrieval"]
    assert len(retrieval) == 5
    for record in retrieval:
        assert all(0 <= record["final"][k] <= 1 for k in ("acc_present", "acc_absent")), record["name"]
        assert [h["step"] for h in record["history"]] == [2, 4]


def report_device(job, runs_dir, engine):
    """A worker that trains nothing and notes the device it sees, one file per job."""
    (Path(runs_dir) / f"{job.hashes[0]}.device").write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
    return 0


def test_workers_take_the_devices_round_robin():
    started = multiprocessing.get_context("spawn").Value("i", 0)
    assert [local_backend._take_device(["3", "5"], started) for _ in range(5)] == ["3", "5", "3", "5", "3"]


def test_pool_workers_see_only_their_device(tmp_path):
    jobs = plan_jobs(tiny(seeds=1).plan().runs, 8)
    local_backend.run_pool(jobs, tmp_path, 2, {"batch": True}, lambda job, trained: None, lambda: True,
                           run=report_device, device_ids=["5", "7"])
    seen = [p.read_text() for p in tmp_path.glob("*.device")]
    assert len(seen) == len(jobs) and set(seen) <= {"5", "7"}


def log_start_and_meet(job, runs_dir, engine):
    """A worker that trains nothing: it logs the job and its device, then waits until a job has started on each
    of the pool's two devices (so neither worker can take every job before the other one starts)."""
    folder, device = Path(runs_dir), os.environ["CUDA_VISIBLE_DEVICES"]
    with open(folder / "starts.log", "a") as log:
        log.write(f"{job.hashes[0]} {device}\n")
    (folder / f"device-{device}").touch()
    deadline = time.monotonic() + 60
    while len(list(folder.glob("device-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    return 0


def test_the_pool_starts_the_longest_jobs_first_on_every_device(tmp_path):
    """Four jobs of 1 to 4 steps a run on two (fake) devices, one worker each: the two longest start first, one on
    each device, and the others follow longest first."""
    spec = tiny(seeds=1)
    jobs = [job for steps in (1, 4, 2, 3)
            for job in plan_jobs(dataclasses.replace(spec, train={**spec.train, "steps": steps}).plan().runs[:1], 8)]
    assert [job.tokens for job in local_backend.start_order(jobs)] == sorted((job.tokens for job in jobs),
                                                                              reverse=True)
    local_backend.run_pool(jobs, tmp_path, 2, {"batch": True}, lambda job, trained: None, lambda: True,
                           run=log_start_and_meet, device_ids=["5", "7"])
    started = [line.split() for line in (tmp_path / "starts.log").read_text().splitlines()]
    longest = [job.hashes[0] for job in local_backend.start_order(jobs)]
    assert {h for h, _ in started[:2]} == set(longest[:2]) and [h for h, _ in started[2:]] == longest[2:]
    assert {device for _, device in started[:2]} == {"5", "7"}, "the first two jobs run on the two devices at once"


def test_cuda_devices_all_names_every_visible_device(tmp_path, monkeypatch, capsys):
    """``--cuda-devices all`` is every device this process sees (three, faked here); the sweep's workers go
    round-robin to them. Seeing none, it is refused in one line."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pools = []
    monkeypatch.setattr(local_backend, "run_pool", lambda jobs, runs_dir, workers, engine, job_done, may_start,
                        device_ids=None: pools.append((workers, device_ids)))
    spec = tmp_path / "tiny.yaml"
    spec.write_text(json.dumps(TINY))
    main(["sweep", str(spec), "--out", str(tmp_path / "out"), "--cuda-devices", "all", "--workers", "3",
          "--no-progress"])
    assert pools == [(3, ["0", "1", "2"])]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(SystemExit) as refused:
        main(["sweep", str(spec), "--out", str(tmp_path / "out"), "--cuda-devices", "all", "--workers", "3"])
    assert refused.value.code == 2 and "--cuda-devices all: this process sees no CUDA device" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="maps indices without a GPU to count them")
def test_device_indices_map_through_this_process_visible_devices(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert local_backend.visible_device_ids([0, 3]) == ["0", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert local_backend.visible_device_ids([1]) == ["6"]
    with pytest.raises(ValueError, match=r"does not see \(2 visible\)"):
        local_backend.visible_device_ids([2])


@pytest.mark.parametrize("kwargs,named", [
    ({"cuda_devices": [0, 0], "workers": 2}, "distinct"),
    ({"cuda_devices": [-1], "workers": 2}, "non-negative"),
    ({"cuda_devices": [], "workers": 2}, "cuda_devices"),
    ({"cuda_devices": [0, 1], "workers": 1}, "workers=1 cannot cover 2"),
    ({"cuda_devices": [0], "workers": 1, "backend": "ray"}, "local backend"),
], ids=["repeated", "negative", "empty", "too-few-workers", "ray"])
def test_bad_cuda_devices_are_refused_before_anything_runs(tmp_path, kwargs, named):
    with pytest.raises(ValueError, match=named):
        run_sweep(tiny(seeds=1).plan(), tmp_path / "out", SweepOptions(progress=False, **kwargs))
    assert not (tmp_path / "out").exists()
