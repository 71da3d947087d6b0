"""Conformance cases for the audit trail: the hash chain, purge and tombstones, and verify."""

from __future__ import annotations

import dataclasses
import logging
import sqlite3

import pytest
import sqlalchemy as sa

import statebook.adapters.sqlite_screen as sqlite_screen
import statebook.lifecycle.sweep as sweep_module
from statebook.lifecycle import (
    Book,
    Command,
    EntityNotFound,
    NewEntity,
    Reason,
    TransitionConflict,
    TransitionRejected,
    apply_many,
    as_of,
    create,
    create_many,
    history,
    purge,
    replay,
    transition,
    verify,
)
from statebook.adapters.registry import builtin_registry
from statebook.lifecycle.facts import GENESIS, fact_hash, facts_table, insert_values
from statebook.lifecycle.sweep import sweep
from statebook.outbox import enqueue_dispatch
from statebook.outbox.dispatch.schema import dispatch_outbox
from statebook.scheduler.runs import open_run
from statebook.scheduler.schema import schedule_runs, schedules
from statebook.scheduler.store import create_schedule, schedule_row

from statebook.lifecycle.testing.cases import walked

from .support import (
    CREATED,
    FINISHED,
    OPERATOR,
    PURGED,
    REFUSED,
    STARTED,
    SYSTEM,
    TASK,
    TASK_CREATED_WORKING,
    TASK_WITH_SHORTCUT,
    count_facts,
    execute,
    new_task,
    row,
    start,
    task_registry,
    task_values,
    tasks,
)


async def all_tasks(book: Book) -> list[sa.Row]:
    async with book.engine.connect() as conn:
        return list((await conn.execute(sa.select(tasks).order_by(tasks.c.id))).all())


async def swap_seq(book: Book, a: int, b: int) -> None:
    """Give two facts each other's ``seq`` with raw SQL (hashes untouched): a history read in seq order runs
    backwards there. A free value carries one across, since seq is the primary key."""
    t = facts_table
    free = -1 - max(a, b)
    for old, new in ((a, free), (b, a), (free, b)):
        await execute(book, sa.update(t).where(t.c.seq == old).values(seq=new))


async def damaged(book: Book) -> None:
    """Clean tasks next to one of every kind of damage verify reports (see the single cases below)."""
    for n in range(6):
        await walked(book, f"ok{n}")
    for entity_id in ("status", "column", "edited", "gap", "gone", "edge", "back", "reordered"):
        await walked(book, entity_id)
    second, third = (await history(book, "task", "reordered"))[1:3]
    await swap_seq(book, second.seq, third.seq)
    await execute(book, sa.update(tasks).where(tasks.c.id == "status").values(status="done"))
    await execute(book, sa.update(tasks).where(tasks.c.id == "column").values(attempt=42))
    edited = (await history(book, "task", "edited"))[1]
    await execute(book, sa.update(facts_table).where(facts_table.c.id == edited.id).values(reason_summary="no"))
    middle = (await history(book, "task", "gap"))[1]
    await execute(book, sa.delete(facts_table).where(facts_table.c.id == middle.id))
    await execute(book, sa.delete(tasks).where(tasks.c.id == "gone"))
    last = (await history(book, "task", "edge"))[-1]
    forged = insert_values({**last.content(), "id": "forged", "prev_fact_id": last.id, "previous_status": "working",
                            "status": "rejected", "version": last.version + 1, "patch": {}}, last.hash)
    await execute(book, sa.insert(facts_table).values(forged))
    await execute(book, sa.update(tasks).where(tasks.c.id == "edge").values(
        status="rejected", version=forged["version"], last_fact_id="forged", chain_hash=forged["hash"]))
    await transition(book, "task", "back", "done", expected="working", reason=FINISHED, actor=SYSTEM)
    saved = await row(book, "back")
    await purge(book, "task", "back", reason=PURGED, actor=OPERATOR)
    await execute(book, sa.insert(tasks).values(saved))
    await execute(book, sa.insert(tasks).values({**saved, "id": "nofacts"}))
    older = Book(book.engine, task_registry(TASK_CREATED_WORKING), book.clock)
    await create(older, "task", values=task_values(), status="working", reason=Reason("task.working.started"),
                 actor=SYSTEM, entity_id="older")


class AuditCases:
    """The history is a tamper-evident chain; verify finds every kind of damage."""

    async def test_export_writes_every_fact_oldest_first_with_its_chain(self, book: Book):
        """L8 / L12: ``export_jsonl`` writes each fact once, oldest first per entity, as JSON with its hash and
        previous hash — an auditor re-hashes each line and follows the chain without the database."""
        import io
        import json

        from statebook.lifecycle.replay import export_jsonl

        await new_task(book, "t1")
        await start(book, "t1")
        await new_task(book, "t2")
        out = io.StringIO()
        assert await export_jsonl(book, out, entity_type="task") == 3
        lines = [json.loads(line) for line in out.getvalue().splitlines()]
        by_entity: dict[str, list[dict]] = {}
        for line in lines:
            by_entity.setdefault(line["entity_id"], []).append(line)
        assert [f["status"] for f in by_entity["t1"]] == ["open", "working"]
        prev = GENESIS
        for fact in by_entity["t1"]:
            content = {k: fact[k] for k in (*fact,) if k not in ("prev_hash", "hash", "seq", "tx_id")}
            assert fact["prev_hash"] == prev and fact_hash(content, prev) == fact["hash"]
            prev = fact["hash"]

    # -- the chain ------------------------------------------------------------------------------

    async def test_a_second_fact_on_the_same_predecessor_cannot_commit(self, book: Book):
        """L8: (entity, version) is unique, so a fork of the history (a second fact at a version) is refused by
        the database."""
        await new_task(book, "t1")
        await start(book, "t1")
        first, second = await history(book, "task", "t1")
        fork = {**second.content(), "id": "fork", "status": "rejected"}
        with pytest.raises(sa.exc.IntegrityError):
            await execute(book, sa.insert(facts_table).values(insert_values(fork, first.hash)))
        assert await count_facts(book) == 2
        other = {**second.content(), "id": "other", "entity_id": "t2", "prev_fact_id": first.id}
        await execute(book, sa.insert(facts_table).values(insert_values(other, first.hash)))
        assert await count_facts(book) == 3, "the constraint is per entity"

    async def test_a_forged_successor_at_another_version_commits_but_verify_reports_it(self, book: Book):
        """L8: the database forbids two facts at one version; a forged second successor that claims the next
        version instead is stored, and verify names the damage (the chain no longer ends at the row's head)."""
        await new_task(book, "t1")
        await start(book, "t1")
        first, second = await history(book, "task", "t1")
        assert (await verify(book)).ok
        forged = {**second.content(), "id": "f" * 32, "version": 3, "status": "rejected"}
        await execute(book, sa.insert(facts_table).values(insert_values(forged, first.hash)))
        report = await verify(book)
        assert not report.ok
        assert {f.entity_id for f in report.findings} == {"t1"}, report.findings

    # -- verify finds tampering ------------------------------------------------------------------

    async def test_patched_column_changed_behind_the_engine(self, book: Book):
        """L7 / L12: a patch column edited by SQL is caught the same way."""
        await walked(book, "t1")
        await execute(book, sa.update(tasks).where(tasks.c.id == "t1").values(attempt=42))
        report = await verify(book)
        assert [(f.kind, f.entity_id) for f in report.findings] == [("row_mismatch", "t1")]
        assert "'attempt'" in report.findings[0].detail

    async def test_row_deleted_without_purge(self, book: Book):
        """L12: a row deleted by SQL leaves facts with no row and no tombstone: missing_row."""
        await walked(book, "t1")
        await execute(book, sa.delete(tasks).where(tasks.c.id == "t1"))
        report = await verify(book)
        assert [(f.kind, f.entity_id) for f in report.findings] == [("missing_row", "t1")]

    async def test_row_without_facts(self, book: Book):
        """L12: a row inserted behind the engine has no history: row_without_facts."""
        await new_task(book, "t1")
        forged = {**task_values(), "id": "forged", "status": "open", "version": 1, "updated_at": 0.0,
                  "status_reason_code": "task.open.created", "status_reason_summary": "", "last_fact_id": "x",
                  "chain_hash": "y"}
        await execute(book, sa.insert(tasks).values(forged))
        report = await verify(book)
        assert [(f.kind, f.entity_id) for f in report.findings] == [("row_without_facts", "forged")]
        assert report.entities == 2

    async def test_forged_fact_on_an_undeclared_edge(self, book: Book):
        """L12: a correctly hashed fact for an edge the policy never had is a forbidden edge."""
        await new_task(book, "t1")
        (first,) = await history(book, "task", "t1")
        content = {**first.content(), "id": "forged", "prev_fact_id": first.id, "previous_status": "open",
                   "status": "done", "version": 2, "reason_code": "task.done.finished", "patch": {}}
        fact = insert_values(content, first.hash)
        await execute(book, sa.insert(facts_table).values(fact))
        await execute(book, sa.update(tasks).where(tasks.c.id == "t1").values(
            status="done", version=2, status_reason_code="task.done.finished", last_fact_id="forged",
            chain_hash=fact["hash"]))
        report = await verify(book)
        assert [(f.kind, f.fact_id) for f in report.findings] == [("forbidden_edge", "forged")]

    async def test_edge_written_under_an_older_policy(self, book: Book):
        """L12: a fact legal under the policy it was written with, but not under today's, names both fingerprints."""
        older = Book(book.engine, task_registry(TASK_WITH_SHORTCUT), book.clock)
        await new_task(older, "t1")
        await transition(older, "task", "t1", "done", expected="open", reason=FINISHED, actor=SYSTEM)
        assert (await verify(older)).ok
        report = await verify(book)
        (finding,) = report.findings
        assert (finding.kind, finding.entity_id) == ("edge_not_in_current_policy", "t1")
        assert TASK_WITH_SHORTCUT.fingerprint in finding.detail and TASK.fingerprint in finding.detail

    async def test_creation_under_an_older_policy(self, book: Book):
        """L12: a creation in a status that was initial under the older policy is attributed to that policy."""
        older = Book(book.engine, task_registry(TASK_CREATED_WORKING), book.clock)
        await create(older, "task", values=task_values(), status="working", reason=Reason("task.working.started"),
                     actor=SYSTEM, entity_id="t1")
        (finding,) = (await verify(book)).findings
        assert finding.kind == "edge_not_in_current_policy"
        assert TASK_CREATED_WORKING.fingerprint in finding.detail and TASK.fingerprint in finding.detail

    async def test_history_written_under_an_accepted_earlier_policy_verifies(self, book: Book):
        """L12c: v1 allowed open -> done; v2 removed it. A v2 that accepts v1 verifies the old history (in the
        screen: no entity reaches the full check); a v2 that accepts nothing reports every old fact as
        unknown_policy; a fact forged under v1 on an edge neither policy allowed is a forbidden_edge."""
        older = Book(book.engine, task_registry(TASK_WITH_SHORTCUT), book.clock)
        await new_task(older, "t1")
        await transition(older, "task", "t1", "done", expected="open", reason=FINISHED, actor=SYSTEM)
        accepting = Book(book.engine, task_registry(dataclasses.replace(TASK, accepts=(TASK_WITH_SHORTCUT,))), book.clock)
        assert (await verify(accepting)).ok
        suspects = []
        await sweep(accepting, [accepting.policy("task")], lambda lc, screen, s: suspects.extend(s) or [])
        assert suspects == []
        strict = Book(book.engine, task_registry(dataclasses.replace(TASK, accepts=())), book.clock)
        assert [(f.kind, f.entity_id) for f in (await verify(strict)).findings] == [("unknown_policy", "t1")] * 2
        await new_task(older, "t2")
        (first,) = await history(book, "task", "t2")
        forged = insert_values({**first.content(), "id": "forged", "prev_fact_id": first.id, "previous_status": "open",
                                "status": "blocked", "version": 2, "reason_code": "task.blocked.waiting",
                                "patch": {}}, first.hash)
        await execute(book, sa.insert(facts_table).values(forged))
        await execute(book, sa.update(tasks).where(tasks.c.id == "t2").values(
            status="blocked", version=2, status_reason_code="task.blocked.waiting", last_fact_id="forged",
            chain_hash=forged["hash"]))
        (finding,) = (await verify(accepting)).findings
        assert (finding.kind, finding.entity_id, finding.fact_id) == ("forbidden_edge", "t2", "forged")
        assert TASK_WITH_SHORTCUT.fingerprint in finding.detail

    async def test_verify_can_be_limited_to_one_entity_type(self, book: Book):
        """L12: verify(entity_type=...) checks that lifecycle only."""
        await new_task(book, "t1")
        await execute(book, sa.update(tasks).where(tasks.c.id == "t1").values(status="done"))
        assert not (await verify(book, "task")).ok
        only_dispatch = await verify(book, "dispatch")
        assert only_dispatch.ok and only_dispatch.entities == 0

    async def test_columns_no_fact_sets_are_checked_too(self, book: Book):
        """L7 / L12: the row equals the fold of its facts in EVERY column; a column no fact set folds to the
        table's declared default, so editing it by SQL (a claim id, a poll cursor, the deferral count, a
        run's reported spend, which the budget gate reads) is a row_mismatch naming it."""
        did = await enqueue_dispatch(book, kind="note", deliver_to="ops", body={"text": "hi"})
        schedule = await create_schedule(book, {
            "name": "nightly", "trigger_type": "interval", "interval_sec": 60, "action_kind": "command",
            "action_command": "true"})
        run_id = await open_run(book, await schedule_row(book, schedule.id), reason=Reason("schedule_run.running.fired"),
                                context={},
                                daemon_id="d1")
        assert (await verify(book)).ok
        for table, entity_id, values in (
            (dispatch_outbox, did, {"claim_id": "f" * 32}),
            (schedules, schedule.id, {"github_cursor": "999", "deferrals": 3}),
            (schedule_runs, run_id, {"cost_usd": 0.01, "tokens": 5}),
        ):
            await execute(book, sa.update(table).where(table.c.id == entity_id).values(values))
        report = await verify(book)
        found = {(f.kind, f.entity_type, f.entity_id, f.detail.split("'")[1]) for f in report.findings}
        assert found == {
            ("row_mismatch", "dispatch", did, "claim_id"),
            ("row_mismatch", "schedule", schedule.id, "github_cursor"),
            ("row_mismatch", "schedule", schedule.id, "deferrals"),
            ("row_mismatch", "schedule_run", run_id, "cost_usd"),
            ("row_mismatch", "schedule_run", run_id, "tokens"),
        }

    async def test_a_declared_default_edited_by_sql_is_found(self, book: Book):
        """L7 / L12: a column filled by its server default at creation (never given, never patched) is checked
        against that default; replay returns it as well."""
        values = task_values()
        del values["attempt"]  # server_default "0"
        del values["score"]  # no default: NULL
        await create(book, "task", values=values, status="open", reason=CREATED, actor=SYSTEM, entity_id="t1")
        assert (await verify(book)).ok
        folded = await replay(book, "task", "t1")
        assert folded == await row(book, "t1") and (folded["attempt"], folded["score"]) == (0, None)
        await execute(book, sa.update(tasks).where(tasks.c.id == "t1").values(attempt=9, score=2.5))
        report = await verify(book)
        assert sorted((f.kind, f.detail.split("'")[1]) for f in report.findings) == [
            ("row_mismatch", "attempt"), ("row_mismatch", "score")]

    # -- what verify does not know is a finding (L12a) --------------------------------------------

    async def test_facts_and_rows_of_an_unregistered_type_are_findings(self, book: Book):
        """L12a: a book whose registry lacks a lifecycle that wrote facts (the application's own) reports its
        facts and its managed table instead of saying ok over them; --type / entity_type narrows the run."""
        await walked(book, "t1")
        await execute(book, sa.update(tasks).where(tasks.c.id == "t1").values(status="done"))
        builtin = Book(book.engine, builtin_registry(), book.clock)
        report = await verify(builtin)
        assert not report.ok and (report.entities, report.facts) == (0, 0)
        assert sorted((f.kind, f.entity_type) for f in report.findings) == [
            ("unregistered_table", ""), ("unregistered_type", "task")]
        assert "4 fact(s)" in report.findings[0].detail or "4 fact(s)" in report.findings[1].detail
        assert any(tasks.name in f.detail for f in report.findings)
        assert (await verify(builtin, "dispatch")).ok, "narrowed to a registered type: only that type"
        assert {f.kind for f in (await verify(book)).findings} == {"row_mismatch"}

    async def test_a_managed_table_without_facts_is_a_finding(self, book: Book):
        """L12a: rows in a table with the lifecycle columns that no registered lifecycle manages, even with
        no fact at all, are reported; an empty such table is not."""
        builtin = Book(book.engine, builtin_registry(), book.clock)
        assert (await verify(builtin)).ok, "an empty unmanaged table is nothing to check"
        forged = {**task_values(), "id": "forged", "status": "open", "version": 1, "updated_at": 0.0,
                  "status_reason_code": "task.open.created", "status_reason_summary": "", "last_fact_id": "x",
                  "chain_hash": "y"}
        await execute(book, sa.insert(tasks).values(forged))
        (finding,) = (await verify(builtin)).findings
        assert finding.kind == "unregistered_table" and tasks.name in finding.detail and "1 row(s)" in finding.detail

    async def test_facts_reordered_in_seq_are_a_finding(self, book: Book):
        """L12d: two consecutive facts of one entity given each other's seq (raw SQL, every hash untouched) read
        backwards in seq order (a tail, an export, a projection): verify reports ``seq_out_of_order`` on that
        entity and fact, and nothing else; the other entities stay clean."""
        await walked(book, "t1")
        await walked(book, "t2")
        facts = await history(book, "task", "t1")
        await swap_seq(book, facts[1].seq, facts[2].seq)
        report = await verify(book)
        assert [(f.kind, f.entity_id, f.fact_id) for f in report.findings] == [
            ("seq_out_of_order", "t1", facts[2].id)], report.findings
        assert f"seq {facts[1].seq}" in report.findings[0].detail and "version 2" in report.findings[0].detail
        await swap_seq(book, facts[1].seq, facts[2].seq)
        assert (await verify(book)).ok

    # -- purge -----------------------------------------------------------------------------------

    async def test_purge_deletes_the_row_and_appends_a_tombstone(self, book: Book):
        """L11: purge removes the row and records a tombstone (status NULL); the history verifies."""
        await walked(book, "t1")
        await transition(book, "task", "t1", "done", expected="working", reason=FINISHED, actor=SYSTEM)
        done_at = book.clock.now()
        book.clock.advance(60)
        outcome = await purge(book, "task", "t1", reason=PURGED, actor=OPERATOR)
        assert (outcome.kind, outcome.status, outcome.version) == ("applied", None, 6)
        assert await row(book, "t1") is None
        facts = await history(book, "task", "t1")
        tombstone = facts[-1]
        assert tombstone.id == outcome.fact_id and tombstone.is_tombstone
        assert (tombstone.previous_status, tombstone.status, tombstone.version) == ("done", None, 6)
        assert (tombstone.reason_code, tombstone.actor_type) == ("task.purged.cleanup", "operator")
        assert tombstone.prev_fact_id == facts[-2].id
        assert await replay(book, "task", "t1") is None
        assert (await as_of(book, "task", "t1", done_at))["status"] == "done"
        assert (await verify(book)).ok

    async def test_purge_of_a_live_status_needs_force(self, book: Book):
        """L11: a non-purgeable (non-terminal) entity is purged only with force=True, which is recorded."""
        await new_task(book, "t1")
        with pytest.raises(TransitionRejected) as excinfo:
            await purge(book, "task", "t1", reason=PURGED, actor=OPERATOR)
        assert excinfo.value.rule == "purge" and "force=True" in str(excinfo.value)
        assert (await row(book, "t1"))["status"] == "open" and await count_facts(book) == 1
        outcome = await purge(book, "task", "t1", reason=PURGED, actor=OPERATOR, force=True)
        assert outcome.applied
        tombstone = (await history(book, "task", "t1"))[-1]
        assert tombstone.is_tombstone and tombstone.metadata == {"forced": True}
        assert (await verify(book)).ok

    async def test_purge_compare_and_set_and_refusals(self, book: Book):
        """L3 / L4 / L11: purge honours ``expected``, needs a declared reason and an existing row."""
        await new_task(book, "t1")
        await transition(book, "task", "t1", "rejected", expected="open", reason=REFUSED, actor=SYSTEM)
        with pytest.raises(TransitionConflict) as lost:
            await purge(book, "task", "t1", reason=PURGED, actor=OPERATOR, expected="done")
        assert (lost.value.expected, lost.value.actual, lost.value.target) == (("done",), "rejected", None)
        conflict = await purge(book, "task", "t1", reason=PURGED, actor=OPERATOR, expected="done", on_conflict="return")
        assert conflict.kind == "conflict" and conflict.status == "rejected"
        with pytest.raises(TransitionRejected):
            await purge(book, "task", "t1", reason=Reason("task.purged.because"), actor=OPERATOR)
        assert (await row(book, "t1"))["status"] == "rejected" and await count_facts(book) == 2
        with pytest.raises(EntityNotFound):
            await purge(book, "task", "ghost", reason=PURGED, actor=OPERATOR)
        assert (await purge(book, "task", "t1", reason=PURGED, actor=OPERATOR, expected="rejected")).applied

    async def test_row_back_after_its_tombstone(self, book: Book):
        """L12: a row re-inserted behind the engine after a purge is reported as purged_row_present."""
        await new_task(book, "t1")
        await transition(book, "task", "t1", "rejected", expected="open", reason=REFUSED, actor=SYSTEM)
        saved = await row(book, "t1")
        await purge(book, "task", "t1", reason=PURGED, actor=OPERATOR)
        await execute(book, sa.insert(tasks).values(saved))
        report = await verify(book)
        assert [(f.kind, f.entity_id) for f in report.findings] == [("purged_row_present", "t1")]

    # -- how verify reads: the screen and the worker processes ------------------------------------

    async def test_histories_the_engine_writes_pass_the_screen(self, book: Book):
        """L12: verify's fast screen passes every entity the engine wrote (creates, transitions, batches,
        JSON values, purges), so only damage reaches the full check."""
        await walked(book, "t1")
        await new_task(book, "t2", labels={"nested": [1, 2.5, None, "é\n"]}, owner="zoë", score=None)
        await transition(book, "task", "t2", "rejected", expected="open", reason=REFUSED, actor=SYSTEM)
        await purge(book, "task", "t2", reason=PURGED, actor=OPERATOR)
        await create_many(book, "task", [NewEntity(task_values(f"batch {n}"), "open", CREATED, SYSTEM)
                                         for n in range(3)])
        ids = [r.id for r in await all_tasks(book) if r.title.startswith("batch")]
        await apply_many(book, [Command("task", i, "working", STARTED, SYSTEM, ("open",), patch={"attempt": 1})
                                for i in ids])
        suspects = []
        entities, facts, found = await sweep(book, list(book.registry), lambda lc, screen, s: suspects.extend(s) or [])
        assert (entities, facts, found) == (5, 13, []) and suspects == []

    async def test_json_stored_in_another_spelling_is_not_damage(self, book: Book):
        """L12: the screen hashes stored JSON text; text with the same value in another spelling fails it,
        and the full check (on decoded values) then decides: nothing was changed."""
        await walked(book, "t1")
        first = (await history(book, "task", "t1"))[0]
        await execute(book, sa.update(facts_table).where(facts_table.c.id == first.id)
                      .values(metadata=sa.text("'{ \"source\" : \"suite\" }'")))
        await execute(book, sa.update(tasks).where(tasks.c.id == "t1").values(labels=sa.text("'[ \"docs\" ]'")))
        suspects = []
        await sweep(book, [book.policy("task")], lambda lc, screen, s: suspects.extend(s) or [])
        assert [s[0] for s in suspects] == ["t1"]
        assert (await verify(book)).ok

    async def test_every_way_of_reading_finds_the_same(self, book: Book, monkeypatch, caplog):
        """L12: verify reports the same, in the same order, however it reads: in one range or many, in
        this process or in worker processes (SQLite files), or inside the caller's transaction."""
        await damaged(book)
        whole = await verify(book, processes=0)
        kinds = {f.kind for f in whole.findings}
        assert kinds == {"row_mismatch", "hash_mismatch", "broken_chain", "version_gap", "missing_row",
                         "forbidden_edge", "purged_row_present", "row_without_facts", "edge_not_in_current_policy",
                         "seq_out_of_order"}
        async with book.begin() as tx:
            assert (await verify(tx, processes=2)).to_json() == whole.to_json()
        monkeypatch.setattr(sweep_module, "CHUNK_FACTS", 3)
        seen: list[tuple[int, int]] = []
        with caplog.at_level(logging.WARNING, logger="statebook.lifecycle"):
            spread = await verify(book, processes=2, progress=lambda done, total: seen.append((done, total)))
            assert (await verify(book, processes=0)).to_json() == whole.to_json()
        assert not caplog.records, "a worker process failed and this process took over"
        assert spread.to_json() == whole.to_json()
        assert seen[-1] == (spread.facts, spread.facts)

    async def test_a_file_it_cannot_open_again_is_read_on_the_books_connection(self, book: Book, monkeypatch, caplog):
        """L12: when verify cannot open a SQLite file on a connection of its own, it reads on the book's."""
        await damaged(book)
        expected = (await verify(book, processes=0)).to_json()

        def refuse(*args):
            raise sqlite3.OperationalError("unable to open database file")

        monkeypatch.setattr(sqlite_screen, "screen_file", refuse)
        with caplog.at_level(logging.WARNING, logger="statebook.lifecycle"):
            assert (await verify(book, processes=0)).to_json() == expected
        assert ("cannot read" in caplog.text) == (book.dialect == "sqlite")

    async def test_verify_in_a_transaction_sees_its_own_writes(self, book: Book):
        """L12: given a book bound to a transaction, verify reads inside it (uncommitted writes included)."""
        await walked(book, "t1")

        class Undo(Exception):
            pass

        with pytest.raises(Undo):
            async with book.begin() as tx:
                await tx.conn.execute(sa.update(tasks).where(tasks.c.id == "t1").values(attempt=7))
                report = await verify(tx, processes=2)
                assert [(f.kind, f.entity_id) for f in report.findings] == [("row_mismatch", "t1")]
                raise Undo
        assert (await verify(book)).ok
