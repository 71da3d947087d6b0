"""L1 / specs/lifecycle.md "Statuses are declared once": the status CHECK and the partial-index
predicates are built from the sealed registry, and a database that refuses a declared status is
named before anything moves."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.schema import CreateIndex, CreateTable

from statebook.adapters.db import open_book
from statebook.adapters.registry import builtin_registry
from statebook.lifecycle import Actor, Lifecycle, Reason, Registry, create, edges, managed_table, transition
from statebook.lifecycle.errors import PolicyError
from statebook.lifecycle.errors import SchemaMismatch
from statebook.lifecycle.schema import schema_for, status_index, status_in
from statebook.outbox import DISPATCH, dispatch_outbox
from statebook.outbox.dispatch.attempts import ACTIVE
from statebook.outbox.dispatch.policy import DUE_STATUSES

OPERATOR = Actor("operator", "alice")


def with_cancelled() -> Registry:
    """The built-in registry with a terminal ``cancelled`` dispatch status only an operator reaches."""
    registry = builtin_registry(seal=False)
    registry.extend(
        "dispatch",
        statuses=["cancelled"],
        terminal=["cancelled"],
        edges=edges("pending", "cancelled", actors="operator"),
        reasons={"dispatch.cancelled.operator"},
    )
    return registry.seal()


def ddl(meta: sa.MetaData, table: str, dialect: object) -> str:
    t = meta.tables[table]
    parts = [str(CreateTable(t).compile(dialect=dialect))]
    parts += [str(CreateIndex(i).compile(dialect=dialect)) for i in sorted(t.indexes, key=lambda i: i.name or "")]
    return "\n".join(parts)


# -- the DDL follows the registry --------------------------------------------------------------


def test_an_extended_builtin_registers_and_its_check_admits_the_new_status():
    """L1: a status added to a built-in lifecycle passes registration (once: "CHECK admits only") and the
    schema built for that registry admits it, in the CHECK and in the settled (terminal) index."""
    registry = with_cancelled()
    assert "cancelled" in registry.get("dispatch").statuses
    for dialect in (sqlite.dialect(), postgresql.dialect()):
        text = ddl(schema_for(registry), "dispatch_outbox", dialect)
        assert (
            "CONSTRAINT ck_dispatch_outbox_status CHECK (status IN ('pending', 'delivering', 'delivered', "
            "'acked', 'dead_letter', 'expired', 'cancelled'))"
        ) in text
        assert "idx_dispatch_outbox_settled ON dispatch_outbox (status, updated_at) WHERE status IN " \
               "('delivered', 'acked', 'dead_letter', 'expired', 'cancelled')" in text
        assert "idx_dispatch_outbox_due ON dispatch_outbox (next_attempt_at, created_at, id) WHERE status IN " \
               "('pending', 'delivering')" in text


def test_the_builtin_schema_is_what_it_was():
    """L1: existing databases keep matching: the built-in registry gives the CHECK and predicates of before."""
    text = ddl(schema_for(builtin_registry()), "dispatch_outbox", postgresql.dialect())
    assert ("CHECK (status IN ('pending', 'delivering', 'delivered', 'acked', 'dead_letter', 'expired'))") in text
    assert "WHERE status IN ('delivered', 'acked', 'dead_letter', 'expired')" in text
    runs = ddl(schema_for(builtin_registry()), "schedule_runs", postgresql.dialect())
    assert "CONSTRAINT ck_schedule_runs_status CHECK (status IN ('queued', 'waiting_dependency', 'running'" in runs


def test_module_tables_are_untouched_by_schema_for():
    """L1: queries use the module-level tables; only the DDL copy varies with the registry."""
    before = {c.name for c in dispatch_outbox.constraints}
    schema_for(with_cancelled())
    assert {c.name for c in dispatch_outbox.constraints} == before
    assert "ck_dispatch_outbox_status" not in before, "the table itself does not list statuses"


def test_schema_for_wants_a_sealed_registry():
    """L1: the schema is built for the lifecycles that will run, so an unsealed registry is refused, saying so."""
    with pytest.raises(PolicyError, match=r"seal\(\)"):
        schema_for(builtin_registry(seal=False))


def test_the_due_scan_asks_the_policy():
    """L1: built-in code derives its status literals from the lifecycle, not from text of its own."""
    assert DUE_STATUSES == DISPATCH.active == ("pending", "delivering")
    assert ACTIVE.text == "dispatch_outbox.status IN ('pending', 'delivering')"
    assert status_in("status", ["it's"]) == "status IN ('it''s')"


APP_META = sa.MetaData()
TICKETS = managed_table(
    "ext_tickets",
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("title", sa.Text, nullable=False),
    status_index("idx_ext_tickets_open", "id", where="active"),
    meta=APP_META,
)


def ticket(*extra: str) -> Lifecycle:
    return Lifecycle(
        entity_type="ext_ticket",
        table=TICKETS,
        statuses=("open", "closed", *extra),
        initial={"open"},
        terminal={"closed", *extra},
        edges=(*edges("open", "closed"), *(e for s in extra for e in edges("open", s))),
        reason_prefixes={"ext_ticket"},
        reasons={"ext_ticket.open.created", "ext_ticket.closed.done", *(f"ext_ticket.{s}.done" for s in extra)},
    )


def test_an_application_table_follows_its_lifecycle():
    """L1: an application's table gets its CHECK and index predicate from its lifecycle, extended or not."""
    registry = builtin_registry(seal=False)
    registry.register(ticket("wontfix"))
    text = ddl(schema_for(registry.seal()), "ext_tickets", sqlite.dialect())
    assert "CHECK (status IN ('open', 'closed', 'wontfix'))" in text
    assert "idx_ext_tickets_open ON ext_tickets (id) WHERE status IN ('open')" in text


def test_the_deprecated_statuses_argument_must_agree():
    """L1: managed_table(statuses=...) still works, but a lifecycle that disagrees with it is refused by name."""
    meta = sa.MetaData()
    with pytest.warns(DeprecationWarning, match="drop statuses="):
        table = managed_table("ext_old", sa.Column("id", sa.String(32), primary_key=True),
                              statuses=("open", "closed"), meta=meta)
    agreeing = Lifecycle(entity_type="ext_old", table=table, statuses=("open", "closed"), initial={"open"},
                         terminal={"closed"}, edges=edges("open", "closed"), reason_prefixes={"ext_old"})
    Registry([agreeing])
    with pytest.raises(PolicyError) as excinfo:
        Registry([agreeing.extend(statuses=["lost"], terminal=["lost"], edges=edges("open", "lost"))])
    message = str(excinfo.value)
    assert "'ext_old'" in message and "lost" in message and "drop statuses=" in message


# -- against a database -------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def fresh_database(backend: str, db_url: str, tmp_path) -> AsyncIterator[str]:
    """An empty database of the backend (PostgreSQL: a new database on the test cluster)."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    from sqlalchemy.ext.asyncio import create_async_engine

    from statebook.adapters.db import normalize_url

    name = f"sb_ext_{uuid.uuid4().hex[:10]}"
    admin = create_async_engine(normalize_url(db_url), isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.exec_driver_sql(f"CREATE DATABASE {name}")
        url = sa.engine.make_url(normalize_url(db_url)).set(database=name).render_as_string(hide_password=False)
        try:
            yield url
        finally:
            async with admin.connect() as conn:
                await conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.dispose()


async def enqueue(book) -> str:
    now = book.clock.now()
    out = await create(
        book, "dispatch",
        values=dict(kind="k", deliver_to="x", payload={}, next_attempt_at=now, created_at=now),
        status="pending", reason=Reason("dispatch.pending.enqueued"), actor=Actor("system"),
    )
    return out.entity_id


async def test_a_status_added_to_dispatch_can_be_reached(backend, db_url, tmp_path):
    """L1: the schema created for an extended registry admits the new status: the move commits and verifies."""
    from statebook.lifecycle import verify

    async with fresh_database(backend, db_url, tmp_path) as url:
        book = await open_book(url, registry=with_cancelled())
        try:
            did = await enqueue(book)
            out = await transition(book, "dispatch", did, "cancelled", expected="pending",
                                   reason=Reason("dispatch.cancelled.operator"), actor=OPERATOR)
            assert out.status == "cancelled"
            assert (await verify(book)).ok
        finally:
            await book.engine.dispose()


@pytest.mark.parametrize("create_schema", [True, False], ids=["create", "open_only"])
async def test_an_existing_check_that_refuses_a_declared_status_is_named(backend, db_url, tmp_path, create_schema):
    """L1: a database built for the built-in dispatch is refused, clearly, for a registry that adds a status —
    never a raw IntegrityError at the first move."""
    async with fresh_database(backend, db_url, tmp_path) as url:
        book = await open_book(url)  # the built-in registry: CHECK without 'cancelled'
        await book.engine.dispose()
        with pytest.raises(SchemaMismatch) as excinfo:
            await open_book(url, registry=with_cancelled(), create=create_schema)
        message = str(excinfo.value)
        for fragment in ("'dispatch_outbox'", "'cancelled'", "'dispatch'", "ck_dispatch_outbox_status",
                         "Run the schema upgrade", "statebook --app MODULE:ATTR db upgrade"):
            assert fragment in message, f"{fragment!r} missing from {message!r}"
        book = await open_book(url)  # the registry it was built for still opens
        await book.engine.dispose()
        # the upgrade the message names migrates the constraint, on both backends
        from statebook.adapters.db import connect
        from statebook.adapters.migrations import upgrade

        engine = connect(url)
        async with engine.connect() as conn:
            await conn.run_sync(upgrade, with_cancelled())
        await engine.dispose()
        book = await open_book(url, registry=with_cancelled(), create=create_schema)
        try:
            did = await enqueue(book)
            out = await transition(book, "dispatch", did, "cancelled", expected="pending",
                                   reason=Reason("dispatch.cancelled.operator"), actor=OPERATOR)
            assert out.status == "cancelled"
        finally:
            await book.engine.dispose()


async def test_the_check_at_open_does_not_wait_for_a_writer(tmp_path):
    """L15: opening an existing SQLite file (create=False, as the CLI does) only reads, so a daemon holding
    the write lock does not delay it."""
    import asyncio
    import sqlite3

    url = f"sqlite:///{tmp_path / 'busy.db'}"
    book = await open_book(url)
    await book.engine.dispose()
    holder = sqlite3.connect(tmp_path / "busy.db", timeout=0.1, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        book = await asyncio.wait_for(open_book(url, create=False, must_exist=True), 2)
        await book.engine.dispose()
    finally:
        holder.execute("ROLLBACK")
        holder.close()


async def test_tables_outside_the_registry_keep_their_ddl_events(backend, db_url, tmp_path):
    """L1: only the registry's managed tables are built from copies: the facts table is created from its own
    Table, so its after_create DDL (PostgreSQL: the tx_id default the tail relies on, L13) still runs."""
    async with fresh_database(backend, db_url, tmp_path) as url:
        book = await open_book(url, registry=with_cancelled())
        try:
            async with book.engine.connect() as conn:
                if backend == "postgres":
                    default = (await conn.exec_driver_sql(
                        "SELECT column_default FROM information_schema.columns "
                        "WHERE table_name = 'status_transitions' AND column_name = 'tx_id'")).scalar()
                    assert default and "pg_current_xact_id" in default
                names = set(await conn.run_sync(lambda c: sa.inspect(c).get_table_names()))
            assert {"dispatch_outbox", "schedules", "schedule_runs", "status_transitions", "statebook_alembic_version"} <= names
        finally:
            await book.engine.dispose()


async def test_a_status_added_to_an_applications_lifecycle_is_named_at_open(backend, db_url, tmp_path):
    """L1: the application's case: its table was created for (open, closed); the lifecycle now adds 'wontfix'.
    Registration passes; opening the old database says what to migrate, instead of an IntegrityError at the
    first move into 'wontfix'."""
    def registry_with(*extra: str) -> Registry:
        registry = builtin_registry(seal=False)
        registry.register(ticket(*extra))
        return registry.seal()

    async with fresh_database(backend, db_url, tmp_path) as url:
        book = await open_book(url, registry=registry_with())
        await book.engine.dispose()
        with pytest.raises(SchemaMismatch) as excinfo:
            await open_book(url, registry=registry_with("wontfix"))
        message = str(excinfo.value)
        assert "'ext_tickets'" in message and "'wontfix'" in message and "'ext_ticket'" in message
        assert "CHECK (status IN ('open', 'closed', 'wontfix'))" in message


async def test_the_upgrade_of_the_message_migrates_a_sqlite_file_in_place(tmp_path):
    """L1: on SQLite the upgrade the message names rebuilds the table with the registry's CHECK: the file
    then opens with the extended registry, still verifies, and admits the new status."""
    from statebook.adapters.db import connect
    from statebook.adapters.migrations import upgrade
    from statebook.lifecycle import history, verify

    url = f"sqlite:///{tmp_path / 'old.db'}"
    book = await open_book(url)
    did = await enqueue(book)
    await book.engine.dispose()
    with pytest.raises(SchemaMismatch, match="db upgrade"):
        await open_book(url, registry=with_cancelled())
    engine = connect(url)
    async with engine.connect() as conn:
        await conn.run_sync(upgrade, with_cancelled())
    await engine.dispose()
    book = await open_book(url, registry=with_cancelled())
    try:
        assert (await verify(book)).ok
        await transition(book, "dispatch", did, "cancelled", expected="pending",
                         reason=Reason("dispatch.cancelled.operator"), actor=OPERATOR)
        assert [f.status for f in await history(book, "dispatch", did)] == ["pending", "cancelled"]
    finally:
        await book.engine.dispose()
