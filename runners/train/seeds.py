"""What a run's two seeds make, alike for a run trained alone and one of a stack.

``data_seed`` generates the train and test sets; ``init_seed`` seeds the model's initialisation (``init_seed``)
and the shuffling of the training set (``init_seed + 1``). Nothing here reads or changes the caller's global RNG
state.
"""

from __future__ import annotations

import torch
from mixlab import models, tasks
from mixlab.runners.train.config import TrainConfig


def run_data(task: tasks.Task, train: TrainConfig) -> tuple[tasks.TaskData, tasks.TaskData]:
    """The run's training set (``num_train`` rows) and test set (``num_test`` rows), both from ``data_seed``."""
    return (task.generate(train.num_train, seed=train.data_seed, split="train"),
            task.generate(train.num_test, seed=train.data_seed, split="test"))


def initial_model(model_config: models.ModelConfig, init_seed: int, device: torch.device) -> torch.nn.Module:
    """The model built under ``torch.manual_seed(init_seed)`` and moved to the device, in a forked RNG (forking
    the CUDA generator too when the device is CUDA)."""
    fork_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=fork_devices, device_type=device.type if fork_devices else "cuda"):
        torch.manual_seed(init_seed)
        return models.build_model(model_config).to(device)


def shuffle_generator(init_seed: int) -> torch.Generator:
    """The generator of the run's permutations of its training rows, one an epoch."""
    return torch.Generator().manual_seed(init_seed + 1)
