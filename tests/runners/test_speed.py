"""Speed modes (``runners.train.speed``): auto picks per stack by device and row length, the command-line flags map
onto the modes, and the engine runs each stack in the mode picked for it."""

import pytest
import torch
from mixlab.runners.bench import mad as bench_mad_module
from mixlab.runners.bench import train as bench_train_module
from mixlab.runners.bench.train import bench_train
from mixlab.runners.cli.main import main
from mixlab.runners.sweep.jobs import run_job
from mixlab.runners.train import engine
from mixlab.runners.train.config import RunConfig, TrainConfig
from mixlab.runners.train.resolved import resolve
from mixlab.runners.train.speed import GRAPH_MAX_ROW, from_flags, stack_modes

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


@pytest.mark.parametrize(("speed", "device", "row", "modes"), [
    ("auto", CUDA, GRAPH_MAX_ROW, (True, True)),
    ("auto", CUDA, GRAPH_MAX_ROW + 1, (True, False)),
    ("auto", CUDA, 1024, (True, False)),
    ("auto", CPU, 32, (False, False)),
    ("auto", CPU, 1024, (False, False)),
    ("eager", CUDA, 32, (False, False)),
    ("compile", CUDA, 32, (True, False)),
    ("cuda-graph", CUDA, 1024, (False, True)),
    ("compile+graph", CPU, 1024, (True, True)),
], ids=["auto-cuda-at-threshold", "auto-cuda-past-threshold", "auto-cuda-long", "auto-cpu-short", "auto-cpu-long",
        "eager", "compile-short-rows", "graph-long-rows", "compile+graph-as-asked"])
def test_stack_modes(speed, device, row, modes):
    assert stack_modes(speed, device, row) == modes


@pytest.mark.parametrize(("mixer", "compiles"), [("attention", True), ("hyena", True), ("gla", False),
                                                  ("mamba2", False), ("hyena,retnet", False)])
def test_auto_leaves_stacks_of_fla_baselines_eager(mixer, compiles):
    """A model with an fla mixer in any layer: auto runs its stacks eager on CUDA (compiling them was timed not
    to help); what was asked explicitly stays as asked."""
    run = resolve(RunConfig(task="mad/in_context_recall", model={"mixer": mixer, "n_layers": 2}))
    assert run.auto_compiles is compiles
    modes = stack_modes("auto", CUDA, 127, run.auto_compiles)
    assert modes == ((True, False) if compiles else (False, False))
    assert stack_modes("compile", CUDA, 127, run.auto_compiles) == (True, False)


@pytest.mark.parametrize(("speed", "compile", "cuda_graph", "want"), [
    (None, False, False, "eager"),
    (None, True, False, "compile"),
    (None, False, True, "cuda-graph"),
    (None, True, True, "compile+graph"),
    ("auto", False, False, "auto"),
    ("compile", True, False, "compile"),
], ids=["no-flag", "compile-flag", "graph-flag", "both-flags", "speed-alone", "speed-and-its-flag"])
def test_flags_map_onto_modes(speed, compile, cuda_graph, want):
    assert from_flags(speed, compile, cuda_graph) == want


@pytest.mark.parametrize(("call", "message"), [
    (lambda: from_flags("auto", True, False), "--speed auto contradicts --compile/--cuda-graph"),
    (lambda: from_flags("fast"), "unknown speed 'fast'"),
    (lambda: stack_modes("fast", CPU, 8), "unknown speed 'fast'"),
], ids=["speed-against-flag", "unknown-speed", "unknown-speed-in-engine"])
def test_bad_speed_names_the_value(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_auto_compiles_on_cuda_graphs_short_rows_and_leaves_packed_stacks_eager(monkeypatch):
    """Groups of three row lengths and a packed task under auto, the device taken as CUDA: every unpacked stack
    compiles, the shortest rows' is captured too, the packed one runs eager (``_train_stack`` spied: nothing
    trains)."""
    picked = {}

    def spy(runs, names, **kwargs):
        picked[runs[0].config.task, runs[0].row_tokens] = (kwargs["compile"], kwargs["cuda_graph"],
                                                           kwargs["compact_at"])
        return [{} for _ in runs]

    monkeypatch.setattr(engine, "_train_stack", spy)
    monkeypatch.setattr(engine, "pick_device", lambda _: CUDA)
    monkeypatch.setattr(engine, "group_key", lambda run: (run.config.task, run.row_tokens))
    small = {"d_model": 16, "n_heads": 2}
    configs = [RunConfig(task="mad/in_context_recall", task_params={"seq_len": t}, model=small,
                         train=TrainConfig(epochs=1, init_seed=seed)) for t in (32, 64, 1024) for seed in (0, 1)]
    configs.append(RunConfig(task="packed/noisy_recall", model=small, train=TrainConfig(epochs=1)))
    engine.train_runs_batched(configs, progress=False, speed="auto")
    compiled = (True, False, engine.COMPILED_COMPACTION)
    packed_len = resolve(configs[-1]).row_tokens
    assert picked == {("mad/in_context_recall", 31): (True, True, engine.COMPILED_COMPACTION),
                      ("mad/in_context_recall", 63): compiled, ("mad/in_context_recall", 1023): compiled,
                      ("packed/noisy_recall", packed_len): (False, False, 1.0)}


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.filterwarnings("ignore:There is a performance drop because we have not yet")
def test_auto_on_the_cpu_trains_as_eager():
    """auto on the CPU is eager: the records equal the default's bitwise (time fields aside)."""
    configs = [RunConfig(task="mad/in_context_recall", task_params={"seq_len": 16},
                         model={"d_model": 8, "n_heads": 2, "n_layers": 1, "mlp_hidden": 0},
                         train=TrainConfig(epochs=1, batch_size=4, num_train=8, num_test=4, eval_batch_size=4,
                                           device="cpu", init_seed=seed)) for seed in (0, 1)]
    times = ("wall_time_s", "train_time_s", "steps_per_s", "argv")
    auto, eager = (engine.train_runs_batched(configs, progress=False, speed=s) for s in ("auto", "eager"))
    assert [{k: v for k, v in r.items() if k not in times} for r in auto] == \
           [{k: v for k, v in r.items() if k not in times} for r in eager]
    with pytest.raises(ValueError, match="speed='compile' is an option of the batched engine"):
        run_job(None, None, batch=False, speed="compile")


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.filterwarnings("ignore:There is a performance drop because we have not yet")
def test_bench_train_adds_a_row_per_mode_and_auto_names_its_pick():
    report = bench_train(n_runs=2, steps=2, device="cpu", task_params={"seq_len": 16}, num_train=16, num_test=8,
                         batch_size=8, speeds=["auto", "eager"])
    rows = [line for line in report.splitlines() if line.startswith("| batched")]
    assert [r.split(" | ")[0] for r in rows] == ["| batched", "| batched, auto (eager)"]
    assert rows[1].endswith("| bitwise |")


def test_bench_commands_map_flags_onto_modes(monkeypatch):
    asked = {}
    monkeypatch.setattr(bench_train_module, "bench_train", lambda **kwargs: asked.update(kwargs) or "")
    main(["bench", "train", "--device", "cpu", "--compile", "--cuda-graph", "--speed", "auto"])
    assert asked["speeds"] == ["compile", "cuda-graph", "compile+graph", "auto"]
    monkeypatch.setattr(bench_mad_module, "bench_mad",
                        lambda model, profile, options: asked.update(options=options) or "")
    main(["bench", "mad", "--device", "cpu", "--cuda-graph", "--tasks", "mad/compression", "--settings",
          "baseline,seq_len=64", "--stop-after", "420", "--warmup-steps", "2", "--heaviest-first", "--precompile", "3"])
    options = asked["options"]
    assert (options.speed, options.tasks, options.settings) == ("cuda-graph", ("mad/compression",),
                                                                ("baseline", "seq_len=64"))
    assert (options.stop_after, options.warmup_steps, options.seeds, options.heaviest_first,
            options.precompile) == (420, 2, None, True, 3)
