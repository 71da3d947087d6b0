"""Reason codes: ``<domain>.<status-or-outcome>.<cause>``, declared per lifecycle."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .errors import InvalidArgument, PolicyError

_SEGMENT = r"[a-z][a-z0-9_]*"
REASON_PATTERN = re.compile(rf"^{_SEGMENT}\.{_SEGMENT}\.{_SEGMENT}$")


def check_reason_code(code: str) -> tuple[str, str, str]:
    """Split a well-formed code into its three parts or raise :class:`PolicyError`.

    >>> check_reason_code("dispatch.pending.enqueued")
    ('dispatch', 'pending', 'enqueued')
    """
    if not isinstance(code, str) or not REASON_PATTERN.match(code):
        raise PolicyError(
            f"reason code {code!r} is malformed: expected '<domain>.<status-or-outcome>.<cause>', "
            "three lowercase segments of letters, digits and underscores, e.g. 'dispatch.pending.enqueued'"
        )
    domain, middle, cause = code.split(".")
    return domain, middle, cause


@dataclass(frozen=True)
class Reason:
    """Why a transition happened: a declared code, a human summary and evidence references."""

    code: str
    summary: str = ""
    evidence: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.evidence or type(self.evidence) is not tuple:  # () needs nothing (the common case)
            if isinstance(self.evidence, (str, bytes)) or not isinstance(self.evidence, (list, tuple, set, frozenset)):
                raise InvalidArgument(f"reason.evidence: expected a list of references, got "
                                      f"{type(self.evidence).__name__}", argument="reason.evidence", rule="type")
            object.__setattr__(self, "evidence", tuple(str(e) for e in self.evidence))


@dataclass(frozen=True)
class Actor:
    """Who asked for a transition: a type (``system``, ``operator``, ...) and an id.

    >>> Actor.parse("operator:alice")
    Actor(type='operator', id='alice')
    """

    type: str
    id: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or not self.type or ":" in self.type:
            raise InvalidArgument(f"actor.type: {self.type!r} must be non-empty text without ':'",
                                  argument="actor.type", rule="actor")

    @classmethod
    def parse(cls, text: str) -> Actor:
        """An actor from ``"type:id"`` text, e.g. ``Actor.parse("user:ana")``."""
        kind, _, ident = text.partition(":")
        return cls(kind, ident)

    def __str__(self) -> str:
        return f"{self.type}:{self.id}" if self.id else self.type
