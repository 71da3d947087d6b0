"""L17: the storage port's size and shape, read from lifecycle/store.py itself (no database).

A new backend reads one page, the module docstring, to know what to write: the write port has at most ten
members, each named there on a line of its own; verify's and audit's reads are a protocol of their own; a
backend that lacks a member of either is refused when it registers, naming what it lacks.
"""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from statebook.adapters.postgres import PostgresStore
from statebook.adapters.sqlite import SQLiteStore
from statebook.lifecycle import store
from statebook.lifecycle.queries import ids_in, lock_rows
from statebook.lifecycle.store import PROTOCOLS, Reads, Store, Upkeep, members, missing, register_backend


def test_the_write_port_has_at_most_ten_members_each_on_a_line_of_the_docstring():
    names = members(Store)
    assert 0 < len(names) <= 10, names
    doc = store.__doc__ or ""
    for name in names:
        assert re.search(rf"^- ``{name}``: \S", doc, re.MULTILINE), f"Store.{name} has no line of its own in the docstring"


def test_the_reads_and_the_upkeep_are_protocols_of_their_own_named_in_the_docstring():
    doc = store.__doc__ or ""
    write, reads, upkeep = set(members(Store)), set(members(Reads)), set(members(Upkeep))
    assert reads and upkeep
    assert not write & reads and not write & upkeep and not reads & upkeep
    assert {"snapshot", "lenient", "undecodable", "batches", "in_id_order", "file_screen", "tail_query",
            "settle"} <= reads
    for name in reads | upkeep:
        assert f"``{name}``" in doc, f"{name} is not named in lifecycle/store.py's docstring"


def test_query_building_is_no_port_member():
    every = {m for p in PROTOCOLS for m in members(p)}
    assert not every & {"lock_rows", "ids_in", "ids_value", "dialect", "engine"}, every


@pytest.mark.parametrize("backend", [SQLiteStore, PostgresStore])
def test_each_backend_implements_every_member(backend: type):
    assert missing(backend) == []


def test_a_backend_that_lacks_a_member_is_refused_naming_it():
    class Lacking:
        def unit(self) -> None: ...

    lacking = missing(Lacking)
    assert "Store.insert" in lacking and "Reads.settle" in lacking and "Upkeep.notify" in lacking
    assert "Store.unit" not in lacking
    with pytest.raises(TypeError, match=r"Lacking is no statebook backend: it lacks Store\.reader, .*Reads\.settle"):
        register_backend("nothing-at-all", Lacking)  # type: ignore[arg-type]


def test_ids_in_is_one_statement_shape_per_dialect_and_lock_rows_nothing_on_sqlite():
    """ids_in compiles to SQLite's ``json_each`` and PostgreSQL's ``= ANY`` of one array, never an IN list
    that grows with the ids; SQLite has no row locks, so a locked query compiles as the plain one."""
    t = sa.table("things", sa.column("id"))
    query = sa.select(t.c.id).where(ids_in(t.c.id, "b_ids"))
    assert "json_each(?)" in str(query.compile(dialect=sqlite.dialect()))
    assert "= ANY (%(b_ids)s::TEXT[])" in str(query.compile(dialect=postgresql.dialect()))
    plain = str(query.compile(dialect=sqlite.dialect()))
    assert str(lock_rows(query, "wait").compile(dialect=sqlite.dialect())) == plain
    assert str(lock_rows(query, "skip_locked").compile(dialect=postgresql.dialect())).endswith("FOR UPDATE SKIP LOCKED")
    assert lock_rows(query, None) is query
    assert "IN (__[POSTCOMPILE_b_ids])" in str(query)  # no backend's form: SQLAlchemy's expanding IN
