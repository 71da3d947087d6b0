"""The liveness signal beside the lease (S15, S16) on PostgreSQL, in one process on a FakeClock.

Each daemon's :class:`LeaseLeader` holds a session advisory lock on a connection of its own
(``SessionLock``). A "crash" here ends that session the way a dying process does — the socket closes —
while the lease row, by the clock, is still fresh: only the liveness signal can tell. Real processes
(SIGKILL, SIGSTOP) are in ``test_leader_processes.py``; the SQLite file lock in ``test_two_daemons.py``.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
import sqlalchemy as sa

from statebook.adapters.db import connect, open_book, reset_schema
from statebook.adapters.leader import LEASE as LEASE_NAME, LeaseLeader
from statebook.adapters.liveness import SessionLock
from statebook.adapters.pgnotify import asyncpg_dsn
from statebook.lifecycle import Book, FakeClock
from statebook.scheduler.errors import LeadershipLost
from statebook.scheduler.schema import scheduler_leases

LEASE = 15.0
SOON = 5.0
"""How long a test waits for the server to see a closed socket (milliseconds, as a rule)"""

pytestmark = pytest.mark.postgres


@pytest.fixture
async def books(pg_url):
    """Three Books on one PostgreSQL database, each with its own engine (three daemons), on one FakeClock."""
    clock = FakeClock(1_800_000_000)
    first = await open_book(pg_url, clock=clock)
    await reset_schema(first.engine)
    made = [first] + [Book(connect(pg_url), first.registry, clock) for _ in range(2)]
    try:
        yield made
    finally:
        for book in made:
            await book.engine.dispose()


@pytest.fixture
async def daemons(books):
    """A LeaseLeader with a SessionLock per book (``host-a``, ``host-b``, ``host-c``); released afterwards."""
    made = [LeaseLeader(book, f"host-{n}:1:{n}", lease_seconds=LEASE,
                        liveness=SessionLock(asyncpg_dsn(book), f"host-{n}:1:{n}", name=LEASE_NAME, watch_seconds=1))
            for n, book in zip("abc", books)]
    try:
        yield made
    finally:
        for leader in made:
            await leader.release()


def crash(leader: LeaseLeader) -> None:
    """End the leader's liveness session as a dying process does: the socket closes, nothing is released."""
    leader.liveness._session.terminate()


async def soon(check) -> bool:
    """``check()`` until it is true, for at most SOON seconds (the clock does not move)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SOON
    while not await check():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def lease_row(book):
    async with book.read() as conn:
        return (await conn.execute(sa.select(scheduler_leases))).one()


async def test_a_leader_whose_session_ended_is_replaced_at_once(books, daemons, caplog):
    """S15: the standby stands by while the leader's session lives (a fresh heartbeat, a held lock); once the
    session ends it takes the lease at epoch 2 at once — the clock never moved — and its log says why."""
    a, b, _ = daemons
    assert await a.is_leader() and a.epoch == 1
    for _ in range(3):
        assert not await b.is_leader()
    crash(a)
    with caplog.at_level(logging.INFO, logger="statebook.leader"):
        assert await soon(b.is_leader), "the standby did not take over a leader whose session ended"
    assert b.epoch == 2 and (await lease_row(books[0])).holder == "host-b:1:b"
    [took] = [r.getMessage() for r in caplog.records if "took the scheduler lease" in r.getMessage()]
    assert "from host-a:1:a: its database session ended" in took and "heartbeat 0.0s old" in took


async def test_a_frozen_leader_keeps_its_session_and_the_lease_until_it_lapses(books, daemons, caplog):
    """S15, S16: a frozen leader keeps its session and its lock: the standby waits for the lease's expiry, takes a
    stale lease (saying so), and the leader, waking, is fenced: it writes nothing and stands by."""
    a, b, _ = daemons
    clock = books[0].clock
    assert await a.is_leader()
    assert not await b.is_leader()
    clock.advance(LEASE - 1)
    assert not await b.is_leader(), "took the lease of a leader whose session lives before the lease ran out"
    clock.advance(2)
    with caplog.at_level(logging.INFO, logger="statebook.leader"):
        assert await b.is_leader() and b.epoch == 2
    assert any("from host-a:1:a: its heartbeat 16.0s old, older than the 15s lease" in r.getMessage()
               for r in caplog.records)
    async with books[0].begin() as tx:  # a wakes and goes on with its fire
        with pytest.raises(LeadershipLost, match="epoch 2"):
            await a.fence(tx)
    assert not await a.is_leader() and a.epoch is None


async def test_a_leader_whose_own_session_drops_stops_leading(books, daemons, caplog):
    """S15, S16: the server ends the leader's liveness session while its process lives (pg_terminate_backend, as a
    server restart or a dropped connection would): as soon as the socket closes it no longer holds the lease for
    a launch and fences nothing more; the standby takes over; the old leader stands down on its next tick."""
    a, b, _ = daemons
    clock = books[0].clock
    assert await a.is_leader() and a.holds(clock.now())
    assert not await b.is_leader()
    async with books[0].read() as conn:
        await conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": a.liveness._session.get_server_pid()})

    async def let_go() -> bool:
        return not a.holds(clock.now())

    assert await soon(let_go), "a leader whose liveness session ended may still launch"
    assert await soon(b.is_leader) and b.epoch == 2
    with caplog.at_level(logging.INFO, logger="statebook.leader"):
        assert not await a.is_leader()
    assert a.epoch is None
    assert any("host-a:1:a lost its liveness signal while leading at epoch 1" in r.getMessage() for r in caplog.records)
    assert not await a.is_leader(), "the old leader, back with a new session, took the live standby's lease"


async def test_a_leader_whose_session_dropped_fences_nothing_and_takes_a_new_epoch(books, daemons, caplog):
    """S16: with no standby, a leader whose session dropped is fenced on its next fire (nothing written); on its
    next tick it opens a new session and takes the lease back at a new epoch."""
    a, _, _ = daemons
    assert await a.is_leader()
    crash(a)
    async with books[0].begin() as tx:
        with pytest.raises(LeadershipLost, match="liveness signal ended"):
            await a.fence(tx)
    with caplog.at_level(logging.INFO, logger="statebook.leader"):
        assert await a.is_leader() and a.epoch == 2
    assert any("took the scheduler lease back at epoch 2" in r.getMessage() for r in caplog.records)
    async with books[0].begin() as tx:
        assert await a.fence(tx) == 2


async def test_two_standbys_racing_for_a_dead_leaders_lease_one_wins(books, daemons):
    """S15: both standbys find the leader's session gone and both have read the lease row before either writes:
    the compare-and-set on the epoch lets exactly one take epoch 2; the other stands by, then and on later ticks."""
    a, b, c = daemons
    assert await a.is_leader()
    assert not await b.is_leader() and not await c.is_leader()
    crash(a)
    assert await soon(lambda: b.liveness.gone(a.daemon_id))
    both_read = asyncio.Barrier(2)
    for standby in (b, c):
        standby._seen_gone = (a.daemon_id, 1)  # as their watchers would have seen it: no probe between them

        async def vacancy(conn, row, cutoff, found=standby._vacancy):
            why = await found(conn, row, cutoff)
            await both_read.wait()  # neither writes before both have found the lease vacant
            return why

        standby._vacancy = vacancy
    won = await asyncio.wait_for(asyncio.gather(b.is_leader(), c.is_leader()), SOON)
    assert sorted(won) == [False, True], "two daemons took the same lease"
    winner, loser = (b, c) if won[0] else (c, b)
    assert (winner.epoch, loser.epoch) == (2, None)
    del b._vacancy, c._vacancy
    for _ in range(3):
        assert await winner.is_leader() and not await loser.is_leader()
    assert (await lease_row(books[0])).holder == winner.daemon_id


async def test_a_standby_wakes_the_moment_the_leader_dies(books, daemons):
    """S15: the standby's watcher waits on the holder's lock: no wake while the leader lives (a wait ends
    without one), a wake as soon as its session ends, and the tick that follows takes the lease."""
    a, b, _ = daemons
    assert await a.is_leader()
    assert not await b.is_leader()
    woke = asyncio.Event()
    b.watch(woke.set)
    await asyncio.sleep(1.5)  # longer than one wait of the watcher (watch_seconds=1)
    assert not woke.is_set(), "woken while the leader lives"
    crash(a)
    await asyncio.wait_for(woke.wait(), SOON)
    assert await b.is_leader() and b.epoch == 2
