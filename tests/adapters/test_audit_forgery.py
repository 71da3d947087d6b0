"""The forgery matrix (specs/audit.md A1-A6): each forgery, written with plain SQL by someone who knows the
hashing but not the chain key, against verify plain, with a checkpoint, with the keyed chain, and both.

Every cell is asserted, the "not detected" ones too: they say what the plain check cannot see, so a change
that makes one detected is a change of the spec.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from conformance.lifecycle.support import SYSTEM, FINISHED, new_task, prepare, start, task_registry

from statebook.adapters.db import connect, open_book, reset_schema
from statebook.lifecycle import Book, FakeClock, transition, verify
from statebook.lifecycle.chain import ChainKeyMismatch, ChainKeyRequired, checkpoint, key_chain
from statebook.lifecycle.chainkey import ChainKey
from statebook.lifecycle.facts import Fact, fact_hash, facts_table, stored_columns

KEY = ChainKey(b"k" * 32)
OTHER = ChainKey(b"o" * 32)
MODES = ("plain", "checkpoint", "keyed", "keyed+checkpoint")


@pytest.fixture
async def engine(db_url):
    engine = connect(db_url)
    await prepare(engine, FakeClock())
    try:
        yield engine
    finally:
        await reset_schema(engine)  # the shared PostgreSQL database is not left keyed: writers would be refused
        await engine.dispose()


async def seeded(engine: Any, mode: str) -> tuple[Book, dict[str, Any] | None]:
    """Three tasks (a1, victim, z9) with two facts each; keyed modes key the chain first; checkpoint modes
    take a checkpoint of that history."""
    book = Book(engine, task_registry(), FakeClock())
    if "keyed" in mode:
        book = book.with_chain_key(KEY)
        await key_chain(book)
    for entity_id in ("a1", "victim", "z9"):
        await new_task(book, entity_id)
        await start(book, entity_id)
    body = await checkpoint(book) if "checkpoint" in mode else None
    return book, body


async def facts_of(book: Book, entity_id: str) -> list[Fact]:
    t = facts_table
    async with book.read() as conn:
        rows = (await conn.execute(sa.select(*stored_columns(t)).where(t.c.entity_id == entity_id)
                                   .order_by(t.c.version))).fetchall()
    return [Fact.from_row(r) for r in rows]


async def sql(book: Book, statement: str, **params: Any) -> None:
    async with book.engine.begin() as conn:
        await conn.execute(sa.text(statement), params)


async def rehash(book: Book, entity_id: str, facts: list[Fact], *, from_version: int = 1) -> None:
    """What a forger does: recompute every hash (plain SHA-256, the published definition) from ``from_version``
    on, write them with plain SQL, and point the row at the new head."""
    prev_hash = ""
    for f in facts:
        content = f.content()
        if f.version >= from_version:
            new = fact_hash(content, prev_hash)
            await sql(book, "UPDATE status_transitions SET prev_hash = :p, hash = :h WHERE seq = :s",
                      p=prev_hash, h=new, s=f.seq)
            prev_hash = new
        else:
            prev_hash = f.hash
    last = facts[-1]
    await sql(book, "UPDATE conformance_tasks SET chain_hash = :h, version = :v, status = :st, last_fact_id = :id, "
              "status_reason_code = :rc, status_reason_summary = :rs, updated_at = :at WHERE id = :e",
              h=prev_hash, v=last.version, st=last.status, id=last.id, rc=last.reason_code, rs=last.reason_summary,
              at=last.at, e=entity_id)


async def field_edit(book: Book) -> None:
    """A1: a fact's field edited, nothing re-hashed."""
    await sql(book, "UPDATE status_transitions SET reason_summary = 'nothing to see' WHERE entity_id = 'victim' "
              "AND version = 1")


async def forged_rehashed(book: Book) -> None:
    """A2: a fact's content changed and its chain (and the row) re-hashed to match."""
    await sql(book, "UPDATE status_transitions SET actor_id = 'mallory' WHERE entity_id = 'victim' AND version = 2")
    await rehash(book, "victim", await facts_of(book, "victim"))


async def cut_tail(book: Book) -> None:
    """A3: the last fact deleted and the row rewritten to the fact before it."""
    facts = await facts_of(book, "victim")
    await sql(book, "DELETE FROM status_transitions WHERE seq = :s", s=facts[-1].seq)
    await sql(book, "UPDATE conformance_tasks SET attempt = 0 WHERE id = 'victim'")  # what the cut fact's patch had set
    await rehash(book, "victim", facts[:-1], from_version=99)


async def erased(book: Book) -> None:
    """A4: an entity erased completely: its facts and its row."""
    await sql(book, "DELETE FROM status_transitions WHERE entity_id = 'victim'")
    await sql(book, "DELETE FROM conformance_tasks WHERE id = 'victim'")


async def inserted(book: Book) -> None:
    """A5: a fact inserted mid-chain (open -> working at version 2), its successor moved up to version 3 (now
    working -> working) and everything re-hashed."""
    facts = await facts_of(book, "victim")
    first, second = facts
    await sql(book, "UPDATE status_transitions SET version = 3, prev_fact_id = 'forged', previous_status = 'working' "
              "WHERE seq = :s", s=second.seq)
    values = {**second.content(), "id": "forged", "prev_fact_id": first.id, "version": 2, "patch": {},
              "reason_summary": "backdated", "idempotency_key": None, "command_digest": None,
              "prev_hash": first.hash, "hash": "rehashed below"}
    async with book.engine.begin() as conn:
        await conn.execute(sa.insert(facts_table).values(**values))
        # The inserted fact took the next seq, after its successor's: move the successor after it (L12d).
        top = (await conn.execute(sa.select(sa.func.max(facts_table.c.seq)))).scalar()
        await conn.execute(sa.update(facts_table).where(facts_table.c.seq == second.seq).values(seq=top + 1))
    await rehash(book, "victim", await facts_of(book, "victim"))


async def appended(book: Book) -> None:
    """A6: a forged fact appended at the tail (working -> done), plain-hashed, the row moved along — after any checkpoint."""
    facts = await facts_of(book, "victim")
    last = facts[-1]
    content = {**last.content(), "id": "forged", "prev_fact_id": last.id, "previous_status": "working",
               "status": "done", "version": last.version + 1, "reason_code": FINISHED.code,
               "reason_summary": FINISHED.summary, "evidence_refs": [], "patch": {}, "metadata": {},
               "idempotency_key": None, "command_digest": None, "actor_type": SYSTEM.type, "actor_id": SYSTEM.id}
    async with book.engine.begin() as conn:
        await conn.execute(sa.insert(facts_table).values(**content, prev_hash=last.hash,
                                                          hash=fact_hash(content, last.hash)))
    await rehash(book, "victim", await facts_of(book, "victim"), from_version=99)


async def reordered(book: Book) -> None:
    """L12d: the seq of two consecutive facts swapped (hashes untouched): read in seq order the history runs
    backwards."""
    first, second = await facts_of(book, "victim")
    for old, new in ((first.seq, -1), (second.seq, first.seq), (-1, second.seq)):
        await sql(book, "UPDATE status_transitions SET seq = :new WHERE seq = :old", new=new, old=old)


FORGERIES = {
    "field_edit": (field_edit, {"plain": True, "checkpoint": True, "keyed": True, "keyed+checkpoint": True}),
    "forged_rehashed": (forged_rehashed, {"plain": False, "checkpoint": True, "keyed": True, "keyed+checkpoint": True}),
    "cut_tail": (cut_tail, {"plain": False, "checkpoint": True, "keyed": False, "keyed+checkpoint": True}),
    "erased": (erased, {"plain": False, "checkpoint": True, "keyed": False, "keyed+checkpoint": True}),
    "inserted": (inserted, {"plain": False, "checkpoint": True, "keyed": True, "keyed+checkpoint": True}),
    "appended": (appended, {"plain": False, "checkpoint": False, "keyed": True, "keyed+checkpoint": True}),
    "reordered": (reordered, {"plain": True, "checkpoint": True, "keyed": True, "keyed+checkpoint": True}),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("forgery", list(FORGERIES))
async def test_forgery_matrix(engine, forgery: str, mode: str):
    """Each forgery under each way of verifying: detected exactly where the matrix in specs/audit.md says."""
    book, body = await seeded(engine, mode)
    clean = await verify(book, checkpoint=body)
    assert clean.ok, clean.findings
    forge, expected = FORGERIES[forgery]
    await forge(book)
    report = await verify(book, checkpoint=body)
    assert (not report.ok) is expected[mode], (forgery, mode, report.findings)
    if expected[mode]:
        assert {f.entity_id for f in report.findings} <= {"victim", ""}, report.findings


async def test_growth_after_a_checkpoint_verifies(engine):
    """A checkpoint allows append-only growth: new facts and new entities written after it verify."""
    book, body = await seeded(engine, "keyed+checkpoint")
    await transition(book, "task", "victim", "done", expected="working", reason=FINISHED, actor=SYSTEM)
    await new_task(book, "later")
    report = await verify(book, checkpoint=body)
    assert report.ok, report.findings


async def test_a_checkpoint_names_what_was_cut_or_erased(engine):
    """Truncation and erasure are named as such, on the entity."""
    book, body = await seeded(engine, "checkpoint")
    await cut_tail(book)
    kinds = {(f.kind, f.entity_id) for f in (await verify(book, checkpoint=body)).findings}
    assert ("truncated", "victim") in kinds
    await erased(book)
    kinds = {(f.kind, f.entity_id) for f in (await verify(book, checkpoint=body)).findings}
    assert ("erased", "victim") in kinds


async def test_keyed_facts_need_the_key_and_a_downgrade_is_found(engine):
    """A plain fact after the switch-over is a finding; so is a moved or deleted switch-over record, a wrong key
    (one clear finding), and writing with another key. Without the key verify passes with a note."""
    book, _ = await seeded(engine, "keyed")
    plain = Book(engine, task_registry(), FakeClock())
    report = await verify(plain)
    assert report.ok and report.notes and KEY.secret.decode() not in str(report.to_json())
    wrong = await verify(book.with_chain_key(OTHER))
    assert [f.kind for f in wrong.findings] == ["wrong_chain_key"] and OTHER.id in wrong.findings[0].detail
    with pytest.raises(ChainKeyMismatch):
        await key_chain(book.with_chain_key(OTHER))
    await sql(book, "UPDATE statebook_chain SET keyed_after = keyed_after + 100")
    assert [f.kind for f in (await verify(book)).findings] == ["switch_forged"]
    await sql(book, "DELETE FROM statebook_chain")
    assert [f.kind for f in (await verify(book)).findings] == ["chain_not_keyed"]


async def test_writing_with_another_key_is_found(engine):
    """Facts written by a book with another key fail the keyed check, and the finding says so."""
    book, _ = await seeded(engine, "keyed")
    await transition(book.with_chain_key(OTHER), "task", "victim", "done", expected="working", reason=FINISHED,
                     actor=SYSTEM)
    report = await verify(book)
    assert [f.kind for f in report.findings] == ["hash_mismatch"]
    assert "another key" in report.findings[0].detail


async def test_facts_before_the_switch_over_are_pinned(engine):
    """A plain fact before the switch-over re-hashed (it has no keyed successor) changes the recorded root."""
    book = Book(engine, task_registry(), FakeClock())
    await new_task(book, "old")
    keyed = book.with_chain_key(KEY)
    await key_chain(keyed)
    await new_task(keyed, "new")
    assert (await verify(keyed)).ok
    await sql(book, "UPDATE status_transitions SET reason_summary = 'rewritten' WHERE entity_id = 'old'")
    await rehash(book, "old", await facts_of(book, "old"))
    assert (await verify(book)).ok  # the plain check cannot see it
    assert [f.kind for f in (await verify(keyed)).findings] == ["switch_root_mismatch"]


async def test_a_book_without_the_chain_key_writes_nothing_to_a_keyed_chain(engine, db_url):
    """A1 / C15: once the chain is keyed, no book without its key writes a fact: open_book as a writer (create)
    refuses at once, naming how to give the key; a book opened to read refuses the write it attempts; another
    key is refused likewise. Nothing is written; with the key the write verifies."""
    book, _ = await seeded(engine, "keyed")
    facts = len(await facts_of(book, "victim"))
    with pytest.raises(ChainKeyRequired, match="STATEBOOK_AUDIT__CHAIN_KEY__FILE") as refused:
        await open_book(db_url, registry=task_registry())
    assert KEY.id in str(refused.value) and KEY.secret.decode() not in str(refused.value)
    with pytest.raises(ChainKeyMismatch, match=OTHER.id):
        await open_book(db_url, registry=task_registry(), chain_key=OTHER)
    for key, error in ((None, ChainKeyRequired), (OTHER, ChainKeyMismatch)):
        reader = await open_book(db_url, registry=task_registry(), create=False, chain_key=key)
        try:
            assert reader.keyed_with == KEY.id
            with pytest.raises(error):
                await transition(reader, "task", "victim", "done", expected="working", reason=FINISHED, actor=SYSTEM)
            with pytest.raises(error):
                await new_task(reader, "another")
        finally:
            await reader.engine.dispose()
    assert len(await facts_of(book, "victim")) == facts and await facts_of(book, "another") == []
    writer = await open_book(db_url, registry=task_registry(), chain_key=KEY)
    try:
        await transition(writer, "task", "victim", "done", expected="working", reason=FINISHED, actor=SYSTEM)
        assert (await verify(writer)).ok
    finally:
        await writer.engine.dispose()
