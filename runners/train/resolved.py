"""A run resolved once (``ResolvedRun``): its config and hash, its task, its full model config, and what the
engine decides from them.

``resolve`` builds the task from a RunConfig, draws one example to learn the row length and whether rows pack
documents, and completes the ModelConfig with what the task fixes. Everything after it (a sweep's plan and jobs,
the stacked engine, the one-run loop, the record, the cost and benchmark tables) reads the frozen value and never
resolves again: a sweep's run is resolved when it is planned (``runners.sweep.plan.Resolver``), a bare RunConfig
where ``train_run`` or ``train_runs_batched`` is given one.
"""

from __future__ import annotations

import dataclasses

from mixlab import models, tasks
from mixlab.runners.train.config import RunConfig, TrainConfig, config_hash


@dataclasses.dataclass(frozen=True, eq=False)
class ResolvedRun:
    """A run and what its config resolves to. Plain picklable data: a sweep sends it to worker processes and Ray
    tasks as it is.

    Given: ``config``; ``task``, its instance; ``model_config``, the full ModelConfig (vocab_size, max_seq_len and
    objective are the task's); ``packed``, whether the task's rows pack documents (its data has doc_ids);
    ``named_device``, the device the run was planned with when it trains on another (``on_device``), else None.
    Derived when made:
        hash: ``config_hash(planned_config)``, the run's name in a sweep.
        stack_key: what runs must share to train in one stack of the engine (``runners.train.engine``): what fixes
            its tensors' shapes and its stacked arithmetic (the model config, the row shape, packing, the batch
            size, the test set's size and batches, AdamW's betas). Each run of a stack keeps its own step plan
            (epochs, steps, training set, evaluations, learning rates, early stop). The engine adds the device and
            precision the run resolves to where it trains.
        unbatchable_reason: why the run cannot train in a stack (then it trains alone), or None.
        auto_compiles: False when a layer's mixer asks ``--speed auto`` to leave its stacks eager.
    """

    config: RunConfig
    task: tasks.Task
    model_config: models.ModelConfig
    packed: bool
    named_device: str | None = None
    hash: str = dataclasses.field(init=False)
    stack_key: tuple = dataclasses.field(init=False)
    unbatchable_reason: str | None = dataclasses.field(init=False)
    auto_compiles: bool = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        tc = self.config.train
        mixers = models.pattern_classes(self.model_config.mixer)
        derived = {
            "hash": config_hash(self.planned_config),
            "stack_key": (self.model_config, (self.row_tokens,), self.packed, tc.batch_size, tc.num_test,
                          tc.eval_batch_size, tc.beta1, tc.beta2),
            "unbatchable_reason": _unbatchable_reason(self.config.task, self.model_config, mixers, self.packed),
            "auto_compiles": all(mixer.auto_compiles for mixer in mixers.values()),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    @property
    def row_tokens(self) -> int:
        """Tokens in one input row: the task's row length, which the model's max_seq_len is."""
        return self.model_config.max_seq_len

    @property
    def objective(self) -> str:
        """What the model is trained to output, as the task declares it (``tasks.Task.objective``)."""
        return self.task.objective

    @property
    def planned_config(self) -> RunConfig:
        """The config the run was planned with, which names it: ``config`` with the device it was planned for."""
        if self.named_device is None:
            return self.config
        return dataclasses.replace(self.config, train=dataclasses.replace(self.config.train, device=self.named_device))

    def with_train(self, train: TrainConfig) -> ResolvedRun:
        """The same task and model under other training settings (a new hash): nothing is resolved again."""
        return dataclasses.replace(self, config=dataclasses.replace(self.config, train=train), named_device=None)

    def on_device(self, device: str) -> ResolvedRun:
        """The same run, by the same name, trained on ``device`` (auto, cpu or cuda): where a run trains is not what
        it is. Its config (and so its record) says the device it trains on; its hash stays the one it was planned
        with, whose config named a device too (the hashes of records written before are kept)."""
        planned = self.planned_config.train.device
        train = dataclasses.replace(self.config.train, device=device)
        return dataclasses.replace(self, config=dataclasses.replace(self.config, train=train),
                                   named_device=None if device == planned else planned)


def resolve(config: RunConfig) -> ResolvedRun:
    """The run of ``config``, resolved; raises ValueError on any bad name or value, and when ``config.model`` sets
    a field the task fixes to another value."""
    task = tasks.get_task(config.task, **config.task_params)
    sample = task.generate(1, seed=0)
    fixed = {"vocab_size": task.vocab_size, "max_seq_len": sample.seq_len, "objective": task.objective}
    clash = sorted(k for k in set(config.model) & set(fixed) if config.model[k] != fixed[k])
    if clash:
        raise ValueError(f"model fields {clash} are set by the task {config.task!r}")
    return ResolvedRun(config=config, task=task, model_config=models.ModelConfig.from_dict({**config.model, **fixed}),
                       packed=sample.doc_ids is not None)


def as_resolved(run: ResolvedRun | RunConfig) -> ResolvedRun:
    """``run`` itself when it is resolved, else its config resolved."""
    return run if isinstance(run, ResolvedRun) else resolve(run)


def _unbatchable_reason(task: str, model_config: models.ModelConfig, mixers: dict[str, type],
                        packed: bool) -> str | None:
    """Why runs of this model on this task cannot stack, from what each layer's mixer declares (``models.Mixer``)."""
    backend = model_config.kernel_backend
    for name, mixer in mixers.items():
        if not mixer.stacks_on:
            return (f"mixer {name!r} does not stack: nothing says its forward runs under vmap "
                    f"(data-dependent control flow or .item() would fail there)")
        if backend not in mixer.stacks_on:
            return f"kernel_backend={backend!r}: a kernel of mixer {name!r} has no vmap rule there"
        if packed and not mixer.stacks_with_documents:
            return (f"task {task!r} has documents and mixer {name!r} reads their layout on the host in code with no "
                    f"per-run vmap rule")
    return None
