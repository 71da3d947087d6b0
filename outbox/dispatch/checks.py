"""The outbox's argument checks (specs/outbox.md O22), run before any query.

Each refusal is a :class:`DispatchInvalid` (an ``InvalidArgument``) whose message starts with the
public argument's name. Built on :mod:`statebook.lifecycle.inputs`; the ranges below are the
outbox's own, the same on every backend (both hold far more than these).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from statebook.lifecycle import Actor, Book
from statebook.lifecycle.errors import InvalidArgument
from statebook.lifecycle import inputs
from statebook.lifecycle.inputs import KEY_CHARS, Limits, duration, integer, json_value, number, text, timestamp

from .bounds import dash_routes
from .errors import DispatchInvalid

MAX_ATTEMPTS = 10_000
"""``max_attempts`` is 1 to this: attempts beyond it would only repeat a capped backoff for years."""
MAX_BATCH = 10_000
"""``batch_size`` (rows one pass claims) is 1 to this."""
MAX_CONCURRENCY = 1_000
"""``concurrency`` (transports in flight) is 1 to this."""
MAX_LIST = 100_000
"""``list_dispatches(limit=)`` is 1 to this (each row comes back decoded, payload and all)."""
ROUTE_CHARS = 4_096
"""The longest ``deliver_to``: a channel, an address, a URL; far below what an argv element carries."""
NOTE_CHARS = 500
"""The longest operator note an operator call keeps in its fact's summary (the console's reason field)."""
MAX_DAYS = 36_600.0
"""Retention periods are more than 0 and at most a century of days."""

T = TypeVar("T")


def refused(exc: InvalidArgument) -> DispatchInvalid:
    """``exc`` as the outbox's error."""
    return DispatchInvalid(str(exc), argument=exc.argument, rule=exc.rule)


def in_item(exc: InvalidArgument, index: int) -> DispatchInvalid:
    """A batch item's refusal, named as ``items[index].<argument>`` (its message starts with the argument)."""
    return DispatchInvalid(f"items[{index}].{exc}", argument=f"items[{index}].{exc.argument}", rule=exc.rule)


def _as_dispatch(check: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    try:
        return check(*args, **kwargs)
    except DispatchInvalid:
        raise
    except InvalidArgument as exc:
        raise refused(exc) from None


def _refuse(argument: str, rule: str, message: str) -> DispatchInvalid:
    return DispatchInvalid(f"{argument}: {message}", argument=argument, rule=rule)


def book_arg(value: Any, *, unbound: str | None = None) -> Book:
    """A :class:`Book`; with ``unbound`` (what needs it) one that is not bound to a transaction."""
    _as_dispatch(inputs.book, "book", value)
    book: Book = value
    if unbound is not None and book.conn is not None:
        raise _refuse("book", "bound", f"{unbound} runs transports outside any transaction; pass an unbound "
                                       "book, not one from book.begin()")
    return book


def dispatch_id(value: Any, argument: str = "dispatch_id") -> str:
    """An id as text both backends can compare (no NUL, no lone surrogate, at most KEY_CHARS)."""
    return _as_dispatch(text, argument, value, max_chars=KEY_CHARS)


def actor(value: Any, argument: str = "actor") -> Actor:
    """An :class:`Actor` (the engine checks its text)."""
    return _as_dispatch(inputs.actor, argument, value)


def transport_arg(value: Any, argument: str = "transport") -> None:
    """Anything with an async ``send(deliver_to, payload)`` (the :class:`~.transport.Transport` protocol)."""
    if not callable(getattr(value, "send", None)):
        hint = "; wrap an async function in CallableTransport(fn)" if callable(value) else ""
        raise _refuse(argument, "type", f"expected a Transport (an object with async send(deliver_to, payload)), "
                                        f"got {type(value).__name__}{hint}")


def flag(argument: str, value: Any) -> bool:
    """Return ``value`` when it is a bool; raises ``DispatchInvalid`` naming ``argument`` otherwise."""
    return _as_dispatch(inputs.flag, argument, value) is True  # not optional: True or False, never None


def text_arg(argument: str, value: Any) -> str:
    """Text UTF-8 can encode, without NUL (what a command line and both databases carry)."""
    return _as_dispatch(text, argument, value)


def note(value: Any) -> str | None:
    """An operator's note: None, or text of at most :data:`NOTE_CHARS` characters."""
    return None if value is None else _as_dispatch(text, "note", value, max_chars=NOTE_CHARS)


def with_note(summary: str, note: str | None) -> str:
    """A fact's summary with the operator's note after it, in parentheses (as a notification replay's)."""
    return f"{summary} ({note})" if note else summary


def name(argument: str, value: Any, *, max_chars: int = KEY_CHARS) -> str:
    """Text that is not blank (a kind, a route, a key)."""
    checked = _as_dispatch(text, argument, value, max_chars=max_chars)
    if not checked.strip():
        raise _refuse(argument, "empty", "must be a non-empty string (not blank)")
    return checked


def optional_name(argument: str, value: Any) -> str | None:
    """``None``, or ``value`` checked as a name (see :func:`name`)."""
    return None if value is None else name(argument, value)


def route(argument: str, value: Any, limits: Limits) -> str:
    """A route: non-blank text of at most :data:`ROUTE_CHARS`; a leading ``-`` only when the delivery
    template puts ``--`` before ``{deliver_to}`` (otherwise the command would read it as an option)."""
    checked = name(argument, value, max_chars=ROUTE_CHARS)
    if checked.startswith("-") and not dash_routes(limits):
        raise _refuse(argument, "dash", "starts with '-', so the delivery command would read it as an option; "
                                        "use a route without a leading '-', or put '--' before {deliver_to} in "
                                        "the notify template (and build book.limits with dispatch_limits)")
    return checked


def count(argument: str, value: Any, high: int) -> int:
    """An integer from 1 to ``high``."""
    return _as_dispatch(integer, argument, value, low=1, high=high)


def when(argument: str, value: Any) -> float:
    """POSIX seconds, finite, 1970 to 9999."""
    return _as_dispatch(timestamp, argument, value)


def seconds(argument: str, value: Any) -> float:
    """A duration of more than 0 seconds, at most a century."""
    return _as_dispatch(duration, argument, value, positive=True)


def days(argument: str, value: Any) -> float:
    """A retention period in days: more than 0, at most :data:`MAX_DAYS`."""
    checked = _as_dispatch(number, argument, value, low=0.0, high=MAX_DAYS)
    if checked <= 0:
        raise _refuse(argument, "range", f"{value!r} must be more than 0 days")
    return checked


def callback(argument: str, value: Any) -> None:
    """Raise ``DispatchInvalid`` naming ``argument`` unless ``value`` is callable or None."""
    _as_dispatch(inputs.callback, argument, value)


def texts(argument: str, value: Any) -> list[str]:
    """A list (any iterable but a string or mapping) of names."""
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise _refuse(argument, "type", f"expected a list of names, got {type(value).__name__}")
    items = list(value)
    for index, item in enumerate(items):
        name(f"{argument}[{index}]", item)
    return items


def json_object(argument: str, value: Any, limits: Limits) -> None:
    """A JSON object within ``limits`` (depth, size), walked without recursion."""
    if not isinstance(value, Mapping):
        raise _refuse(argument, "type", f"must be a JSON object (a dict) or None, got {type(value).__name__}")
    _as_dispatch(json_value, argument, value, limits)  # refuses what the encoder cannot write, by name
