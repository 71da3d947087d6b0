"""What ``verify`` reads, as one comparable value: lets a state machine skip a verify that cannot find anything new.

A machine that verifies after every step spends most of its time re-verifying a database its last step did not
change (a refused command, a read, a clock jump). ``book_state`` reads every row of every table the book's
registry manages and the facts' count and highest ``seq``; when two reads are equal, verify's answer is too
(facts are only ever inserted, or deleted by a purge, which changes the count; never updated in place).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Book
from statebook.lifecycle.facts import facts_table


async def book_state(book: Book) -> tuple[Any, ...]:
    async with book.read() as conn:
        rows = []
        for lc in book.registry:
            table = lc.table
            rows.append(tuple(tuple(r) for r in await conn.execute(sa.select(table).order_by(table.c.id))))
        mark = tuple((await conn.execute(sa.select(sa.func.count(), sa.func.max(facts_table.c.seq)))).one())
    return (*rows, mark)
