"""``statebook dispatch``: masking, operator actions, one-line errors, ``deliver --once``."""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from statebook.adapters.cli import app
from statebook.adapters.db import open_book
from statebook.lifecycle import history
from statebook.outbox import Dispatch, deliver_due_dispatches, enqueue_dispatch, get_dispatch, list_dispatches

from conformance.outbox.support import Recorder, failing


def run_async(coro):
    return asyncio.run(coro)


@pytest.fixture
def db(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


async def _with_book(url, fn):
    book = await open_book(url)
    try:
        return await fn(book)
    finally:
        await book.engine.dispose()


def setup_rows(url: str) -> dict[str, str]:
    async def go(book):
        acked = await enqueue_dispatch(book, kind="k", deliver_to="seat-1", ack_required=True)
        dead = await enqueue_dispatch(book, kind="k", deliver_to="seat-2", max_attempts=1)
        await deliver_due_dispatches(book, transport=Recorder(outcome=failing("down")).transport)
        pending = await enqueue_dispatch(book, kind="k", deliver_to="seat-3")
        token = (await get_dispatch(book, acked)).ack_token.get_secret_value()
        return {"acked": acked, "dead": dead, "pending": pending, "token": token}

    return run_async(_with_book(url, go))


def invoke(url: str, *args: str):
    return CliRunner().invoke(app, ["--db", url, "dispatch", *args])


def row(url: str, did: str):
    return run_async(_with_book(url, lambda book: get_dispatch(book, did)))


def test_ls_and_show_mask_ack_tokens_unless_revealed(db):
    """O18 (do-better 7): ls --json and show never print an ack token (row or payload) unless
    --reveal is given."""
    ids = setup_rows(db)
    token = ids["token"]
    for args in (("ls", "--json"), ("ls",), ("show", ids["acked"])):
        result = invoke(db, *args)
        assert result.exit_code == 0, result.output
        assert token not in result.output
    shown = json.loads(invoke(db, "show", ids["acked"]).output)
    assert shown["ack_token"] == "********" and shown["payload"]["ack_token"] == "********"
    listed = json.loads(invoke(db, "ls", "--json", "--status", "pending").output)
    assert {r["id"] for r in listed} == {ids["acked"], ids["pending"]}
    assert token in invoke(db, "show", ids["acked"], "--reveal").output
    assert token in invoke(db, "ls", "--json", "--reveal").output


def test_reads_return_the_frozen_dispatch_model_that_json_prints(db):
    """get_dispatch and list_dispatches return Dispatch models: typed, frozen, times as aware datetimes, the
    engine's head left out; ``show`` and ``ls --json`` print the model's dump (ack tokens masked there)."""
    ids = setup_rows(db)
    one = row(db, ids["acked"])
    assert isinstance(one, Dispatch) and one.ack_required is True and isinstance(one.payload, dict)
    assert one.created_at.tzinfo is not None and one.created_at <= datetime.now(timezone.utc)
    assert one.ack_token is not None and one.ack_token.get_secret_value() == ids["token"]
    with pytest.raises(ValidationError):
        one.status = "acked"
    dumped = one.dump()
    assert "last_fact_id" not in dumped and "chain_hash" not in dumped and ids["token"] not in json.dumps(dumped)
    assert json.loads(invoke(db, "show", ids["acked"]).output) == dumped
    assert json.loads(invoke(db, "show", ids["acked"], "--reveal").output) == one.dump(reveal=True)
    listed = run_async(_with_book(db, lambda book: list_dispatches(book)))
    assert all(isinstance(d, Dispatch) for d in listed)
    assert json.loads(invoke(db, "ls", "--json").output) == [d.dump() for d in listed]


def test_ack_retry_and_purge_act_as_the_operator(db, monkeypatch):
    """O17, O18: ack, retry and purge record operator:$USER in their facts."""
    monkeypatch.setenv("USER", "dana")
    ids = setup_rows(db)
    assert invoke(db, "ack", ids["acked"], ids["token"]).exit_code == 0
    assert row(db, ids["acked"]).status == "acked"
    result = invoke(db, "retry", ids["dead"])
    assert result.exit_code == 0, result.output
    assert row(db, ids["dead"]).status == "pending"
    assert invoke(db, "purge", ids["dead"], "--force").exit_code == 0
    for did in (ids["acked"], ids["dead"]):
        facts = run_async(_with_book(db, lambda book, d=did: history(book, "dispatch", d)))
        assert (facts[-1].actor_type, facts[-1].actor_id) == ("operator", "dana")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("ack", "{acked}", "wrong"), "wrong acknowledgement token"),
        (("ack", "{pending}", "x"), "did not request"),
        (("show", "0" * 32), "does not exist"),
        (("retry", "{pending}"), "only dead_letter or expired"),
        (("retry", "0" * 32), "does not exist"),
        (("purge", "{pending}"), "force"),
        (("purge", "--status", "pending", "--before", "2100-01-01", "--yes"), "non-terminal"),
        (("purge", "--before", "yesterday"), "ISO-8601"),
        (("purge",), "--before"),
        (("ls", "--status", "done"), "unknown dispatch status"),
    ],
)
def test_errors_are_one_line_with_a_non_zero_exit(db, args, message):
    """O18: refusals print one line naming the problem and exit non-zero; nothing changes."""
    ids = setup_rows(db)
    result = invoke(db, *(a.format(**ids) for a in args))
    assert result.exit_code != 0
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert row(db, ids["pending"]).status == "pending"


def test_bulk_purge_dry_run_then_purge(db):
    """O16, O18: purge --before --dry-run lists the terminal rows and keeps them; without
    --dry-run they are purged."""
    ids = setup_rows(db)
    result = invoke(db, "purge", "--before", "2100-01-01", "--dry-run")
    assert result.exit_code == 0 and ids["dead"] in result.output
    assert row(db, ids["dead"]) is not None
    assert invoke(db, "purge", "--before", "2100-01-01", "--yes").exit_code == 0
    assert row(db, ids["dead"]) is None and row(db, ids["pending"]) is not None


def test_deliver_once_runs_the_configured_template_and_prints_counters(db, tmp_path):
    """O18, O13: deliver --once --config FILE uses dispatch.notify_template and prints the five
    counters as JSON."""
    out = tmp_path / "routes.txt"
    script = tmp_path / "notify.py"
    script.write_text(f"import sys\nopen({str(out)!r}, 'a').write(sys.argv[1] + '\\n')\n")
    config = tmp_path / "statebook.toml"
    config.write_text(f"[dispatch]\nnotify_template = [{json.dumps(sys.executable)}, {json.dumps(str(script))}, \"{{deliver_to}}\"]\n")
    ids = setup_rows(db)
    result = invoke(db, "deliver", "--once", "--config", str(config))
    assert result.exit_code == 0, result.output
    counts = json.loads(result.output.strip().splitlines()[-1])
    assert counts == {"attempted": 1, "delivered": 1, "dead_letter": 0, "expired": 0, "retried": 0}
    assert Path(out).read_text() == "seat-3\n"
    assert row(db, ids["pending"]).status == "delivered"


def test_deliver_once_expands_python_and_config_dir_as_run_does(db, tmp_path):
    """O18: deliver --once reads the template as `statebook run` does: {python} is this interpreter and
    {config_dir} the settings file's folder (the example settings use both)."""
    folder = tmp_path / "conf"
    folder.mkdir()
    (folder / "notify.py").write_text("import pathlib, sys\n"
                                      "(pathlib.Path(__file__).parent / 'routes.txt').write_text(sys.argv[1])\n")
    config = folder / "statebook.toml"
    config.write_text('[dispatch]\nnotify_template = ["{python}", "{config_dir}/notify.py", "{deliver_to}"]\n')
    ids = setup_rows(db)
    result = invoke(db, "deliver", "--once", "--config", str(config))
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["delivered"] == 1
    assert (folder / "routes.txt").read_text() == "seat-3"
    assert row(db, ids["pending"]).status == "delivered"


@pytest.fixture
def any_db(db_url, backend) -> str:
    """An empty statebook database on either backend (PostgreSQL's is shared: emptied first)."""
    from statebook.adapters.db import reset_schema

    async def go(book):
        if backend == "postgres":
            await reset_schema(book.engine)

    run_async(_with_book(db_url, go))
    return db_url


def snapshot(url: str) -> tuple[list[tuple], int]:
    """Every dispatch's (id, status, attempt, due time, claim id), and the number of facts."""
    import sqlalchemy as sa

    from statebook.lifecycle.facts import facts_table
    from statebook.outbox import dispatch_outbox as t

    async def go(book):
        async with book.read() as conn:
            rows = (await conn.execute(sa.select(t.c.id, t.c.status, t.c.attempt, t.c.next_attempt_at, t.c.claim_id)
                                       .order_by(t.c.id))).all()
            count = await conn.scalar(sa.select(sa.func.count()).select_from(facts_table))
        return [tuple(r) for r in rows], count

    return run_async(_with_book(url, go))


def test_deliver_without_a_transport_refuses_to_start_and_claims_nothing(any_db, tmp_path):
    """O18 (issue 25): `dispatch deliver` with no `dispatch.notify_template` refuses to start — one line naming
    the setting, exit 2 — before it opens the database: no dispatch is claimed or failed (it used to burn
    attempts, a pending dispatch going to attempt 4 of 8 due 15 minutes later), with --once and without,
    on both backends. The same template given through the environment starts it."""
    import os

    ids = setup_rows(any_db)
    before = snapshot(any_db)
    config = tmp_path / "statebook.toml"
    config.write_text("[dispatch]\nbatch_size = 10\n")
    once = invoke(any_db, "deliver", "--once", "--config", str(config))
    assert once.exit_code == 2, once.output
    lines = once.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "notify_template" in lines[0], once.stderr
    assert "nothing was claimed" in lines[0]
    unset: dict[str, str | None] = {k: None for k in os.environ if k.startswith("STATEBOOK_")}
    served = CliRunner().invoke(app, ["--db", any_db, "dispatch", "deliver", "--config", str(config)], env=unset)
    assert served.exit_code == 2 and "notify_template" in served.stderr, served.stderr
    assert "delivering;" not in served.stderr
    assert snapshot(any_db) == before
    assert row(any_db, ids["pending"]).attempt == 0
    template = {**unset, "STATEBOOK_DISPATCH__NOTIFY_TEMPLATE": json.dumps(["/bin/true", "{deliver_to}"])}
    started = CliRunner().invoke(app, ["--db", any_db, "dispatch", "deliver", "--once", "--config", str(config)],
                                 env=template)
    assert started.exit_code == 0, started.stderr
    assert row(any_db, ids["pending"]).status == "delivered"


def test_expedite_from_the_command_line_acts_as_the_operator(any_db, monkeypatch):
    """O18, O23: `dispatch expedite ID` makes a pending dispatch waiting out its backoff due now, as
    operator:$USER, and says so; a dead letter is refused in one line naming retry (exit 2), a missing id is
    one line (exit 2); nothing else changes. Both backends."""
    monkeypatch.setenv("USER", "dana")

    async def go(book):
        waiting = await enqueue_dispatch(book, kind="k", deliver_to="seat-9")
        await deliver_due_dispatches(book, transport=Recorder(outcome=failing("down")).transport)
        return waiting

    ids = setup_rows(any_db)
    waiting = run_async(_with_book(any_db, go))
    due = row(any_db, waiting).next_attempt_at
    done = invoke(any_db, "expedite", waiting)
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith(f"expedited {waiting}")
    now = row(any_db, waiting)
    assert now.status == "pending" and now.attempt == 1 and now.next_attempt_at < due
    last = run_async(_with_book(any_db, lambda book: history(book, "dispatch", waiting)))[-1]
    assert (last.reason_code, last.actor_type, last.actor_id) == ("dispatch.pending.operator_expedited", "operator",
                                                                  "dana")
    before = snapshot(any_db)
    for target, message in ((ids["dead"], "dispatch retry"), ("0" * 32, "does not exist")):
        refused = invoke(any_db, "expedite", target)
        assert refused.exit_code == 2, refused.output
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], refused.stderr
    assert snapshot(any_db) == before
