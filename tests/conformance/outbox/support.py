"""Helpers for the outbox tests: a scriptable in-process transport and row/fact readers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from statebook.lifecycle import Book, Fact, history
from statebook.outbox import CallableTransport, TransportResult, get_dispatch


@dataclass
class Recorder:
    """A transport that records every send and answers from ``outcome(deliver_to, n)``.

    ``n`` is how many times that route was sent before. ``in_flight_max`` is the largest number of
    sends that were running at once; ``delay`` makes each send take that long (seconds).
    """

    outcome: Callable[[str, int], TransportResult | bool] = lambda _to, _n: True
    delay: float = 0.0
    calls: list[tuple[str, str]] = field(default_factory=list)
    in_flight: int = 0
    in_flight_max: int = 0

    async def __call__(self, deliver_to: str, payload: str) -> TransportResult | bool:
        n = sum(1 for to, _ in self.calls if to == deliver_to)
        self.calls.append((deliver_to, payload))
        self.in_flight += 1
        self.in_flight_max = max(self.in_flight_max, self.in_flight)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            return self.outcome(deliver_to, n)
        finally:
            self.in_flight -= 1

    @property
    def transport(self) -> CallableTransport:
        return CallableTransport(self)

    def ids(self) -> list[str]:
        return [json.loads(p)["dispatch_id"] for _, p in self.calls]


class Signalled(Recorder):
    """A recorder that also sets an event on every call (a test can wait for the first send)."""

    def __init__(self) -> None:
        super().__init__()
        self.called = asyncio.Event()

    async def __call__(self, deliver_to: str, payload: str) -> TransportResult | bool:
        self.called.set()
        return await super().__call__(deliver_to, payload)


def failing(error: str = "boom") -> Callable[[str, int], TransportResult]:
    return lambda _to, _n: TransportResult(False, error)


async def row(book: Book, dispatch_id: str) -> dict[str, Any]:
    found = await get_dispatch(book, dispatch_id)
    assert found is not None, f"dispatch {dispatch_id} is missing"
    return found


async def facts(book: Book, dispatch_id: str) -> list[Fact]:
    return await history(book, "dispatch", dispatch_id)


def moves(found: list[Fact]) -> list[tuple[str | None, str | None, str]]:
    return [(f.previous_status, f.status, f.reason_code) for f in found]
