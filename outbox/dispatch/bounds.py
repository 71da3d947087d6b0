"""What a dispatch may hold so that it can be delivered (specs/outbox.md O22).

Enqueue and delivery run in different processes; the book is what they share, so the delivery
template's capacity travels in ``book.limits``: a :class:`DispatchLimits` built by
:func:`dispatch_limits` from the template. A plain :class:`Limits` means: the payload is bounded by
``json_bytes`` and a route starting with ``-`` is refused.

>>> limits = dispatch_limits(["notify-send", "--", "{deliver_to}", "{payload}"])
>>> limits.payload_bytes, limits.dash_routes
(126976, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from statebook.lifecycle.inputs import DEFAULT_LIMITS, Limits, integer

from .errors import DispatchInvalid

DELIVER_TO = "{deliver_to}"
PAYLOAD = "{payload}"
"""The argv template's two placeholders (an element exactly equal to one is replaced by the value)."""

ARG_STRLEN = 131_072
"""Linux ``MAX_ARG_STRLEN``: the longest single argv element the kernel passes, its NUL included."""
ARGV_PAYLOAD_BYTES = ARG_STRLEN - 4_096
"""The default payload bound when the template passes ``{payload}`` as an argument (a page of margin)."""


@dataclass(frozen=True)
class DispatchLimits(Limits):
    """:class:`Limits` plus what the book's delivery can carry."""

    payload_bytes: int | None = None
    """the longest payload (the stored envelope as canonical JSON, UTF-8 bytes); None: ``json_bytes``"""
    dash_routes: bool = False
    """True when the template puts ``--`` before ``{deliver_to}``, so a route starting with ``-`` is inert"""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.payload_bytes is not None:
            integer("payload_bytes", self.payload_bytes, low=2, high=2**30)
        if type(self.dash_routes) is not bool:
            raise DispatchInvalid(f"dash_routes: expected True or False, got {type(self.dash_routes).__name__}",
                                  argument="dash_routes", rule="type")


def dispatch_limits(template: Sequence[str] | None, base: Limits = DEFAULT_LIMITS, *,
                    payload_bytes: int | None = None) -> DispatchLimits:
    """``base`` with the payload bound and the dash rule of an argv ``template``.

    With ``{payload}`` as an element the payload bound is :data:`ARGV_PAYLOAD_BYTES` (or the smaller
    ``payload_bytes`` given; a larger one is refused: it could never be delivered); otherwise the
    payload goes to stdin and ``payload_bytes`` (default ``base.json_bytes``) bounds it.
    """
    parts = list(template) if isinstance(template, list | tuple) else []
    if payload_bytes is not None:
        integer("payload_bytes", payload_bytes, low=2, high=2**30)
    if PAYLOAD in parts:
        if payload_bytes is not None and payload_bytes > ARGV_PAYLOAD_BYTES:
            raise DispatchInvalid(
                f"payload_bytes: {payload_bytes} is more than one argv element can carry ({ARGV_PAYLOAD_BYTES} bytes: "
                f"Linux passes at most {ARG_STRLEN} per argument); the template passes {PAYLOAD} as an argument, so "
                "lower payload_bytes or send the payload on stdin (drop the {payload} element)",
                argument="payload_bytes", rule="range",
            )
        payload_bytes = payload_bytes or ARGV_PAYLOAD_BYTES
    dash = DELIVER_TO in parts and "--" in parts[: parts.index(DELIVER_TO)]
    return DispatchLimits(json_depth=base.json_depth, json_bytes=base.json_bytes, payload_bytes=payload_bytes,
                          dash_routes=dash)


def payload_bound(limits: Limits) -> tuple[int, str]:
    """The longest payload ``limits`` admit, and where that bound comes from (for the refusal)."""
    configured = getattr(limits, "payload_bytes", None)
    if configured is None or configured >= limits.json_bytes:
        return limits.json_bytes, "limits.json_bytes, the longest JSON a book stores"
    if configured == ARGV_PAYLOAD_BYTES:
        return configured, (f"limits.payload_bytes: the delivery template passes {PAYLOAD} as one argv element, "
                            f"and Linux passes at most {ARG_STRLEN} bytes per argument")
    return configured, "limits.payload_bytes, the bound configured for this book's delivery"


def dash_routes(limits: Limits) -> bool:
    """Whether ``limits`` admit a route starting with ``-`` (only behind a template's ``--``)."""
    return getattr(limits, "dash_routes", False) is True
