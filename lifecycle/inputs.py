"""Arguments checked at the boundary, the same way for every backend (specs/lifecycle.md L20).

A value reaches the database only after it passed the rule its column (or argument) states, so
SQLite and PostgreSQL accept and refuse exactly the same inputs and the refusal names the argument:

- text: a ``str`` that UTF-8 can encode (no lone surrogate), without NUL; at most :data:`KEY_CHARS`
  characters where an index stores it (ids, keys, names), at most ``String(n)``'s ``n``;
- integers: an ``int`` (not a ``bool``) in the column's range on both backends (``Integer``: 32 bits,
  ``BigInteger``: 64 bits);
- numbers and times: finite (no NaN, no infinity), times between 1970 and 9999, given as POSIX seconds or an
  aware ``datetime`` (a naive one is refused);
- JSON: dicts with string keys, lists, strings, finite numbers, booleans and null; nested at most
  :attr:`Limits.json_depth` levels, at most :attr:`Limits.json_bytes` bytes as canonical text.

Every refusal is an :class:`InvalidArgument`, raised before any statement runs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from .clock import posix
from .codec import dumps
from .errors import InvalidArgument
from .reasons import Actor, Reason

KEY_CHARS = 255
"""The longest text an index stores (ids, idempotency and dedup keys, names): two such keys of
4-byte characters stay under PostgreSQL's b-tree entry limit."""
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
TIME_RANGE = (0.0, 253402300799.0)
"""POSIX seconds from 1970-01-01 to 9999-12-31T23:59:59Z: what both backends and ``datetime`` hold."""


@dataclass(frozen=True)
class Limits:
    """Bounds on stored JSON (a body, metadata, a patch), set per book (settings ``[limits]``)."""

    json_depth: int = 32
    """the deepest nesting of lists and objects"""
    json_bytes: int = 1_048_576
    """the longest canonical JSON text, in UTF-8 bytes"""

    def __post_init__(self) -> None:
        integer("json_depth", self.json_depth, low=1, high=200)  # the encoder recurses once per level
        integer("json_bytes", self.json_bytes, low=2, high=2**30)


def _refuse(argument: str, rule: str, message: str) -> InvalidArgument:
    return InvalidArgument(f"{argument}: {message}", argument=argument, rule=rule)


def text(argument: str, value: Any, *, max_chars: int | None = None, empty: bool = True) -> str:
    """``value`` if it is storable text, else :class:`InvalidArgument` naming ``argument``."""
    if not isinstance(value, str):
        raise _refuse(argument, "type", f"expected text, got {type(value).__name__}")
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError as exc:
            raise _refuse(argument, "utf8", f"is not valid UTF-8 text (a lone surrogate at {exc.start})") from None
    if "\x00" in value:
        raise _refuse(argument, "nul", f"contains a NUL character at {value.index(chr(0))}")
    if max_chars is not None and len(value) > max_chars:
        raise _refuse(argument, "length", f"is {len(value)} characters long; at most {max_chars} are allowed")
    if not empty and not value:
        raise _refuse(argument, "empty", "must not be empty")
    return value


def integer(argument: str, value: Any, *, low: int = INT64[0], high: int = INT64[1]) -> int:
    """``value`` if it is an ``int`` in ``[low, high]``."""
    if type(value) is not int and (not isinstance(value, int) or isinstance(value, bool)):
        raise _refuse(argument, "type", f"expected an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise _refuse(argument, "range", f"{shown(value)} is out of range; allowed: {low} to {high}")
    return value


def number(argument: str, value: Any, *, low: float = -math.inf, high: float = math.inf) -> float:
    """``value`` (an int or float) if it is finite and in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _refuse(argument, "type", f"expected a number, got {type(value).__name__}")
    try:
        as_float = float(value)
    except OverflowError:
        as_float = math.inf
    if not math.isfinite(as_float):
        raise _refuse(argument, "finite", f"{shown(value)} is not a finite number")
    if not low <= as_float <= high:
        raise _refuse(argument, "range", f"{shown(value)} is out of range; allowed: {low:g} to {high:g}")
    return value


def timestamp(argument: str, value: Any) -> float:
    """A time as stored: POSIX seconds, finite, from 1970 to 9999, from an aware ``datetime`` or a number
    (returned as given); a naive ``datetime`` is refused (rule ``naive``), and so is a ``bool``."""
    if isinstance(value, datetime):
        try:
            value = posix(value, argument)
        except ValueError as exc:
            raise _refuse(argument, "naive", str(exc).split(": ", 1)[1]) from None
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _refuse(argument, "type", f"expected a datetime or POSIX seconds, got {type(value).__name__}")
    return number(argument, value, low=TIME_RANGE[0], high=TIME_RANGE[1])


def duration(argument: str, value: Any, *, low: float = 0.0, high: float = 100 * 366 * 86400.0,
             positive: bool = False) -> float:
    """Seconds, finite, in ``[low, high]`` (at most a century by default); ``positive`` refuses 0."""
    number(argument, value, low=low, high=high)
    if positive and value <= 0:
        raise _refuse(argument, "range", f"{shown(value)} must be more than 0 seconds")
    seconds: float = value
    return seconds


def flag(argument: str, value: Any, *, optional: bool = False) -> bool | None:
    """``value`` if it is a ``bool`` (with ``optional``, or None); 0 and 1 are not flags here."""
    if type(value) is bool or (optional and value is None):
        return value
    expected = "true, false or None" if optional else "true or false"
    raise _refuse(argument, "type", f"expected {expected}, got {type(value).__name__}")


def actor(argument: str, value: Any) -> Actor:
    """``value`` if it is an :class:`Actor` (its text is checked where its fact is written)."""
    if not isinstance(value, Actor):
        raise _refuse(argument, "type", f"expected an Actor (e.g. Actor('operator', 'alice')), got "
                                        f"{type(value).__name__}")
    return value


@functools.cache
def _book_class() -> type:
    # Imported on first use (the book module imports this one), then kept: an import statement in
    # book() ran the import machinery on every enqueue.
    from .book import Book

    return Book


def book(argument: str, value: Any) -> Any:
    """``value`` if it is a :class:`~statebook.lifecycle.Book`."""
    if not isinstance(value, _book_class()):
        raise _refuse(argument, "type", f"expected a statebook Book, got {type(value).__name__}")
    return value


def callback(argument: str, value: Any) -> Any:
    """``value`` if it is callable or None."""
    if value is not None and not callable(value):
        raise _refuse(argument, "type", f"expected a callable or None, got {type(value).__name__}")
    return value


def json_value(argument: str, value: Any, limits: Limits | None = None) -> Any:
    """``value`` if it is JSON within ``limits`` (see the module docstring); walked without recursion.

    The walk also sums a bound on the canonical text's length (a character takes at most 6 bytes
    escaped, a number at most 26); only a value whose bound exceeds ``json_bytes`` is encoded to
    measure it exactly."""
    limits = limits or DEFAULT_LIMITS
    low, high = INT64
    estimate = 0
    stack: list[tuple[Any, int]] = [((value,), 0)]  # the value inside a depth-0 wrapper: one loop for all
    while stack:  # containers only; their scalars are checked where they are met
        node, depth = stack.pop()
        if depth > limits.json_depth:
            raise _refuse(argument, "depth", f"is nested more than {limits.json_depth} levels deep")
        estimate += 2
        if type(node) is dict:
            for key in node:
                if type(key) is not str:
                    raise _refuse(argument, "json", f"has a key of type {type(key).__name__}; JSON keys are text")
                if not key.isascii():
                    _json_text(argument, key)
                estimate += 6 * len(key) + 4
            items: Any = node.values()
        else:
            items = node
        for item in items:
            kind = type(item)
            if kind is str:
                if not item.isascii():
                    _json_text(argument, item)
                estimate += 6 * len(item) + 3
            elif kind is int:
                if not low <= item <= high:
                    integer(argument, item)
                estimate += 21
            elif kind is float:
                if item - item != 0.0:
                    raise _refuse(argument, "finite", f"holds {item!r}, which JSON cannot carry")
                estimate += 26
            elif kind is dict or kind is list or kind is tuple:
                stack.append((item, depth + 1))
            elif item is None or kind is bool:
                estimate += 6
            else:
                raise _refuse(argument, "json", f"holds a {kind.__name__}, which is not JSON")
    if estimate > limits.json_bytes:
        size = len(dumps(value).encode())
        if size > limits.json_bytes:
            raise _refuse(argument, "size", f"is {size} bytes as JSON; at most {limits.json_bytes} are allowed")
    return value


def _digits(value: int) -> int:
    """How many decimal digits ``abs(value)`` has, without writing it as text."""
    magnitude = abs(value)
    estimate = max(1, int(magnitude.bit_length() * 0.30102999566398120))  # log10(2)
    return estimate + 1 if magnitude >= 10**estimate else estimate


def _json_text(argument: str, value: str) -> None:
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise _refuse(argument, "utf8", f"holds text that is not valid UTF-8 (a lone surrogate at {exc.start})") from None


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` for a message, cut to about ``limit`` characters (input may be megabytes).

    An integer too long to show is described by its size: Python refuses to write an integer of more
    than 4,300 digits as text, and a message must never fail.

    >>> shown(10**5000)
    'an integer of 5001 digits'
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of {_digits(value)} digits"
    full = repr(value)
    return full if len(full) <= limit else f"{full[: limit - 20]}…({len(full)} characters)"


DEFAULT_LIMITS = Limits()


# -- columns ----------------------------------------------------------------------------------------
_rules: dict[sa.Table, dict[str, tuple[str, Any, Any] | None]] = {}


def check_columns(table: sa.Table, values: Mapping[str, Any], limits: Limits, *, what: str = "") -> None:
    """Each value against the rule of its column (unknown names are the caller's to refuse).

    The common values (short ASCII text, in-range ints, finite floats) pass inline; anything else
    goes through the full check, which says what is wrong."""
    rules = _rules.get(table)
    if rules is None:
        rules = _rules[table] = {c.name: _column_rule(table, c) for c in table.columns}
    for name, value in values.items():
        if value is None:
            continue
        rule = rules.get(name)
        if rule is None:
            continue
        kind, low, high = rule
        vtype = type(value)
        if kind == "text":
            if vtype is str and value.isascii() and "\x00" not in value and (high is None or len(value) <= high):
                continue
            text(_name(table, what, name), value, max_chars=high)
        elif kind == "int":
            if vtype is int and low <= value <= high:
                continue
            integer(_name(table, what, name), value, low=low, high=high)
        elif kind == "float":
            if vtype is float and value - value == 0.0:  # false for NaN and the infinities
                continue
            number(_name(table, what, name), value)
        elif kind == "json":
            json_value(_name(table, what, name), value, limits)
        elif kind == "bool":
            _boolean(_name(table, what, name), value)


def _name(table: sa.Table, what: str, column: str) -> str:
    return f"{what or table.name}.{column}"


def _column_rule(table: sa.Table, column: sa.Column[Any]) -> tuple[str, Any, Any] | None:
    kind = column.type
    if isinstance(kind, sa.JSON):
        return ("json", None, None)
    if isinstance(kind, sa.Boolean):
        return ("bool", None, None)
    if isinstance(kind, sa.Integer):
        low, high = INT64 if isinstance(kind, sa.BigInteger) else INT32
        return ("int", low, high)
    if isinstance(kind, (sa.Float, sa.Numeric)):
        return ("float", None, None)
    if isinstance(kind, sa.String):
        bound = kind.length
        if _indexed(table, column):
            bound = min(bound or KEY_CHARS, KEY_CHARS)
        return ("text", None, bound)
    return None


def _boolean(argument: str, value: Any) -> Any:
    if type(value) is not bool and value not in (0, 1):
        raise _refuse(argument, "type", f"expected true or false, got {shown(value)}")
    return value


def _indexed(table: sa.Table, column: sa.Column[Any]) -> bool:
    if column.primary_key or column.unique or column.index:
        return True
    in_index = any(column.name in {c.name for c in index.columns} for index in table.indexes)
    in_unique = any(isinstance(c, sa.UniqueConstraint) and column.name in {k.name for k in c.columns}
                    for c in table.constraints)
    return in_index or in_unique


def plain_texts(values: Any, max_chars: int) -> bool:
    """Whether every value is ASCII text of at most ``max_chars`` without NUL: the common case, which
    passes :func:`text` too, checked in one call. False says nothing: run :func:`text` on each."""
    for value in values:
        if type(value) is not str or len(value) > max_chars or not value.isascii() or "\x00" in value:
            return False
    return True


_ANY_LENGTH = 1 << 62


def check_reason_actor(reason: Any, actor: Any, metadata: Mapping[str, Any] | None, limits: Limits) -> None:
    """A command's reason, actor and metadata: what its fact stores besides the row's values."""
    if not isinstance(reason, Reason):
        raise _refuse("reason", "type", f"expected a Reason, got {type(reason).__name__}")
    if not isinstance(actor, Actor):
        raise _refuse("actor", "type", f"expected an Actor (e.g. Actor('operator', 'alice')), got "
                                       f"{type(actor).__name__}")
    evidence = reason.evidence
    if not isinstance(evidence, tuple):
        raise _refuse("reason.evidence", "type", f"expected a tuple of text, got {type(evidence).__name__}")
    if not (actor.type and plain_texts((reason.code, actor.type, actor.id), KEY_CHARS)
            and plain_texts((reason.summary, *evidence), _ANY_LENGTH)):
        text("reason.code", reason.code, max_chars=KEY_CHARS)
        text("reason.summary", reason.summary)
        for ref in evidence:
            text("reason.evidence", ref)
        text("actor.type", actor.type, max_chars=KEY_CHARS, empty=False)
        text("actor.id", actor.id, max_chars=KEY_CHARS)
    if metadata:
        if type(metadata) is not dict:
            if not isinstance(metadata, Mapping):
                raise _refuse("metadata", "type", f"expected a mapping, got {type(metadata).__name__}")
            metadata = dict(metadata)
        json_value("metadata", metadata, limits)
