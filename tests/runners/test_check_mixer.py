"""``mixlab check-mixer`` and the commands that take a mixer name, driven with mixers from outside mixlab: the
example plugin (examples/mixlab-maxpool, installed by the README's test command, found through its entry
point; the tests that need it are marked ``example_plugin`` and skip without it) and the helper module
tests/models/byo_mixers.py (by import path)."""

import json
from pathlib import Path

import pytest
import yaml
from cli_run import run_cli
from mixlab import models
from mixlab.runners.check import check_mixer

HELPERS = Path(__file__).resolve().parents[1] / "models"  # byo_mixers.py, byo_broken_mixer.py
EXAMPLE = "gated_maxpool"


@pytest.fixture(autouse=True)
def helper_modules(monkeypatch):
    monkeypatch.syspath_prepend(str(HELPERS))


@pytest.mark.parametrize("mixer", [*models.MIXERS, *(pytest.param(name, id=name, marks=pytest.mark.example_plugin)
                                                    for name in (EXAMPLE, "mixlab_maxpool:GatedMaxPool"))])
def test_check_mixer_passes_registry_mixers_and_the_example(mixer, one_torch_thread):
    report = check_mixer(mixer, bench=False)
    assert report.passed, report.format()
    names = [c.name for c in report.checks]
    assert names[:7] == ["build", "shape", "dtype", "finite", "causality", "gradients", "determinism"]
    probes = [c for c in report.checks if c.name.startswith("leakage.")]
    assert len(probes) == 5
    judged = models.claims_document_blindness(models.resolve_mixer(mixer)(
        models.ModelConfig(vocab_size=16, d_model=32, n_heads=4, mixer=mixer), 0))
    assert all((c.passed is True) if judged else (c.passed is None) for c in probes)
    assert report.bench == ()


@pytest.mark.example_plugin
def test_check_mixer_cli_reports_and_benchmarks_the_example(capsys, one_torch_thread):
    code, out, err = run_cli(capsys, "check-mixer", EXAMPLE, "--shape", "2,32,16")
    assert code == 0, out + err
    assert out.startswith(f"check-mixer {EXAMPLE}  [entry point of mixlab-maxpool 0.1.0 ")
    assert "documents: forward takes cu_seqlens: claims exact blindness" in out
    assert "benchmark at B=2, T=32, D=16, fp32 on cpu" in out
    table = [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ")]
    assert table == ["mixer", EXAMPLE, "attention", "dynamic_conv"]
    assert out.rstrip().endswith("all 12 checks passed")


def test_mixer_without_cu_seqlens_passes_without_leakage_probes(capsys, one_torch_thread):
    code, out, _ = run_cli(capsys, "check-mixer", "byo_mixers:CumulativeMean", "--no-bench")
    assert code == 0, out
    assert "forward takes no cu_seqlens: packed inputs are refused" in out
    (probe_line,) = [line for line in out.splitlines() if line.startswith("leakage ")]
    assert probe_line.split()[1:3] == ["-", "n/a:"]


@pytest.mark.parametrize(
    "mixer,failed",
    [
        ("byo_mixers:WrongShape", ["shape"]),
        ("byo_mixers:Lookahead", ["causality"]),
        ("byo_mixers:LeakyClaimsBlind", ["leakage.perturbation", "leakage.nan", "leakage.gradient",
                                         "leakage.packing", "leakage.metric"]),
        ("byo_mixers:NanGradient", ["gradients"]),
        ("byo_mixers:Noisy", ["causality", "determinism"]),  # fresh noise also moves the earlier outputs
        ("byo_mixers:Float32Out", ["dtype"]),
        ("byo_mixers:RaisesInInit", ["build"]),
        ("byo_mixers:returns_tensor", ["build"]),
    ],
    ids=["wrong-shape", "not-causal", "leaks-while-claiming-blindness", "nan-gradients", "not-deterministic",
         "wrong-dtype", "factory-raises", "factory-returns-a-tensor"],
)
def test_check_mixer_fails_bad_mixers_naming_the_check(capsys, mixer, failed, one_torch_thread):
    code, out, err = run_cli(capsys, "check-mixer", mixer, "--no-bench")
    assert code == 1, out + err
    assert out.rstrip().splitlines()[-1] == "FAILED: " + ", ".join(failed)
    assert "benchmark at" not in out


def test_declared_leaky_mixer_passes_with_probes_unjudged(one_torch_thread):
    report = check_mixer("byo_mixers:DeclaredLeaky", bench=False)
    assert report.passed
    probes = {c.name: c for c in report.checks if c.name.startswith("leakage.")}
    assert all(c.passed is None and c.detail.startswith("declared leaky, not judged")
               for c in probes.values())
    assert "share 0" not in probes["leakage.metric"].detail


@pytest.mark.parametrize(
    "mixer,named",
    [
        ("not_a_module_xyz:Mixer", "cannot import 'not_a_module_xyz'"),
        ("byo_broken_mixer:Broken", "No module named 'mixlab_test_missing_dependency'"),
        ("byo_mixers:Missing", "has no attribute 'Missing'"),
        ("byo_mixers:NOT_A_FACTORY", "not a callable factory"),
        ("lstm", "unknown m"),  # mad run says "unknown model": it also takes presets
    ],
    ids=["missing-module", "module-fails-to-import", "missing-attribute", "not-callable", "unknown-name"],
)
@pytest.mark.parametrize(
    "command",
    [["check-mixer"], ["leakage", "--mixer"], ["run", "mqar", "--mixer"],
     ["mad", "run", "--profile", "smoke", "--model"]],
    ids=["check-mixer", "leakage", "run", "mad-run"],
)
def test_bad_import_paths_are_one_line_and_exit_2(capsys, tmp_path, command, mixer, named):
    code, _, err = run_cli(capsys, *command, mixer, *(["--out", str(tmp_path)] if "run" in command else []))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("mixlab: error:") and named in lines[0], err


@pytest.mark.example_plugin
def test_mixers_list_shows_the_example_with_its_origin(capsys):
    code, out, _ = run_cli(capsys, "mixers", "list")
    assert code == 0
    lines = {line.split()[0]: line for line in out.strip().splitlines()}
    assert list(lines)[:len(models.MIXERS)] == list(models.MIXERS)
    assert all(lines[name].endswith("[built-in]" if cls.extra is None else f"needs mixlab[{cls.extra}]]")
               for name, cls in models.MIXERS.items())
    assert lines[EXAMPLE].endswith("[entry point of mixlab-maxpool 0.1.0 (mixlab_maxpool:GatedMaxPool)]")


RUN_SMALL = ["--set", "vocab_size=32", "--set", "seq_len=16", "--set", "num_kv_pairs=2",
             "--set", "d_model=16", "--set", "n_heads=2", "--set", "n_layers=1", "--set", "mlp_hidden=16",
             "--set", "num_train=32", "--set", "num_test=16", "--set", "batch_size=16",
             "--steps", "2", "--device", "cpu", "--no-progress"]


@pytest.mark.parametrize("mixer", [pytest.param(EXAMPLE, id="entry-point", marks=pytest.mark.example_plugin),
                                   pytest.param("byo_mixers:CumulativeMean", id="import-path")])
def test_run_trains_an_external_mixer(capsys, tmp_path, mixer, one_torch_thread):
    code, out, err = run_cli(capsys, "run", "mqar", "--mixer", mixer, *RUN_SMALL, "--out", str(tmp_path))
    assert code == 0, err
    (path,) = tmp_path.glob("*.json")
    record = json.loads(path.read_text())
    assert record["resolved"]["model"]["mixer"] == mixer and record["steps"] == 2
    assert out.startswith(f"mqar {mixer}: acc ")


def test_run_refuses_packed_documents_for_a_mixer_without_cu_seqlens(capsys, tmp_path, one_torch_thread):
    code, _, err = run_cli(capsys, "run", "packed/noisy_recall", "--mixer", "byo_mixers:CumulativeMean",
                       "--set", "seq_len=128", "--set", "d_model=16", "--set", "n_heads=2",
                       "--set", "num_train=8", "--set", "num_test=8", "--steps", "1", "--device", "cpu",
                       "--no-progress",
                       "--out", str(tmp_path))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "takes no cu_seqlens" in lines[0], err


@pytest.mark.example_plugin
def test_leakage_command_probes_external_mixers(capsys, one_torch_thread):
    code, out, _ = run_cli(capsys, "leakage", "--mixer", EXAMPLE, "--rows", "2", "--seq-len", "24")
    assert code == 0 and f"{EXAMPLE}  blind" in out and out.rstrip().endswith("exact")
    code, out, _ = run_cli(capsys, "leakage", "--mixer", "byo_mixers:LeakyClaimsBlind", "--rows", "2",
                       "--seq-len", "24")
    assert code == 1 and "byo_mixers:LeakyClaimsBlind" in out.splitlines()[-1]


@pytest.mark.example_plugin
def test_mad_smoke_profile_runs_the_example_plugin(capsys, tmp_path, one_torch_thread):
    code, out, err = run_cli(capsys, "mad", "run", "--model", EXAMPLE, "--profile", "smoke", "--device", "cpu",
                         "--out", str(tmp_path), "--no-progress")
    assert code == 0, err
    records = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*.json")]
    assert len(records) == 12 and all(r["resolved"]["model"]["mixer"] == EXAMPLE for r in records)
    assert f"| {EXAMPLE} (smoke, n=1) |" in out and "| Average " in out


def test_sweep_by_import_path_runs_in_spawned_workers(capsys, tmp_path):
    """Workers are fresh processes: each imports the mixer's module again from the import path."""
    spec = {"name": "byo", "tasks": [{"task": "mqar", "params": {"vocab_size": 32, "seq_len": 16,
                                                                  "num_kv_pairs": 2}}],
            "models": {"mean": {"mixer": "byo_mixers:CumulativeMean", "d_model": 16, "n_layers": 1,
                                "mlp_hidden": 16}},
            "train": {"steps": 1, "epochs": None, "num_train": 16, "num_test": 16, "batch_size": 16,
                      "device": "cpu"},
            "seeds": 2}
    path = tmp_path / "byo.yaml"
    path.write_text(yaml.safe_dump(spec))
    code, out, err = run_cli(capsys, "sweep", str(path), "--out", str(tmp_path / "out"), "--workers", "2",
                         "--no-progress")
    assert code == 0, err
    records = [json.loads(p.read_text()) for p in (tmp_path / "out" / "runs").glob("*.json")]
    assert sorted(r["config"]["train"]["init_seed"] for r in records) == [0, 1]
    assert all(r["resolved"]["model"]["mixer"] == "byo_mixers:CumulativeMean" for r in records)
