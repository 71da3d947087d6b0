"""The lifecycle commands of the CLI: inspect (L16), history/replay (L7), verify (L12), the demo.

The CLI runs ``asyncio.run`` itself, so these are plain sync tests on a SQLite file; they prepare
their database with ``asyncio.run`` too.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from datetime import datetime, timezone

import pytest
from typer.testing import CliRunner

from statebook.adapters.cli import app
from statebook.adapters.db import open_book
from statebook.adapters.registry import builtin_registry
from statebook.lifecycle import Actor, FakeClock, Reason, create, transition

runner = CliRunner()
START = 1_700_000_000.0
SYSTEM = Actor("system", "test")


async def _seed(url: str) -> str:
    """One dispatch: created at START, claimed at START + 10."""
    clock = FakeClock(START)
    book = await open_book(url, clock=clock)
    try:
        made = await create(
            book, "dispatch", status="pending", reason=Reason("dispatch.pending.enqueued", "queued by test"),
            actor=SYSTEM, values={"kind": "note", "deliver_to": "ops", "payload": {"text": "hi"},
                                  "next_attempt_at": START, "created_at": START},
        )
        clock.advance(10)
        await transition(book, "dispatch", made.entity_id, "delivering", expected="pending", guards={"attempt": 0},
                         patch={"attempt": 1}, reason=Reason("dispatch.delivering.attempt"), actor=SYSTEM)
        return made.entity_id
    finally:
        await book.engine.dispose()


@pytest.fixture
def seeded(tmp_path):
    path = tmp_path / "cli.db"
    entity_id = asyncio.run(_seed(f"sqlite:///{path}"))
    return path, entity_id


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"STATEBOOK_DB": None})


def assert_one_line_error(result) -> None:
    assert result.exit_code not in (0, None)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error:")


# -- lifecycle ls / show / graph --------------------------------------------------------------


def test_ls_lists_every_builtin_lifecycle_with_its_fingerprint():
    """L16: `lifecycle ls` shows each type, its table, status count and fingerprint, without a database."""
    result = invoke("--db", "/nonexistent/dir/x.db", "lifecycle", "ls")
    assert result.exit_code == 0, result.output
    for lc in builtin_registry():
        row = next(line for line in result.stdout.splitlines() if f" {lc.entity_type} " in line)
        assert lc.table_name in row and lc.fingerprint in row and f" {len(lc.statuses)} " in row


def test_show_names_statuses_edges_fields_and_reasons():
    """L16: `lifecycle show dispatch` lists what the declaration says, including the operator gate."""
    lc = builtin_registry().get("dispatch")
    result = invoke("lifecycle", "show", "dispatch")
    assert result.exit_code == 0, result.output
    for name in (*lc.statuses, *lc.patch_fields, *lc.reasons, lc.fingerprint):
        assert name in result.stdout, name
    assert "operator only" in result.stdout


def test_graph_prints_raw_mermaid_and_text():
    """L16: `lifecycle graph dispatch --format mermaid` is exactly the diagram; text lists every edge."""
    from statebook.lifecycle.diagram import to_mermaid

    lc = builtin_registry().get("dispatch")
    result = invoke("lifecycle", "graph", "dispatch", "--format", "mermaid")
    assert result.exit_code == 0
    assert result.stdout.startswith("stateDiagram-v2\n")
    assert result.stdout == to_mermaid(lc)
    text = invoke("lifecycle", "graph", "schedule_run", "--format", "text")
    assert text.exit_code == 0
    run_lc = builtin_registry().get("schedule_run")
    assert text.stdout.count("  -> ") == len(run_lc.edges)


@pytest.mark.parametrize("args", [
    ("lifecycle", "show", "nope"),
    ("lifecycle", "graph", "nope"),
])
def test_unknown_type_is_a_one_line_error(args):
    """L16: an unknown type exits non-zero with one line naming the known types."""
    result = invoke(*args)
    assert_one_line_error(result)
    assert "nope" in result.stderr and "dispatch" in result.stderr


# -- history / replay -------------------------------------------------------------------------


def test_history_json_prints_every_fact(seeded):
    """L7: `history --json` prints one fact per line, oldest first, chained."""
    path, entity_id = seeded
    result = invoke("--db", str(path), "history", "dispatch", entity_id, "--json")
    assert result.exit_code == 0, result.output
    facts = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(f["previous_status"], f["status"]) for f in facts] == [(None, "pending"), ("pending", "delivering")]
    assert facts[1]["prev_fact_id"] == facts[0]["id"] and facts[1]["patch"] == {"attempt": 1}
    table = invoke("--db", str(path), "history", "dispatch", entity_id)
    assert table.exit_code == 0
    assert "(new) ->" in table.stdout and "pending ->" in table.stdout and "attempt=1" in table.stdout


def test_replay_folds_now_and_as_of(seeded):
    """L7: replay prints the fold of the facts; --as-of (epoch or ISO-8601) folds only earlier facts."""
    path, entity_id = seeded
    now = json.loads(invoke("--db", str(path), "replay", "dispatch", entity_id).stdout)
    assert now["status"] == "delivering" and now["version"] == 2 and now["attempt"] == 1
    before = json.loads(invoke("--db", str(path), "replay", "dispatch", entity_id, "--as-of", str(START + 5)).stdout)
    assert before["status"] == "pending" and before["version"] == 1
    iso = datetime.fromtimestamp(START + 5, timezone.utc).isoformat()
    assert json.loads(invoke("--db", str(path), "replay", "dispatch", entity_id, "--as-of", iso).stdout) == before
    bad = invoke("--db", str(path), "replay", "dispatch", entity_id, "--as-of", "last tuesday")
    assert_one_line_error(bad)


def test_db_commands_refuse_bad_input_in_one_line(seeded, tmp_path):
    """Bad input: a missing SQLite file, a malformed URL, an unknown type or entity -> one-line error."""
    path, _ = seeded
    missing = tmp_path / "missing.db"
    for args in (
        ("--db", str(missing), "verify"),
        ("--db", "mysql://u@h/db", "verify"),
        ("--db", str(path), "verify", "--type", "nope"),
        ("--db", str(path), "history", "dispatch", "no-such-id"),
    ):
        assert_one_line_error(invoke(*args))
    assert not missing.exists()


# -- verify -----------------------------------------------------------------------------------


def test_verify_passes_on_a_clean_database(seeded):
    """L12: a database written only by the engine verifies clean: exit 0 and an ok summary."""
    path, _ = seeded
    result = invoke("--db", str(path), "verify")
    assert result.exit_code == 0, result.output
    assert "verified 1 entities, 2 facts: ok" in result.stdout
    report = json.loads(invoke("--db", str(path), "verify", "--json").stdout)
    assert report["ok"] is True and report["facts"] == 2


def test_verify_fails_on_a_tampered_row(seeded):
    """L12: a status written behind the engine's back is found: exit 1, the finding is printed."""
    path, entity_id = seeded
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE dispatch_outbox SET status = 'acked' WHERE id = ?", (entity_id,))
    conn.close()
    result = invoke("--db", str(path), "verify")
    assert result.exit_code == 1, result.output
    assert "1 finding" in result.stdout and "row_mismatch" in result.stdout
    as_json = invoke("--db", str(path), "verify", "--type", "dispatch", "--json")
    assert as_json.exit_code == 1
    report = json.loads(as_json.stdout)
    assert report["ok"] is False
    assert [(f["kind"], f["entity_id"]) for f in report["findings"]] == [("row_mismatch", entity_id)]


# -- demo -------------------------------------------------------------------------------------


def test_demo_runs_and_ends_with_a_passing_verify(tmp_path):
    """L3/L4/L12: the demo shows a conflict and a rejection, prints history and verifies clean, twice."""
    path = tmp_path / "demo.db"
    for _ in range(2):  # the database is recreated each run
        result = invoke("demo", "--db", str(path))
        assert result.exit_code == 0, result.output
        assert "conflict" in result.stdout and "rejected" in result.stdout
        assert result.stdout.strip().splitlines()[-1] == "verified 2 entities, 7 facts: ok"


def test_demo_refuses_to_overwrite_another_database(seeded):
    """The demo never deletes a database it did not make."""
    path, _ = seeded
    result = invoke("demo", "--db", str(path))
    assert_one_line_error(result)
    assert path.exists() and "not a demo database" in result.stderr


async def _seed_tickets(url: str) -> str:
    """The README's first lifecycle (``ticket``), written by an application with its own registry."""
    import sqlalchemy as sa

    from statebook.lifecycle import Lifecycle, edges, managed_table

    meta = sa.MetaData()  # apart from statebook's schema, as an application's table would be
    tickets = managed_table("tickets", sa.Column("id", sa.String(32), primary_key=True),
                            sa.Column("title", sa.Text, nullable=False), meta=meta)
    ticket = Lifecycle(
        entity_type="ticket", table=tickets, statuses=("open", "closed"), initial={"open"}, terminal={"closed"},
        edges=edges("open", "closed"), reason_prefixes={"ticket"}, reasons={"ticket.open.filed", "ticket.closed.fixed"},
    )
    registry = builtin_registry(seal=False)
    registry.register(ticket)
    book = await open_book(url, registry=registry.seal(), clock=FakeClock(START))
    try:
        async with book.engine.begin() as conn:
            await conn.run_sync(meta.create_all)
        made = await create(book, "ticket", values={"title": "disk full"}, status="open",
                            reason=Reason("ticket.open.filed"), actor=Actor("user", "ana"))
        await transition(book, "ticket", made.entity_id, "closed", expected="open",
                         reason=Reason("ticket.closed.fixed", "freed 20 GB"), actor=Actor("user", "ana"))
        return made.entity_id
    finally:
        await book.engine.dispose()


def test_verify_reports_what_its_registry_does_not_know(tmp_path):
    """L12a: `statebook verify` over the README's ticket example (not in the built-in registry), with a
    tampered ticket row, does not say ok over it: it names the unregistered type and table and exits 1;
    --type narrows the run to what it knows."""
    path = tmp_path / "app.db"
    ticket_id = asyncio.run(_seed_tickets(f"sqlite:///{path}"))
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE tickets SET title = 'nothing to see' WHERE id = ?", (ticket_id,))
    conn.close()
    result = invoke("--db", str(path), "verify")
    assert result.exit_code == 1, result.output
    assert "verified 0 entities, 0 facts: 2 finding(s)" in result.stdout
    assert "unregistered_type" in result.stdout and "ticket" in result.stdout
    assert "unregistered_table" in result.stdout and "'tickets'" in result.stdout
    report = json.loads(invoke("--db", str(path), "verify", "--json").stdout)
    assert {(f["kind"], f["entity_type"]) for f in report["findings"]} == {
        ("unregistered_type", "ticket"), ("unregistered_table", "")}
    narrowed = invoke("--db", str(path), "verify", "--type", "dispatch")
    assert narrowed.exit_code == 0, narrowed.output


def test_verify_reports_a_malformed_fact_instead_of_crashing(seeded):
    """L12b: a fact whose patch is valid JSON but not an object, and one whose version is text, are
    findings printed in the report (exit 1), not a traceback; the other checks still run."""
    path, entity_id = seeded
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE status_transitions SET patch = '[1, 2]' WHERE entity_id = ? AND version = 2", (entity_id,))
        conn.execute("UPDATE status_transitions SET version = 'one' WHERE entity_id = ? AND version = 1", (entity_id,))
        conn.execute("UPDATE dispatch_outbox SET deliver_to = 'elsewhere' WHERE id = ?", (entity_id,))
    conn.close()
    result = invoke("--db", str(path), "verify", "--json")
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    kinds = {f["kind"] for f in json.loads(result.stdout)["findings"]}
    assert {"malformed_fact", "hash_mismatch", "row_mismatch"} <= kinds and "unreadable" not in kinds


@pytest.mark.parametrize("processes", ["0", "2"])
def test_verify_reads_text_that_is_not_utf8_as_damage(seeded, processes, monkeypatch):
    """L12b: SQLite text that is not UTF-8 (CAST(X'..' AS TEXT) by plain SQL) in a fact's JSON and text
    columns, and in another fact's entity type, is reported, not a decode error: in this process and in
    worker processes."""
    import statebook.lifecycle.sweep as sweep_module

    path, entity_id = seeded
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE status_transitions SET patch = CAST(X'7bff7d' AS TEXT), reason_code = CAST(X'80' AS TEXT) "
                     "WHERE entity_id = ? AND version = 2", (entity_id,))
        conn.execute("INSERT INTO status_transitions (id, entity_type, entity_id, prev_fact_id, version, reason_code, "
                     "reason_summary, evidence_refs, actor_type, actor_id, at, patch, metadata, policy_fingerprint, "
                     "prev_hash, hash) VALUES ('x', CAST(X'c3' AS TEXT), 'e', '', 1, '', '', '[]', '', '', 0, '{}', "
                     "'{}', '', '', '')")
    conn.close()
    monkeypatch.setattr(sweep_module, "PARALLEL_MIN_FACTS", 0)
    monkeypatch.setattr(sweep_module, "CHUNK_FACTS", 1)
    monkeypatch.setattr(sweep_module, "MAX_PROCESSES", int(processes))
    result = invoke("--db", str(path), "verify", "--json")
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    findings = json.loads(result.stdout)["findings"]
    kinds = {(f["kind"], f["entity_id"]) for f in findings}
    assert {("hash_mismatch", entity_id), ("row_mismatch", entity_id), ("unregistered_type", "")} <= kinds
    assert "unreadable" not in {k for k, _ in kinds}
