"""The overview (docs/console.md, "Overview and live updates"): its figures match what was created, on
SQLite and PostgreSQL; the deliveries chart is SVG with every label escaped."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from statebook.adapters.leader import LeaseLeader
from statebook.adapters.web.overview import deliveries_per_minute, figures
from statebook.adapters.web.svg import bar_chart
from statebook.lifecycle import Book
from statebook.outbox import CallableTransport, deliver_due_dispatches, enqueue_dispatch
from statebook.outbox.notifications import send_notification
from statebook.outbox.notifications.delivery import deliver_due_notifications
from statebook.outbox.notifications.scripted import ScriptedChannel


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


# -- the page ---------------------------------------------------------------------------------------

async def test_the_page_shows_the_figures_and_the_chart(client: Any, sign_in: Any, book: Book) -> None:
    await deliver_some(book)
    assert (await client.get("/")).status_code == 303  # anonymous: to the sign-in page
    await sign_in("viewer")
    page = await client.get("/")
    assert page.status_code == 200
    html = page.text
    assert figure(html, "dispatch-delivered") == "3" and figure(html, "dispatch-dead_letter") == "2"
    assert figure(html, "dispatch-pending") == "2" and figure(html, "total-dispatch") == "7"
    assert figure(html, "due-dispatch") == "2" and figure(html, "due-dispatch-age") == "30 s"
    assert figure(html, "dead-letters") == "2" and figure(html, "dead-letters-dispatch") == "2"
    assert figure(html, "delivered-dispatch-delivered") == "3"
    assert figure(html, "delivered-dispatch-dead_letter") == "2"
    assert '<svg xmlns="http://www.w3.org/2000/svg" class="chart"' in html
    assert "No verify has run in this console" in html
    assert 'src="/static/live.js"' in html and 'data-live="/live"' in html
    assert '<a href="/" class="refresh">' in html  # without JavaScript: a refresh link
    assert "<script>" not in html  # no inline script (the CSP would refuse it)


async def test_the_fragment_is_the_figures_alone(client: Any, sign_in: Any, book: Book) -> None:
    await deliver_some(book)
    await sign_in("viewer")
    fragment = await client.get("/?fragment=figures")
    assert fragment.status_code == 200
    assert "<html" not in fragment.text and figure(fragment.text, "dispatch-delivered") == "3"


async def test_the_leader_on_the_page(client: Any, sign_in: Any, book: Book) -> None:
    assert await LeaseLeader(book, "daemon-<b>", lease_seconds=90).is_leader()
    await sign_in("viewer")
    html = (await client.get("/")).text
    assert figure(html, "leader") == "daemon-&lt;b&gt;"
    book.clock.advance(600.0)  # type: ignore[attr-defined]
    assert "stale: older than the 90 s lease" in (await client.get("/")).text


async def test_a_notification_dead_letter_is_counted(book: Book) -> None:
    channel = ScriptedChannel("email", ["reject"] * 50)
    await send_notification(book, recipient="ops", content={"text": "x"}, mode="guaranteed", channels=["email"])
    for _ in range(20):
        await deliver_due_notifications(book, {"email": channel}, deadline=5)
        book.clock.advance(3600.0)  # type: ignore[attr-defined]
    found = await figures(book)
    assert found.entities["notification"]["failed"] == 1
    assert found.dead_letters["notification"] == 1 and found.dead_letters_total == 1


def figure(html: str, name: str) -> str:
    found = re.search(rf'data-figure="{re.escape(name)}"[^>]*>([^<]*)<', html)
    assert found, f"no figure {name!r} on the page"
    return found.group(1).strip()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_the_figures_read_indexes_not_the_whole_tables(book: Book) -> None:
    """SQLite's plans: the counts of a table with both partial status indexes read them (the settled one
    covers the status), the chart reads a range of the fact log's primary key."""
    from sqlalchemy.dialects import sqlite

    from statebook.adapters.stats import _entities_query
    from statebook.adapters.web.overview import chart_query

    def plan_of(query: Any) -> str:
        return str(query.compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True}))

    async with book.read() as conn:
        counts = [r[3] for r in await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + plan_of(_entities_query(book)))]
        chart = [r[3] for r in await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + plan_of(chart_query(10, 0.0, 60.0)))]
    assert "SEARCH dispatch_outbox USING COVERING INDEX idx_dispatch_outbox_settled (status=?)" in counts
    assert "SEARCH notifications USING COVERING INDEX ix_notifications_settled (status=?)" in counts
    assert not any(step.startswith("SCAN dispatch_outbox") and "INDEX" not in step for step in counts)
    assert chart == ["SEARCH status_transitions USING INTEGER PRIMARY KEY (rowid>?)"]
