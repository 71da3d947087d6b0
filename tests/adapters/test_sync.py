"""statebook.sync (adapters/sync.py, docs/how-to/sync.md): the async API as blocking functions on one private loop
thread, on SQLite and PostgreSQL.

- every function is its async twin's blocking form, with the same signature;
- many threads at once, one loop thread for all of them; a Flask view through Flask's test client;
- an error comes out in the calling thread with the loop's frames in its traceback;
- a call from inside a running event loop (and from the loop's own thread) raises CalledFromEventLoop at once;
- a call commits on its own, whatever the caller's own transaction does; ``run`` groups writes in one;
- the process exits cleanly with books left open; a forked child runs a loop of its own.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import os
import subprocess
import sys
import textwrap
import threading
import traceback
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sqlalchemy as sa
from flask import Flask

from statebook import sync
from statebook.adapters import sync as implementation
from statebook.adapters.db import reset_schema
from statebook.adapters.registry import builtin_registry
from statebook.lifecycle import Actor, Book, Lifecycle, Reason, Registry, TransitionRejected, create, edges
from statebook.lifecycle import managed_table
from statebook.outbox import enqueue_dispatch

ROOT = Path(__file__).resolve().parent.parent.parent
ANA = Actor("user", "ana")
FILED = Reason("ticket.open.filed")

tickets = managed_table("sync_tickets", sa.Column("id", sa.String(40), primary_key=True),
                        sa.Column("title", sa.Text, nullable=False), meta=sa.MetaData())
TICKET = Lifecycle(entity_type="ticket", table=tickets, statuses=("open", "closed"), initial={"open"},
                   terminal={"closed"}, edges=edges("open", "closed"), reason_prefixes={"ticket"},
                   reasons={"ticket.open.filed", "ticket.closed.fixed"})


def make_registry() -> Registry:
    registry = builtin_registry(seal=False)
    registry.register(TICKET)
    registry.seal()
    return registry


async def empty_tickets(book: Book) -> None:
    async with book.engine.begin() as conn:
        await conn.execute(tickets.delete())


async def drop_tickets(book: Book) -> None:
    async with book.engine.begin() as conn:
        await conn.run_sync(tickets.drop, checkfirst=True)


@pytest.fixture
def book(db_url: str, backend: str) -> Iterator[Book]:
    opened = sync.open_book(db_url, registry=make_registry())
    if backend == "postgres":  # the session's database: its facts and this module's tickets emptied
        sync.run(reset_schema, opened.engine)
        sync.run(empty_tickets, opened)
    try:
        yield opened
    finally:
        if backend == "postgres":  # no later test's verify on this database is to find the table unregistered
            sync.run(drop_tickets, opened)
        sync.close(opened)


def new_id() -> str:
    return f"T-{uuid.uuid4().hex[:12]}"


def file(book: Book, ticket: str) -> None:
    sync.create(book, "ticket", entity_id=ticket, values={"title": "disk full"}, status="open", reason=FILED,
                actor=ANA)


def loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "statebook-sync"]


def test_each_function_is_the_blocking_form_of_its_async_twin() -> None:
    assert sync.__all__ == implementation.__all__ and sync.__doc__ == implementation.__doc__
    twins = 0
    for name in sync.__all__:
        function = getattr(sync, name)
        original = inspect.unwrap(function)
        if original is function:
            continue  # open_book's keeper, close, run and the error: their own
        assert inspect.iscoroutinefunction(original) and original.__name__ == name.split(".")[-1]
        assert not inspect.iscoroutinefunction(function)
        assert inspect.signature(function) == inspect.signature(original), name
        assert function.__doc__ and name in function.__doc__
        twins += 1
    assert twins >= 30


def test_calls_from_many_threads_share_one_loop_thread(book: Book) -> None:
    ids = [new_id() for _ in range(40)]

    def work(ticket: str) -> int:
        file(book, ticket)
        sync.transition(book, "ticket", ticket, "closed", expected="open", reason=Reason("ticket.closed.fixed"),
                        actor=ANA)
        return len(sync.history(book, "ticket", ticket))

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert list(pool.map(work, ids)) == [2] * len(ids)
    assert len(loop_threads()) == 1
    assert all(sync.replay(book, "ticket", t)["status"] == "closed" for t in ids)
    assert sync.verify(book, "ticket").ok  # (the session's database may hold other tests' tables)


def test_an_error_comes_out_in_the_calling_thread_with_its_traceback(book: Book) -> None:
    ticket = new_id()
    file(book, ticket)
    caught: list[BaseException] = []

    def caller() -> None:
        try:
            sync.transition(book, "ticket", ticket, "open", expected="open", reason=FILED, actor=ANA)
        except TransitionRejected as exc:
            caught.append(exc)

    thread = threading.Thread(target=caller, name="the-caller")
    thread.start()
    thread.join()
    [error] = caught
    frames = traceback.extract_tb(error.__traceback__)
    assert frames[0].name == "caller"  # raised in the calling thread ...
    assert any(Path(f.filename).parent.name == "lifecycle" for f in frames)  # ... with the engine's frames


async def test_a_call_inside_a_running_event_loop_is_refused_at_once(book: Book) -> None:
    with pytest.raises(sync.CalledFromEventLoop, match=r"statebook\.sync\.history was called from a running event "
                                                        r"loop.*await the async function there instead"):
        sync.history(book, "ticket", "T-1")


def test_a_call_from_the_loops_own_thread_is_refused_not_deadlocked(book: Book) -> None:
    async def nested() -> None:
        sync.verify(book)

    with pytest.raises(sync.CalledFromEventLoop):
        sync.run(nested)


def test_a_flask_view_calls_it_through_the_test_client(book: Book) -> None:
    app = Flask(__name__)

    @app.post("/tickets/<ticket_id>")
    def file_view(ticket_id: str) -> tuple[dict[str, str], int]:
        file(book, ticket_id)
        return {"ticket": ticket_id}, 201

    @app.get("/tickets/<ticket_id>")
    def show_view(ticket_id: str) -> dict[str, object]:
        return {"facts": [f.reason_code for f in sync.history(book, "ticket", ticket_id)]}

    ticket = new_id()
    with app.test_client() as client:
        assert client.post(f"/tickets/{ticket}").status_code == 201
        assert client.get(f"/tickets/{ticket}").get_json() == {"facts": ["ticket.open.filed"]}
        refused = client.post(f"/tickets/{ticket}")  # the same id again: the view's error is the request's
        assert refused.status_code == 500


def test_run_groups_writes_in_one_transaction_and_rolls_them_back_together(book: Book) -> None:
    async def file_with_page(tx_book: Book, ticket: str, fail: bool) -> str:
        async with tx_book.begin() as tx:
            await create(tx, "ticket", entity_id=ticket, values={"title": "x"}, status="open", reason=FILED, actor=ANA)
            dispatch = await enqueue_dispatch(tx, kind="ticket.filed", deliver_to="ops", body={"ticket": ticket})
            if fail:
                raise ValueError("refused")
            return dispatch

    kept, dropped = new_id(), new_id()
    assert sync.get_dispatch(book, sync.run(file_with_page, book, kept, False)) is not None
    with pytest.raises(ValueError, match="refused"):
        sync.run(file_with_page, book, dropped, True)
    assert sync.replay(book, "ticket", kept) is not None and sync.replay(book, "ticket", dropped) is None
    assert [d.payload["body"] for d in sync.list_dispatches(book)] == [{"ticket": kept}]


@pytest.mark.postgres
def test_a_call_does_not_join_the_callers_own_transaction(pg_url: str) -> None:
    """A call made while the caller's own transaction is open commits on its own: the caller's rollback takes
    the caller's writes back, not the call's. (On SQLite the call would wait for the caller's write lock, then
    fail: docs/how-to/sync.md says to commit first.)"""
    book = sync.open_book(pg_url, registry=make_registry())
    ticket = new_id()

    async def callers_transaction() -> bool:
        async with book.engine.connect() as conn:  # the caller's own connection and transaction
            await conn.begin()
            await conn.execute(sa.text("CREATE TEMP TABLE callers_rows (id text)"))
            await asyncio.to_thread(file, book, ticket)  # statebook.sync from inside it (in a thread: see above)
            await conn.rollback()
            exists = "SELECT to_regclass('pg_temp.callers_rows') IS NOT NULL"
            return bool((await conn.execute(sa.text(exists))).scalar())

    try:
        assert sync.run(callers_transaction) is False  # the caller's write is gone ...
        assert sync.replay(book, "ticket", ticket) is not None  # ... the call's stays
    finally:
        sync.run(drop_tickets, book)
        sync.close(book)


@pytest.mark.parametrize("backend_name", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_the_process_exits_cleanly_with_books_left_open(backend_name: str, tmp_path: Path,
                                                         request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("pg_url") if backend_name == "postgres" else f"sqlite:///{tmp_path / 'exit.db'}"
    script = textwrap.dedent(f"""
        import threading
        import sqlalchemy as sa
        from statebook import sync
        book = sync.open_book({url!r})
        sa.event.listen(book.engine.sync_engine.pool, "close", lambda *_: print("a connection closed", flush=True))
        sync.enqueue_dispatch(book, kind="exit.test", deliver_to="ops", body={{}})
        sync.verify(book)
        print(sorted(t.name for t in threading.enumerate() if t.name == "statebook-sync"), flush=True)
    """)
    done = subprocess.run([sys.executable, "-W", "default::ResourceWarning", "-c", script], capture_output=True,
                          text=True, timeout=60, env={k: v for k, v in os.environ.items() if not k.startswith("STATEBOOK_")})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "['statebook-sync']" and lines[1:] and set(lines[1:]) == {"a connection closed"}, lines
    assert done.stderr == ""  # no unclosed connection, no task destroyed while pending, no resource warning
    if backend_name == "sqlite":  # the last connection closed cleanly checkpoints the log away
        assert not (tmp_path / "exit.db-wal").exists()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_runs_a_loop_of_its_own(book: Book, db_url: str) -> None:
    parent, mine, inherited, again = book, new_id(), new_id(), new_id()
    file(parent, new_id())
    pid = os.fork()
    if pid == 0:  # the child: its own loop, a book of its own and the parent's with fresh connections
        code = 1
        try:
            child = sync.open_book(db_url, registry=make_registry())
            file(child, mine)
            file(parent, inherited)
            gc.collect()  # the parent's connections, dropped here, are collected without touching the parent's
            code = 0 if len(loop_threads()) == 1 and sync.verify(child, "ticket").ok else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert sync.replay(parent, "ticket", mine) is not None and sync.replay(parent, "ticket", inherited) is not None
    file(parent, again)  # the parent's own connections are untouched by the child's
    assert sync.verify(parent, "ticket").ok


def test_importing_it_loads_no_extra(tmp_path: Path) -> None:
    """statebook.sync is core: no HTTP client, web framework, metrics or crypto library comes with it."""
    from statebook.adapters.extras import EXTRAS

    modules = sorted({m for names in EXTRAS.values() for m in names})
    code = f"import sys, statebook.sync; print(','.join(m for m in {modules!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={k: v for k, v in os.environ.items() if not k.startswith("STATEBOOK_")})
    assert done.returncode == 0 and done.stdout.strip() == "", (done.stdout, done.stderr)
