"""One fire per occurrence outside the tick's batch path (S1), gate order overlap → budget (S5), max_runs
and follow-ups (S5, S8), and a stale read through a second SQLite connection (S1).

The single-schedule claims — missed fire ``skip`` / ``run_once``, a cadence advance, a github event, a
manual fire — rely on their own compare-and-set (``next_fire_at``, ``github_cursor``, the status) and
not on the tick's row lock. Each test below hands such a claim a schedule row that another claimant
has already moved on, and counts the runs.
"""

from __future__ import annotations



from statebook.adapters.db import connect, open_book
from statebook.lifecycle import Book, verify
from statebook.scheduler.occurrence import claim
from statebook.scheduler.store import get_schedule, schedule_row
from statebook.lifecycle import Reason

from conformance.scheduler.support import make, runs_of

from conformance.scheduler.cases_stale_claim import engine


async def test_sqlite_two_connections_stale_read_is_a_conflict(tmp_path, clock):
    """S1 on SQLite: two Books (two engines) on one file; a claim with a row read before the other's claim
    conflicts and the occurrence has one run."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    a_book = await open_book(url, clock=clock)
    b_book = Book(connect(url), a_book.registry, clock)
    try:
        s = await make(a_book, interval_sec=10)
        clock.advance(10)
        stale = await schedule_row(a_book, s.id)
        a, b = engine(a_book, clock), engine(b_book, clock)
        assert await b.consider_many([await schedule_row(b_book, s.id)], clock.now()) == ["fired"]
        assert await a.consider_many([dict(stale)], clock.now()) == ["conflict"]
        lost = await claim(a_book, stale, stale["next_fire_at"], stale["next_fire_at"] + 10,
                           reason=Reason("schedule.active.fire_claimed", "stale"))
        assert lost.conflict
        await b.wait_idle()
        runs = await runs_of(a_book, s.id)
        assert [r["occurrence_at"] for r in runs] == [stale["next_fire_at"]]
        assert (await verify(a_book)).ok
    finally:
        await a_book.engine.dispose()
        await b_book.engine.dispose()
