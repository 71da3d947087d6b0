"""The twin harness: every fuzz example runs against a SQLite book AND a PostgreSQL book.

Before each example both databases are emptied and seeded with the same few entities (``SEEDS``);
the call runs once per backend; then, per backend, the property of issue 10 is checked:

- the call succeeded, or raised a ``StatebookError`` (anything else propagates: the test fails with
  the escaped exception and a note naming the backend);
- when it did not succeed, the row count of every managed table and of ``status_transitions`` is
  unchanged;
- ``verify`` finds nothing.

Finally the two outcomes (``ok`` or the error's class name, and the change in counts) must be equal:
an input one backend accepts and the other refuses fails the test.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from hypothesis import Phase, settings

from statebook.adapters.db import open_book, reset_schema
from statebook.lifecycle import Book, FakeClock, StatebookError, verify
from statebook.lifecycle.facts import facts_table
from statebook.outbox import CallableTransport, TransportResult, deliver_due_dispatches, enqueue_dispatch, get_dispatch
from statebook.scheduler import create_schedule

from .strategies import Deep, Seed, nested

START = 1_700_000_000.0
SCALE = {"deep": 10}
"""Examples per surface are the module constants times this factor for the active Hypothesis profile."""


def examples(count: int) -> settings:
    """``settings(max_examples=count)``, scaled up under ``HYPOTHESIS_PROFILE=deep``.

    ``STATEBOOK_FUZZ_SHRINK=0`` skips shrinking: a quick survey of every failing surface (shrinking a
    failure that round-trips two databases can take minutes)."""
    factor = SCALE.get(os.environ.get("HYPOTHESIS_PROFILE", "dev"), 1)
    if os.environ.get("STATEBOOK_FUZZ_SHRINK") == "0":
        return settings(max_examples=count * factor, phases=[p for p in Phase if p not in (Phase.shrink, Phase.explain)])
    return settings(max_examples=count * factor)


@dataclass
class Twin:
    """One backend's side of an example: its engine, the seeded entities, the book of this example."""

    name: str
    url: str
    proto: Book
    seeds: dict[str, Any] = field(default_factory=dict)
    book: Book | None = None


@dataclass(frozen=True)
class Outcome:
    kind: str
    """``ok``, or the class name of the StatebookError raised (API) / ``exit N`` (CLI)"""
    delta: tuple[tuple[str, int], ...]
    """each table's change in rows (only the tables that changed)"""


async def counts(book: Book) -> dict[str, int]:
    """Rows of every managed table and of ``status_transitions``."""
    tables = [facts_table, *(lc.table for lc in book.registry)]
    query = sa.select(*(sa.select(sa.func.count()).select_from(t).scalar_subquery().label(t.name) for t in tables))
    async with book.engine.connect() as conn:
        return dict((await conn.execute(query)).one()._mapping)


def delta(before: dict[str, int], after: dict[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple((name, after[name] - before[name]) for name in sorted(after) if after[name] != before[name])


async def _ok_send(deliver_to: str, payload: str) -> bool:
    return True


async def _failed_send(deliver_to: str, payload: str) -> TransportResult:
    return TransportResult.failed("seed: refused")


async def seed(book: Book) -> dict[str, Any]:
    """The same small world on each backend; ids differ, so they are returned by role.

    ``delivered`` (delivered, no ack asked), ``dead_letter`` (failed its only attempt), ``pending``
    (due, asks an ack; ``ack_token`` is its token), ``schedule`` (an hourly command, named ``nightly``).
    """
    clock = book.clock
    seeds: dict[str, Any] = {}
    seeds["delivered"] = await enqueue_dispatch(book, kind="note", deliver_to="ops", body={"text": "done"})
    await deliver_due_dispatches(book, transport=CallableTransport(_ok_send))
    seeds["dead_letter"] = await enqueue_dispatch(book, kind="note", deliver_to="ops", body={}, max_attempts=1)
    await deliver_due_dispatches(book, transport=CallableTransport(_failed_send))
    seeds["pending"] = await enqueue_dispatch(book, kind="note", deliver_to="ops", body={"n": 1}, ack_required=True)
    seeds["ack_token"] = (await get_dispatch(book, seeds["pending"])).ack_token.get_secret_value()
    row = await create_schedule(book, {"name": "nightly", "trigger_type": "interval", "interval_sec": 3600,
                                       "action_kind": "command", "action_command": "/bin/true"})
    seeds["schedule"], seeds["schedule_name"] = row.id, row.name
    clock.advance(60)
    return seeds


def resolve(value: Any, seeds: dict[str, Any]) -> Any:
    """``value`` with every :class:`Seed` replaced by this backend's entity and every :class:`Deep` built
    (through lists, tuples and dicts)."""
    if isinstance(value, Seed):
        return seeds[value.role]
    if isinstance(value, Deep):
        return nested(value.depth)
    if type(value) is list:
        return [resolve(v, seeds) for v in value]
    if type(value) is tuple:
        return tuple(resolve(v, seeds) for v in value)
    if type(value) is dict:
        return {k: resolve(v, seeds) for k, v in value.items()}
    return value


class Pair:
    """Both backends, driven from synchronous Hypothesis tests through one event loop."""

    def __init__(self, runner: asyncio.Runner, twins: list[Twin]) -> None:
        self.runner = runner
        self.twins = twins

    def fresh(self, twin: Twin) -> Book:
        """Empty ``twin``'s database, seed it on a new FakeClock, and return the example's book."""

        return self.runner.run(self._prepare(twin))

    async def _prepare(self, twin: Twin) -> Book:
        await reset_schema(twin.proto.engine)
        twin.book = Book(twin.proto.engine, twin.proto.registry, FakeClock(START))
        twin.seeds = await seed(twin.book)
        return twin.book

    def check(self, call: Callable[[Book, Callable[[Any], Any]], Awaitable[Any]]) -> list[Outcome]:
        """Run ``call(book, resolve)`` on each backend; check the property; compare the outcomes."""
        outcomes = [self.runner.run(self._one(twin, call)) for twin in self.twins]
        same(self.twins, outcomes)
        return outcomes

    async def _one(self, twin: Twin, call: Callable[..., Awaitable[Any]]) -> Outcome:
        book = await self._prepare(twin)
        before = await counts(book)
        try:
            await call(book, lambda value: resolve(value, twin.seeds))
            kind = "ok"
        except StatebookError as exc:
            kind = type(exc).__name__
        except BaseException as exc:
            exc.add_note(f"escaped on {twin.name}: {type(exc).__name__} is not a StatebookError")
            raise
        after = await counts(book)
        if kind != "ok":
            unchanged(twin.name, kind, before, after)
        await clean(twin.name, book)
        return Outcome(kind, delta(before, after))

    def measure(self, twin: Twin) -> dict[str, int]:
        assert twin.book is not None
        return self.runner.run(counts(twin.book))

    def verify_clean(self, twin: Twin) -> None:
        assert twin.book is not None
        self.runner.run(clean(twin.name, twin.book))


def unchanged(backend: str, kind: str, before: dict[str, int], after: dict[str, int]) -> None:
    assert after == before, f"{backend}: failed with {kind} but wrote rows: {delta(before, after)}"


async def clean(backend: str, book: Book) -> None:
    report = await verify(book)
    assert report.ok, f"{backend}: verify found {[f.kind if hasattr(f, 'kind') else f for f in report.findings]}"


def same(twins: list[Twin], outcomes: list[Outcome]) -> None:
    (a, oa), (b, ob) = zip([t.name for t in twins], outcomes)
    assert oa.kind == ob.kind, f"backends disagree: {a} -> {oa.kind}, {b} -> {ob.kind}"
    assert oa.delta == ob.delta, f"backends wrote differently: {a} -> {oa.delta}, {b} -> {ob.delta}"


def open_pair(sqlite_path: Path, pg_url: str) -> Iterator[Pair]:
    """A generator for a module fixture: both books open on one ``asyncio.Runner``, disposed after."""
    runner = asyncio.Runner()
    urls = {"sqlite": f"sqlite:///{sqlite_path}", "postgres": pg_url}
    twins = [Twin(name, url, runner.run(open_book(url, clock=FakeClock(START)))) for name, url in urls.items()]
    try:
        yield Pair(runner, twins)
    finally:
        for twin in twins:
            runner.run(reset_schema(twin.proto.engine))
            runner.run(twin.proto.engine.dispose())
        runner.close()
