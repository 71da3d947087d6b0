"""lifecycle/inputs.py against a plain recursive reference: the fast paths refuse exactly what the rules say."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, strategies as st

from statebook.lifecycle.errors import InvalidArgument
from statebook.lifecycle.inputs import INT32, INT64, Limits, check_columns, json_value, text

ANY_TEXT = st.text(st.characters(codec=None, categories=None), max_size=12)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), ANY_TEXT,
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.one_of(ANY_TEXT, st.integers()), inner,
                                                                         max_size=4)),
    max_leaves=25,
)


def reference(value: Any, limits: Limits, depth: int = 0) -> str | None:
    """The rule that breaks, or None: recursion and the real encoder, no shortcuts."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return None if INT64[0] <= value <= INT64[1] else "range"
    if isinstance(value, float):
        return None if math.isfinite(value) else "finite"
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return "utf8"
        return None
    if depth + 1 > limits.json_depth:
        return "depth"
    if isinstance(value, dict):
        if any(type(k) is not str for k in value):
            return "json"
        items = [*value.keys(), *value.values()]
    else:
        items = list(value)
    for item in items:
        if (broken := reference(item, limits, depth + 1)) is not None:
            return broken
    return None


def outcome(value: Any, limits: Limits) -> str | None:
    try:
        json_value("v", value, limits)
    except InvalidArgument as exc:
        return exc.rule
    return None


@given(VALUES, st.integers(min_value=1, max_value=6), st.integers(min_value=2, max_value=400))
def test_json_value_refuses_exactly_what_the_rules_refuse(value: Any, depth: int, size: int) -> None:
    limits = Limits(json_depth=depth, json_bytes=size)
    got = outcome(value, limits)
    broken = reference(value, limits)
    if broken is None:
        text_size = len(json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())
        assert got == ("size" if text_size > size else None), (got, text_size)
    else:
        assert got is not None  # which rule is reported first may differ; that one is refused may not


def test_a_body_nested_far_deeper_than_the_recursion_limit_is_a_clear_refusal() -> None:
    value: Any = 0
    for _ in range(100_000):
        value = {"a": value}
    with pytest.raises(InvalidArgument, match="nested more than 32 levels"):
        json_value("body", value)


TABLE = sa.Table(
    "t", sa.MetaData(), sa.Column("id", sa.String(8), primary_key=True), sa.Column("n", sa.Integer),
    sa.Column("big", sa.BigInteger), sa.Column("x", sa.Float), sa.Column("note", sa.Text),
    sa.Column("key", sa.Text, unique=True), sa.Column("flag", sa.Boolean),
)


@given(st.sampled_from(["id", "n", "big", "x", "note", "key", "flag"]), SCALARS)
def test_column_fast_paths_agree_with_the_full_checks(column: str, value: Any) -> None:
    """Whatever the inline fast path lets through, the full check of the column's rule accepts too."""
    try:
        check_columns(TABLE, {column: value}, Limits())
        accepted = True
    except InvalidArgument as exc:
        assert exc.argument == f"t.{column}"
        accepted = False
    if value is None:
        assert accepted
        return
    expected = True
    try:
        if column in ("id", "note", "key"):
            text(column, value, max_chars={"id": 8, "key": 255}.get(column))
        elif column in ("n", "big"):
            low, high = INT32 if column == "n" else INT64
            assert type(value) is int and low <= value <= high
        elif column == "x":
            assert type(value) in (int, float) and not isinstance(value, bool) and math.isfinite(float(value))
        elif column == "flag":
            assert type(value) is bool or value in (0, 1)
    except (InvalidArgument, AssertionError, OverflowError):
        expected = False
    assert accepted == expected, (column, value)


EDGE_TEXT = st.text(st.characters(codec="utf-8"), max_size=300)


@given(st.one_of(st.lists(EDGE_TEXT, max_size=5), st.dictionaries(EDGE_TEXT, st.one_of(EDGE_TEXT, st.none(),
                                                                                        st.integers(min_value=-(2**63), max_value=2**63 - 1)), max_size=4)),
       st.integers(min_value=-3, max_value=3))
def test_the_size_bound_is_exact_at_the_edge(value: Any, offset: int) -> None:
    """Text of escapes and multi-byte characters right at the bound: the estimate never lets one past."""
    exact = len(json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())
    bound = max(2, exact + offset)
    assert (outcome(value, Limits(json_bytes=bound)) == "size") == (exact > bound)


def test_a_mapping_that_is_not_a_dict_is_refused_as_not_json() -> None:
    """The canonical encoder takes dicts only: any other mapping inside a value is refused here, not a TypeError later."""
    from types import MappingProxyType

    with pytest.raises(InvalidArgument, match="mappingproxy, which is not JSON"):
        json_value("body", {"inner": MappingProxyType({"a": 1})})


def test_the_shared_argument_checks_use_one_wording() -> None:
    """flag, actor, book and callback: the outbox, the notifications and the scheduler call these, so each
    refusal reads the same everywhere ("<argument>: expected ..., got <type>")."""
    from statebook.lifecycle import Actor
    from statebook.lifecycle.inputs import actor, book, callback, flag

    assert flag("force", True) is True and flag("dead_letter", None, optional=True) is None
    for value in (1, 0, "yes", None):
        with pytest.raises(InvalidArgument, match=r"^force: expected true or false, got ") as err:
            flag("force", value)
        assert (err.value.argument, err.value.rule) == ("force", "type")
    with pytest.raises(InvalidArgument, match=r"^dead_letter: expected true, false or None, got int$"):
        flag("dead_letter", 1, optional=True)
    who = Actor("operator", "ana")
    assert actor("actor", who) is who
    with pytest.raises(InvalidArgument, match=r"^actor: expected an Actor \(e\.g\. Actor\('operator', 'alice'\)\), got str$"):
        actor("actor", "operator:ana")
    with pytest.raises(InvalidArgument, match=r"^book: expected a statebook Book, got str$"):
        book("book", "sqlite://")
    assert callback("progress", None) is None and callback("progress", print) is print
    with pytest.raises(InvalidArgument, match=r"^progress: expected a callable or None, got int$"):
        callback("progress", 3)
