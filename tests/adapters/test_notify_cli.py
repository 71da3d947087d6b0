"""``statebook notify``: ls (status, dead letter, JSON), show with its attempts by cycle, attempts, errors."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from statebook.adapters.cli import app
from statebook.adapters.db import open_book
from statebook.lifecycle import FakeClock
from statebook.outbox.notifications import send_notification
from statebook.outbox.notifications.delivery import deliver_due_notifications
from statebook.outbox.notifications.scripted import ScriptedChannel


@pytest.fixture
def db(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def seed(url: str) -> dict[str, str]:
    """One delivered notification (Slack rejected, email accepted) and one dead letter (three attempts)."""

    async def go() -> dict[str, str]:
        clock = FakeClock()
        book = await open_book(url, clock=clock)
        try:
            ok = await send_notification(book, recipient="ops", content={"text": "a"}, mode="guaranteed",
                                         channels=["email", "slack"])
            dead = await send_notification(book, recipient="dba", content={"text": "b"}, mode="guaranteed",
                                           channels=["pagerduty"])
            chans = {"slack": ScriptedChannel("slack", ["reject"]), "email": ScriptedChannel("email", ["success"]),
                     "pagerduty": ScriptedChannel("pagerduty", ["reject"])}
            for _ in range(3):
                await deliver_due_notifications(book, chans, deadline=0.05)
                clock.advance(10)
            return {"ok": ok.id, "dead": dead.id}
        finally:
            await book.engine.dispose()

    return asyncio.run(go())


def invoke(url: str, *args: str):
    return CliRunner().invoke(app, ["--db", url, "notify", *args])


def test_ls_filters_by_status_and_dead_letter(db):
    ids = seed(db)
    everything = json.loads(invoke(db, "ls", "--json").output)
    assert sorted(r["id"] for r in everything) == sorted(ids.values())
    dead = json.loads(invoke(db, "ls", "--dead-letter", "--json").output)
    assert [(r["id"], r["status"], r["dead_letter"]) for r in dead] == [(ids["dead"], "failed", True)]
    delivered = json.loads(invoke(db, "ls", "--status", "delivered", "--json").output)
    assert [r["id"] for r in delivered] == [ids["ok"]]
    table = invoke(db, "ls")
    assert table.exit_code == 0 and "dead letter" in table.output


def test_reads_return_frozen_models_that_json_prints(db):
    """get_notification, list_notifications, notification_attempts and list_dead_letters return frozen
    models (times as aware datetimes, no engine head); ``ls``, ``show``, ``attempts`` and ``dead-letters``
    print their dumps."""
    from pydantic import ValidationError

    from statebook.outbox.notifications import (
        ChannelAttempt, DeadLetter, Notification, get_notification, list_dead_letters, list_notifications,
        notification_attempts,
    )

    ids = seed(db)

    async def read():
        book = await open_book(db, clock=FakeClock())
        try:
            return (await get_notification(book, ids["ok"]), await list_notifications(book),
                    await notification_attempts(book, ids["ok"]), await list_dead_letters(book))
        finally:
            await book.engine.dispose()

    ok, listed, attempts, dead = asyncio.run(read())
    assert isinstance(ok, Notification) and ok in listed and all(isinstance(n, Notification) for n in listed)
    assert all(isinstance(a, ChannelAttempt) for a in attempts) and [type(d) for d in dead] == [DeadLetter]
    assert ok.created_at.tzinfo is not None and ok.channels == ["slack", "email"] and ok.dead_letter is False
    with pytest.raises(ValidationError):
        ok.status = "failed"
    assert "chain_hash" not in ok.dump() and "last_fact_id" not in attempts[0].dump()
    assert json.loads(invoke(db, "ls", "--json").output) == [n.dump() for n in listed]
    assert json.loads(invoke(db, "attempts", ids["ok"], "--json").output) == [a.dump() for a in attempts]
    assert json.loads(invoke(db, "dead-letters", "--json").output) == [d.dump() for d in dead]
    shown = json.loads(invoke(db, "show", ids["ok"]).output)
    assert {k: v for k, v in shown.items() if k in ok.dump()} == ok.dump()
    assert shown["attempts_by_cycle"] == {"1": [a.dump() for a in attempts]}


def test_show_and_attempts_list_each_cycle_s_observations(db):
    ids = seed(db)
    shown = invoke(db, "show", ids["ok"])
    assert shown.exit_code == 0, shown.output
    body = json.loads(shown.output)
    assert body["delivered_channel"] == "email"
    assert [(a["channel"], a["status"]) for a in body["attempts_by_cycle"]["1"]] == [("slack", "rejected"),
                                                                                    ("email", "success")]
    attempts = json.loads(invoke(db, "attempts", ids["dead"], "--json").output)
    assert [(a["attempt"], a["status"]) for a in attempts] == [(1, "rejected"), (2, "rejected"), (3, "rejected")]
    assert invoke(db, "attempts", ids["dead"]).exit_code == 0


def test_unknown_ids_and_statuses_fail_in_one_line(db):
    seed(db)
    missing = invoke(db, "show", "0" * 32)
    assert missing.exit_code == 2 and "does not exist" in missing.output  # as `dispatch show` (specs/cli.md)
    assert invoke(db, "attempts", "0" * 32).exit_code == 2
    bad = invoke(db, "ls", "--status", "lost")
    assert bad.exit_code != 0 and "unknown status" in bad.output and "Traceback" not in bad.output


def test_dead_letters_replay_and_resolve_from_the_command_line(db, monkeypatch):
    """N26-N29: the dead-letter view lists the failure with a replayable status; replay starts cycle 2 and
    empties the view; a second replay is refused in one line (exit 2) with its reason; resolve needs a
    reason and records the operator ($USER)."""
    monkeypatch.setenv("USER", "alice")
    ids = seed(db)
    dead = json.loads(invoke(db, "dead-letters", "--json").output)
    assert [(r["id"], r["replay_block_reason"]) for r in dead] == [(ids["dead"], None)]
    assert invoke(db, "dead-letters").exit_code == 0
    replayed = invoke(db, "replay", ids["dead"], "--note", "pager fixed")
    assert replayed.exit_code == 0 and "cycle 2" in replayed.output, replayed.output
    assert json.loads(invoke(db, "dead-letters", "--json").output) == []
    again = invoke(db, "replay", ids["dead"])
    assert again.exit_code == 2 and "not_failed" in again.output and "Traceback" not in again.output
    row = json.loads(invoke(db, "show", ids["dead"]).output)
    assert (row["status"], row["cycle"], row["attempts"], row["cycle_attempts"]) == ("pending", 2, 3, 0)
    missing_reason = invoke(db, "resolve", ids["ok"])
    assert missing_reason.exit_code == 2
    not_dead = invoke(db, "resolve", ids["ok"], "--reason", "fine")
    assert not_dead.exit_code == 2 and "not an unresolved dead letter" in not_dead.output


def test_ack_dismiss_and_show_the_response_from_the_command_line(db):
    """N32, N33: `notify ack` records the answer and its actor; the same again prints it unchanged; a
    conflicting dismiss is one line, exit 2; `show` carries the response and its callbacks; a bad actor
    is refused."""

    async def go() -> str:
        book = await open_book(db)  # the system clock, as the CLI's: the deadline is ten minutes away
        try:
            accepted = await send_notification(book, recipient="ops", content={"text": "a"}, mode="guaranteed",
                                               channels=["email"], response_timeout=600)
            await deliver_due_notifications(book, {"email": ScriptedChannel("email", ["success"])}, deadline=2)
            return accepted.id
        finally:
            await book.engine.dispose()

    nid = asyncio.run(go())
    acked = invoke(db, "ack", nid, "--actor", "operator:alice", "--note", "on it")
    assert acked.exit_code == 0 and "acked" in acked.output and "operator:alice" in acked.output, acked.output
    assert invoke(db, "ack", nid, "--actor", "operator:alice").exit_code == 0
    conflict = invoke(db, "dismiss", nid, "--actor", "operator:bob")
    assert conflict.exit_code == 2 and "already acked by operator:alice" in conflict.output
    shown = json.loads(invoke(db, "show", nid).output)
    assert (shown["response"]["status"], shown["response"]["note"], shown["callbacks"]) == ("acked", "on it", [])
    assert (shown["effective_ack_status"], shown["ack_inherited"]) == ("acked", False)
    bad = invoke(db, "ack", nid, "--actor", "")
    assert bad.exit_code == 2 and "Traceback" not in bad.output
def test_retain_removes_settled_notifications_and_keeps_dead_letters(db):
    """N30: `notify retain --before T --horizon D` removes the old delivered notification, keeps the dead
    letter, prints the ids removed and a summary, and records the run as the operator's."""
    ids = seed(db)
    dry = invoke(db, "retain", "--before", "2024-06-01T00:00:00Z", "--horizon", "7d", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert dry.stdout.split() == [ids["ok"]] and "would remove" in dry.stderr
    assert sorted(r["id"] for r in json.loads(invoke(db, "ls", "--json").output)) == sorted(ids.values())
    done = invoke(db, "retain", "--before", "2024-06-01T00:00:00Z", "--horizon", str(7 * 86400), "--json", "--yes")
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    assert (report["notifications"], report["dry_run"]) == ([ids["ok"]], False)
    assert report["counts"]["notification"]["protected_by"] == {"dead_letter": 1}
    assert report["counts"]["channel_attempt"]["removed"] == 2  # Slack rejected, email accepted
    assert [r["id"] for r in json.loads(invoke(db, "ls", "--json").output)] == [ids["dead"]]
    assert invoke(db, "show", ids["ok"]).exit_code == 2

    async def run_rows():
        book = await open_book(db)
        try:
            from statebook.lifecycle import history
            from statebook.outbox.notifications.schema import notification_retention_runs as t

            import sqlalchemy as sa

            async with book.read() as conn:
                runs = [dict(r._mapping) for r in await conn.execute(sa.select(t))]
            tomb = (await history(book, "notification", ids["ok"]))[-1]
            return runs, tomb
        finally:
            await book.engine.dispose()

    runs, tomb = asyncio.run(run_rows())
    assert sorted((r["dry_run"], r["status"]) for r in runs) == [(0, "completed"), (1, "completed")]
    assert (tomb.reason_code, tomb.actor_type) == ("notification.purged.retention", "operator")


def test_retain_refuses_a_cutoff_younger_than_the_horizon_and_bad_options_in_one_line(db):
    """N30: a cutoff younger than the horizon, an unreadable time or duration, and a missing option are
    one-line errors with a non-zero exit; nothing is removed."""
    ids = seed(db)
    cases = [
        (["--before", "2099-01-01T00:00:00Z", "--horizon", "7d"], "horizon"),
        (["--before", "now-ish", "--horizon", "7d"], "--before"),
        (["--before", "2024-06-01", "--horizon", "soon"], "--horizon"),
        (["--before", "2024-06-01", "--horizon", "-3d"], "--horizon"),
        (["--before", "2024-06-01", "--horizon", "0"], "--horizon"),
        (["--horizon", "7d"], "--before"),
        (["--before", "2024-06-01"], "--horizon"),
    ]
    for args, named in cases:
        out = invoke(db, "retain", *args, "--yes")
        assert out.exit_code != 0, args
        assert named in out.output and "Traceback" not in out.output, (args, out.output)
        if len(args) == 4:  # ours, not typer's usage box: one line
            assert len(out.output.strip().splitlines()) == 1, out.output
    assert sorted(r["id"] for r in json.loads(invoke(db, "ls", "--json").output)) == sorted(ids.values())


def test_ls_filters_by_response_status_and_ack_wants_type_and_id(db_url, backend):
    """N34: `notify ls --status` takes the response statuses too (acked, dismissed, timed_out: the answer a
    notification's obligation got, a follower's through its owner) besides the notification's own; `--actor`
    without `type:` (or without an id) is refused before anything is read or written. Both backends."""
    from statebook.adapters.db import reset_schema
    from statebook.outbox.notifications import get_response

    async def go() -> dict[str, str]:
        book = await open_book(db_url)  # the system clock, as the CLI's
        try:
            if backend == "postgres":
                await reset_schema(book.engine)
            ids = {}
            for name in ("acked", "dismissed", "open"):
                made = await send_notification(book, recipient=name, content={"text": name}, mode="guaranteed",
                                               channels=["email"], response_timeout=600)
                ids[name] = made.id
            ids["plain"] = (await send_notification(book, recipient="ops", content={"text": "x"}, mode="guaranteed",
                                                    channels=["email"])).id
            await deliver_due_notifications(book, {"email": ScriptedChannel("email", ["success"] * 4)}, deadline=2)
            return ids
        finally:
            await book.engine.dispose()

    ids = asyncio.run(go())
    assert invoke(db_url, "ack", ids["acked"], "--actor", "operator:ana").exit_code == 0
    assert invoke(db_url, "dismiss", ids["dismissed"], "--actor", "operator:ana").exit_code == 0
    for status, expected in (("acked", ["acked"]), ("dismissed", ["dismissed"]), ("timed_out", [])):
        listed = invoke(db_url, "ls", "--status", status, "--json")
        assert listed.exit_code == 0, listed.output
        assert [r["id"] for r in json.loads(listed.stdout)] == [ids[n] for n in expected]
        assert invoke(db_url, "ls", "--status", status).exit_code == 0
    delivered = json.loads(invoke(db_url, "ls", "--status", "delivered", "--json").stdout)
    assert sorted(r["id"] for r in delivered) == sorted(ids.values())  # the notification's own status, as before
    bad = invoke(db_url, "ls", "--status", "lost")
    assert bad.exit_code == 2 and "timed_out" in bad.output and "rate_limited" in bad.output
    for actor in ("ana", "operator:", ":ana"):
        refused = invoke(db_url, "ack", ids["open"], "--actor", actor)
        assert refused.exit_code == 2, refused.output
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and "--actor" in lines[0] and "type:id" in lines[0] and "operator:alice" in lines[0]

    async def answer():
        book = await open_book(db_url)
        try:
            return await get_response(book, ids["open"])
        finally:
            await book.engine.dispose()

    assert asyncio.run(answer()).status == "pending"  # nothing was written
