"""Schema migrations (specs/migrations.md): the fixtures of the previous schema upgrade and verify, every
command refuses a database it does not expect, extended lifecycles get their DDL through the upgrade."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

import pgcluster
from statebook.adapters.cli import app
from statebook.adapters.db import connect, normalize_url, open_book
from statebook.adapters.migrations import HEAD, VERSION_TABLE, check, read_stamp, upgrade
from statebook.adapters.registry import builtin_registry
from statebook.lifecycle import Actor, Reason, Registry, edges, transition, verify
from statebook.lifecycle.errors import SchemaMismatch
from statebook.lifecycle.schema import schema_for

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
STATEBOOK = str(Path(sys.executable).parent / "statebook")
OPERATOR = Actor("operator", "test")
COUNTED = ("dispatch_outbox", "notifications", "channel_attempts", "dedup_claims", "notification_responses",
           "schedules", "schedule_runs", "status_transitions", "statebook_chain")


def extended() -> Registry:
    """The built-in registry with a terminal ``cancelled`` dispatch (a new status, so the settled status
    index covers it) and a ``archived`` schedule (its table is referenced by schedule_runs' foreign key)."""
    registry = builtin_registry(seal=False)
    registry.extend("dispatch", statuses=["cancelled"], terminal=["cancelled"],
                    edges=edges("pending", "cancelled", actors="operator"), reasons={"dispatch.cancelled.operator"})
    registry.extend("schedule", statuses=["archived"], terminal=["archived"],
                    edges=edges("active", "archived", actors="operator"), reasons={"schedule.archived.operator"})
    return registry.seal()


@contextlib.asynccontextmanager
async def fresh_pg(pg_url: str) -> AsyncIterator[str]:
    """A new, empty database on the test cluster; dropped afterwards."""
    from sqlalchemy.ext.asyncio import create_async_engine

    name = f"sb_mig_{uuid.uuid4().hex[:10]}"
    admin = create_async_engine(normalize_url(pg_url), isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.exec_driver_sql(f"CREATE DATABASE {name}")
        url = sa.engine.make_url(normalize_url(pg_url)).set(database=name).render_as_string(hide_password=False)
        try:
            yield url
        finally:
            async with admin.connect() as conn:
                await conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.dispose()


def restore_pg_dump(url: str) -> None:
    bindir = pgcluster.find_pg_bin()
    plain = url.replace("postgresql+asyncpg", "postgresql")
    subprocess.run([str(bindir / "psql"), "-q", "-v", "ON_ERROR_STOP=1", "-f", str(FIXTURES / "schema_v2.pg.sql"),
                    plain], check=True, capture_output=True)


@contextlib.asynccontextmanager
async def previous_database(backend: str, tmp_path: Path, request) -> AsyncIterator[str]:
    """A database written by the previous statebook (the committed fixture), ready to be upgraded."""
    if backend == "sqlite":
        path = tmp_path / "v2.sqlite"
        shutil.copy(FIXTURES / "schema_v2.sqlite", path)
        yield f"sqlite:///{path}"
        return
    async with fresh_pg(request.getfixturevalue("pg_url")) as url:
        restore_pg_dump(url)
        yield url


async def counts(url: str) -> dict[str, int]:
    engine = connect(url)
    try:
        async with engine.connect() as conn:
            return {t: (await conn.execute(sa.text(f"SELECT count(*) FROM {t}"))).scalar() for t in COUNTED}
    finally:
        await engine.dispose()


async def run_upgrade(url: str, registry: Registry | None = None):  # type: ignore[no-untyped-def]
    engine = connect(url)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(upgrade, registry)
    finally:
        await engine.dispose()


async def run_check(url: str, registry: Registry | None = None):  # type: ignore[no-untyped-def]
    engine = connect(url)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(check, registry)
    finally:
        await engine.dispose()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``statebook ARGS`` in process (typer's runner), with no ``STATEBOOK_`` variable set. The command runs
    an event loop of its own, so it runs in a thread: an async test's loop is already running here."""
    unset: dict[str, str | None] = {k: None for k in os.environ if k.startswith("STATEBOOK_")}
    with ThreadPoolExecutor(1) as pool:
        result = pool.submit(CliRunner().invoke, app, list(args), env=unset).result()
    return subprocess.CompletedProcess(["statebook", *args], result.exit_code, result.stdout, result.stderr)


def cli_process(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``statebook ARGS`` as a process of its own in ``cwd``: for ``--app``, which imports the application's
    module from there (in this process the first test to import a ``myapp`` would fix it for the rest)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATEBOOK_")}
    return subprocess.run([STATEBOOK, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request) -> str:
    return request.param


def test_head_is_the_script_directorys_head():
    """M2: the constant open_book compares with is the last revision of the scripts."""
    from alembic.script import ScriptDirectory

    from statebook.adapters.migrations import HERE

    assert ScriptDirectory(str(HERE)).get_current_head() == HEAD


def test_the_open_path_imports_no_alembic():
    """M2: opening a book reads the version table without importing Alembic."""
    code = ("import sys, asyncio, tempfile, os\n"
            "from statebook.adapters.db import open_book\n"
            "async def go():\n"
            "    d = tempfile.mkdtemp(); b = await open_book(f'sqlite:///{d}/x.db'); await b.engine.dispose()\n"
            "    b = await open_book(f'sqlite:///{d}/x.db', create=False); await b.engine.dispose()\n"
            "asyncio.run(go())\n"
            "print('alembic' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


async def test_the_previous_schema_upgrades_and_verifies(backend, tmp_path, request):
    """M3, M4: a database of the previous version (the fixture) is adopted, upgraded, verified; no row is lost."""
    async with previous_database(backend, tmp_path, request) as url:
        before = await counts(url)
        assert before["status_transitions"] > 20 and before["schedule_runs"] >= 1
        report = await run_upgrade(url)
        assert report.before == "pre-migration v2" and report.applied[-1] == HEAD
        assert await counts(url) == before
        assert (await run_check(url)).drift == []
        book = await open_book(url, create=False)
        try:
            assert (await verify(book)).ok
            async with book.read() as conn:
                names = await conn.run_sync(lambda c: set(sa.inspect(c).get_table_names()))
            assert "statebook_schema" not in names and VERSION_TABLE in names
        finally:
            await book.engine.dispose()
        again = await run_upgrade(url)
        assert again.applied == [] and again.ddl == []


async def test_an_extended_registry_gets_its_ddl_through_the_upgrade(backend, tmp_path, request):
    """M6: new statuses on built-in tables (one referenced by foreign keys, one with status indexes) reach the
    CHECK and the index predicates; every row, its chain and the referencing rows survive."""
    async with previous_database(backend, tmp_path, request) as url:
        await run_upgrade(url)
        before = await counts(url)
        with pytest.raises(SchemaMismatch):
            await open_book(url, registry=extended(), create=False)
        drift = (await run_check(url, extended())).drift
        assert any("ck_schedules_status" in d for d in drift) and any("idx_dispatch_outbox_settled" in d for d in drift)
        report = await run_upgrade(url, extended())
        assert any("ck_dispatch_outbox_status" in line for line in report.ddl)
        assert any("ck_schedules_status" in line for line in report.ddl)
        assert await counts(url) == before
        assert (await run_check(url, extended())).drift == []
        book = await open_book(url, registry=extended(), create=False)
        try:
            assert (await verify(book)).ok
            async with book.read() as conn:
                sid = (await conn.execute(sa.text("SELECT id FROM schedules"))).scalar()
                did = (await conn.execute(sa.text("SELECT id FROM dispatch_outbox WHERE status = 'pending'"))).scalar()
            await transition(book, "schedule", sid, "archived", expected="active",
                             reason=Reason("schedule.archived.operator"), actor=OPERATOR)
            await transition(book, "dispatch", did, "cancelled", expected="pending",
                             reason=Reason("dispatch.cancelled.operator"), actor=OPERATOR)
            assert (await verify(book)).ok
        finally:
            await book.engine.dispose()


async def test_migrations_from_empty_and_create_all_give_the_same_schema(backend, tmp_path, request):
    """M5: the fast path (create_all + HEAD) and the revisions from an empty database build one schema."""
    async with contextlib.AsyncExitStack() as stack:
        if backend == "sqlite":
            migrated, created = f"sqlite:///{tmp_path / 'm.db'}", f"sqlite:///{tmp_path / 'c.db'}"
        else:
            migrated = await stack.enter_async_context(fresh_pg(request.getfixturevalue("pg_url")))
            created = await stack.enter_async_context(fresh_pg(request.getfixturevalue("pg_url")))
        await run_upgrade(migrated)
        book = await open_book(created)
        await book.engine.dispose()
        for url in (migrated, created):
            assert (await run_check(url)).drift == []  # compare_metadata against schema_for + registry DDL
        assert await shape(migrated) == await shape(created)


async def shape(url: str) -> dict[str, object]:
    """Tables, columns, indexes (with their predicates) and CHECKs as the database reports them."""
    from statebook.adapters.migrations.ddl import index_predicates

    def read(conn: sa.Connection) -> dict[str, object]:
        inspector = sa.inspect(conn)
        out: dict[str, object] = {}
        for table in sorted(inspector.get_table_names()):
            out[table] = {
                "columns": [(c["name"], str(c["type"]), c["nullable"], str(c.get("default"))) for c in inspector.get_columns(table)],
                "indexes": sorted(index_predicates(conn, table).items()),
                "checks": sorted((c.get("name") or "", c.get("sqltext") or "") for c in inspector.get_check_constraints(table)),
                "fks": sorted(str(fk) for fk in inspector.get_foreign_keys(table)),
            }
        return out

    engine = connect(url)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(read)
    finally:
        await engine.dispose()


async def test_db_check_finds_a_dropped_index(backend, tmp_path, request):
    """M7: an index dropped by hand is drift: ``db check`` exits 1 naming it and the command to run."""
    async with previous_database(backend, tmp_path, request) as url:
        await run_upgrade(url)
        assert cli("--db", url, "db", "check").returncode == 0
        engine = connect(url)
        async with engine.begin() as conn:
            await conn.exec_driver_sql("DROP INDEX idx_dispatch_outbox_created")
        await engine.dispose()
        out = cli("--db", url, "db", "check")
        assert out.returncode == 1, out.stdout + out.stderr
        assert "idx_dispatch_outbox_created" in out.stdout and "run: statebook db upgrade" in out.stdout
        found = json.loads(cli("--db", url, "db", "check", "--json").stdout)
        assert found["ok"] is False and any("idx_dispatch_outbox_created" in d for d in found["drift"])


async def test_concurrent_upgrades_on_postgres_serialize(pg_url):
    """M8: two hosts upgrading one database at once: the advisory lock puts one after the other; the second
    finds nothing to do, and the database is at head with no drift."""
    async with fresh_pg(pg_url) as url:
        restore_pg_dump(url)
        reports = await asyncio.gather(run_upgrade(url, extended()), run_upgrade(url, extended()))
        assert sorted(bool(r.applied) for r in reports) == [False, True]
        assert (await run_check(url, extended())).drift == []


test_concurrent_upgrades_on_postgres_serialize = pytest.mark.postgres(test_concurrent_upgrades_on_postgres_serialize)


# --- refusals, through the real CLI --------------------------------------------------------------------------


def snapshot(path: Path) -> bytes:
    return path.read_bytes()


def wal(path: Path) -> None:
    """Put the file in WAL mode first, as every statebook connection would: opening it then changes no byte."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA journal_mode=WAL")


def stamp_sqlite(path: Path, revision: str) -> None:
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute(f"UPDATE {VERSION_TABLE} SET version_num = ?", (revision,))


APP = '''
from statebook.adapters.registry import builtin_registry
from statebook.lifecycle import edges

registry = builtin_registry(seal=False)
registry.extend("dispatch", statuses=["cancelled"], terminal=["cancelled"],
                edges=edges("pending", "cancelled", actors="operator"), reasons={"dispatch.cancelled.operator"})
registry.seal()
'''


def refusal_case(tmp_path: Path, case: str) -> tuple[Path, list[str], str]:
    """The database file, the command and the expected fragment of the one-line refusal."""
    path = tmp_path / f"{case}.db"
    if case == "empty":
        path.touch()
        return path, ["dispatch", "ls"], "no statebook schema; run: statebook db upgrade"
    if case == "pre-migration":
        shutil.copy(FIXTURES / "schema_v2.sqlite", path)
        return path, ["verify"], "pre-migration schema (version 2)"
    shutil.copy(FIXTURES / "schema_v2.sqlite", path)
    asyncio.run(run_upgrade(f"sqlite:///{path}"))
    if case == "older":
        stamp_sqlite(path, "0001")
        return path, ["verify"], f"revision 0001, this statebook expects {HEAD}; run: statebook db upgrade"
    if case == "newer":
        stamp_sqlite(path, "9999")
        return path, ["dispatch", "ls"], f"newer than this statebook (expects {HEAD}); upgrade statebook"
    assert case == "check-mismatch"
    (tmp_path / "myapp.py").write_text(APP)
    return path, ["--app", "myapp:registry", "verify"], "statebook --app myapp:registry db upgrade"


@pytest.mark.parametrize("case", ["empty", "pre-migration", "older", "newer", "check-mismatch"])
def test_every_command_refuses_a_database_it_does_not_expect(tmp_path, case):
    """M1: one line naming what to run, exit 2, and not one byte of the file written."""
    path, args, expected = refusal_case(tmp_path, case)
    if path.stat().st_size:
        wal(path)
    before = snapshot(path)
    db = ["--db", f"sqlite:///{path}"]
    out = cli_process(*args[:2], *db, *args[2:], cwd=tmp_path) if args[0] == "--app" else cli(*db, *args)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], out.stderr
    assert "Traceback" not in out.stderr and "OperationalError" not in out.stderr
    if before:
        assert snapshot(path) == before
    else:  # an empty file: connecting puts it in WAL mode (a header), but no table is created
        with contextlib.closing(sqlite3.connect(path)) as db:
            assert db.execute("SELECT name FROM sqlite_master").fetchall() == []
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0


def test_db_current_and_history_name_where_the_database_stands(tmp_path):
    """M9: ``current`` says pre-migration v2, then the revision; ``history`` marks the current one."""
    path = tmp_path / "v2.db"
    shutil.copy(FIXTURES / "schema_v2.sqlite", path)
    db = ["--db", f"sqlite:///{path}"]
    assert cli(*db, "db", "current").stdout.startswith("pre-migration v2")
    up = cli(*db, "db", "upgrade")
    assert up.returncode == 0 and up.stdout.strip().endswith(f"now at {HEAD}")
    assert json.loads(cli(*db, "db", "current", "--json").stdout)["current"] == HEAD
    rows = json.loads(cli(*db, "db", "history", "--json").stdout)
    assert [r["revision"] for r in rows if r["current"]] == [HEAD] and rows[0]["revision"] == "0001"
    empty = tmp_path / "empty.db"
    empty.touch()
    assert cli("--db", f"sqlite:///{empty}", "db", "current").stdout.startswith("empty")


def test_pending_lists_what_upgrade_would_apply(tmp_path):
    """M3: a pre-migration database has 0002 and later pending (0001 is its schema, stamped); at head nothing is."""
    from statebook.adapters.migrations import pending

    path = tmp_path / "v2.db"
    shutil.copy(FIXTURES / "schema_v2.sqlite", path)
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.connect() as conn:
        assert pending(conn) == ["0002", "0003"]
        assert read_stamp(conn).describe() == "pre-migration v2"
    with engine.connect() as conn:
        upgrade(conn)
    with engine.connect() as conn:
        assert pending(conn) == []
    engine.dispose()


def test_schema_for_is_not_imported_by_the_revisions():
    """M2: the revisions are frozen code: they import no live metadata of statebook."""
    from statebook.adapters.migrations import HERE

    for script in (HERE / "versions").glob("0*.py"):
        text = script.read_text()
        assert "import statebook" not in text and "from statebook" not in text, script.name
    assert schema_for  # the live schema is what the comparison uses, not the revisions


async def test_a_pre_migration_schema_other_than_2_is_refused_by_open_and_upgrade(tmp_path):
    """M3: only version 2 is revision 0001's schema; version 1 is refused by both, nothing changed."""
    from statebook.adapters.errors import ConfigError
    from statebook.adapters.migrations import UpgradeRefused

    path = tmp_path / "v1.db"
    shutil.copy(FIXTURES / "schema_v2.sqlite", path)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("UPDATE statebook_schema SET version = 1")
    with pytest.raises(ConfigError, match="version 1, which no migration adopts.*create a new database"):
        await open_book(f"sqlite:///{path}", create=False)
    with pytest.raises(UpgradeRefused, match="only version 2 can be adopted"):
        await run_upgrade(f"sqlite:///{path}")
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT version FROM statebook_schema").fetchall() == [(1,)]


async def test_db_check_leaves_the_applications_own_tables_alone(backend, tmp_path, request):
    """M7b: in a database the application shares, its own tables (and its own Alembic version table) are not
    statebook's drift: ``db check`` passes and never advises removing them; a dropped statebook index beside
    them is still found, and ``db upgrade`` leaves the application's table and rows as they were."""
    async with previous_database(backend, tmp_path, request) as url:
        await run_upgrade(url)
        engine = connect(url)
        async with engine.begin() as conn:
            await conn.exec_driver_sql("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total INTEGER NOT NULL)")
            await conn.exec_driver_sql("CREATE INDEX ix_invoices_total ON invoices (total)")
            await conn.exec_driver_sql("INSERT INTO invoices (id, total) VALUES (1, 100)")
            await conn.exec_driver_sql("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
        await engine.dispose()
        out = cli("--db", url, "db", "check")
        assert out.returncode == 0, out.stdout + out.stderr
        assert "invoices" not in out.stdout and "alembic_version" not in out.stdout
        assert (await run_check(url)).drift == []
        engine = connect(url)
        async with engine.begin() as conn:
            await conn.exec_driver_sql("DROP INDEX idx_dispatch_outbox_created")
        await engine.dispose()
        found = json.loads(cli("--db", url, "db", "check", "--json").stdout)
        assert found["ok"] is False and not any("invoices" in d or "alembic_version" in d for d in found["drift"])
        assert any("idx_dispatch_outbox_created" in d for d in found["drift"])
        assert cli("--db", url, "db", "upgrade").returncode == 0
        assert (await run_check(url)).drift == []
        engine = connect(url)
        async with engine.connect() as conn:
            assert (await conn.execute(sa.text("SELECT id, total FROM invoices"))).all() == [(1, 100)]
        await engine.dispose()
