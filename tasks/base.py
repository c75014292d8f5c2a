"""Shared pieces of every task generator: the data record, token roles, typed parameters, seeding.

A task is a class with a frozen ``Params`` dataclass (the task's parameters and their defaults) and a
``_generate(rng, num_examples, split)`` method that draws everything from the one ``numpy.random.Generator`` it
is given. ``Task.generate`` creates that generator from ``(seed, split)``, so the same seed gives the same bytes,
and the train and test splits of one seed never share a stream.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

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
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return np.random.default_rng([int(seed), SPLITS.index(split)])


def _field_types(params_cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(params_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(params_cls)}


def _check_type(name: str, value: Any, annotation: Any) -> Any:
    """Check (and lightly normalise) one parameter value against its annotation; raise ValueError naming it."""
    origin = typing.get_origin(annotation)
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"parameter {name!r} must be an integer, got {value!r}")
        return int(value)
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise ValueError(f"parameter {name!r} must be a number, got {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ValueError(f"parameter {name!r} must be a string, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (tuple, list)):
            raise ValueError(f"parameter {name!r} must be a tuple, got {value!r}")
        (item,) = {a for a in typing.get_args(annotation) if a is not Ellipsis}
        return tuple(_check_type(name, v, item) for v in value)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _check_type(name, value, inner)
    raise TypeError(f"unsupported parameter annotation {annotation!r} for {name!r}")


def parse_value(name: str, text: str, annotation: Any) -> Any:
    """Parse the text of ``--set name=text`` into the annotated type (int, float, str, bool, tuples, Optionals)."""
    origin = typing.get_origin(annotation)
    text = text.strip()
    try:
        if annotation is str:
            return text
        if annotation is bool:
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(text)
            return text.lower() in ("true", "1", "yes")
        if annotation is int:
            return int(text)
        if annotation is float:
            return float(text)
        if origin is tuple:
            (item,) = {a for a in typing.get_args(annotation) if a is not Ellipsis}
            parts = [p for p in text.strip("()[]").replace(" ", "").split(",") if p]
            return tuple(parse_value(name, p, item) for p in parts)
        if origin in (typing.Union, types.UnionType):
            if text.lower() in ("none", "null"):
                return None
            (inner,) = [a for a in typing.get_args(annotation) if a is not type(None)]
            return parse_value(name, text, inner)
    except ValueError:
        raise ValueError(f"parameter {name!r}: cannot read {text!r} as {_type_name(annotation)}") from None
    raise TypeError(f"unsupported parameter annotation {annotation!r} for {name!r}")


def _type_name(annotation: Any) -> str:
    if annotation is bool:
        return "true or false"
    if annotation is int:
        return "an integer"
    if annotation is float:
        return "a number"
    if typing.get_origin(annotation) is tuple:
        return "a comma-separated list"
    return str(annotation)


class Task:
    """Base class of every generator. Subclasses set ``name``, ``description``, ``Params`` and ``_generate``."""

    name: ClassVar[str]
    description: ClassVar[str]
    Params: ClassVar[type]
    # Tasks whose train and test splits differ in kind (not just in stream), e.g. MAD recall scoring.
    split_dependent: ClassVar[bool] = False

    def __init__(self, **params: Any) -> None:
        fields = _field_types(self.Params)
        unknown = sorted(set(params) - set(fields))
        if unknown:
            raise ValueError(
                f"unknown parameter {unknown[0]!r} for task {self.name!r}; known: {', '.join(fields)}"
            )
        checked = {k: _check_type(k, v, fields[k]) for k, v in params.items()}
        self.params = self.Params(**checked)
        self.validate()

    @classmethod
    def parse_params(cls, assignments: dict[str, str]) -> dict[str, Any]:
        """Turn ``{"seq_len": "256"}`` (from ``--set``) into typed values; unknown keys raise ValueError."""
        fields = _field_types(cls.Params)
        out = {}
        for key, text in assignments.items():
            if key not in fields:
                raise ValueError(f"unknown parameter {key!r} for task {cls.name!r}; known: {', '.join(fields)}")
            out[key] = parse_value(key, text, fields[key])
        return out

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        return dataclasses.asdict(cls.Params())

    def validate(self) -> None:
        """Raise ValueError naming the parameter when the combination is impossible."""

    @property
    def vocab_size(self) -> int:
        return self.params.vocab_size

    def generate(self, num_examples: int, seed: int, split: str = "train") -> TaskData:
        if isinstance(num_examples, bool) or not isinstance(num_examples, (int, np.integer)) or num_examples < 1:
            raise ValueError(f"num_examples must be a positive integer, got {num_examples!r}")
        rng = split_stream(seed, split)
        return self._generate(rng, int(num_examples), split)

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
