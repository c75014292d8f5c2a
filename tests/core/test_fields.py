"""core.fields: checking values against annotations, reading them from text, dataclasses from mappings."""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np
import pytest
from mixlab.core.fields import (
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    check,
    check_dataclass,
    check_mapping,
    field_types,
    from_mapping,
    from_yaml,
    parse,
)

CHOICES = ("lm", "compression")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    width: PositiveInt
    lengths: tuple[int, ...] = (1, 2)
    rate: PositiveFloat = 0.5
    cap: NonNegativeInt | None = None
    mode: Literal[CHOICES] = "lm"
    tags: dict = dataclasses.field(default_factory=dict)  # unchecked: no __post_init__


@dataclasses.dataclass(frozen=True, kw_only=True)
class Checked:
    width: PositiveInt = 1
    rate: float = 0.5
    cap: NonNegativeInt | None = None
    mode: Literal[CHOICES] = "lm"

    def __post_init__(self) -> None:
        check_dataclass(self)


def raises(match: str):
    return pytest.raises(ValueError, match=f"^{match}$")


@pytest.mark.parametrize("value", [3, np.int64(3), np.int32(3)], ids=["int", "int64", "int32"])
def test_ints_accept_numpy_and_become_int(value):
    out = check("seq_len", value, int)
    assert out == 3 and type(out) is int


@pytest.mark.parametrize("value", [True, 3.0, "12", None], ids=["bool", "float", "str", "none"])
def test_ints_are_strict(value):
    with raises(f"seq_len must be an integer, got {value!r}"):
        check("seq_len", value, int)


def test_message_names_where_the_field_lives():
    with raises("mqar.seq_len must be an integer, got '12'"):
        check("seq_len", "12", int, where="mqar")


def test_floats_accept_ints_and_become_float_unless_keep_ints():
    assert type(check("lr", 1, float)) is float and type(check("lr", np.float32(0.5), float)) is float
    assert type(check("lr", 1, float, keep_ints=True)) is int
    assert type(check("lr", np.int64(1), float, keep_ints=True)) is int
    assert type(check("lr", 0.5, float, keep_ints=True)) is float
    with raises("lr must be a number, got True"):
        check("lr", True, float)


@pytest.mark.parametrize(("annotation", "bad", "words"), [
    (PositiveInt, 0, "a positive integer"),
    (NonNegativeInt, -1, "a non-negative integer"),
    (PositiveFloat, 0.0, "a positive number"),
    (NonNegativeFloat, -0.5, "a non-negative number"),
    (PositiveFloat, float("nan"), "a positive number"),
    (PositiveInt, True, "a positive integer"),
])
def test_bounds(annotation, bad, words):
    with raises(f"x must be {words}, got {bad!r}"):
        check("x", bad, annotation)


def test_bounds_accept_their_edge():
    assert check("x", 1, PositiveInt) == 1 and check("x", 0, NonNegativeInt) == 0
    assert check("x", 0, NonNegativeFloat) == 0.0


def test_optional():
    assert check("cap", None, NonNegativeInt | None) is None
    assert check("cap", 4, NonNegativeInt | None) == 4
    with raises("cap must be a non-negative integer, got -1"):
        check("cap", -1, NonNegativeInt | None)


def test_tuples_take_lists_and_name_the_bad_item():
    assert check("lengths", [1, np.int64(2)], tuple[int, ...]) == (1, 2)
    with raises("lengths must be a list, got 3"):
        check("lengths", 3, tuple[int, ...])
    with raises("t.lengths\\[1\\] must be an integer, got 'x'"):
        check("lengths", (1, "x"), tuple[int, ...], where="t")


def test_literal_choices():
    assert check("mode", "lm", Literal[CHOICES]) == "lm"
    assert check("backend", None, Literal[None, "torch"]) is None
    with raises("mode must be one of 'lm', 'compression', got 'mlm'"):
        check("mode", "mlm", Literal[CHOICES])


def test_strings_bools_and_classes():
    assert check("name", "a", str) == "a" and check("flag", False, bool) is False
    assert check("config", Checked(), Checked) == Checked()
    with raises("name must be a string, got 1"):
        check("name", 1, str)
    with raises("flag must be true or false, got 1"):
        check("flag", 1, bool)
    with raises("config must be a Checked, got 1"):
        check("config", 1, Checked)


def test_dicts_are_checked_as_dicts_only():
    fields = {"d_model": "not checked"}
    assert check("model", fields, dict[str, int]) is fields
    with raises("model must be a dict, got \\[1\\]"):
        check("model", [1], dict[str, int])


def test_unsupported_annotation_is_a_programming_error():
    with pytest.raises(TypeError, match="unsupported"):
        check("x", 1, int | str)


@pytest.mark.parametrize(("text", "annotation", "value"), [
    (" 12 ", int, 12),
    ("1e-3", float, 1e-3),
    ("1,2, 3", tuple[int, ...], (1, 2, 3)),
    ("(4,5)", tuple[int, ...], (4, 5)),
    ("none", PositiveInt | None, None),
    ("NULL", float | None, None),
    ("7", PositiveInt | None, 7),
    ("compression", Literal[CHOICES], "compression"),
    ("none", Literal[None, "torch"], None),
    ("yes", bool, True),
    ("0", bool, False),
    ("abc", str, "abc"),
])
def test_parse_text(text, annotation, value):
    out = parse("x", text, annotation)
    assert out == value and type(out) is type(value)


def test_parse_leaves_bounds_to_check():
    assert parse("x", "0", PositiveInt) == 0


@pytest.mark.parametrize(("text", "annotation", "message"), [
    ("abc", int, "p.x: cannot read 'abc' as an integer"),
    ("1.5", int, "p.x: cannot read '1.5' as an integer"),
    ("fast", PositiveFloat, "p.x: cannot read 'fast' as a number"),
    ("1,x", tuple[int, ...], "p.x\\[1\\]: cannot read 'x' as an integer"),
    ("fancy", Literal[CHOICES], "p.x: cannot read 'fancy' as one of 'lm', 'compression'"),
    ("maybe", bool, "p.x: cannot read 'maybe' as true or false"),
])
def test_parse_names_unreadable_text(text, annotation, message):
    with raises(message):
        parse("x", text, annotation, where="p")


def test_from_yaml_reads_number_text_in_float_fields_only():
    assert from_yaml("lr", "1e-3", float) == 1e-3
    assert from_yaml("lr", "1e-3", PositiveFloat | None) == 1e-3
    assert from_yaml("n", "12", int) == "12", "an int field's text is left for check to refuse"
    assert from_yaml("lr", 2, float) == 2 and from_yaml("lr", None, float | None) is None
    with raises("train.lr: cannot read 'fast' as a number"):
        from_yaml("lr", "fast", float, where="train")


def test_field_types_keep_bounds_in_field_order():
    types = field_types(Checked)
    assert list(types) == ["width", "rate", "cap", "mode"]
    assert types["width"] == PositiveInt and types["cap"] == NonNegativeInt | None
    with pytest.raises(TypeError):
        types["width"] = int


def test_check_dataclass_normalises_frozen_fields_and_names_the_class():
    config = Checked(width=np.int64(2), rate=1)
    assert type(config.width) is int and type(config.rate) is float
    with raises("Checked.width must be a positive integer, got 0"):
        Checked(width=0)
    with raises("Checked.mode must be one of 'lm', 'compression', got 'mlm'"):
        Checked(mode="mlm")


def test_check_dataclass_keep_ints():
    config = Config(width=1, rate=1)
    check_dataclass(config, where="cfg", keep_ints=True)
    assert type(config.rate) is int
    with raises("cfg.rate must be a positive number, got 0"):
        check_dataclass(Config(width=1, rate=0), where="cfg", keep_ints=True)


def test_check_mapping():
    assert check_mapping("s", {"a": 1}, {"a", "b"}, required={"a"}) == {"a": 1}
    assert check_mapping("s", {"anything": 1}) == {"anything": 1}
    with raises("s must be a mapping, got \\[1\\]"):
        check_mapping("s", [1])
    with raises("s: unknown keys \\['c'\\]; allowed: \\['a', 'b'\\]"):
        check_mapping("s", {"a": 1, "c": 2}, {"a", "b"})
    with raises("s: missing keys \\['a'\\]"):
        check_mapping("s", {"b": 1}, {"a", "b"}, required={"a"})


def test_from_mapping():
    assert from_mapping(Checked, {"width": 3}) == Checked(width=3)
    assert from_mapping(Config, {"width": 3}).tags == {}, "a default_factory field is not required"
    with raises("Checked: unknown keys \\['widht'\\]; allowed: \\['cap', 'mode', 'rate', 'width'\\]"):
        from_mapping(Checked, {"widht": 3})
    with raises("Config: missing keys \\['width'\\]"):
        from_mapping(Config, {})
    with raises("model must be a mapping, got 3"):
        from_mapping(Checked, 3, where="model")
    with raises("Checked.width must be a positive integer, got 0"):
        from_mapping(Checked, {"width": 0})
