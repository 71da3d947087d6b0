"""statebook inside a FastAPI application (statebook.adapters.asgi, docs/how-to/fastapi.md): the example app driven
through httpx's ASGI transport with its lifespan run as a server runs it, on SQLite and PostgreSQL.

- a request's writes commit together when its handler returns, before the response starts, and the worker running
  in the application's process delivers the dispatch it enqueued;
- a handler that raises leaves nothing written;
- shutdown stops and awaits every task (none is left running), releases the scheduler lease, disposes the engine;
- a worker whose task dies is logged at once and its error raised at shutdown;
- the scheduler runs under the leadership ``statebook run`` takes (one daemon per SQLite file).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI

from statebook.adapters.asgi import BookDep, book_of, embedded, lifespan
from statebook.adapters.db import connect, open_book, reset_schema
from statebook.adapters.errors import ConfigError
from statebook.outbox import DeliveryWorker
from statebook.scheduler.schema import scheduler_daemons, scheduler_leases

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLE = ROOT / "examples" / "fastapi_helpdesk.py"

Scope = dict[str, Any]


@contextlib.asynccontextmanager
async def served(app: Any) -> AsyncIterator[Any]:
    """What an ASGI server does around an app: the lifespan's startup before the first request and its shutdown
    after the last (over the ASGI lifespan protocol), the lifespan state copied into each request's scope. Yields
    the app to give httpx; a failed startup or shutdown raises the app's error."""
    state: dict[str, Any] = {}
    to_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    from_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": state},
                                    to_app.get, from_app.put))

    async def answer(expected: str) -> None:
        reply = asyncio.create_task(from_app.get())
        await asyncio.wait({reply, task}, return_when=asyncio.FIRST_COMPLETED)
        if not reply.done():
            reply.cancel()
            await task  # the app ended without answering: its error
        message = reply.result()
        if message["type"] != expected:
            await task  # Starlette re-raises the lifespan's error after saying it failed
            raise AssertionError(message)

    await to_app.put({"type": "lifespan.startup"})
    await answer("lifespan.startup.complete")

    async def with_state(scope: Scope, receive: Any, send: Any) -> None:
        await app({**scope, "state": dict(state)}, receive, send)

    try:
        yield with_state
    finally:
        await to_app.put({"type": "lifespan.shutdown"})
        await answer("lifespan.shutdown.complete")
        await task


def load_example(monkeypatch: pytest.MonkeyPatch, db_url: str) -> ModuleType:
    monkeypatch.setenv("STATEBOOK_DB", db_url)
    spec = importlib.util.spec_from_file_location(f"fastapi_helpdesk_{uuid.uuid4().hex}", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
async def clean_db(db_url: str, backend: str) -> AsyncIterator[str]:
    """The test's database, emptied first on PostgreSQL (a dispatch left pending by another test would be sent);
    the example's table is dropped after it, so no later test's verify finds it unregistered."""
    if backend == "postgres":
        book = await open_book(db_url)
        try:
            await reset_schema(book.engine)
        finally:
            await book.engine.dispose()
    yield db_url
    if backend == "postgres":
        engine = connect(db_url)
        try:
            async with engine.begin() as conn:
                await conn.execute(sa.text("DROP TABLE IF EXISTS helpdesk_tickets"))
        finally:
            await engine.dispose()


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://helpdesk.test")


async def rows(db_url: str, query: Any) -> list[Any]:
    engine = connect(db_url)
    try:
        async with engine.connect() as conn:
            return list((await conn.execute(query)).fetchall())
    finally:
        await engine.dispose()


def others() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]


def test_the_docs_show_the_example_as_it_is() -> None:
    docs = (ROOT / "docs" / "how-to" / "fastapi.md").read_text()
    code = EXAMPLE.read_text()
    body = code[code.index("import json"):]
    blocks = re.findall(r'```python title="app.py"\n(.*?)```', docs, re.S)
    assert blocks == [body], "docs/how-to/fastapi.md must show examples/fastapi_helpdesk.py from its first import on"


async def test_a_request_commits_its_dispatch_and_the_worker_in_process_delivers_it(
        clean_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    example = load_example(monkeypatch, clean_db)
    ticket = f"T-{uuid.uuid4().hex[:8]}"
    async with served(example.app) as app, client(app) as http:
        answer = await http.post(f"/tickets/{ticket}", json={"title": "disk full"})
        assert answer.status_code == 201, answer.text
        for _ in range(200):
            if example.PAGED:
                break
            await asyncio.sleep(0.02)
        assert example.PAGED == [{"ticket": ticket}]
        facts = (await http.get(f"/tickets/{ticket}/history")).json()
        assert facts == [{"version": 1, "status": "open", "reason": "ticket.open.filed"}]
    outbox = sa.table("dispatch_outbox", sa.column("dedup_key"), sa.column("status"))
    assert await rows(clean_db, sa.select(outbox.c.status).where(outbox.c.dedup_key == f"ticket.filed:{ticket}")) \
        == [("delivered",)]


async def test_the_transaction_commits_before_the_response_starts(clean_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The response is sent after the commit, so a failed commit can never be answered with a success."""
    example = load_example(monkeypatch, clean_db)
    ticket = f"T-{uuid.uuid4().hex[:8]}"
    table = example.tickets
    seen: list[Any] = []
    async with served(example.app) as app:
        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                seen.append((message["status"], await rows(clean_db, sa.select(table.c.id).where(table.c.id == ticket))))

        body = b'{"title": "disk full"}'
        received = iter([{"type": "http.request", "body": body, "more_body": False}])

        async def receive() -> dict[str, Any]:
            return next(received, {"type": "http.disconnect"})

        await app({"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
                   "path": f"/tickets/{ticket}", "raw_path": f"/tickets/{ticket}".encode(), "query_string": b"",
                   "root_path": "", "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 1),
                   "server": ("helpdesk.test", 80)}, receive, send)
    assert seen == [(201, [(ticket,)])]


async def test_a_handler_that_raises_leaves_nothing_written(clean_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    example = load_example(monkeypatch, clean_db)
    ticket = f"T-{uuid.uuid4().hex[:8]}"
    async with served(example.app) as app, client(app) as http:
        refused = await http.post(f"/tickets/{ticket}", json={"title": "test ticket"})
        assert refused.status_code == 422 and refused.json() == {"detail": "test tickets are refused"}
        assert (await http.get(f"/tickets/{ticket}/history")).status_code == 404
        await asyncio.sleep(0.1)  # the worker, had anything committed, would have sent it by now
        assert example.PAGED == []
    table = example.tickets
    facts = sa.table("status_transitions", sa.column("entity_id"))
    outbox = sa.table("dispatch_outbox", sa.column("dedup_key"))
    assert await rows(clean_db, sa.select(table.c.id).where(table.c.id == ticket)) == []
    assert await rows(clean_db, sa.select(facts.c.entity_id).where(facts.c.entity_id == ticket)) == []
    assert await rows(clean_db, sa.select(outbox.c.dedup_key).where(outbox.c.dedup_key == f"ticket.filed:{ticket}")) == []


async def test_shutdown_leaves_no_task_running_and_gives_the_lease_up(clean_db: str) -> None:
    """Delivery and the scheduler in process: while the app runs, their tasks run and this process leads the
    scheduler (a heartbeat and the lease, as ``statebook run``); after shutdown no task is left, the heartbeat
    is gone (the lease released) and the engine holds no connection."""
    app = FastAPI(lifespan=lifespan(db=clean_db, delivery=True, scheduler=True))
    books = []

    @app.get("/")
    async def home(book: BookDep) -> dict[str, str]:
        books.append(book)
        return {"db": book.dialect}

    before = set(others())
    async with served(app) as running, client(running) as http:
        assert (await http.get("/")).status_code == 200
        names = {t.get_name() for t in others()}
        assert {"statebook-delivery", "statebook-scheduler"} <= names, names
        leases = await rows(clean_db, sa.select(scheduler_leases.c.holder))
        beats = await rows(clean_db, sa.select(scheduler_daemons.c.daemon_id))
        assert len(beats) == 1 and leases == beats
    assert set(others()) <= before, [t.get_name() for t in others()]
    assert await rows(clean_db, sa.select(scheduler_daemons.c.daemon_id)) == []
    assert books[0].engine.pool.checkedout() == 0


async def test_a_worker_that_dies_is_logged_at_once_and_raised_at_shutdown(
        clean_db: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def broken(self: DeliveryWorker) -> None:
        raise RuntimeError("the worker broke")

    monkeypatch.setattr(DeliveryWorker, "started", broken)
    app = FastAPI(lifespan=lifespan(db=clean_db, delivery=True))
    with caplog.at_level(logging.ERROR, logger="statebook.daemon"), pytest.raises(RuntimeError, match="worker broke"):
        async with served(app):
            for _ in range(100):
                if caplog.records:
                    break
                await asyncio.sleep(0.01)
            assert [r.getMessage() for r in caplog.records] == [
                "statebook-delivery stopped with an error; it runs no more passes in this process"]
            assert caplog.records[0].exc_info is not None
    assert others() == []


async def test_one_scheduler_per_sqlite_file_as_statebook_run(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    async with embedded(db=url, scheduler=True):
        with pytest.raises(ConfigError, match="another statebook daemon is already running on this database"):
            async with embedded(db=url, scheduler=True):
                pass
        async with embedded(db=url, delivery=True) as book:  # delivery alone: any number of processes
            assert book.dialect == "sqlite"
    assert others() == []


async def test_a_handler_without_the_lifespan_is_told_what_is_missing() -> None:
    app = FastAPI()

    @app.get("/")
    async def home(book: BookDep) -> dict[str, str]:
        return {}

    with pytest.raises(ConfigError, match=r"give it lifespan=statebook\.adapters\.asgi\.lifespan\(\.\.\.\)"):
        async with client(app) as http:
            await http.get("/")
    assert book_of.__doc__


async def test_the_console_mounts_under_the_given_path_for_the_lifespan_only(tmp_path: Path) -> None:
    app = FastAPI(lifespan=lifespan(db=f"sqlite:///{tmp_path / 'app.db'}", console="/ops"))
    for _ in range(2):  # a second start mounts it again, once
        async with served(app) as running:
            transport = httpx.ASGITransport(app=running, client=("127.0.0.1", 5000))
            async with httpx.AsyncClient(transport=transport, base_url="http://app.test") as http:
                overview = await http.get("/ops/")
                assert overview.status_code == 200 and 'href="/ops/lifecycles"' in overview.text
        assert not [r for r in app.router.routes if getattr(r, "path", None) == "/ops"]


def test_without_the_web_extra_the_import_is_one_line_naming_it(tmp_path: Path) -> None:
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text("import sys\nsys.modules['starlette'] = None\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STATEBOOK_", "PYTHON"))} | {"PYTHONPATH": str(shim)}
    code = ("from statebook.adapters.extras import MissingExtra\ntry:\n    import statebook.adapters.asgi\n"
            "except MissingExtra as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == ("statebook.adapters.asgi (FastAPI and Starlette): the 'web' extra is not installed "
                                   "(no module starlette): pip install 'statebook[web]'"), done.stderr
