"""Bad-input strategies: what a careless caller or another program hands a public entry point.

Each strategy mixes a few well-formed values (so the success path is exercised too) with the
shapes issue 10 found: lone surrogates, NUL, huge text, deep JSON, NaN and infinities, numbers past
32 and 64 bits (and past 4,300 digits, issue 25), times outside 1970..9999, wrong types. ``Seed`` stands for an entity the harness
created before the example (tests/fuzz/support.py resolves it per backend, since ids differ).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

HUGE_CHARS = 100_000
DEEPEST = 5000


@dataclass(frozen=True)
class Seed:
    """The id (or another field) of a seeded entity, named by role: ``Seed("pending")``, ``Seed("ack_token")``."""

    role: str


@dataclass(frozen=True)
class Deep:
    """``[[[...]]]`` ``depth`` levels deep, built only when the call runs (support.resolve): Hypothesis
    prints a failing example's arguments, and printing 5000 levels would itself overflow the stack."""

    depth: int


# -- text ---------------------------------------------------------------------------------------
surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
any_char = st.characters(codec=None, categories=None)
fair_chars = st.characters(codec="utf-8", exclude_characters="\x00")

FIXED_TEXT = ("", " ", "\x00", "a\x00b", "\ud800", "x\udfff", "-", "--version", "-rf", "..", "../../etc/passwd",
              "{payload}", "{deliver_to}", "a\nb", "x" * 255, "x" * 256, "é" * 256, "😀" * 300)


def huge_text() -> st.SearchStrategy[str]:
    """Rarely drawn: one character repeated up to 100k times (cheap to build, costly to store)."""
    return st.builds(lambda c, n: c * n, st.sampled_from("x\x00é\ud800"), st.integers(1_000, HUGE_CHARS))


def sparingly(rare: st.SearchStrategy[Any], common: st.SearchStrategy[Any], *, one_in: int = 20) -> st.SearchStrategy[Any]:
    """``rare`` about once in ``one_in`` draws, ``common`` otherwise (huge values stay cheap on average)."""
    return st.integers(1, one_in).flatmap(lambda n: rare if n == 1 else common)


def texts(*fair: str) -> st.SearchStrategy[str]:
    """Arbitrary text, weighted towards the bad cases; ``fair`` are values the call accepts."""
    common = st.one_of(
        st.sampled_from(fair or ("ops",)),
        st.sampled_from(FIXED_TEXT),
        st.text(any_char, max_size=20),
        st.text(st.one_of(fair_chars, surrogates, st.just("\x00")), max_size=12),
    )
    return sparingly(huge_text(), common)


def ids(*roles: str) -> st.SearchStrategy[Any]:
    """An id: a seeded entity's (by role), a well-formed unknown one, or bad text or a wrong type."""
    return st.one_of(
        st.sampled_from([Seed(r) for r in roles]) if roles else st.nothing(),
        st.just("0" * 32),
        texts(),
        wrong_types(),
    )


def wrong_types() -> st.SearchStrategy[Any]:
    return st.sampled_from([None, 0, 1.5, True, b"bytes", ["list"], {"a": 1}, object()])


# -- numbers and times --------------------------------------------------------------------------
EDGE_INTS = (0, 1, -1, 2**31 - 1, 2**31, -(2**31) - 1, 2**63 - 1, 2**63, -(2**63) - 1, 2**80)


def _huge(sign: int) -> int:
    return sign * 10**5000


def huge_ints() -> st.SearchStrategy[int]:
    """Integers Python refuses to write as text (more than 4,300 digits): a message showing one must not
    fail. Built by a function, since Hypothesis writes the values of ``sampled_from`` in its own reprs."""
    return st.sampled_from((1, -1)).map(_huge)
EDGE_FLOATS = (math.nan, math.inf, -math.inf, 1e400, -0.0, 5e-324, 1.7976931348623157e308)
EDGE_TIMES = (0.0, -1.0, 1_700_000_000.0, 253402300799.0, 253402300800.0, 1e12, -1e12)


def integers(*fair: int) -> st.SearchStrategy[Any]:
    """A count or limit: in range, at the 32/64-bit edges, far past them, or not an integer at all."""
    return st.one_of(
        st.sampled_from(fair or (1,)),
        st.sampled_from(EDGE_INTS),
        st.integers(min_value=-(2**80), max_value=2**80),
        huge_ints(),
        st.floats(allow_nan=True, allow_infinity=True),
        wrong_types(),
    )


def numbers(*fair: float) -> st.SearchStrategy[Any]:
    """A duration or amount: finite or not, huge, negative, an int past 64 bits, or a wrong type."""
    return st.one_of(
        st.sampled_from(fair or (1.0,)),
        st.sampled_from(EDGE_FLOATS),
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(min_value=-(2**80), max_value=2**80),
        huge_ints(),
        wrong_types(),
    )


def times() -> st.SearchStrategy[Any]:
    """POSIX seconds: ordinary, at and past 1970 and 9999, not finite, or a wrong type."""
    return st.one_of(st.sampled_from(EDGE_TIMES), numbers(1_700_000_000.0))


def time_texts() -> st.SearchStrategy[str]:
    """What an operator types for ``--before``/``--at``/``--as-of``: numbers, ISO-8601 and junk."""
    return st.one_of(
        st.sampled_from(("nan", "NaN", "inf", "-inf", "infinity", "1e400", "-1", "0", "1700000000",
                         "253402300800", "99999999999999999999", "2026-05-01T09:00:00Z", "2026-05-01T09:00:00+02:00",
                         "0001-01-01", "9999-12-31T23:59:59Z", "2026-13-01", "")),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.integers(min_value=-(2**80), max_value=2**80).map(str),
        texts(),
    )


def number_texts() -> st.SearchStrategy[str]:
    """What an operator types for a numeric option: a number in any range, or not a number."""
    return st.one_of(
        st.sampled_from(("1", "0", "-1", "nan", "inf", "1e400", "2147483648", "9223372036854775808",
                         "99999999999", "0.2", "", "1" + "0" * 5000)),
        st.integers(min_value=-(2**80), max_value=2**80).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        texts(),
    )


# -- JSON ---------------------------------------------------------------------------------------
def nested(depth: int, leaf: Any = 1) -> Any:
    """``[[[...leaf...]]]`` ``depth`` levels deep, built without recursion."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def json_values() -> st.SearchStrategy[Any]:
    """JSON-ish values, some not JSON: NaN, surrogates, NUL, 64-bit overflow, sets, bytes, deep nesting."""
    scalars = st.one_of(
        st.none(), st.booleans(), st.floats(allow_nan=True, allow_infinity=True),
        st.integers(min_value=-(2**80), max_value=2**80), huge_ints(), st.text(any_char, max_size=8),
        st.text(st.one_of(fair_chars, surrogates, st.just("\x00")), max_size=6),
    )
    trees = st.recursive(
        scalars,
        lambda inner: st.one_of(st.lists(inner, max_size=3),
                                st.dictionaries(st.text(any_char, max_size=5), inner, max_size=3)),
        max_leaves=8,
    )
    odd = st.sampled_from([{1: "int key"}, {"set": {1, 2}}, {"bytes": b"x"}, {"obj": object()}, ("tuple",)])
    deep = st.integers(1, DEEPEST).map(Deep)
    big = st.integers(1, 3).map(lambda n: {"text": "x" * (n * 600_000)})
    return st.one_of(trees, odd, deep, sparingly(big, trees))


def bodies() -> st.SearchStrategy[Any]:
    """A dispatch body or metadata: usually a mapping (of anything), sometimes not."""
    return st.one_of(
        st.just({"text": "hi"}),
        st.dictionaries(st.text(any_char, max_size=5), json_values(), max_size=3),
        st.integers(1, DEEPEST).map(lambda d: {"deep": Deep(d)}),
        json_values(),
    )
