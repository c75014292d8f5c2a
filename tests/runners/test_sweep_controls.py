"""The packed diagnostics' positive-control presets: what each changes from the preset it controls, and nothing
else (reproductions/packed/NOTES.md says why)."""

from mixlab.runners.sweep.spec import load_spec


def test_the_cpu_control_is_packed_mq_small_attention_at_its_better_rate():
    """Same configs as packed_mq_small's attention runs at lr 1e-3, so the same record names: its records are
    those runs trained again."""
    control = load_spec("packed_mq_control_small").plan().runs
    small = load_spec("packed_mq_small").plan().runs
    assert len(control) == 2 * 3
    assert {r.hash for r in control} == {r.hash for r in small
                                         if r.meta["model"] == "attention" and r.config.train.lr == 1e-3}


def test_the_gpu_control_is_packed_mq_attention_at_1e3_with_four_times_the_steps():
    control = load_spec("packed_mq_control").plan().runs
    full = {(r.meta["task"], r.meta["seed"]): r.config for r in load_spec("packed_mq").plan().runs
            if r.meta["model"] == "attention" and r.config.train.lr == 1e-3}
    assert len(control) == len(full) == 2 * 3
    for run in control:
        mine, theirs = run.config, full[run.meta["task"], run.meta["seed"]]
        assert (mine.train.steps, theirs.train.steps) == (20_000, 5_000)
        assert mine.model == theirs.model and mine.task_params == theirs.task_params
        changed = {k for k, v in vars(mine.train).items() if vars(theirs.train)[k] != v}
        assert changed == {"steps"}
