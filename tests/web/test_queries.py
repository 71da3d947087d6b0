"""The console's reads (adapters/web/queries.py, entity_queries.py) on SQLite and PostgreSQL: keyset pages,
filters, masking, an entity's timeline, its row as of a time and the verify of that one entity."""

from __future__ import annotations

import sqlalchemy as sa
import pytest

from statebook.adapters.db import open_book, reset_schema
from statebook.adapters.registry import builtin_registry
from statebook.adapters.web.entity_queries import check, entity
from statebook.adapters.web.queries import browse, counts, decode_cursor, masked, order_of
from statebook.lifecycle import Actor, EntityNotFound, Lifecycle, Reason, create, edges, managed_table, transition
from statebook.lifecycle.errors import InvalidArgument, UnknownEntityType
from statebook.outbox import enqueue_dispatch
from statebook.outbox.notifications import deliver_due_notifications, resolve_notification, send_notification
from statebook.outbox.notifications.scripted import ScriptedChannel
from statebook.scheduler import create_schedule
from statebook.scheduler.runs import open_run
from statebook.scheduler.store import schedule_row

META = sa.MetaData()
TICKETS = managed_table("web_tickets", sa.Column("id", sa.String(32), primary_key=True),
                        sa.Column("name", sa.Text, nullable=False), sa.Column("api_token", sa.Text), meta=META)
TICKET = Lifecycle(entity_type="web_ticket", table=TICKETS, statuses=("open", "closed"), initial={"open"},
                   terminal={"closed"}, edges=edges("open", "closed"), reason_prefixes={"ticket"},
                   reasons={"ticket.open.filed", "ticket.closed.fixed"})
WHO = Actor("user", "ana")


def app_registry():
    registry = builtin_registry(seal=False)
    registry.register(TICKET)
    return registry.seal()


@pytest.fixture
async def app_book(db_url, backend, clock):
    book = await open_book(db_url, clock=clock, registry=app_registry())
    try:
        if backend == "postgres":
            await reset_schema(book.engine)
            async with book.engine.begin() as conn:
                await conn.execute(sa.delete(TICKETS))
        yield book
    finally:
        await book.engine.dispose()


async def ticket(book, name: str, **values) -> str:
    made = await create(book, "web_ticket", values={"name": name, **values}, status="open",
                        reason=Reason("ticket.open.filed"), actor=WHO)
    return made.entity_id


async def walk(book, entity_type: str, limit: int, **filters) -> tuple[list[str], list]:
    """Every page from the first by ``next``; returns the ids in page order and the pages."""
    pages = [await browse(book, entity_type, limit=limit, **filters)]
    while pages[-1].next is not None:
        pages.append(await browse(book, entity_type, limit=limit, after=pages[-1].next, **filters))
    return [r["id"] for p in pages for r in p.rows], pages


async def test_keyset_pages_cover_every_row_once_in_order_both_ways(app_book, clock):
    """Ties in time are broken by id; following next then prev gives every row exactly once, newest first."""
    for i in range(23):
        await ticket(app_book, f"t{i}")
        if i % 3 == 0:
            clock.advance(1)  # some rows share their time, so the id breaks ties
    t = TICKETS
    async with app_book.engine.connect() as conn:
        expected = [r.id for r in await conn.execute(
            sa.select(t.c.id).order_by(t.c.updated_at.desc(), t.c.id.desc()))]
    ids, pages = await walk(app_book, "web_ticket", 5)
    assert ids == expected and len(pages) == 5
    assert pages[0].prev is None and pages[-1].next is None and all(len(p.rows) == 5 for p in pages[:-1])
    back = [pages[-1]]
    while back[-1].prev is not None:
        back.append(await browse(app_book, "web_ticket", limit=5, before=back[-1].prev))
    assert [[r["id"] for r in p.rows] for p in reversed(back)] == [[r["id"] for r in p.rows] for p in pages]
    assert back[-1].prev is None and back[-1].next == pages[0].next


async def test_exact_multiple_of_the_limit_has_no_empty_last_page(app_book):
    for i in range(10):
        await ticket(app_book, f"t{i}")
    ids, pages = await walk(app_book, "web_ticket", 5)
    assert len(ids) == len(set(ids)) == 10 and len(pages) == 2 and pages[1].next is None


async def test_dispatches_are_ordered_by_created_at_and_filtered_by_status_time_and_text(book, clock):
    assert order_of(book.policy("dispatch")).name == "created_at"
    assert order_of(book.policy("channel_attempt")).name == "updated_at"
    ids = []
    for i in range(12):
        ids.append(await enqueue_dispatch(book, kind="mail" if i % 2 else "sms", deliver_to="ops", body={"i": i},
                                          dedup_key=f"key-{i}"))
        clock.advance(10)
    start = clock.now() - 120
    assert (await walk(book, "dispatch", 4, status="pending"))[0] == list(reversed(ids))
    assert (await walk(book, "dispatch", 4, status="delivered"))[0] == []
    window = (await walk(book, "dispatch", 4, since=start + 20, until=start + 50))[0]
    assert window == [ids[4], ids[3], ids[2]]
    assert set((await walk(book, "dispatch", 4, text="MAIL"))[0]) == set(ids[1::2])
    assert (await walk(book, "dispatch", 4, text="key-11"))[0] == [ids[11]]
    assert (await walk(book, "dispatch", 4, text=ids[5][3:20].upper()))[0] == [ids[5]]
    page = await browse(book, "dispatch", status="pending", text="key", limit=3)
    assert page.filters.params() == {"status": "pending", "text": "key"}


async def test_text_takes_percent_and_underscore_literally(app_book):
    wanted = await ticket(app_book, "50%_off")
    await ticket(app_book, "50XYoff")
    await ticket(app_book, "5000off")
    await ticket(app_book, r"50\off")
    assert (await walk(app_book, "web_ticket", 10, text="%_"))[0] == [wanted]
    assert (await walk(app_book, "web_ticket", 10, text="0%"))[0] == [wanted]
    assert len((await walk(app_book, "web_ticket", 10, text="\\"))[0]) == 1


async def test_an_applications_lifecycle_is_listed_and_counted(app_book):
    first = await ticket(app_book, "disk full")
    await ticket(app_book, "printer")
    await transition(app_book, "web_ticket", first, "closed", expected="open", reason=Reason("ticket.closed.fixed"),
                     actor=WHO)
    found = {c.entity_type: c for c in await counts(app_book)}
    assert set(found) >= {"web_ticket", "dispatch", "notification", "schedule", "schedule_run"}
    assert found["web_ticket"].statuses == (("open", 1), ("closed", 1)) and found["web_ticket"].total == 2
    page = await browse(app_book, "web_ticket", status="closed")
    assert [r["id"] for r in page.rows] == [first] and page.order == "updated_at"


async def test_secrets_are_masked_in_rows_and_history(app_book):
    tid = await ticket(app_book, "see https://bob:hunter2@example.com/x?token=abc", api_token="s3cret")
    did = await enqueue_dispatch(app_book, kind="hook", deliver_to="https://u:pw@hooks.example/x", body={"password": "pw"},
                                 ack_required=True)
    [row] = (await browse(app_book, "web_ticket")).rows
    assert row["api_token"] == "***" and "hunter2" not in row["name"] and "abc" not in row["name"]
    [d] = (await browse(app_book, "dispatch")).rows
    assert d["ack_token"] == "***" and "pw" not in d["deliver_to"] and d["payload"]["body"]["password"] == "***"
    view = await entity(app_book, "web_ticket", tid)
    assert "s3cret" not in repr(view) and "hunter2" not in repr(view)
    assert "pw@" not in repr(await entity(app_book, "dispatch", did))
    assert masked({"nested": [{"secret": 1}]}) == {"nested": [{"secret": "***"}]}


async def test_history_shows_each_fact_with_hash_and_previous_hash(app_book, clock):
    tid = await ticket(app_book, "disk full")
    clock.advance(5)
    await transition(app_book, "web_ticket", tid, "closed", expected="open",
                     reason=Reason("ticket.closed.fixed", "freed 20 GB"), actor=WHO)
    view = await entity(app_book, "web_ticket", tid)
    first, second = view.timeline
    assert (first.previous_status, first.status, first.prev_hash, first.prev_fact_id) == (None, "open", "", "")
    assert (second.previous_status, second.status, second.reason_code, second.reason_summary) == (
        "open", "closed", "ticket.closed.fixed", "freed 20 GB")
    assert second.prev_hash == first.hash and second.prev_fact_id == first.id and len(second.hash) == 64
    assert (second.actor_type, second.actor_id) == ("user", "ana") and view.row["chain_hash"] == second.hash
    assert view.check.ok and view.check.facts == 2


async def test_the_row_as_of_a_time(app_book, clock):
    tid = await ticket(app_book, "disk full")
    made = clock.now()
    clock.advance(60)
    await transition(app_book, "web_ticket", tid, "closed", expected="open", reason=Reason("ticket.closed.fixed"),
                     actor=WHO)
    assert (await entity(app_book, "web_ticket", tid, as_of=made + 30)).row_as_of["status"] == "open"
    assert (await entity(app_book, "web_ticket", tid, as_of=made + 60)).row_as_of["status"] == "closed"
    assert (await entity(app_book, "web_ticket", tid, as_of=made - 1)).row_as_of is None


async def test_a_raw_sql_edit_is_a_finding_of_that_entity_only(app_book):
    edited = await ticket(app_book, "disk full")
    clean = await ticket(app_book, "printer")
    async with app_book.engine.begin() as conn:
        await conn.execute(sa.update(TICKETS).where(TICKETS.c.id == edited).values(name="nothing happened"))
    found = await check(app_book, "web_ticket", edited)
    assert not found.ok and [f.kind for f in found.findings] == ["row_mismatch"] and "name" in found.findings[0].detail
    assert (await check(app_book, "web_ticket", clean)).ok
    assert not (await entity(app_book, "web_ticket", edited)).check.ok


async def test_unknown_types_ids_and_cursors_are_refused(app_book):
    with pytest.raises(UnknownEntityType):
        await browse(app_book, "nope")
    with pytest.raises(UnknownEntityType):
        await entity(app_book, "nope", "x")
    with pytest.raises(EntityNotFound):
        await entity(app_book, "web_ticket", "missing")
    with pytest.raises(EntityNotFound):
        await check(app_book, "web_ticket", "x" * 300)
    for bad in ("garbage", "W10", "bnVsbA"):
        with pytest.raises(InvalidArgument):
            await browse(app_book, "web_ticket", after=bad)
    with pytest.raises(InvalidArgument):
        await browse(app_book, "web_ticket", status="gone")
    with pytest.raises(InvalidArgument):
        await browse(app_book, "web_ticket", after="x", before="y")
    assert decode_cursor("after", (await browse(app_book, "web_ticket")).next or "WzEuNSwiYSJd") == (1.5, "a")


async def test_a_notification_and_a_schedule_show_their_parts(book):
    accepted = await send_notification(book, recipient="ops", content={"text": "disk"}, mode="guaranteed",
                                       channels=["email"])
    view = await entity(book, "notification", accepted.id)
    part = view.notification
    assert part is not None and part.owner == accepted.id and part.cycles == () and part.followers == ()
    assert part.replay_block_reason is None and part.successor is None
    schedule = await create_schedule(book, {"name": "nightly", "trigger_type": "interval", "interval_sec": 3600,
                                            "action_kind": "command", "action_command": "/bin/true"})
    assert (await entity(book, "schedule", schedule.id)).schedule.runs == ()


BOUNDED = {"schedule", "rate_bucket", "notification_retention"}
"""Lifecycles whose tables stay small (one row per configured schedule, channel scope, retention run)."""


def test_every_growing_builtin_table_has_an_index_for_its_keyset_order():
    """A deep page seeks the index its order leads (the 1,000th page costs what the first does)."""
    for lc in builtin_registry():
        if lc.entity_type in BOUNDED:
            continue
        wanted = [order_of(lc).name, "id"]
        leads = [[c.name for c in index.columns][:2] for index in lc.table.indexes]
        assert wanted in leads, (lc.entity_type, wanted, leads)


async def test_a_notifications_lineage_attempts_and_replay_block(book, clock):
    owner = await send_notification(book, recipient="ops", content={"t": 1}, mode="guaranteed", channels=["email"],
                                    obligation_key="disk", obligation_window=600)
    follower = await send_notification(book, recipient="ops", content={"t": 2}, mode="guaranteed", channels=["email"],
                                       obligation_key="disk", obligation_window=600)
    await deliver_due_notifications(book, {"email": ScriptedChannel("email", ["success"])}, deadline=0.5)
    mine = (await entity(book, "notification", owner.id)).notification
    assert mine.followers == (follower.id,) and mine.owner == owner.id
    [(cycle, [attempt])] = mine.cycles
    assert (cycle, attempt["channel"], attempt["status"], attempt["detail"]) == (1, "email", "success", "accepted")
    assert (await entity(book, "notification", follower.id)).notification.owner == owner.id
    failing = await send_notification(book, recipient="ops2", content={"t": 3}, mode="guaranteed", channels=["email"])
    for _ in range(4):
        await deliver_due_notifications(book, {"email": ScriptedChannel("email", ["reject"])}, deadline=0.5)
        clock.advance(3600)
    dead = await entity(book, "notification", failing.id)
    assert dead.row["status"] == "failed" and [a["status"] for a in dead.notification.cycles[0][1]] == ["rejected"] * 3
    assert dead.notification.replay_block_reason is None  # nothing holds the obligation: a replay would be accepted
    await resolve_notification(book, failing.id, reason="recipient left", actor=Actor("operator", "olga"))
    assert (await entity(book, "notification", failing.id)).notification.replay_block_reason == "resolved"


async def test_a_schedules_runs_and_follow_up_chain(book, clock):
    schedule = await create_schedule(book, {"name": "nightly", "trigger_type": "interval", "interval_sec": 3600,
                                            "action_kind": "command", "action_command": "/bin/true"})
    row = await schedule_row(book, schedule.id)
    first = await open_run(book, row, reason=Reason("schedule_run.running.fired"), context={}, daemon_id="d1")
    clock.advance(1)
    second = await open_run(book, row, reason=Reason("schedule_run.running.fired"), context={}, daemon_id="d1",
                            chain_parent_id=first, chain_depth=1)
    part = (await entity(book, "schedule", schedule.id)).schedule
    assert [r["id"] for r in part.runs] == [second, first] and part.follow_ups == {first: (second,)}
    run = (await entity(book, "schedule_run", second)).run
    assert run.parents == (first,) and run.children == () and run.schedule_id == schedule.id
    assert [c["id"] for c in (await entity(book, "schedule_run", first)).run.children] == [second]
