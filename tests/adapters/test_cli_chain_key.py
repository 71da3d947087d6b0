"""C15 / A1: every command that writes opens the book with the configured chain key; without it, a keyed database
refuses the write (exit 2, nothing written) — never a plain fact in a keyed chain.

The key comes from the settings: a global ``--config FILE``, the environment (``STATEBOOK_AUDIT__CHAIN_KEY__FILE``)
or ``./statebook.toml``. Every command of the CLI tree is classified here as a writer (run with the key from each
source, and without it) or as one that writes no fact, so a new command cannot be forgotten.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import typer
from conformance.outbox.support import Recorder, failing
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from typer.testing import CliRunner

from statebook.adapters.cli import app
from statebook.adapters.db import normalize_url, open_book
from statebook.lifecycle import FakeClock, Reason, verify
from statebook.lifecycle.chain import read_switch
from statebook.lifecycle.chainkey import ChainKey
from statebook.lifecycle.facts import facts_table
from statebook.lifecycle.schema import metadata
from statebook.outbox import deliver_due_dispatches, enqueue_dispatch, get_dispatch
from statebook.outbox.notifications import send_notification
from statebook.outbox.notifications.delivery import deliver_due_notifications
from statebook.outbox.notifications.scripted import ScriptedChannel
from statebook.scheduler.runs import open_run
from statebook.scheduler.store import create_schedule, schedule_row

SECRET = "a chain key of forty bytes, for the tests"
KEY = ChainKey(SECRET.encode())
OTHER = ChainKey(b"another key of at least sixteen bytes")
TEMPLATE = json.dumps(["{python}", "-c", "pass", "{deliver_to}"])
"""The notify template ``dispatch deliver`` and the daemon run (a child that succeeds)."""


# -- every command of the tree, classified ----------------------------------------------------------------


def command_paths() -> set[str]:
    """The path of every command the CLI tree holds (a group that runs by itself counts as one)."""
    found: set[str] = set()

    def walk(group: Any, path: str) -> None:
        ctx = typer.Context(group)
        for name in group.list_commands(ctx):
            sub = group.get_command(ctx, name)
            where = f"{path} {name}".strip()
            if not hasattr(sub, "list_commands") or getattr(sub, "invoke_without_command", False):
                found.add(where)
            if hasattr(sub, "list_commands"):
                walk(sub, where)

    walk(typer.main.get_command(app), "")
    return found


Args = Callable[[dict[str, str]], list[str]]

WRITERS: dict[str, dict[str, Args]] = {
    # command path: {case: its arguments given the seeded ids}
    "dispatch ack": {"dispatch ack": lambda i: ["dispatch", "ack", i["acked"], i["token"]]},
    "dispatch retry": {"dispatch retry": lambda i: ["dispatch", "retry", i["dead"]]},
    "dispatch purge": {"dispatch purge ID": lambda i: ["dispatch", "purge", i["dead"]],
                       "dispatch purge --before": lambda i: ["dispatch", "purge", "--before", "2100-01-01", "--yes"]},
    "dispatch expedite": {"dispatch expedite": lambda i: ["dispatch", "expedite", i["waiting"]]},
    "dispatch deliver": {"dispatch deliver --once": lambda i: ["dispatch", "deliver", "--once"]},
    "notify replay": {"notify replay": lambda i: ["notify", "replay", i["failed"]]},
    "notify resolve": {"notify resolve": lambda i: ["notify", "resolve", i["failed"], "--reason", "known"]},
    "notify ack": {"notify ack": lambda i: ["notify", "ack", i["delivered"], "--actor", "operator:ana"]},
    "notify dismiss": {"notify dismiss": lambda i: ["notify", "dismiss", i["delivered"], "--actor", "operator:ana"]},
    "notify retain": {"notify retain": lambda i: ["notify", "retain", "--before", i["week_ago"], "--horizon", "7d",
                                                  "--yes"],
                      "notify retain --dry-run": lambda i: ["notify", "retain", "--before", i["week_ago"],
                                                            "--horizon", "7d", "--dry-run"]},  # records its run
    "schedule add": {"schedule add": lambda i: ["schedule", "add", "later", "--every", "3600", "--command", "true",
                                                "--cwd", tempfile.gettempdir()]},
    "schedule enable": {"schedule enable": lambda i: ["schedule", "enable", "paused"]},
    "schedule disable": {"schedule disable": lambda i: ["schedule", "disable", "active"]},
    "schedule rm": {"schedule rm": lambda i: ["schedule", "rm", "active"]},
    "schedule fire": {"schedule fire": lambda i: ["schedule", "fire", "active"]},
    "runs cancel": {"runs cancel": lambda i: ["runs", "cancel", i["run"]]},
    "run": {"run --for": lambda i: ["run", "--for", "1.5", "--verify-every", "0"]},
}

WRITES_NO_FACT: dict[str, str] = {
    # command path: why it never appends a fact to the database it is given
    "history": "reads", "replay": "reads", "verify": "reads", "export": "reads", "stats": "reads",
    "checkpoint": "reads", "check": "reads", "lifecycle ls": "reads", "lifecycle show": "reads",
    "lifecycle graph": "reads", "dispatch ls": "reads", "dispatch show": "reads", "notify ls": "reads",
    "notify show": "reads", "notify attempts": "reads", "notify dead-letters": "reads", "schedule ls": "reads",
    "schedule show": "reads", "schedule runs": "reads", "runs show": "reads", "channels ls": "reads",
    "channels test": "sends one message, writes nothing", "checkpoint keygen": "writes a key file",
    "audit verify": "reads a bundle", "audit replay": "reads a bundle", "demo": "its own database file",
    "db upgrade": "the schema; no fact", "db current": "reads", "db history": "reads", "db check": "reads",
    "web hash-password": "prints a hash",
    "checkpoint note-key": "writes a key file", "checkpoint publish": "reads the log; writes a checkpoint file",
    "audit prove": "reads", "audit witness-request": "reads", "audit check-proof": "reads a proof and a fact",
    "audit witness": "its own state directory",
}
SERVES: dict[str, str] = {
    # a server whose writes are its requests' (the console's actions), checked where it is tested
    "web": "tests/web/test_serve.py test_the_console_opens_its_book_with_the_chain_key",
}

CASES = [(case, args) for cases in WRITERS.values() for case, args in cases.items()]
MODES = ("config", "environment", "cwd", "none")


def test_every_command_is_classified():
    """C15: each command the CLI tree holds is either a writer (checked below with and without the key) or says
    why it writes no fact; a new command must be added to one of the two."""
    paths = command_paths()
    assert not set(WRITERS) & set(WRITES_NO_FACT) and not set(SERVES) & (set(WRITERS) | set(WRITES_NO_FACT))
    known = set(WRITERS) | set(WRITES_NO_FACT) | set(SERVES)
    assert paths == known, f"unclassified: {sorted(paths - known)}; gone: {sorted(known - paths)}"


# -- a keyed database with something for every writer ---------------------------------------------------


async def _seed(url: str, key: ChainKey | None) -> dict[str, str]:
    """Dispatches (ackable, dead, pending, one waiting out its backoff), notifications (delivered, failed), two schedules and a run, written
    an hour ago through a book with ``key`` (which keys the chain)."""
    clock = FakeClock(time.time() - 3600)
    book = await open_book(url, clock=clock, chain_key=key)
    try:
        # First, alone: a dispatch waiting out a backoff that ends after the test runs, whenever that is (the
        # seed is copied for the whole module), so expedite has something to write: it failed a day ahead.
        ahead = book.with_clock(FakeClock(time.time() + 86400))
        waiting = await enqueue_dispatch(ahead, kind="k", deliver_to="seat-4")
        await deliver_due_dispatches(ahead, transport=Recorder(outcome=failing("down")).transport)
        acked = await enqueue_dispatch(book, kind="k", deliver_to="seat-1", ack_required=True)
        dead = await enqueue_dispatch(book, kind="k", deliver_to="seat-2", max_attempts=1)
        await deliver_due_dispatches(book, transport=Recorder(outcome=failing("down")).transport)
        await enqueue_dispatch(book, kind="k", deliver_to="seat-3")
        token = (await get_dispatch(book, acked)).ack_token.get_secret_value()
        delivered = await send_notification(book, recipient="ops", content={"text": "a"}, mode="guaranteed",
                                            channels=["email"], response_timeout=86400)
        failed = await send_notification(book, recipient="dba", content={"text": "b"}, mode="guaranteed",
                                         channels=["pagerduty"])
        channels = {"email": ScriptedChannel("email", ["success"]),
                    "pagerduty": ScriptedChannel("pagerduty", ["reject"])}
        for _ in range(3):
            await deliver_due_notifications(book, channels, deadline=0.05)
            clock.advance(10)
        command = {"trigger_type": "interval", "interval_sec": 60, "action_kind": "command", "action_command": "true",
                   "action_cwd": tempfile.gettempdir()}
        active = await create_schedule(book, {"name": "active", **command})
        await create_schedule(book, {"name": "paused", **command, "enabled": False})
        run = await open_run(book, await schedule_row(book, active.id), reason=Reason("schedule_run.running.fired"),
                             context={}, daemon_id="d1")
        week_ago = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 8 * 86400))
        return {"acked": acked, "token": token, "dead": dead, "delivered": delivered.id, "failed": failed.id,
                "run": run, "week_ago": week_ago, "waiting": waiting}
    finally:
        await book.engine.dispose()


async def _on_server(url: str, sql: str) -> None:
    """One statement (CREATE/DROP DATABASE) on the PostgreSQL server of ``url``, outside any transaction."""
    server = make_url(normalize_url(url))
    engine = create_async_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.exec_driver_sql(sql)
    finally:
        await engine.dispose()


def _database(url: str, name: str) -> str:
    return make_url(normalize_url(url)).set(database=name).render_as_string(hide_password=False)


_SEEDED: dict[tuple[str, bool], tuple[str, dict[str, str]]] = {}
"""(backend, keyed) -> the seeded database each test copies (a SQLite file, a PostgreSQL template database)."""


@pytest.fixture(scope="module")
def _templates() -> Iterator[dict[tuple[str, bool], tuple[str, dict[str, str]]]]:
    yield _SEEDED
    for (backend, _), (where, _) in list(_SEEDED.items()):
        if backend == "postgres":
            asyncio.run(_on_server(where, f'DROP DATABASE IF EXISTS "{make_url(where).database}"'))
    _SEEDED.clear()


@pytest.fixture
def keyed(backend: str, db_url: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
          _templates: dict[tuple[str, bool], tuple[str, dict[str, str]]]
          ) -> Iterator[Callable[..., tuple[str, dict[str, str]]]]:
    """A fresh copy of a seeded database (keyed with KEY, or plain), seeded once per module: a copied SQLite file,
    or a PostgreSQL database made from a seeded template (dropped after the test)."""
    made: list[str] = []

    def make(key: ChainKey | None = KEY) -> tuple[str, dict[str, str]]:
        seeded = _templates.get((backend, key is not None))
        if seeded is None:
            if backend == "postgres":
                name = f"sb_chain_seed_{key is not None:d}_{uuid.uuid4().hex[:8]}"
                asyncio.run(_on_server(db_url, f'CREATE DATABASE "{name}"'))
                where = _database(db_url, name)
            else:
                where = f"sqlite:///{tmp_path_factory.mktemp('seeded') / 'seed.db'}"
            seeded = _templates[(backend, key is not None)] = (where, asyncio.run(_seed(where, key)))
        where, ids = seeded
        if backend == "postgres":
            name = f"sb_chain_{uuid.uuid4().hex[:12]}"
            asyncio.run(_on_server(db_url, f'CREATE DATABASE "{name}" TEMPLATE "{make_url(where).database}"'))
            made.append(name)
            return _database(db_url, name), dict(ids)
        source, copy = make_url(where).database, tmp_path / "keyed.db"
        for suffix in ("", "-wal", "-shm"):
            if Path(f"{source}{suffix}").exists():
                shutil.copy(f"{source}{suffix}", f"{copy}{suffix}")
        return f"sqlite:///{copy}", dict(ids)

    yield make
    for name in made:
        asyncio.run(_on_server(db_url, f'DROP DATABASE IF EXISTS "{name}"'))


# -- running a command with the key from one source ---------------------------------------------------------


def invoke(url: str, args: list[str], mode: str, where: Path, monkeypatch: pytest.MonkeyPatch, key: str = SECRET):
    """The command run with the chain key from ``mode`` (none: no key anywhere) in the folder ``where``."""
    key_file = where / "chain.key"
    key_file.write_text(key + "\n")
    settings = f'[audit]\nchain_key = {{file = "{key_file}"}}\n'
    monkeypatch.chdir(where)
    root = ["--db", url]
    env = {"STATEBOOK_DISPATCH__NOTIFY_TEMPLATE": TEMPLATE, "STATEBOOK_AUDIT__CHAIN_KEY__FILE": None,
           "STATEBOOK_AUDIT__CHAIN_KEY__ENV": None}
    if mode == "config":
        (where / "elsewhere.toml").write_text(settings)
        root = ["--config", str(where / "elsewhere.toml"), *root]
    elif mode == "environment":
        env["STATEBOOK_AUDIT__CHAIN_KEY__FILE"] = str(key_file)
    elif mode == "cwd":
        (where / "statebook.toml").write_text(settings)
    return CliRunner().invoke(app, [*root, *args], env=env)


async def _snapshot(url: str) -> list[Any]:
    """Every row of every statebook table, the facts included."""
    book = await open_book(url, create=False)
    try:
        async with book.read() as conn:
            return [sorted(map(repr, (await conn.execute(sa.select(t))).all())) for t in metadata.sorted_tables]
    finally:
        await book.engine.dispose()


async def _audit(url: str, key: ChainKey | None) -> tuple[Any, int, Any]:
    """(verify with ``key``, the fact count, the switch-over record)."""
    book = await open_book(url, create=False)
    try:
        report = await verify(book.with_chain_key(key))
        async with book.read() as conn:
            facts = await conn.scalar(sa.select(sa.func.count()).select_from(facts_table))
        return report, facts, await read_switch(book)
    finally:
        await book.engine.dispose()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", [c for c, _ in CASES])
def test_every_writer_writes_keyed_facts_with_the_key_and_nothing_without_it(
        keyed, case: str, mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """C15 / A1: on a keyed database each writing command, given the key by --config, the environment or
    ./statebook.toml, writes facts that verify with the key; given no key it is refused before anything is
    written: exit 2, one line naming how to give the key, never the key."""
    url, ids = keyed()
    args = dict(CASES)[case](ids)
    before = asyncio.run(_snapshot(url))
    _, facts_before, _ = asyncio.run(_audit(url, KEY))
    done = invoke(url, args, mode, tmp_path, monkeypatch)
    assert SECRET not in done.output
    if mode == "none":
        assert done.exit_code == 2, done.output
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
        assert all(how in lines[0] for how in ("chain key", KEY.id, "--config", "STATEBOOK_AUDIT__CHAIN_KEY__FILE",
                                               "statebook.toml")), lines[0]
        assert asyncio.run(_snapshot(url)) == before, "a refused writer wrote"
        return
    assert done.exit_code == 0, done.output
    report, facts_after, switch = asyncio.run(_audit(url, KEY))
    assert facts_after > facts_before, f"{case} wrote no fact"
    assert report.ok, report.findings
    assert switch is not None and switch.key_id == KEY.id


def test_a_writer_with_the_key_keys_a_plain_database(keyed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """C15 / A1: a writer given the key on a database never keyed records the switch-over first (as the daemon
    does), so its facts verify with the key; the plain facts before it are pinned by the record."""
    url, ids = keyed(None)
    done = invoke(url, ["dispatch", "retry", ids["dead"]], "environment", tmp_path, monkeypatch)
    assert done.exit_code == 0, done.output
    report, _, switch = asyncio.run(_audit(url, KEY))
    assert switch is not None and switch.key_id == KEY.id
    assert report.ok, report.findings


def test_a_writer_with_another_key_is_refused(keyed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """C15 / A1: a writer given a key other than the one the chain was keyed with is refused before it writes."""
    url, ids = keyed()
    before = asyncio.run(_snapshot(url))
    other = OTHER.secret.decode()
    done = invoke(url, ["dispatch", "retry", ids["dead"]], "config", tmp_path, monkeypatch, key=other)
    assert done.exit_code == 2 and KEY.id in done.stderr and OTHER.id in done.stderr, done.output
    assert other not in done.output and len(done.stderr.strip().splitlines()) == 1
    assert asyncio.run(_snapshot(url)) == before


def test_readers_need_no_key(keyed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """C15: commands that only read run on a keyed database without the key (verify says what it could not
    check), and write nothing."""
    url, ids = keyed()
    before = asyncio.run(_snapshot(url))
    for args in (["dispatch", "ls", "--json"], ["notify", "show", ids["delivered"]], ["history", "dispatch", ids["dead"]],
                 ["stats"], ["verify"]):
        done = invoke(url, args, "none", tmp_path, monkeypatch)
        assert done.exit_code == 0, (args, done.output)
    assert asyncio.run(_snapshot(url)) == before
