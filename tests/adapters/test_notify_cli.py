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


def test_retain_removes_settled_notifications_and_keeps_dead_letters(db):
    """N30: `notify retain --before T --horizon D` removes the old delivered notification, keeps the dead
    letter, prints the ids removed and a summary, and records the run as the operator's."""
    ids = seed(db)
    dry = invoke(db, "retain", "--before", "2024-06-01T00:00:00Z", "--horizon", "7d", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert dry.stdout.split() == [ids["ok"]] and "would remove" in dry.stderr
    assert sorted(r["id"] for r in json.loads(invoke(db, "ls", "--json").output)) == sorted(ids.values())
    done = invoke(db, "retain", "--before", "2024-06-01T00:00:00Z", "--horizon", str(7 * 86400), "--json")
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
            from statebook.outbox.notifications import notification_retention_runs as t

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
        out = invoke(db, "retain", *args)
        assert out.exit_code != 0, args
        assert named in out.output and "Traceback" not in out.output, (args, out.output)
        if len(args) == 4:  # ours, not typer's usage box: one line
            assert len(out.output.strip().splitlines()) == 1, out.output
    assert sorted(r["id"] for r in json.loads(invoke(db, "ls", "--json").output)) == sorted(ids.values())
