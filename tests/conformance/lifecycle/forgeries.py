"""Forgeries written the way an attacker with write access would: plain SQL, the published (plain SHA-256) hashing,
no chain key, no signing key. Each works on the task ``victim`` (two facts: created, started), which the cases
seed; specs/audit.md's tables (A4, A6) say which anchor finds each.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Book
from statebook.lifecycle.facts import Fact, fact_hash, facts_table, stored_columns

from .support import FINISHED, SYSTEM


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
