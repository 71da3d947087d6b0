"""The bounded slots every delivery pass runs on (statebook.outbox.core.slots, specs/notifications.md N11)."""

from __future__ import annotations

import asyncio

import pytest

from statebook.outbox.core.slots import Claimed, run_in_slots


def run(coro):
    return asyncio.run(coro)


def test_work_never_exceeds_the_slots_and_every_result_is_recorded():
    in_flight = most = 0
    recorded: list[tuple[int, int]] = []

    async def work(n: int) -> int:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.001 * (n % 3))
        in_flight -= 1
        return n * n

    async def record(group):
        recorded.extend(group)

    run(run_in_slots(range(20), work, record, concurrency=3, counts={}))
    assert most == 3
    assert sorted(recorded) == [(n, n * n) for n in range(20)]


def test_refills_fill_free_slots_within_the_budget_and_stop_when_rows_run_out():
    asked: list[int] = []
    due = list(range(7))

    async def refill(n: int) -> Claimed[int]:
        asked.append(n)
        taken, due[:] = due[:n], due[n:]
        return Claimed(taken, {"claimed": len(taken)}, len(taken))

    done: list[int] = []

    async def work(n: int) -> int:
        await asyncio.sleep(0)
        return n

    async def record(group):
        done.extend(n for n, _ in group)

    counts: dict[str, int] = {}
    run(run_in_slots([], work, record, concurrency=2, counts=counts, refill=refill, budget=100))
    assert sorted(done) == list(range(7)) and counts == {"claimed": 7}
    assert all(n <= 2 for n in asked)  # never more than the free slots
    assert asked[-1] > (7 - sum(asked[:-1]))  # the last refill found fewer rows than asked: no further one


def test_the_budget_bounds_what_a_pass_claims():
    async def refill(n: int) -> Claimed[int]:
        return Claimed(list(range(n)), {"claimed": n}, n)

    async def work(n: int) -> int:
        return n

    async def record(group):
        pass

    counts: dict[str, int] = {}
    run(run_in_slots([], work, record, concurrency=4, counts=counts, refill=refill, budget=10))
    assert counts == {"claimed": 10}


def test_work_that_raises_is_logged_and_not_recorded(caplog):
    recorded: list[int] = []

    async def work(n: int) -> int:
        if n == 2:
            raise RuntimeError("adapter bug")
        return n

    async def record(group):
        recorded.extend(n for n, _ in group)

    run(run_in_slots(range(5), work, record, concurrency=2, counts={}))
    assert sorted(recorded) == [0, 1, 3, 4]
    assert "adapter bug" in caplog.text


def test_a_refill_that_fails_first_fails_the_pass_and_later_ends_the_refills():
    async def broken(n: int) -> Claimed[int]:
        raise ConnectionError("database down")

    async def work(n: int) -> int:
        return n

    async def record(group):
        pass

    with pytest.raises(ConnectionError):
        run(run_in_slots([], work, record, concurrency=2, counts={}, refill=broken, budget=5))
    recorded: list[int] = []

    async def keep(group):
        recorded.extend(n for n, _ in group)

    run(run_in_slots([1, 2], work, keep, concurrency=4, counts={}, refill=broken, budget=5))
    assert sorted(recorded) == [1, 2]


def test_with_overlap_a_refill_runs_beside_a_slow_record_and_the_pass_waits_for_every_record():
    due = list(range(6))
    events: list[str] = []
    recording = 0

    async def refill(n: int) -> Claimed[int]:
        events.append(f"refill while {recording} recording")
        taken, due[:] = due[:n], due[n:]
        return Claimed(taken, {}, len(taken))

    async def work(n: int) -> int:
        return n

    recorded: list[int] = []

    async def record(group):
        nonlocal recording
        recording += 1
        await asyncio.sleep(0.01)
        recorded.extend(n for n, _ in group)
        recording -= 1

    run(run_in_slots([], work, record, concurrency=2, counts={}, refill=refill, budget=10, overlap=True))
    assert sorted(recorded) == list(range(6))  # every record finished before the pass returned
    assert any(e != "refill while 0 recording" for e in events), events
