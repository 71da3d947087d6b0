"""Operator actions (adapters/web/actions.py): offered from the lifecycle's edges, each the CLI's call with
the signed-in operator and the typed reason, refused with the API's own one-line message."""

from __future__ import annotations

import sys

import pytest
import sqlalchemy as sa

from statebook.adapters.web import actions
from statebook.adapters.web.actions import ActionRefused, available, perform
from statebook.lifecycle import Actor, Lifecycle, edges, history, managed_table
from statebook.lifecycle.errors import StatebookError
from statebook.lifecycle.facts import facts_table
from statebook.outbox import (CallableTransport, ack_dispatch, deliver_due_dispatches, enqueue_dispatch, get_dispatch,
                              purge_dispatch, retry_dispatch)
from statebook.outbox.notifications import (get_notification, replay_notification, resolve_notification,
                                            send_notification)
from statebook.outbox.notifications.delivery import deliver_due_notifications
from statebook.outbox.notifications.scripted import ScriptedChannel
from statebook.scheduler.store import create_schedule, disable_schedule, enable_schedule, get_schedule

ALICE = Actor("operator", "alice")
WHY = "customer asked <script>alert(1)</script>"


def flash_in(location: str) -> str:
    """The flash message a redirect's location carries (signed: see pages.flash_query)."""
    from urllib.parse import parse_qs, urlsplit

    return parse_qs(urlsplit(location).query).get("flash", [""])[0]


async def _fail(deliver_to, payload):
    return False


async def dead_dispatch(book, **extra) -> str:
    """A dispatch that failed its only attempt: a dead letter."""
    did = await enqueue_dispatch(book, kind="k", deliver_to="seat", max_attempts=1, **extra)
    await deliver_due_dispatches(book, transport=CallableTransport(_fail))
    assert (await get_dispatch(book, did)).status == "dead_letter"
    return did


async def dead_notification(book, clock, recipient="dba") -> str:
    """A notification whose three attempts were rejected: an unresolved dead letter."""
    nid = (await send_notification(book, recipient=recipient, content={"text": "disk"}, mode="guaranteed",
                                   channels=["pagerduty"])).id
    for _ in range(3):
        await deliver_due_notifications(book, {"pagerduty": ScriptedChannel("pagerduty", ["reject"])}, deadline=0.05)
        clock.advance(10)
    row = await get_notification(book, nid)
    assert row.status == "failed" and row.dead_letter
    return nid


async def schedule(book, name: str, tmp_path, *, paused: bool = False) -> str:
    row = await create_schedule(book, {"name": name, "trigger_type": "interval", "interval_sec": 3600,
                                       "action_kind": "command", "action_command": sys.executable,
                                       "action_command_args": ["-c", "pass"], "action_cwd": str(tmp_path),
                                       "enabled": not paused})
    return row.id


async def refusal(call) -> str:
    """The one-line message the API call refuses with."""
    with pytest.raises(StatebookError) as refused:
        await call
    return str(refused.value)


def last(facts):
    f = facts[-1]
    return (f.previous_status, f.status, f.reason_code, f.actor_type, f.actor_id)


async def fact_count(book) -> int:
    async with book.read() as conn:
        return (await conn.execute(sa.select(sa.func.count()).select_from(facts_table))).scalar_one()


# -- what is offered --------------------------------------------------------------------------------------
def test_offered_actions_follow_the_edges_and_the_calls(book):
    """Each built-in action is offered exactly from the statuses its call accepts that the lifecycle lets
    an operator take (a purge: the purgeable ones)."""
    offered = {(a.entity_type, a.name): a.sources(book.policy(a.entity_type)) for a in actions.TABLE}
    assert offered == {
        ("dispatch", "retry"): ("dead_letter", "expired"),
        ("dispatch", "expedite"): ("pending",),
        ("dispatch", "ack"): ("pending", "delivering"),
        ("dispatch", "purge"): ("delivered", "acked", "dead_letter", "expired"),
        ("notification", "replay"): ("failed",),
        ("notification", "resolve"): ("failed",),
        ("schedule", "enable"): ("paused", "exhausted"),
        ("schedule", "disable"): ("active",),
        ("schedule", "fire"): ("active", "paused"),
    }
    policy = book.policy("dispatch")
    names = lambda row: [a.name for a in available("dispatch", row, policy=policy)]  # noqa: E731
    assert names({"status": "dead_letter", "ack_required": False}) == ["retry", "purge"]
    assert names({"status": "pending", "ack_required": False}) == ["expedite"]
    assert names({"status": "pending", "ack_required": True}) == ["expedite", "ack"]
    assert names({"status": "delivering", "ack_required": False}) == []
    notif = book.policy("notification")
    assert [a.name for a in available("notification", {"status": "failed", "dead_letter": 1, "resolved_at": None},
                                      policy=notif)] == ["replay", "resolve"]
    assert [a.name for a in available("notification", {"status": "failed", "dead_letter": 0, "resolved_at": 5.0},
                                      policy=notif)] == ["replay"]
    assert available("notification", {"status": "delivered"}, policy=notif) == []


def test_an_applications_lifecycle_offers_no_action():
    tickets = managed_table("console_tickets", sa.Column("id", sa.String(32), primary_key=True), meta=sa.MetaData())
    ticket = Lifecycle(entity_type="ticket", table=tickets, statuses=("open", "closed"), initial={"open"},
                       terminal={"closed"}, edges=edges("open", "closed"), reason_prefixes={"ticket"})
    assert available("ticket", {"status": "open"}, policy=ticket) == []
    assert available("ticket", {"status": "closed"}, policy=ticket) == []
    with pytest.raises(ActionRefused, match="ticket has no action 'purge'"):
        actions.find("ticket", "purge")


def test_an_edge_reserved_for_another_actor_is_not_offered(book):
    """An application that reserves dead_letter -> pending for its own actor type takes retry away."""
    import dataclasses

    from statebook.lifecycle.policy import Edge

    policy = book.policy("dispatch")
    changed = dataclasses.replace(policy, edges=tuple(
        Edge(e.source, e.target, frozenset({"robot"}), e.requires_patch, e.requires_guard)
        if (e.source, e.target) == ("dead_letter", "pending") else e for e in policy.edges))
    assert actions.find("dispatch", "retry").sources(changed) == ("expired",)


def test_a_reason_is_required_and_bounded():
    assert actions.check_reason("  why \n") == "why"
    for bad in ("", "   ", "x" * 501, "a\x00b", 7):
        with pytest.raises(ActionRefused, match="reason"):
            actions.check_reason(bad)
    assert actions.check_reason("y" * 500) == "y" * 500


# -- what each does: the CLI's call, the operator, the reason ----------------------------------------------
async def test_retry_purge_and_expedite_write_the_calls_facts(book, clock):
    twins = [await dead_dispatch(book), await dead_dispatch(book)]
    [done] = await perform(book, "dispatch", "retry", [twins[0]], ALICE, WHY)
    assert done == actions.Result(twins[0], True, f"retried {twins[0]}")
    assert await retry_dispatch(book, twins[1], actor=ALICE, note=WHY)
    console, api = (await history(book, "dispatch", twins[0]))[-1], (await history(book, "dispatch", twins[1]))[-1]
    assert last([console]) == last([api]) == ("dead_letter", "pending", "dispatch.pending.operator_retry",
                                              "operator", "alice")
    assert console.reason_summary == api.reason_summary == f"operator retry from dead_letter ({WHY})"

    clock.advance(1)
    later = await enqueue_dispatch(book, kind="k", deliver_to="seat")
    await deliver_due_dispatches(book, transport=CallableTransport(_fail))  # attempt 1 failed: pending, backoff
    [done] = await perform(book, "dispatch", "expedite", [later], ALICE, "now please")
    assert done.done and (await history(book, "dispatch", later))[-1].reason_summary.endswith("(now please)")

    dead = await dead_dispatch(book)
    [done] = await perform(book, "dispatch", "purge", [dead], ALICE, WHY)
    assert done == actions.Result(dead, True, f"purged {dead}")
    tomb = (await history(book, "dispatch", dead))[-1]
    assert (tomb.status, tomb.reason_code, tomb.actor_id, tomb.reason_summary) == (
        None, "dispatch.purged.operator", "alice", f"purged by an operator ({WHY})")


async def test_refusals_are_the_apis_messages_and_write_nothing(book, clock):
    pending = await enqueue_dispatch(book, kind="k", deliver_to="seat")
    before = await fact_count(book)
    [retry] = await perform(book, "dispatch", "retry", [pending], ALICE, WHY)
    assert retry == actions.Result(pending, False, await refusal(retry_dispatch(book, pending, actor=ALICE, note=WHY)))
    assert "only dead_letter or expired dispatches can be retried" in retry.message
    [purge] = await perform(book, "dispatch", "purge", [pending], ALICE, WHY)
    assert purge == actions.Result(pending, False, await refusal(purge_dispatch(book, pending, actor=ALICE, note=WHY)))
    assert "not purgeable" in purge.message
    [missing] = await perform(book, "dispatch", "retry", ["nope"], ALICE, WHY)
    assert missing == actions.Result("nope", False, "dispatch 'nope' does not exist")
    [gone] = await perform(book, "dispatch", "purge", ["nope"], ALICE, WHY)
    assert gone == actions.Result("nope", False, "dispatch nope does not exist")
    acked = await enqueue_dispatch(book, kind="k", deliver_to="seat", ack_required=True)
    [wrong] = await perform(book, "dispatch", "ack", [acked], ALICE, WHY, fields={"token": "not-it"})
    assert wrong == actions.Result(acked, False, f"wrong acknowledgement token for dispatch {acked}")
    assert await fact_count(book) == before + 1  # only the second enqueue wrote


async def test_ack_takes_the_token_as_the_cli_does(book):
    did = await enqueue_dispatch(book, kind="k", deliver_to="seat", ack_required=True)
    token = (await get_dispatch(book, did)).ack_token.get_secret_value()
    model = await get_dispatch(book, did)  # a read model is a row too
    assert [a.name for a in available("dispatch", model, policy=book.policy("dispatch"))] == ["expedite", "ack"]
    with pytest.raises(ActionRefused, match="token"):
        await perform(book, "dispatch", "ack", [did], ALICE, WHY)
    [done] = await perform(book, "dispatch", "ack", [did], ALICE, WHY, fields={"token": token})
    assert done.done
    f = (await history(book, "dispatch", did))[-1]
    assert (f.status, f.reason_code, f.actor_type, f.actor_id) == ("acked", "dispatch.acked.consumer", "operator",
                                                                   "alice")
    assert f.reason_summary == f"acknowledged with the dispatch's token ({WHY})"
    twin = await enqueue_dispatch(book, kind="k", deliver_to="seat", ack_required=True)
    assert await ack_dispatch(book, twin, (await get_dispatch(book, twin)).ack_token.get_secret_value(),
                              actor=ALICE, note=WHY)
    assert last(await history(book, "dispatch", twin)) == last([f])


async def test_replay_and_resolve_write_the_calls_facts(book, clock):
    one, two = await dead_notification(book, clock, "a"), await dead_notification(book, clock, "b")
    [done] = await perform(book, "notification", "resolve", [one], ALICE, WHY)
    assert done == actions.Result(one, True, f"resolved {one} by operator:alice")
    await resolve_notification(book, two, reason=WHY, actor=ALICE)
    a, b = (await history(book, "notification", one))[-1], (await history(book, "notification", two))[-1]
    assert last([a]) == last([b]) == ("failed", "failed", "notification.failed.resolved", "operator", "alice")
    assert a.reason_summary == b.reason_summary == WHY

    [again] = await perform(book, "notification", "resolve", [one], ALICE, WHY)
    assert not again.done and again.message.startswith(f"notification {one} is not an unresolved dead letter")
    [blocked] = await perform(book, "notification", "replay", [one], ALICE, WHY)
    assert blocked == actions.Result(one, False, f"notification {one} cannot be replayed: resolved")

    three = await dead_notification(book, clock, "c")
    [replayed] = await perform(book, "notification", "replay", [three], ALICE, WHY)
    assert replayed == actions.Result(three, True, f"replayed {three} (cycle 2)")
    four = await dead_notification(book, clock, "d")
    await replay_notification(book, four, actor=ALICE, note=WHY)
    [a] = [f for f in await history(book, "notification", three) if f.reason_code == "notification.pending.replayed"]
    [b] = [f for f in await history(book, "notification", four) if f.reason_code == "notification.pending.replayed"]
    assert last([a]) == last([b]) == ("failed", "pending", "notification.pending.replayed", "operator", "alice")
    assert a.reason_summary == b.reason_summary == f"replayed by alice: cycle 2 ({WHY})"


async def test_enable_disable_and_fire_write_the_calls_facts(book, tmp_path):
    first, second = await schedule(book, "one", tmp_path), await schedule(book, "two", tmp_path)
    [done] = await perform(book, "schedule", "disable", [first], ALICE, WHY)
    assert done == actions.Result(first, True, "schedule one is paused")
    await disable_schedule(book, second, actor=ALICE, note=WHY)
    a, b = (await history(book, "schedule", first))[-1], (await history(book, "schedule", second))[-1]
    assert last([a]) == last([b]) == ("active", "paused", "schedule.paused.disabled", "operator", "alice")
    assert a.reason_summary == b.reason_summary == f"disabled by operator ({WHY})"
    [again] = await perform(book, "schedule", "disable", [first], ALICE, WHY)
    assert again == actions.Result(first, False, "schedule one is already paused; nothing was written")

    [done] = await perform(book, "schedule", "enable", [first], ALICE, WHY)
    assert done.done and (await get_schedule(book, first)).status == "active"
    await enable_schedule(book, second, actor=ALICE, note=WHY)
    a, b = (await history(book, "schedule", first))[-1], (await history(book, "schedule", second))[-1]
    assert last([a]) == last([b]) == ("paused", "active", "schedule.active.enabled", "operator", "alice")
    assert a.reason_summary == b.reason_summary == f"enabled by operator ({WHY})"

    [fired] = await perform(book, "schedule", "fire", [first], ALICE, WHY)
    await actions.wait_for_fires()
    assert fired.done and fired.message.startswith(f"fired {first}: run ")
    run_id = fired.message.rsplit(" ", 1)[1]
    run = await history(book, "schedule_run", run_id)
    assert [(f.status, f.actor_type, f.actor_id) for f in run][0] == ("running", "operator", "alice")
    assert run[0].reason_summary == f"manual fire ({WHY})" and run[-1].status == "completed"
    touch = (await history(book, "schedule", first))[-1]
    assert (touch.reason_code, touch.actor_id) == ("schedule.active.manual_fire", "alice")


async def test_a_missing_schedule_is_the_apis_refusal(book):
    [missing] = await perform(book, "schedule", "fire", ["nope"], ALICE, WHY)
    assert not missing.done and missing.message.startswith("schedule 'nope' does not exist")


async def test_only_an_operator_acts(book):
    did = await dead_dispatch(book)
    before = await fact_count(book)
    for who in (Actor("viewer", "bob"), Actor("operator", ""), Actor("recipient", "alice")):
        with pytest.raises(ActionRefused, match="operator"):
            await perform(book, "dispatch", "retry", [did], who, WHY)
    with pytest.raises(ActionRefused, match="reason"):
        await perform(book, "dispatch", "retry", [did], ALICE, " ")
    assert await fact_count(book) == before


async def test_bulk_calls_once_per_id_and_reports_each(book):
    dead = [await dead_dispatch(book) for _ in range(3)]
    live = await enqueue_dispatch(book, kind="k", deliver_to="seat")
    results = await perform(book, "dispatch", "retry", [*dead, live], ALICE, WHY)
    assert [r.done for r in results] == [True, True, True, False]
    assert [(await get_dispatch(book, d)).status for d in dead] == ["pending"] * 3


# -- through the console: the routes ---------------------------------------------------------------------------
OLGA = Actor("operator", "olga")  # the conftest's operator


def cli(*args: str):
    from typer.testing import CliRunner

    from statebook.adapters.cli import app

    return CliRunner().invoke(app, list(args))


async def post_act(client, csrf, entity_type, entity_id, action, reason=WHY, **extra):
    return await client.post(f"/e/{entity_type}/{entity_id}/act/{action}",
                             data={"csrf_token": csrf, "reason": reason, **extra})


async def test_a_console_action_is_the_clis_with_the_signed_in_operator(book, clock, client, sign_in, db_url,
                                                                        monkeypatch):
    """Each dispatch and notification action through the console writes the fact the CLI writes for the same
    operator (``$USER`` for the CLI, the signed-in name here), the typed reason kept in its summary."""
    import asyncio

    token = await sign_in("operator")
    monkeypatch.setenv("USER", "olga")
    here, there = await dead_dispatch(book), await dead_dispatch(book)
    answer = await post_act(client, token, "dispatch", here, "retry")
    assert answer.status_code == 303
    path, _, query = answer.headers["location"].partition("?")
    assert path == f"/e/dispatch/{here}" and flash_in(answer.headers["location"]) == f"retried {here}"
    assert (await asyncio.to_thread(cli, "--db", db_url, "dispatch", "retry", there)).exit_code == 0
    mine, theirs = (await history(book, "dispatch", here))[-1], (await history(book, "dispatch", there))[-1]
    assert last([mine]) == last([theirs]) == ("dead_letter", "pending", "dispatch.pending.operator_retry",
                                              "operator", "olga")
    assert mine.reason_summary == f"{theirs.reason_summary} ({WHY})"

    here, there = await dead_notification(book, clock, "a"), await dead_notification(book, clock, "b")
    assert (await post_act(client, token, "notification", here, "resolve")).status_code == 303
    assert (await asyncio.to_thread(cli, "--db", db_url, "notify", "resolve", there, "--reason", WHY)).exit_code == 0
    mine, theirs = (await history(book, "notification", here))[-1], (await history(book, "notification", there))[-1]
    assert last([mine]) == last([theirs]) and (mine.actor_id, mine.reason_summary) == ("olga", WHY)
    assert theirs.reason_summary == WHY

    here, there = await dead_notification(book, clock, "c"), await dead_notification(book, clock, "d")
    assert (await post_act(client, token, "notification", here, "replay")).status_code == 303
    assert (await asyncio.to_thread(cli, "--db", db_url, "notify", "replay", there, "--note", WHY)).exit_code == 0
    [mine] = [f for f in await history(book, "notification", here) if f.reason_code.endswith("replayed")]
    [theirs] = [f for f in await history(book, "notification", there) if f.reason_code.endswith("replayed")]
    assert last([mine]) == last([theirs]) and mine.reason_summary == theirs.reason_summary


async def test_schedule_actions_through_the_console(book, client, sign_in, tmp_path):
    token = await sign_in("operator")
    sid = await schedule(book, "nightly", tmp_path)
    assert (await post_act(client, token, "schedule", sid, "disable")).status_code == 303
    f = (await history(book, "schedule", sid))[-1]
    assert (f.status, f.actor_type, f.actor_id, f.reason_summary) == ("paused", "operator", "olga",
                                                                      f"disabled by operator ({WHY})")
    assert (await post_act(client, token, "schedule", sid, "enable")).status_code == 303
    fired = await post_act(client, token, "schedule", sid, "fire")
    await actions.wait_for_fires()
    assert fired.status_code == 303 and " run " in flash_in(fired.headers["location"])
    assert (await history(book, "schedule", sid))[-1].actor_id == "olga"


async def test_a_refusal_is_the_apis_message_and_writes_nothing(book, client, sign_in):
    token = await sign_in("operator")
    pending = await enqueue_dispatch(book, kind="k", deliver_to="seat")
    before = await fact_count(book)
    answer = await post_act(client, token, "dispatch", pending, "retry")
    assert answer.status_code == 409
    message = await refusal(retry_dispatch(book, pending, actor=OLGA, note=WHY))
    assert message.replace("'", "&#39;") in answer.text
    acked = await post_act(client, token, "dispatch", pending, "ack", token="nope")
    assert acked.status_code == 409 and "did not request an acknowledgement" in acked.text
    for reason in ("", "   ", "x" * 501):
        assert (await post_act(client, token, "dispatch", pending, "retry", reason=reason)).status_code == 400
    assert (await post_act(client, token, "dispatch", pending, "explode")).status_code == 404
    assert (await post_act(client, token, "no_such_type", pending, "retry")).status_code == 404
    assert await fact_count(book) == before


async def test_htmx_gets_the_answer_as_a_fragment(book, client, sign_in):
    token = await sign_in("operator")
    dead = await dead_dispatch(book)
    answer = await client.post(f"/e/dispatch/{dead}/act/retry", data={"reason": WHY},
                               headers={"HX-Request": "true", "X-CSRF-Token": token})
    assert answer.status_code == 200 and f"retried {dead}" in answer.text and "<html" not in answer.text
    again = await client.post(f"/e/dispatch/{dead}/act/retry", data={"reason": WHY},
                              headers={"HX-Request": "true", "X-CSRF-Token": token})
    assert "Refused: " in again.text and "only dead_letter or expired" in again.text


async def test_a_viewer_is_refused_and_nothing_is_written(book, client, sign_in):
    token = await sign_in("viewer")
    dead = await dead_dispatch(book)
    before = await fact_count(book)
    assert (await post_act(client, token, "dispatch", dead, "retry")).status_code == 403
    assert (await client.get("/lifecycles/dispatch/bulk/retry")).status_code == 403
    assert (await client.post("/lifecycles/dispatch/bulk/retry", data={"csrf_token": token, "reason": WHY,
                                                                       "status": "dead_letter"})).status_code == 403
    assert await fact_count(book) == before and (await get_dispatch(book, dead)).status == "dead_letter"


async def test_bulk_confirms_the_count_and_acts_on_exactly_the_filtered_set(book, client, sign_in):
    token = await sign_in("operator")
    chosen = [await dead_dispatch(book, dedup_key=f"seat-a-{i}") for i in range(3)]
    other = await dead_dispatch(book, dedup_key="seat-b-0")
    live = await enqueue_dispatch(book, kind="k", deliver_to="seat", dedup_key="seat-a-live")
    page = await client.get("/lifecycles/dispatch/bulk/retry", params={"text": "seat-a"})
    assert page.status_code == 200
    assert '<td class="num" id="selected">4</td>' in page.text  # the three dead letters and the pending one
    assert '<td class="num" id="applicable">3</td>' in page.text
    assert "at most 1,000 per request" in page.text
    done = await client.post("/lifecycles/dispatch/bulk/retry", data={"csrf_token": token, "reason": WHY,
                                                                      "text": "seat-a"})
    assert done.status_code == 200 and '<span id="done">3</span>' in done.text
    assert [(await get_dispatch(book, d)).status for d in chosen] == ["pending"] * 3
    assert (await get_dispatch(book, other)).status == "dead_letter"
    for d in chosen:
        assert last(await history(book, "dispatch", d))[3:] == ("operator", "olga")
    assert len(await history(book, "dispatch", live)) == 1


async def test_bulk_acts_on_at_most_the_maximum_per_request(book, client, sign_in, monkeypatch):
    from statebook.adapters.web import action_routes

    monkeypatch.setattr(action_routes, "BULK_MAX", 2)
    token = await sign_in("operator")
    dead = [await dead_dispatch(book) for _ in range(3)]
    done = await client.post("/lifecycles/dispatch/bulk/purge", data={"csrf_token": token, "reason": WHY,
                                                                      "status": "dead_letter"})
    assert '<span id="done">2</span>' in done.text and "1 more matched" in done.text
    assert sorted([(await get_dispatch(book, d)) is None for d in dead]) == [False, True, True]
    refused = await client.post("/lifecycles/dispatch/bulk/purge", data={"csrf_token": token, "reason": " ",
                                                                         "status": "dead_letter"})
    assert refused.status_code == 400 and [(await get_dispatch(book, d)) is None for d in dead].count(True) == 2
    assert (await client.get("/lifecycles/dispatch/bulk/ack")).status_code == 404  # one at a time only
    assert (await client.get("/lifecycles/dispatch/bulk/retry", params={"status": "nope"})).status_code == 400


async def test_the_entity_page_shows_the_forms_to_an_operator_only(book, client, sign_in):
    dead = await dead_dispatch(book)
    await sign_in("viewer")
    page = (await client.get(f"/e/dispatch/{dead}")).text
    assert "/act/" not in page and 'name="reason"' not in page
    assert "/bulk/" not in (await client.get("/lifecycles/dispatch")).text
    await sign_in("operator")
    page = (await client.get(f"/e/dispatch/{dead}")).text
    assert f'action="/e/dispatch/{dead}/act/retry"' in page and f'action="/e/dispatch/{dead}/act/purge"' in page
    assert "/act/expedite" not in page and "/act/ack" not in page and page.count('name="reason" required') == 2
    listing = (await client.get("/lifecycles/dispatch", params={"status": "dead_letter"})).text
    assert 'href="/lifecycles/dispatch/bulk/retry?status=dead_letter"' in listing
    assert "/bulk/purge?" in listing and "/bulk/expedite" not in listing  # only what applies to the status
    assert f'href="/e/dispatch/{dead}#act-retry"' in listing
    purged = await post_act(client, await sign_in("operator"), "dispatch", dead, "purge")
    assert purged.status_code == 303
    page = await client.get(purged.headers["location"])
    assert page.status_code == 200 and f"purged {dead}" in page.text and "/act/" not in page.text


def test_the_docs_table_is_the_action_table(book):
    """docs/console.md, "Operator actions": one line per action with its statuses, API call and CLI command."""
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "console.md").read_text()
    section = docs.split("## Operator actions", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(lines) == len(actions.TABLE)
    for line, action in zip(lines, actions.TABLE, strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[:2] == [action.entity_type, action.label] and cells[3:] == [f"`{action.api}`", f"`{action.cli}`"]
        assert cells[2].split(" (")[0] == ", ".join(f"`{s}`" for s in action.sources(book.policy(action.entity_type)))


async def test_a_fire_still_running_stops_with_the_app(book, settings, tmp_path):
    """Fire now runs in the console's process: when the app stops, the run is stopped as a daemon's is."""
    import httpx

    from statebook.adapters.web import create_app
    from statebook.scheduler import get_run

    from .conftest import PASSWORDS, csrf_of

    row = await create_schedule(book, {"name": "slow", "trigger_type": "interval", "interval_sec": 3600,
                                       "action_kind": "command", "action_command": sys.executable,
                                       "action_command_args": ["-c", "import time; time.sleep(60)"],
                                       "action_cwd": str(tmp_path)})
    app = create_app(book, settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://console.test") as client:
            await client.post("/sign-in", data={"name": "olga", "password": PASSWORDS["olga"],
                                                "csrf_token": await csrf_of(client)})
            fired = await post_act(client, await csrf_of(client), "schedule", row.id, "fire")
            assert fired.status_code == 303
            run_id = flash_in(fired.headers["location"]).rsplit(" ", 1)[1]
            assert (await get_run(book, run_id)).status == "running"
    assert not [t for t, b in actions._running.items() if b is book]
    assert (await get_run(book, run_id)).status == "cancelled"
