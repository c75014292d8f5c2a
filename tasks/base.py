"""Shared pieces of every task generator: the data record, token roles, typed parameters, seeding.

A task is a class with a frozen ``Params`` dataclass (the task's parameters and their defaults) and a
``_generate(rng, num_examples, split)`` method that draws everything from the one ``numpy.random.Generator`` it
is given. ``Task.generate`` creates that generator from ``(seed, split)``, so the same seed gives the same bytes,
and the train and test splits of one seed never share a stream.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from mixlab.core import fields

IGNORE = -100
SPLITS = ("train", "test")


class Role(enum.IntEnum):
    """What a token is there for; drives ``mixlab tasks show`` and analysis of per-role behaviour."""

    OTHER = 0
    KEY = 1
    VALUE = 2
    SEPARATOR = 3
    NOISE = 4
    FILLER = 5
    BOUNDARY = 6  # beginning of a document / of a packed segment
    SPECIAL = 7  # task control tokens: copy, insert, compress, query marker
    PAD = 8


ROLE_TAGS = {
    Role.OTHER: "tok",
    Role.KEY: "key",
    Role.VALUE: "val",
    Role.SEPARATOR: "sep",
    Role.NOISE: "noise",
    Role.FILLER: "fill",
    Role.BOUNDARY: "doc",
    Role.SPECIAL: "ctl",
    Role.PAD: "pad",
}


@dataclass(frozen=True)
class TaskData:
    """A generated split. ``targets`` is -100 wherever the position is not scored.

    inputs:  LongTensor [N, T]
    targets: LongTensor [N, T]
    roles:   uint8 tensor [N, T] of ``Role`` values
    doc_ids: LongTensor [N, T] (document index within the row, 0..n_docs-1) for packed tasks, else None
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    roles: torch.Tensor
    vocab_size: int
    doc_ids: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.inputs.shape != self.targets.shape or self.inputs.shape != self.roles.shape:
            raise ValueError(
                f"inputs {tuple(self.inputs.shape)}, targets {tuple(self.targets.shape)} and roles "
                f"{tuple(self.roles.shape)} must have one shape"
            )
        if self.doc_ids is not None and self.doc_ids.shape != self.inputs.shape:
            raise ValueError(f"doc_ids {tuple(self.doc_ids.shape)} must match inputs {tuple(self.inputs.shape)}")

    def __len__(self) -> int:
        return self.inputs.shape[0]

    @property
    def seq_len(self) -> int:
        return self.inputs.shape[1]

    @classmethod
    def from_numpy(
        cls,
        inputs: np.ndarray,
        targets: np.ndarray,
        roles: np.ndarray,
        vocab_size: int,
        doc_ids: np.ndarray | None = None,
    ) -> TaskData:
        return cls(
            inputs=torch.from_numpy(np.ascontiguousarray(inputs, dtype=np.int64)),
            targets=torch.from_numpy(np.ascontiguousarray(targets, dtype=np.int64)),
            roles=torch.from_numpy(np.ascontiguousarray(roles, dtype=np.uint8)),
            vocab_size=int(vocab_size),
            doc_ids=None if doc_ids is None else torch.from_numpy(np.ascontiguousarray(doc_ids, dtype=np.int64)),
        )


def split_stream(seed: int, split: str) -> np.random.Generator:
    """The generator for one (seed, split): independent streams for train and test of the same seed."""
    split = fields.check("split", split, Literal[SPLITS])
    return np.random.default_rng([fields.check("seed", seed, fields.NonNegativeInt), SPLITS.index(split)])


class Task:
    """Base class of every generator. Subclasses set ``name``, ``description``, ``Params`` and ``_generate``.

    ``Params``'s annotations say what each parameter accepts (``core.fields``); ``validate`` adds the rules
    between parameters.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    Params: ClassVar[type]
    # Tasks whose train and test splits differ in kind (not just in stream), e.g. MAD recall scoring.
    split_dependent: ClassVar[bool] = False
    # What a model of this task is trained to output (``models.ModelConfig.objective``, which the task fixes): "lm",
    # next-token logits, or "compression", the MAD autoencoder's reconstruction of the whole row.
    objective: ClassVar[str] = "lm"

    def __init__(self, **params: Any) -> None:
        self.params = fields.from_mapping(self.Params, params, where=self.name)
        fields.check_dataclass(self.params, where=self.name)
        self.validate()

    @classmethod
    def parse_params(cls, assignments: dict[str, str]) -> dict[str, Any]:
        """Turn ``{"seq_len": "256"}`` (from ``--set``) into typed values; unknown keys raise ValueError."""
        annotations = fields.field_types(cls.Params)
        texts = fields.check_mapping(cls.name, assignments, annotations)
        return {key: fields.parse(key, text, annotations[key], where=cls.name) for key, text in texts.items()}

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return dataclasses.asdict(cls.Params())

    def validate(self) -> None:
        """Raise ValueError naming the parameter when the combination is impossible."""

    @property
    def vocab_size(self) -> int:
        return self.params.vocab_size

    def generate(self, num_examples: int, seed: int, split: str = "train") -> TaskData:
        num_examples = fields.check("num_examples", num_examples, fields.PositiveInt)
        return self._generate(split_stream(seed, split), num_examples, split)

    def _generate(self, rng: np.random.Generator, num_examples: int, split: str) -> TaskData:
        raise NotImplementedError

    def token_label(self, token: int) -> str:
        """Human-readable name of a token id (special tokens override this)."""
        return str(token)

    def score_groups(self, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """Named subsets of the scored positions whose accuracy is reported on its own (bool masks like targets).

        Empty by default; e.g. packed associative retrieval splits present-key from absent-key queries.
        """
        return {}

    def config(self) -> dict[str, Any]:
        return {"task": self.name, **dataclasses.asdict(self.params)}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in dataclasses.asdict(self.params).items())
        return f"{type(self).__name__}({args})"


def require(condition: bool, message: str) -> None:
    """Parameter check used by ``Task.validate``: the message names the parameter."""
    if not condition:
        raise ValueError(message)


def sample_distinct(rng: np.random.Generator, n_rows: int, k: int, low: int, high: int) -> np.ndarray:
    """[n_rows, k] integers from [low, high), distinct within each row, uniformly (vectorised)."""
    span = high - low
    if k > span:
        raise ValueError(f"cannot draw {k} distinct values from a range of {span}")
    if k * 4 <= span:
        # Rejection by sorting: draw with replacement, redraw rows that collide (rare when k << span).
        out = rng.integers(low, high, size=(n_rows, k))
        while True:
            s = np.sort(out, axis=1)
            bad = (s[:, 1:] == s[:, :-1]).any(axis=1)
            if not bad.any():
                return out
            out[bad] = rng.integers(low, high, size=(int(bad.sum()), k))
    # Dense case: the first k of a per-row random permutation.
    return np.argsort(rng.random((n_rows, span)), axis=1)[:, :k] + low
