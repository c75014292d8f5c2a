"""Typed fields: the one place that checks a value against its annotation, reads it from text and builds a
dataclass from a mapping. Task parameters, model configs and the runners' options are dataclasses whose
annotations say what each field accepts; they call this module instead of writing isinstance checks.

Annotations understood by ``check`` and ``parse``:

- ``int``: an integer; a bool is not one; numpy integers are accepted and become ``int``.
- ``float``: a number (ints accepted); becomes ``float`` (unless ``keep_ints``: an int then stays an int).
- ``str``, ``bool`` (only True or False), ``X | None``, ``tuple[X, ...]`` (a tuple or list; becomes a tuple).
- ``dict[K, V]``: a dict (its items are not checked; ``check`` only).
- ``Literal[...]``: one of the choices; ``Literal[CHOICES]`` with a tuple of choices reads the same.
- ``PositiveInt``, ``NonNegativeInt``, ``PositiveFloat``, ``NonNegativeFloat``: ``int`` / ``float`` with a bound.
- any other class: an instance of it (``check`` only).

Every bad value raises ValueError with one line naming the field and the value, e.g.
``ModelConfig.d_model must be a positive integer, got 0``. A field is named ``where.name`` when the caller
says where it lives (the class, a task, a section of a YAML file), else by its name alone.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

import numpy as np


@dataclasses.dataclass(frozen=True)
class Bound:
    """A lower bound of a number field, carried in ``Annotated[int | float, Bound(...)]``."""

    adjective: str  # how messages say it: "a positive integer"
    minimum: float
    strict: bool  # value > minimum, else value >= minimum

    def holds(self, value: float) -> bool:
        return value > self.minimum if self.strict else value >= self.minimum


POSITIVE = Bound("positive", 0, strict=True)
NON_NEGATIVE = Bound("non-negative", 0, strict=False)
PositiveInt = Annotated[int, POSITIVE]
NonNegativeInt = Annotated[int, NON_NEGATIVE]
PositiveFloat = Annotated[float, POSITIVE]
NonNegativeFloat = Annotated[float, NON_NEGATIVE]

_NOUNS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
_NONE_TEXT = ("none", "null")
_TRUE_TEXT, _FALSE_TEXT = ("true", "1", "yes"), ("false", "0", "no")


def check(name: str, value: Any, annotation: Any, *, where: str | None = None, keep_ints: bool = False) -> Any:
    """``value`` checked against ``annotation`` and normalised (numpy ints -> int, ints -> float in a float
    field unless ``keep_ints``, lists -> tuples); ValueError naming ``where.name`` and the value otherwise."""
    subject = _subject(name, where)
    base, bound = _unwrap(annotation)
    origin = typing.get_origin(base)
    if _is_optional(base):
        return None if value is None else check(name, value, _inner(base), where=where, keep_ints=keep_ints)
    if origin is tuple:
        if not isinstance(value, tuple | list):
            raise ValueError(f"{subject} must be a list, got {value!r}")
        item = _item(base)
        return tuple(check(f"{name}[{i}]", v, item, where=where, keep_ints=keep_ints) for i, v in enumerate(value))
    if origin is Literal:
        if value not in typing.get_args(base):
            raise ValueError(f"{subject} must be {describe(base)}, got {value!r}")
        return value
    if base is bool:
        ok = isinstance(value, bool)
    elif base is int:
        ok = not isinstance(value, bool) and isinstance(value, int | np.integer)
    elif base is float:
        ok = not isinstance(value, bool) and isinstance(value, int | float | np.integer | np.floating)
    elif origin is dict:
        ok = isinstance(value, dict)
    elif isinstance(base, type) and origin is None:
        ok = isinstance(value, base)
    else:
        raise TypeError(f"unsupported annotation {annotation!r} for {subject}")
    if not ok or (bound is not None and not bound.holds(value)):
        raise ValueError(f"{subject} must be {describe(annotation)}, got {value!r}")
    if base is int or (base is float and keep_ints and isinstance(value, int | np.integer)):
        return int(value)
    return float(value) if base is float else value


def parse(name: str, text: str, annotation: Any, *, where: str | None = None) -> Any:
    """The value that ``text`` (a command-line ``--set`` value) writes for ``annotation``: ``"1e-3"`` -> 0.001,
    ``"1,2,3"`` -> (1, 2, 3), ``"none"`` -> None where None is allowed. Bounds are left to ``check``."""
    base, _ = _unwrap(annotation)
    text = text.strip()
    if _is_optional(base):
        return None if text.lower() in _NONE_TEXT else parse(name, text, _inner(base), where=where)
    if typing.get_origin(base) is tuple:
        parts = [p for p in text.strip("()[]").replace(" ", "").split(",") if p]
        return tuple(parse(f"{name}[{i}]", p, _item(base), where=where) for i, p in enumerate(parts))
    try:
        return _read(text, base)
    except ValueError:
        raise ValueError(f"{_subject(name, where)}: cannot read {text!r} as {describe(base)}") from None


def from_yaml(name: str, value: Any, annotation: Any, *, where: str | None = None) -> Any:
    """A value read by YAML for ``annotation``: YAML 1.1 reads ``1e-3`` as text, so text in a float field is
    parsed as a number; everything else is left as it is (``check`` sees it later)."""
    base = _unwrap(annotation)[0]
    if _is_optional(base):
        base = _unwrap(_inner(base))[0]
    return parse(name, value, float, where=where) if base is float and isinstance(value, str) else value


def describe(annotation: Any) -> str:
    """How messages name what ``annotation`` accepts: "a positive integer", "one of 'lm', 'compression'"."""
    base, bound = _unwrap(annotation)
    if _is_optional(base):
        return f"{describe(_inner(base))} or None"
    if typing.get_origin(base) is tuple:
        return "a list"
    if typing.get_origin(base) is Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(base)))
    if bound is not None:
        return f"a {bound.adjective} {'integer' if base is int else 'number'}"
    return _NOUNS.get(base) or f"a {getattr(base, '__name__', base)}"


@functools.cache
def field_types(cls: type) -> Mapping[str, Any]:
    """Field name -> annotation of a dataclass, in field order (bounds kept); read-only, made once per class."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return types.MappingProxyType({f.name: hints[f.name] for f in dataclasses.fields(cls)})


def check_dataclass(instance: Any, *, where: str | None = None, keep_ints: bool = False) -> None:
    """``check`` every field of a dataclass in place (frozen ones too): call it first in ``__post_init__``,
    which then keeps only the rules between fields. Fields are named ``where.name`` (default: the class name)."""
    where = where or type(instance).__name__
    for name, annotation in field_types(type(instance)).items():
        value = check(name, getattr(instance, name), annotation, where=where, keep_ints=keep_ints)
        object.__setattr__(instance, name, value)


def check_mapping(where: str, data: Any, allowed: Iterable[str] | None = None,
                  required: Iterable[str] = ()) -> dict[str, Any]:
    """``data`` as a dict; ValueError unless it is a mapping whose keys are all in ``allowed`` (None: any)
    and include every ``required`` one; the message names the keys."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} must be a mapping, got {data!r}")
    if allowed is not None:
        allowed = set(allowed)
        unknown = sorted(str(k) for k in set(data) - allowed)
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown}; allowed: {sorted(allowed)}")
    missing = sorted(set(required) - set(data))
    if missing:
        raise ValueError(f"{where}: missing keys {missing}")
    return dict(data)


def from_mapping(cls: type, data: Any, *, where: str | None = None) -> Any:
    """``cls(**data)`` for a dataclass, after ``check_mapping`` against its fields (those without a default
    are required). The values are the class's to check (``check_dataclass`` in its ``__post_init__``)."""
    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    return cls(**check_mapping(where or cls.__name__, data, field_types(cls), required))


# Metadata key of a field made by ``added_field``.
ADDED_FIELD = "mixlab_added_field"


def added_field(default: Any) -> Any:
    """A dataclass field with ``default``, added after records naming runs by every field of their resolved
    config were written: ``resolved_fields`` leaves it out while it holds its default, so those records keep
    their names (hashes). Give every new field of task parameters or of ModelConfig its default this way."""
    return dataclasses.field(default=default, metadata={ADDED_FIELD: True})


def resolved_fields(instance: Any) -> dict[str, Any]:
    """Every field of a (flat) dataclass as a dict, except a field made by ``added_field`` that holds its
    default: what a run's resolved config records (``runners.sweep.plan``)."""
    return {f.name: getattr(instance, f.name) for f in dataclasses.fields(instance)
            if not (f.metadata.get(ADDED_FIELD) and getattr(instance, f.name) == f.default)}


def _subject(name: str, where: str | None) -> str:
    return f"{where}.{name}" if where else name


def _read(text: str, annotation: Any) -> Any:
    """``text`` as a value of a plain annotation (str, bool, int, float, Literal); a bare ValueError if not."""
    if typing.get_origin(annotation) is Literal:
        for choice in typing.get_args(annotation):
            if text == str(choice) or (choice is None and text.lower() in _NONE_TEXT):
                return choice
        raise ValueError(text)
    if annotation is bool:
        if text.lower() not in _TRUE_TEXT + _FALSE_TEXT:
            raise ValueError(text)
        return text.lower() in _TRUE_TEXT
    if annotation in (str, int, float):
        return annotation(text)
    raise TypeError(f"unsupported annotation {annotation!r} for text")


def _unwrap(annotation: Any) -> tuple[Any, Bound | None]:
    """``Annotated[T, Bound]`` -> (T, the bound); anything else -> (it, None)."""
    if typing.get_origin(annotation) is Annotated:
        base, *extras = typing.get_args(annotation)
        return base, next((e for e in extras if isinstance(e, Bound)), None)
    return annotation, None


def _is_optional(annotation: Any) -> bool:
    return (typing.get_origin(annotation) in (typing.Union, types.UnionType)
            and type(None) in typing.get_args(annotation))


def _inner(optional: Any) -> Any:
    """``X | None`` -> X (one X only)."""
    (inner,) = [a for a in typing.get_args(optional) if a is not type(None)]
    return inner


def _item(annotation: Any) -> Any:
    """``tuple[X, ...]`` -> X."""
    (item,) = {a for a in typing.get_args(annotation) if a is not Ellipsis}
    return item
