"""The overview (docs/console.md, "Overview and live updates"): its figures match what was created, on
SQLite and PostgreSQL; the deliveries chart is SVG with every label escaped."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from statebook.adapters.leader import LeaseLeader
from statebook.adapters.web.overview import deliveries_per_minute, figures
from statebook.adapters.web.svg import bar_chart
from statebook.lifecycle import Book
from statebook.outbox import CallableTransport, deliver_due_dispatches, enqueue_dispatch


async def deliver_some(book: Book) -> None:
    """3 dispatches delivered, 2 dead-lettered (one attempt each, refused), then 2 left due, 30 s old."""
    for i in range(3):
        await enqueue_dispatch(book, kind="k", deliver_to="ok", body={"i": i})
    for i in range(2):
        await enqueue_dispatch(book, kind="k", deliver_to="bad", body={"i": i}, max_attempts=1)

    async def send(to: str, _payload: str) -> bool:
        return to == "ok"

    await deliver_due_dispatches(book, transport=CallableTransport(send))
    for i in range(2):
        await enqueue_dispatch(book, kind="later", deliver_to="ok", body={"j": i})
    book.clock.advance(30.0)  # type: ignore[attr-defined]


async def test_figures_match_what_was_created(book: Book) -> None:
    await deliver_some(book)
    found = await figures(book)
    dispatch = found.entities["dispatch"]
    assert list(dispatch) == list(book.policy("dispatch").statuses)  # every status, zeros included
    assert {s: n for s, n in dispatch.items() if n} == {"pending": 2, "delivered": 3, "dead_letter": 2}
    assert list(found.entities) == [lc.entity_type for lc in book.registry]
    assert found.due["dispatch"].count == 2
    assert found.due["dispatch"].oldest_age_seconds == pytest.approx(30.0)
    assert found.dead_letters["dispatch"] == 2
    assert found.dead_letters.get("notification", 0) == 0
    assert found.dead_letters_total == 2
    delivered = found.deliveries
    assert delivered.complete
    assert len(delivered.minutes) == 60
    assert delivered.by_lifecycle == {"dispatch": {"delivered": 3, "dead_letter": 2}}
    assert sum(c.get("delivered", 0) for _, c in delivered.minutes) == 3
    assert delivered.minutes[-1][0] <= book.clock.now() < delivered.minutes[-1][0] + 60
    assert found.lease is None and found.daemons == []


async def test_the_chart_reads_only_the_newest_facts_and_says_from_when(book: Book) -> None:
    await deliver_some(book)
    whole = await deliveries_per_minute(book, book.clock.now())
    part = await deliveries_per_minute(book, book.clock.now(), limit=3)
    assert whole.complete and not part.complete
    assert part.since > part.start
    assert sum(sum(c.values()) for _, c in part.minutes) <= 3
    later = await deliveries_per_minute(book, book.clock.now() + 3 * 3600)
    assert later.by_lifecycle == {}  # out of the window


async def test_the_leader_and_its_heartbeat(book: Book) -> None:
    leader = LeaseLeader(book, "daemon-a", lease_seconds=90)
    assert await leader.is_leader()
    found = await figures(book, lease_seconds=90)
    assert found.lease is not None and found.lease.holder == "daemon-a" and not found.lease.stale
    assert [d.daemon_id for d in found.daemons] == ["daemon-a"]
    book.clock.advance(120.0)  # type: ignore[attr-defined]
    found = await figures(book, lease_seconds=90)
    assert found.lease is not None and found.lease.stale and found.lease.age == pytest.approx(120.0)


def test_the_chart_is_svg_with_every_label_escaped() -> None:
    evil = "<script>alert(1)</script>"
    svg = bar_chart([(1_700_000_000.0, {evil: 2, "delivered": 1}), (1_700_000_060.0, {})], title=f"t {evil}")
    assert "<script" not in svg
    root = ET.fromstring(svg)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert evil in texts and f"t {evil}" in texts
    rects = [r for r in root.iter("{http://www.w3.org/2000/svg}rect") if r.get("data-series")]
    assert {r.get("data-series") for r in rects} == {evil, "delivered"}
