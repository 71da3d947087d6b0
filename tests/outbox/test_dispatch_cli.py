"""``statebook dispatch``: masking, operator actions, one-line errors, ``deliver --once``."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from statebook.adapters.cli import app
from statebook.adapters.db import open_book
from statebook.lifecycle import history
from statebook.outbox import deliver_due_dispatches, enqueue_dispatch, get_dispatch

from dispatch_support import Recorder, failing


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
        token = (await get_dispatch(book, acked))["ack_token"]
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


def test_ack_retry_and_purge_act_as_the_operator(db, monkeypatch):
    """O17, O18: ack, retry and purge record operator:$USER in their facts."""
    monkeypatch.setenv("USER", "dana")
    ids = setup_rows(db)
    assert invoke(db, "ack", ids["acked"], ids["token"]).exit_code == 0
    assert row(db, ids["acked"])["status"] == "acked"
    result = invoke(db, "retry", ids["dead"])
    assert result.exit_code == 0, result.output
    assert row(db, ids["dead"])["status"] == "pending"
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
    assert row(db, ids["pending"])["status"] == "pending"


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
    assert row(db, ids["pending"])["status"] == "delivered"


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
    assert row(db, ids["pending"])["status"] == "delivered"
