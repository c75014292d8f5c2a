"""``mixlab bench mad``: step shapes group the profile's jobs as the sweep makes them, the token and FLOP counts
are those of the protocol, and the report's rows and totals come from the timed runs."""

import concurrent.futures
import re
import threading
import time

import pytest
import torch
from mixlab.models import ModelConfig, preset_config
from mixlab.runners.bench import mad as bench_mad_module
from mixlab.runners.bench.mad import BenchMadOptions, bench_mad, exp_per_token, flop_per_token, step_shapes
from mixlab.runners.bench.utils import exp2_chain, exp2_rate
from mixlab.runners.cli.main import main
from mixlab.runners.sweep.jobs import plan_jobs
from mixlab.runners.sweep.mad import mad_plan
from mixlab.tasks import get_task


def test_a_shape_shared_by_two_tasks_names_both():
    """Fuzzy recall and selective copy at V=16, T=256 cost the same a step, so they share a shape; its row names
    both tasks, or a reader summing tokens by the row's task credits one with the other's."""
    _, shapes = bench_mad_module._chosen_shapes("transformer", "paper", BenchMadOptions(
        device="cpu", seeds=1, tasks=["mad/fuzzy_recall", "mad/selective_copy"]))
    shared = next(s for s in shapes if s.vocab_size == 16 and s.seq_len == 256)
    assert shared.tasks == {"mad/fuzzy_recall", "mad/selective_copy"}
    row = bench_mad_module._shape_row(shared, bench_mad_module.Ceilings())
    assert row.startswith("| mad/fuzzy_recall, mad/selective_copy | ")


def test_step_shapes_cover_every_run_once_with_the_protocols_tokens():
    plan = mad_plan("transformer", "paper", seeds=1, device="cpu")
    runs = [r for r in plan.runs if r.meta["task"] in ("mad/in_context_recall", "mad/noisy_recall")]
    shapes = step_shapes(plan_jobs(runs))
    hashes = [h for s in shapes for job in s.jobs for h in job.hashes]
    assert sorted(hashes) == sorted(r.hash for r in runs)
    # one step shape per (vocabulary, length, stack size): the train-size and frac_noise variations share their
    # baseline's (V, T); noisy recall's baseline shares in-context recall's V=32 shape
    recall = {(v, 127) for v in (16, 32, 64, 128)} | {(16, t) for t in (255, 511, 1023)}
    noisy = {(v, 127) for v in (32, 48, 80, 144)} | {(32, t) for t in (255, 511, 1023)}
    assert {(s.vocab_size, s.seq_len) for s in shapes} == recall | noisy
    assert len({(s.vocab_size, s.seq_len, len(s.jobs[0])) for s in shapes}) == len(shapes)
    tokens = sum(r.config.train.epochs * r.config.train.num_train
                 * get_task(r.config.task, **r.config.task_params).generate(1, seed=0).inputs.shape[1] for r in runs)
    assert sum(s.tokens for s in shapes) == tokens
    baseline = next(s for s in shapes if s.task == "mad/in_context_recall" and s.vocab_size == 16 and s.seq_len == 127)
    assert {"baseline", "num_train=800"} <= {*(r.meta["setting"] for r in runs if r.hash in
                                               {h for job in baseline.jobs for h in job.hashes})}


def test_flop_per_token_counts_matmul_weights_and_causal_attention():
    config = preset_config("transformer", vocab_size=16, max_seq_len=128)
    d, hidden, layers = config.d_model, config.mlp_hidden, config.n_layers
    # per block: q, k, v, o projections (4 d^2) and SwiGLU (3 d hidden); the untied head d x V
    weights = layers * (4 * d * d + 3 * d * hidden) + d * 16
    assert flop_per_token(config, 127) == 6 * weights + layers * 6 * d * 128
    none = ModelConfig(vocab_size=16, max_seq_len=128, mixer="none")
    assert flop_per_token(none, 127) == 6 * (none.n_layers * 3 * none.d_model * none.mlp_hidden + none.d_model * 16)


@pytest.mark.usefixtures("one_torch_thread")
def test_exp_per_token_counts_the_causal_scores_of_every_attention_head():
    config = preset_config("transformer", vocab_size=16, max_seq_len=128)
    # T=127: 64 scores a query on average, each an exponential forward and one backward
    assert exp_per_token(config, 127) == config.n_layers * config.n_heads * 64 * 2
    hybrid = ModelConfig(vocab_size=16, max_seq_len=128, mixer="hyena,attention", n_heads=4)
    assert exp_per_token(hybrid, 127) == 4 * 64 * 2
    assert exp_per_token(ModelConfig(vocab_size=16, max_seq_len=128, mixer="static_conv"), 127) == 0


def test_exp2_probe_kernel_chains_its_exponentials():
    """The rate probe's Triton kernel (interpreter on the CPU) computes its chain x = -exp2(x) / 2 as torch does;
    off CUDA there is no rate to measure."""
    x = torch.linspace(-0.5, 0.0, 3000)
    want = x.clone()
    for _ in range(5):
        want = torch.exp2(want) * -0.5
    torch.testing.assert_close(exp2_chain(x.clone(), 5), want)
    assert exp2_rate(torch.device("cpu")) is None


def test_report_rows_and_totals_come_from_the_timed_runs():
    text = bench_mad("transformer", "smoke", BenchMadOptions(device="cpu", seeds=1, steps=2,
                     tasks=["mad/memorization", "mad/compression"], progress=False))
    rows = [line for line in text.splitlines() if line.startswith("| mad/")]
    assert [r.split(" | ")[0] for r in rows] == ["| mad/compression", "| mad/memorization"]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[6] == "eager"
        stacked, alone = (float(cells[i].replace(",", "")) for i in (7, 8))
        assert stacked > 0 and alone > 0
        assert cells[-1] == "bitwise"  # eager fp32 on the CPU: the stacked run equals the run alone
    mean = float(re.search(r"token-weighted mean ([\d,]+) tokens/s", text).group(1).replace(",", ""))
    rates = [float(r.split("|")[8].strip().replace(",", "")) for r in rows]
    assert min(rates) <= mean <= max(rates)


@pytest.mark.parametrize(("argv", "message"), [
    ("bench mad --profile smoke --tasks mad/nope --device cpu", "unknown MAD task 'mad/nope'"),
    ("bench mad --profile huge --device cpu", "unknown profile 'huge'"),
    ("bench mad --profile smoke --steps 0 --device cpu", "steps must be a positive integer"),
    ("bench mad --profile smoke --settings seq_len=9 --device cpu", "unknown MAD setting 'seq_len=9'"),
    ("bench mad --profile smoke --speed fast --device cpu", "unknown speed 'fast'"),
    ("bench mad --profile smoke --speed auto --compile --device cpu", "--speed auto contradicts"),
], ids=["unknown-task", "unknown-profile", "zero-steps", "unknown-setting", "unknown-speed", "speed-against-flag"])
def test_bad_input_is_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv.split())
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.usefixtures("one_torch_thread")
def test_a_shape_that_fails_is_named_and_left_out_of_the_totals(monkeypatch):
    """One failing step shape (here: memorization's stack raises) costs its row, not the report."""
    real = bench_mad_module.train_runs_batched

    def failing(runs, **options):
        if runs[0].config.task == "mad/memorization":
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
        return real(runs, **options)

    monkeypatch.setattr(bench_mad_module, "train_runs_batched", failing)
    text = bench_mad("transformer", "smoke", BenchMadOptions(device="cpu", seeds=1, steps=1,
                     tasks=["mad/memorization", "mad/compression"], alone=False, progress=False))
    row = next(line for line in text.splitlines() if line.startswith("| mad/memorization"))
    assert row.endswith("| FAILED RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB |")
    assert "1 step shape(s) failed (gate column): mad/memorization T=32 V=256 x2." in text
    compression = next(line for line in text.splitlines() if line.startswith("| mad/compression"))
    rate = compression.split("|")[8].strip()
    assert f"token-weighted mean {rate} tokens/s" in text  # the totals are the one timed shape's


def test_every_shape_failing_is_one_error(monkeypatch):
    def failing(runs, **options):
        raise RuntimeError("no kernel image is available")

    monkeypatch.setattr(bench_mad_module, "train_runs_batched", failing)
    with pytest.raises(ValueError, match="no step shape was timed: RuntimeError: no kernel image"):
        bench_mad("transformer", "smoke", BenchMadOptions(device="cpu", seeds=1, steps=1, tasks=["mad/memorization"],
                  alone=False, progress=False))


@pytest.mark.usefixtures("one_torch_thread")
def test_end_to_end_sweep_counts_the_tokens_its_runs_trained():
    """The sweep's line counts every run once, with epochs cut (1 epoch of num_train rows here: none can stop
    earlier), and compares its wall time with the shapes' prediction for exactly those tokens."""
    text = bench_mad("transformer", "smoke", BenchMadOptions(device="cpu", seeds=1, steps=2,
                     tasks=["mad/memorization"], alone=False, sweep_epochs=1, progress=False))
    runs = [r for r in mad_plan("transformer", "smoke", seeds=1, device="cpu").runs
            if r.meta["task"] == "mad/memorization"]
    tokens = sum(r.config.train.num_train * get_task(r.config.task, **r.config.task_params).generate(1, seed=0)
                 .inputs.shape[1] for r in runs)
    line = next(line for line in text.splitlines() if line.startswith("End to end"))
    assert f"these {len(runs)} runs, epochs cut to 1, 1 worker(s): 0 stopped early" in line
    assert f"{tokens / 1e6:,.1f}M tokens trained" in line
    wall, predicted = (float(x) for x in re.search(r"in ([\d.]+) s of wall.*predict ([\d.]+) s", line).groups())
    keeps = int(re.search(r"keeps (\d+)% of", line).group(1))
    assert abs(keeps - 100 * predicted / wall) <= 2


def rows_of(text):
    return {line.split(" | ")[0][2:]: [c.strip() for c in line.strip("|").split("|")]
            for line in text.splitlines() if line.startswith("| mad/")}


def test_shapes_stack_every_seed_and_settings_pick_shapes(monkeypatch):
    """Stacks hold a setting's grid times the seeds (smoke: 2 grid points); --settings keeps the shapes holding
    one of them; auto on the CPU runs eager (nothing trains: the timing is stubbed)."""
    speeds = []

    def fake(shape, steps, speed, alone, warmup_steps):
        speeds.append(speed)
        shape.speed, shape.stacked = "eager", 1e6

    monkeypatch.setattr(bench_mad_module, "_measure", fake)
    options = dict(device="cpu", steps=1, alone=False, progress=False, speed="auto")
    three = rows_of(bench_mad("transformer", "smoke", BenchMadOptions(seeds=3, **options)))
    assert len(three) == 6 and {cells[4] for cells in three.values()} == {"6"}
    one = rows_of(bench_mad("transformer", "smoke", BenchMadOptions(**options)))
    assert {cells[4] for cells in one.values()} == {"2"}, "seeds default to the profile's (smoke: one)"
    assert speeds == ["auto"] * 12
    picked = rows_of(bench_mad("transformer", "smoke", BenchMadOptions(seeds=3, settings=["baseline"],
                                                                       tasks=["mad/compression"], **options)))
    assert list(picked) == ["mad/compression"]


@pytest.mark.usefixtures("one_torch_thread")
def test_stop_after_names_the_shapes_not_timed(monkeypatch):
    """Past stop_after no shape starts: its row says so, and the totals are the timed shapes' and say which."""
    clock = iter(range(0, 1000, 10))  # each reading of the clock 10 s later
    monkeypatch.setattr(bench_mad_module.time, "monotonic", lambda: next(clock))
    text = bench_mad("transformer", "smoke", BenchMadOptions(device="cpu", seeds=1, steps=1, alone=False,
                     progress=False, tasks=["mad/memorization", "mad/compression"], stop_after=15, speed="auto"))
    rows = rows_of(text)
    assert rows["mad/compression"][6] == "eager" and rows["mad/compression"][-1] == "-"
    assert rows["mad/memorization"][7] == "-" and rows["mad/memorization"][-1] == "not timed (stop_after)"
    assert "1 step shape(s) were not timed (stop_after passed first): mad/memorization T=32 V=256 x2." in text
    rate = rows["mad/compression"][7]
    assert "Totals over the 1 of 2 step shapes timed (1 seed(s), " in text
    assert f"token-weighted mean {rate} tokens/s" in text
    assert "Estimated device-minutes per seed before early stops, over the 1 of 2 step shapes timed" in text


def test_heaviest_first_times_the_shapes_with_the_most_tokens_first(monkeypatch):
    """--heaviest-first orders the timing by protocol tokens, most first; the table keeps the task order."""
    timed = []

    def fake(shape, steps, speed, alone, warmup_steps):
        timed.append(shape.tokens)
        shape.speed, shape.stacked = "eager", 1e6

    monkeypatch.setattr(bench_mad_module, "_measure", fake)
    options = dict(device="cpu", steps=1, alone=False, progress=False)
    in_order = rows_of(bench_mad("transformer", "smoke", BenchMadOptions(**options)))
    plain = list(timed)
    timed.clear()
    heaviest = rows_of(bench_mad("transformer", "smoke", BenchMadOptions(heaviest_first=True, **options)))
    assert timed == sorted(plain, reverse=True) and timed != plain
    assert list(heaviest) == list(in_order)


def test_precompile_compiles_the_compiled_shapes_ahead_in_the_timing_order(monkeypatch):
    """precompile sends each compiled shape's warm-up call, in order and at most ``processes`` at a time, to its
    executor; eager shapes are left alone, and past the deadline nothing more starts (the pool is replaced by
    threads and ``compile_stack`` by a spy: nothing trains)."""
    calls, lock, running, most = [], threading.Lock(), [0], [0]

    def spy(runs, speed):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            calls.append((runs[0].config.task, runs[0].config.train.steps, len(runs), speed))
        time.sleep(0.02)
        with lock:
            running[0] -= 1
        return 0.0

    monkeypatch.setattr(bench_mad_module, "compile_stack", spy)
    _, shapes = bench_mad_module._chosen_shapes("transformer", "smoke", BenchMadOptions(device="cpu", seeds=2))
    want = [(max(s.jobs, key=len).runs[0].config.task, 2, len(max(s.jobs, key=len)), "compile") for s in shapes]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        assert bench_mad_module.precompile(shapes, "eager", 5, 2, 1, executor=pool) == 0
        assert calls == []
        assert bench_mad_module.precompile(shapes, "compile", 5, 2, 1, executor=pool) == len(shapes)
        assert calls == want and most[0] == 1
        calls.clear()
        assert bench_mad_module.precompile(shapes, "compile", 5, 2, 2, executor=pool) == len(shapes)
        assert sorted(calls) == sorted(want) and 1 <= most[0] <= 2
        calls.clear()
        assert bench_mad_module.precompile(shapes, "compile", 5, 2, 2, deadline=time.monotonic() - 1,
                                           executor=pool) == 0
        assert calls == []

        def fails_on_the_first(runs, speed):  # the timing of that shape names the error; the rest go on
            spy(runs, speed)
            if len(calls) == 1:
                raise RuntimeError("out of memory")
            return 0.0

        monkeypatch.setattr(bench_mad_module, "compile_stack", fails_on_the_first)
        assert bench_mad_module.precompile(shapes, "compile", 5, 2, 1, executor=pool) == len(shapes) - 1
        assert calls == want

    class Broken(concurrent.futures.ThreadPoolExecutor):  # a pool whose process died after the first shape
        def submit(self, fn, *args):
            if self.submitted:
                raise concurrent.futures.BrokenExecutor("a process died")
            self.submitted = True
            return super().submit(fn, *args)

    calls.clear()
    monkeypatch.setattr(bench_mad_module, "compile_stack", spy)
    with Broken(max_workers=2) as pool:
        pool.submitted = False
        assert bench_mad_module.precompile(shapes, "compile", 5, 2, 2, executor=pool) == 1
    assert calls == want[:1]


def test_bench_mad_compiles_ahead_within_half_of_stop_after(monkeypatch):
    """--precompile N: bench_mad hands precompile the timing order and N processes, a deadline at half of
    stop_after, and the report says how many shapes it compiled ahead."""
    asked = {}

    def spy(shapes, speed, steps, warmup_steps, processes, deadline):
        asked.update(tokens=[s.tokens for s in shapes], processes=processes, deadline=deadline, speed=speed)
        return 2

    def fake(shape, steps, speed, alone, warmup_steps):
        shape.speed, shape.stacked = "eager", 1e6

    monkeypatch.setattr(bench_mad_module, "precompile", spy)
    monkeypatch.setattr(bench_mad_module, "_measure", fake)
    monkeypatch.setattr(bench_mad_module.time, "monotonic", lambda: 1000.0)
    text = bench_mad("transformer", "smoke", BenchMadOptions(device="cpu", steps=1, alone=False, progress=False,
                                                             heaviest_first=True, precompile=3, stop_after=100,
                                                             speed="compile"))
    assert asked["processes"] == 3 and asked["deadline"] == 1050.0 and asked["speed"] == "compile"
    assert asked["tokens"] == sorted(asked["tokens"], reverse=True)
    assert "2 shape(s) compiled ahead by 3 process(es) before the timing." in text
