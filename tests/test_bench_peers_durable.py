"""``tests/bench/w7.py`` and ``durable_peers.py``: each W7 driver and DBOS's drain on SQLite, small.

Checks that every contender records one step per transition (15 for 3 entities x 5) and that the
table lines have their targets and n/a reasons; no timing is asserted. Needs the bench extra (dbos,
eventsourcing) and is skipped without it."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

pytest.importorskip("dbos", reason="DBOS is in the bench extra: pip install -e '.[bench]'")
pytest.importorskip("eventsourcing", reason="eventsourcing is in the bench extra: pip install -e '.[bench]'")

BENCH = Path(__file__).resolve().parent / "bench"
_PATH = list(sys.path)
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

import durable_peers  # noqa: E402
import w7  # noqa: E402
from statebook.adapters.db import open_book  # noqa: E402

sys.path[:] = _PATH  # the bench's flat module names stay out of the rest of the session's imports

ENTITIES = ["a", "b", "c"]


def test_statebook_moves_three_entities_through_five_transitions(tmp_path: Path) -> None:
    async def go() -> tuple[float, list[float], int]:
        book = await open_book(f"sqlite:///{tmp_path / 'sb.db'}", registry=w7.registry())
        try:
            return await w7.statebook_w7(book, ENTITIES)
        finally:
            await book.engine.dispose()

    seconds, latencies, recorded = asyncio.run(go())
    assert (recorded, len(latencies)) == (15, 15) and seconds > 0


def test_eventsourcing_records_one_event_per_transition(tmp_path: Path) -> None:
    peer = durable_peers.EventsourcingPeer(f"sqlite:///{tmp_path / 'es.db'}")
    seconds, latencies, recorded = asyncio.run(peer.w7(ENTITIES))
    assert (recorded, len(latencies)) == (15, 15) and seconds > 0


def test_dbos_records_a_step_per_transition_and_drains_five(tmp_path: Path) -> None:
    peer = durable_peers.DbosPeer(f"sqlite:///{tmp_path / 'dbos.db'}")

    async def go() -> tuple[tuple[float, list[float], int], tuple[float, int]]:
        return await peer.w7(ENTITIES), await peer.drain(5)

    (seconds, latencies, recorded), (drained, steps) = asyncio.run(go())
    assert (recorded, len(latencies)) == (15, 15) and seconds > 0
    assert steps == 5 and drained > 0


def test_the_lines_carry_the_targets_and_say_why_a_peer_cannot_run() -> None:
    names = ["statebook", "eventsourcing", "dbos"]
    r = {f"{c}-{b}": [100.0] for c in names for b in ("pg", "sqlite")}
    q = {f"{c}-{b}-{k}": [50.0] for c in ("statebook", "dbos") for b in ("pg", "sqlite") for k in ("enq", "drain")}
    pct = {key: [1.0] for key in r}
    cpu = {key: [0.1] for key in (*r, *q)}
    lines = w7._lines(r, q, pct, pct, cpu, 3, 5, 5)
    w7_lines = [ln for ln in lines if ln.workload.startswith("W7 guarded")]
    assert {(ln.backend, ln.reference) for ln in w7_lines} == {
        (b, p) for b in ("postgresql", "sqlite") for p in ("eventsourcing", "dbos")}
    assert all(ln.target == ">= 2x" and ln.passed is False for ln in w7_lines)  # 1.0x misses 2x
    drains = [ln for ln in lines if ln.workload.startswith("W2 drain")]
    assert [ln.verdict for ln in drains] == ["FAIL", "FAIL", "n/a", "n/a"]
    assert all("no queue" in ln.note for ln in drains if ln.statebook is None)
    assert sum(1 for ln in lines if ln.workload.startswith("W7 transition")) == 8
