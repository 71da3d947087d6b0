"""The forgery matrix (specs/audit.md A1-A6): each forgery, written with plain SQL by someone who knows the
hashing but not the chain key, against verify plain, with a checkpoint, with the keyed chain, and both.

Every cell is asserted, the "not detected" ones too: they say what the plain check cannot see, so a change
that makes one detected is a change of the spec.
"""

from __future__ import annotations

from typing import Any

import pytest
from conformance.lifecycle.forgeries import (
    appended,
    cut_tail,
    erased,
    facts_of,
    field_edit,
    forged_rehashed,
    inserted,
    rehash,
    reordered,
    sql,
)
from conformance.lifecycle.support import SYSTEM, FINISHED, new_task, prepare, start, task_registry

from statebook.adapters.db import connect, open_book, reset_schema
from statebook.lifecycle import Book, FakeClock, transition, verify
from statebook.lifecycle.chain import ChainKeyMismatch, ChainKeyRequired, checkpoint, key_chain
from statebook.lifecycle.chainkey import ChainKey

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
