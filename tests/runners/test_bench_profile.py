"""``mixlab bench profile``: the pure helpers, the stack-step window, one run's profile and the host table on the
CPU, and the command's wiring (its modes, its one-line errors)."""

import pytest
import torch
from cli_run import run_cli
from mixlab.runners.bench import profile, profile_host
from mixlab.runners.bench.profile import (
    ConvInputs,
    TrainProfile,
    Window,
    busy_seconds,
    host_table,
    kernel_groups,
    kernel_table,
    ncu_launches,
    profile_one_run,
    profile_rows,
    profile_stack_steps,
    shortened,
)
from mixlab.runners.train.config import RunConfig, TrainConfig
from mixlab.runners.train.resolved import resolve

TINY_MODEL = {"d_model": 16, "n_heads": 2, "n_layers": 1, "mlp_hidden": 32}


def tiny(**train) -> RunConfig:
    """Six steps of 8 rows over 56 training rows (seven batches: no epoch ends), 8 test rows."""
    fields = {"epochs": None, "steps": 6, "batch_size": 8, "num_train": 56, "num_test": 8, "eval_batch_size": 8,
              "device": "cpu", **train}
    return RunConfig(task="mad/in_context_recall", task_params={"seq_len": 16}, model=TINY_MODEL,
                     train=TrainConfig(**fields))


@pytest.mark.parametrize(("intervals", "seconds"), [
    ([], 0.0),
    ([(0.0, 10.0)], 10e-6),
    ([(0.0, 10.0), (5.0, 15.0)], 15e-6),
    ([(20.0, 30.0), (0.0, 10.0), (22.0, 25.0), (5.0, 15.0)], 25e-6),
    ([(0.0, 10.0), (10.0, 20.0)], 20e-6),
    ([(0.0, 100.0), (10.0, 20.0), (30.0, 40.0)], 100e-6),
], ids=["none", "one", "overlapping", "unsorted_with_nested", "touching", "all_inside_one"])
def test_busy_seconds_counts_each_busy_moment_once(intervals, seconds):
    assert busy_seconds(intervals) == pytest.approx(seconds, abs=1e-12)


def test_kernel_table_sums_each_kernel_per_step_by_time():
    spans = [("copy", 0.0, 10.0), ("gemm", 10.0, 40.0), ("gemm", 50.0, 80.0), ("softmax", 80.0, 100.0)]
    assert kernel_table(spans, rows=2, count=2).splitlines() == [
        "| kernel | µs a step | share | calls a step | mean µs |",
        "|---|---|---|---|---|",
        "| `gemm` | 30.0 | 66.7% | 1 | 30.0 |",
        "| `softmax` | 10.0 | 22.2% | 0.5 | 20.0 |",
    ]
    long = kernel_table([("k" * 100, 0.0, 1500.0)], rows=5, count=1, per="call").splitlines()
    assert long[0] == "| kernel | µs a call | share | calls a call | mean µs |"
    assert long[2] == f"| `{'k' * 70}` | 1,500.0 | 100.0% | 1 | 1,500.0 |"


def test_kernel_groups_sum_each_kernel_under_the_first_group_its_name_matches():
    spans = [
        ("_attn_fwd_kernel", 0.0, 10.0), ("_attn_bwd_one_pass_kernel", 0.0, 30.0),
        ("_dynamic_conv_lowrank_bwd_dx_kernel", 0.0, 4.0), ("_sum_partials_kernel", 0.0, 1.0),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 0.0, 5.0), ("triton_tem_fused_mm_3", 0.0, 2.0),
        ("void at::native::multi_tensor_apply_kernel<TensorListMetadata<4>>", 0.0, 6.0),
        ("triton_poi_fused__to_copy_add_0", 0.0, 7.0), ("Memcpy DtoD (Device -> Device)", 0.0, 8.0),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", 0.0, 9.0),
        ("void at::native::reduce_kernel<512, 1>", 0.0, 11.0), ("_rubi_spectrum_kernel", 0.0, 12.0),
        ("mystery_kernel", 0.0, 13.0),
    ]
    assert kernel_groups(spans) == {
        "attention fwd": 10.0, "attention bwd": 30.0, "short convs": 5.0, "RubiConv": 12.0, "matmuls": 7.0,
        "optimizer": 6.0, "compiled elementwise": 7.0, "copies, fills": 17.0, "eager elementwise": 11.0,
        "other": 13.0,
    }
    assert list(kernel_groups([]).values()) == [0.0] * 10


def test_rows_profile_gives_one_row_a_length_and_no_kernel_figures_on_the_cpu():
    report = profile_rows(lengths=(16, 32), options=TrainProfile(n_runs=2, steps=4, skip=1, num_test=8),
                          device="cpu", model_params=TINY_MODEL)
    rows = [line.split(" | ") for line in report.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0][:5] == ["| seq_len", "row tokens", "ms a step", "GPU busy ms", "train tokens/s"]
    assert rows[0][-1] == "other ms |" and len(rows[0]) == 15
    assert [row[:2] for row in rows[1:]] == [["| 16", "15"], ["| 32", "31"]]
    assert all(float(row[2]) > 0 and int(row[4].replace(",", "")) > 0 for row in rows[1:])
    assert all(cell.strip(" |") == "—" for row in rows[1:] for cell in row[5:])
    with pytest.raises(ValueError, match="seq_len=15 must be an even number"):
        profile_rows(lengths=(16, 15), device="cpu", model_params=TINY_MODEL)
    with pytest.raises(ValueError, match="takes each stack's seq_len from lengths"):
        profile_rows(lengths=(16,), device="cpu", task_params={"seq_len": 32})


def test_host_table_orders_the_ops_by_self_cpu_time():
    ops = [("aten::add", 40.0, 4), ("aten::mm", 300.0, 2), ("aten::empty", 5.0, 10)]
    assert host_table(ops, rows=2, count=2, per="call").splitlines() == [
        "| host op | self CPU µs a call | calls a call |",
        "|---|---|---|",
        "| `aten::mm` | 150.0 | 1 |",
        "| `aten::add` | 20.0 | 2 |",
    ]


def test_window_summary_sets_the_busy_time_against_the_wall():
    window = Window(wall_s=2e-3, count=2, device=[("gemm", 0.0, 500.0), ("copy", 250.0, 1000.0)],
                    host=[("aten::mm", 80.0, 2)])
    assert window.summary("step") == "1.00 ms a step, GPU busy 0.50 ms a step (50% of the wall), 1 device events a step"
    assert window.summary("call", "µs").startswith("1,000.00 µs a call, GPU busy 500.00 µs a call (50% ")
    tables = window.tables(rows=5, per="step")
    assert tables[0].startswith("| kernel | µs a step |") and tables[2].startswith("| host op |")
    assert Window(1.0, 1, [], [("aten::mm", 1.0, 1)]).tables(5, "run")[0].startswith("| host op |"), \
        "no kernel table without device events"


def test_stack_step_profile_records_the_steps_after_skip_only():
    """Steps 3 to 6 of 6: four profiler steps; the epoch's permutation (drawn in step 1) and the evaluation after
    step 6 fall outside."""
    runs = [resolve(tiny()), resolve(tiny(init_seed=1, lr=1e-2))]
    window = profile_stack_steps(runs, skip=2, last=6)
    calls = {name: n for name, _, n in window.host}
    assert window.count == 4 and window.wall_s > 0 and window.device == []
    assert calls["ProfilerStep*"] == 4
    assert "aten::randperm" not in calls and "aten::argmax" not in calls
    assert calls["aten::bmm"] % 4 == 0, "each profiled step makes the same calls"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"skip": 0, "last": 6}, "skip must be a positive integer"),
    ({"skip": 6, "last": 6}, "skip must be below last=6, got 6"),
    ({"speed": "fast"}, "unknown speed 'fast'"),
], ids=["skip_zero", "skip_at_last", "unknown_speed"])
def test_stack_step_profile_refuses_an_empty_window(kwargs, message):
    with pytest.raises(ValueError, match=message):
        profile_stack_steps([resolve(tiny())], **kwargs)


def test_stack_step_profile_takes_the_runs_of_one_stack():
    with pytest.raises(ValueError, match="the runs form 2 stacks; profile the runs of one"):
        profile_stack_steps([resolve(tiny()), resolve(tiny(batch_size=4))], skip=2, last=6)


def test_train_profile_options_leave_a_profiled_step():
    with pytest.raises(ValueError, match=r"skip must leave a profiled step: at most steps - 1 = 29, got 30"):
        TrainProfile(skip=30)
    with pytest.raises(ValueError, match="unknown speed"):
        TrainProfile(speed="fast")


def test_one_run_profile_times_the_run_then_profiles_a_shorter_one():
    rate, window = profile_one_run(tiny(), steps=3, profiled=2)
    calls = {name: n for name, _, n in window.host}
    assert rate > 0 and window.count == 1 and window.device == []
    assert "aten::randperm" in calls and "aten::argmax" in calls, "the window is the whole run: its shuffle and " \
        "its evaluation included"
    short = shortened(tiny(), 2).train
    assert (short.steps, short.epochs, short.eval_every, short.num_train) == (2, None, 2, 16)


def test_conv_inputs_and_ncu_groups_name_a_bad_value():
    with pytest.raises(ValueError, match="shape must be four positive integers"):
        ConvInputs(shape=(4, 4096, 2048))
    with pytest.raises(ValueError, match="dtype"):
        ConvInputs(dtype="fp8")
    with pytest.raises(ValueError, match="unknown kernel 'hs2'; choose from static, hs1, hs16, lowrank"):
        ConvInputs(shape=(1, 16, 8, 2)).calls(torch.device("cpu"), ["static", "hs2"])
    with pytest.raises(ValueError, match="unknown op group 'fft'; choose from shortconv, attention, rubiconv"):
        ncu_launches(["shortconv", "fft"], ConvInputs(), torch.device("cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's check run, on a machine without a GPU")
def test_ops_profile_on_the_cpu_lists_each_case_with_its_host_ops():
    report = profile.profile_ops(ConvInputs(shape=(1, 16, 8, 2), dtype="fp32", n_docs=2), only=("static",),
                                 calls=1, rows=3)
    lines = report.splitlines()
    assert lines[0].startswith("# Profile of the short convs' eager ops, ")
    assert lines[2].startswith("- device: CPU; torch ")
    assert [line for line in lines if line.startswith("## ")] == [
        "## static | no documents | fwd+bwd", "## static | 2 documents | fwd+bwd"]
    assert lines.count("| host op | self CPU µs a call | calls a call |") == 2
    assert "host waits a call: none" in report


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's check run, on a machine without a GPU")
def test_ncu_report_lists_the_launches_in_the_order_run(monkeypatch):
    ran = []
    monkeypatch.setattr(profile, "_cuda", lambda mode, hint="": torch.device("cpu"))
    monkeypatch.setattr(profile, "run_for_ncu", lambda launches: ran.extend(name for name, _ in launches))
    report = profile.profile_ncu(["shortconv"], ConvInputs(shape=(1, 16, 16, 2), dtype="fp32", n_docs=2))
    table = [line for line in report.splitlines() if line.startswith("| ")][1:]
    assert len(ran) == 8 and ran[0] == "static | no documents | fwd+bwd"
    assert table == [f"| {n} | {name.replace('|', chr(92) + '|')} |" for n, name in enumerate(ran, 1)]


def test_host_table_at_tiny_shapes_on_the_cpu_skips_launches_and_restores_them():
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    launchers, rng = (JITFunction.run, InterpretedFunction.run), torch.get_rng_state()
    report = profile_host.host_overhead("cpu", repeats=1, calls=1)
    assert (JITFunction.run, InterpretedFunction.run) == launchers
    assert torch.equal(torch.get_rng_state(), rng), "the inputs come from seeded generators of their own"
    rows = [line.split(" | ") for line in report.splitlines() if line.startswith("| ") and "---" not in line]
    ops, pieces = rows[1:6], rows[7:]
    assert [op[0] for op in ops] == ["| static", "| head-wise, head size 1", "| head-wise, head size 16",
                                     "| low-rank, R=16", "| floor: an autograd Function that only allocates its "
                                     "outputs"]
    assert len(pieces) == 14
    assert all(float(v.strip(" |")) > 0 for row in ops + pieces for v in row[1:])
    assert "launches skipped" in report.splitlines()[2]


def test_launches_skipped_returns_before_the_kernel_runs():
    y = torch.full((2, 8, 4), float("nan"))
    x, w = torch.ones(2, 8, 4), torch.ones(2, 4)
    from mixlab.kernels.short_conv import triton as short_triton

    with profile_host.launches_skipped():
        short_triton._short_conv_fwd_kernel[(1, 1, 2)](x, w, y, None, 8, 4, 2, 0, 0, W=2, BT=8, BD=4, HAS_CU=False,
                                                       RESIDUAL=True)
    assert y.isnan().all(), "a skipped launch writes nothing"
    short_triton._short_conv_fwd_kernel[(1, 1, 2)](x, w, y, None, 8, 4, 2, 0, 0, W=2, BT=8, BD=4, HAS_CU=False,
                                                   RESIDUAL=True)
    assert not y.isnan().any(), "outside the context a launch runs"


def test_profile_lists_its_modes(capsys):
    code, out, _ = run_cli(capsys, "bench", "profile", "--help")
    assert code == 0
    commands = out.split("Commands:")[1].split()
    assert [word for word in commands if word in ("ops", "ncu", "train", "run", "host")] == \
        ["ops", "ncu", "train", "run", "host"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the messages on a machine without a GPU")
@pytest.mark.parametrize(("argv", "message"), [
    (["ops", "--shape", "1,16,8,2"], "bench profile ops profiles Triton kernels on a GPU, and torch sees no CUDA "
                                     "device here"),
    (["ncu"], "bench profile ncu needs a CUDA GPU, and torch sees no CUDA device here"),
    (["train"], "bench profile train needs a CUDA GPU, and torch sees no CUDA device here"),
    (["rows"], "bench profile rows needs a CUDA GPU, and torch sees no CUDA device here (--device cpu checks the "
               "path on a CPU)"),
    (["rows", "--lengths", "128,1k"], "--lengths expects seq_len values, e.g. 128,1024, got '128,1k'"),
    (["run"], "bench profile run needs a CUDA GPU, and torch sees no CUDA device here (--device cpu checks the "
              "path on a CPU)"),
    (["host"], "bench profile host on the CPU needs the Triton interpreter's kernels"),
], ids=["ops", "ncu", "train", "rows", "rows_lengths", "run", "host"])
def test_modes_without_a_gpu_say_what_they_need(capsys, monkeypatch, argv, message):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    code, out, err = run_cli(capsys, "bench", "profile", *argv)
    assert code == 2 and out == ""
    assert err.startswith(f"mixlab: error: {message}") and err.count("\n") == 1, err


def test_profile_train_takes_set_for_task_and_model_only(capsys, monkeypatch):
    calls = []
    monkeypatch.setattr(profile, "profile_train", lambda *args, **kwargs: calls.append((args, kwargs)) or "table")
    code, out, err = run_cli(capsys, "bench", "profile", "train", "--model", "gla", "--set", "proj_bias=true",
                         "--set", "seq_len=1024", "--skip", "2", "--steps", "10", "--speed", "compile")
    assert code == 0 and out == "table\n", err
    ((task, model, options), kwargs), = calls
    assert (task, model) == ("mad/in_context_recall", "gla")
    assert (options.skip, options.steps, options.speed, options.n_runs) == (2, 10, "compile", 6)
    assert kwargs == {"task_params": {"seq_len": 1024}, "model_params": {"proj_bias": True}}
    code, _, err = run_cli(capsys, "bench", "profile", "train", "--set", "lr=0.1")
    assert code == 2 and err == ("mixlab: error: bench profile train sets training fields with its own options "
                                 "(--steps, --num-test), not --set lr\n")
