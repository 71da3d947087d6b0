"""The tracing port: where statebook opens a span, with nothing behind it until a tracer is installed.

The parts call :func:`active` on their hot paths and go on untouched when it answers None (one global
read: nothing is built, nothing imported). ``statebook.adapters.otel`` installs an OpenTelemetry tracer
(the ``otel`` extra); any object with :class:`Tracer`'s one method serves as well, e.g. in a test.

Span names, kinds and attributes follow OpenTelemetry's semantic conventions :data:`SEMCONV_VERSION`
(messaging for the dispatch outbox); docs/how-to/tracing.md lists them. An attribute never holds a
secret: no route, URL, token, body or free-text error.

>>> install(None) is None and active() is None
True
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from typing import Literal, Protocol

__all__ = ["SEMCONV_VERSION", "TRACEPARENT_PATTERN", "Attribute", "Span", "SpanKind", "Tracer", "active", "install",
           "installed", "is_traceparent"]

SEMCONV_VERSION = "1.44.0"
"""The OpenTelemetry semantic conventions the spans follow (schema ``https://opentelemetry.io/schemas/1.44.0``)."""

SpanKind = Literal["internal", "producer", "consumer", "client", "server"]
Attribute = str | int | float | bool
"""What an attribute may hold (OpenTelemetry's primitive values)."""

TRACEPARENT_PATTERN = r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}"
"""A W3C ``traceparent`` of version 00's shape: version, trace id, parent span id, flags (lower-case hex)."""
_TRACEPARENT = re.compile(TRACEPARENT_PATTERN)


class Span(Protocol):
    """An open span as the parts see it."""

    def set(self, key: str, value: Attribute) -> None:
        """Set one attribute (never a secret)."""

    def fail(self, error_type: str) -> None:
        """Mark the span failed; ``error_type`` is a low-cardinality class (``timeout``), never a message."""

    def traceparent(self) -> str | None:
        """This span's context as a W3C ``traceparent`` (``00-<trace>-<span>-<flags>``); None without a valid one."""


class Tracer(Protocol):
    """Opens spans; installed with :func:`install`."""

    def span(self, name: str, kind: SpanKind, attributes: Mapping[str, Attribute], *,
             parent: str | None = None) -> contextlib.AbstractContextManager[Span]:
        """A span current inside the ``with``; ``parent`` (a ``traceparent``) instead of the current context."""


_active: Tracer | None = None


def active() -> Tracer | None:
    """The installed tracer, or None: the parts then open no span and build no attribute."""
    return _active


def install(tracer: Tracer | None) -> Tracer | None:
    """Make ``tracer`` the one spans go to (None: tracing off); returns the one it replaces."""
    global _active
    previous, _active = _active, tracer
    return previous


def is_traceparent(value: object) -> bool:
    """True for a W3C ``traceparent`` of version 00's shape (the envelope's field is checked with it).

    >>> is_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"), is_traceparent("x")
    (True, False)
    """
    return isinstance(value, str) and len(value) == 55 and _TRACEPARENT.fullmatch(value) is not None


@contextlib.contextmanager
def installed(tracer: Tracer | None) -> Iterator[Tracer | None]:
    """:func:`install` for the ``with`` block, the previous tracer back after it (tests, embedding)."""
    previous = install(tracer)
    try:
        yield tracer
    finally:
        install(previous)
