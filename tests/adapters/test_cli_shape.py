"""The CLI's shape (specs/cli.md C10-C14): a lazy root, --version and ``python -m statebook``, tables that
neither wrap nor cut ids off a terminal, --json on every listing, and bulk changes that ask first."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import subprocess
import sys

import pytest
import sqlalchemy as sa
import typer
from typer.testing import CliRunner

import importlib
from statebook.adapters.cli import app
from statebook.adapters.cli.app import COMMANDS
from statebook.adapters.db import open_book, reset_schema
from statebook.lifecycle import FakeClock
from statebook.lifecycle.facts import facts_table
from statebook.outbox import CallableTransport, deliver_due_dispatches, dispatch_outbox, enqueue_dispatch
from statebook.outbox.notifications import notifications, send_notification
from statebook.outbox.notifications.schema import notification_retention_runs

cli_app = importlib.import_module("statebook.adapters.cli.app")  # the package's ``app`` attribute is the Typer app
ENV = {"STATEBOOK_DB": None, "STATEBOOK_APP": None, "STATEBOOK_DEBUG": None}
START = 1_700_000_000.0
HEAVY = ("sqlalchemy", "pydantic", "statebook.lifecycle", "statebook.outbox", "statebook.scheduler", "rich")
"""What ``statebook --help`` and ``--version`` must not import (nor any command module)."""

LISTINGS = {"lifecycle ls", "dispatch ls", "notify ls", "notify attempts", "notify dead-letters", "schedule ls",
            "schedule runs", "channels ls", "history"}
LISTING_NAMES = {"ls", "attempts", "dead-letters", "runs", "history"}
"""A command with one of these names lists rows; each must take --json."""


def invoke(*args: str, input: str | None = None):
    """``statebook ARGS`` in process (typer's runner: standard input and output are not terminals)."""
    return CliRunner().invoke(app, list(args), env=ENV, input=input)


def python(*code_or_args: str) -> subprocess.CompletedProcess[str]:
    """This interpreter with ``ARGS``, in a fresh process with a bare environment."""
    return subprocess.run([sys.executable, *code_or_args], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})


# -- the lazy root ------------------------------------------------------------------------------------------

MODULES_AFTER = """
import json, sys
sys.argv = ["statebook", *json.loads(sys.argv[1])]
from statebook.adapters.cli import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules)))
"""


@pytest.mark.parametrize("args", [["--help"], ["--version"], []])
def test_root_help_and_version_import_no_command_module_nor_sqlalchemy_or_pydantic(args):
    """C10: `statebook --help` (and --version, and no arguments) imports no command module, no SQLAlchemy,
    pydantic, rich or statebook part: what a command needs is imported when it runs."""
    done = python("-c", MODULES_AFTER, json.dumps(args))
    assert done.returncode == 0, done.stderr
    *shown, last = done.stdout.strip().splitlines()
    out, modules = "\n".join(shown) + "\n" + done.stderr, json.loads(last)
    heavy = [m for m in modules if m.split(".")[0] in HEAVY or m.startswith(HEAVY)]
    commands = [m for m in modules if m.startswith("statebook.adapters.cli.") and m.rsplit(".", 1)[1]
                in {module for module, _help in COMMANDS.values()}]
    assert heavy == [] and commands == [], (heavy, commands)
    if args != ["--version"]:
        for name in COMMANDS:  # every command is listed, from the table
            assert f"\n  {name} " in out, name


COMMAND_HEAVY = {
    # typer 0.29 converts every option's value through pydantic, so a command's --help loads it; only typer's
    # private attributes could avoid that, and we do not reach into another project's privates.
    "verify --help": ("sqlalchemy", "rich", "statebook.lifecycle", "statebook.outbox", "alembic"),
    "lifecycle ls --json": ("rich", "sqlalchemy.orm", "sqlalchemy.ext.asyncio", "alembic", "pydantic_settings", "yaml",
                            "aiosqlite", "asyncpg",
                            # the built-in lifecycles, not the machinery around them (the packages' lazy names)
                            "statebook.scheduler.engine", "statebook.outbox.dispatch.worker",
                            "statebook.outbox.notifications.delivery"),
    "dispatch ls": ("alembic", "pydantic_settings", "yaml", "asyncpg"),
}
"""A command -> what it must not import to start (issue 30: each within 300 ms on an idle machine; the figures are
tests/bench/cli_startup.py's)."""


@pytest.mark.parametrize("command", sorted(COMMAND_HEAVY))
def test_the_everyday_commands_import_only_what_they_use(tmp_path, command):
    """C10: `verify --help` imports no SQLAlchemy, rich or statebook part; `lifecycle ls --json` no rich,
    ORM, migrations, settings, driver, scheduler engine or delivery worker; `dispatch ls` on SQLite no migrations, settings, YAML or PostgreSQL
    driver."""
    db = f"sqlite:///{tmp_path / 'small.db'}"
    assert invoke("--db", db, "db", "upgrade").exit_code == 0
    done = python("-c", MODULES_AFTER, json.dumps(["--db", db, *command.split()]))
    assert done.returncode == 0, done.stderr
    modules = json.loads(done.stdout.strip().splitlines()[-1])
    heavy = COMMAND_HEAVY[command]
    assert [m for m in modules if m.startswith(heavy)] == [], command


SHORT_HELP = """
import json, sys
import typer
from statebook.adapters.cli.app import COMMANDS, app
group = typer.main.get_command(app)
ctx = typer.Context(group)
found = {}
for name, (module, _help) in COMMANDS.items():
    if module != sys.argv[1]:
        continue
    cmd = group.get_command(ctx, name)
    found[name] = None if cmd is None else cmd.get_short_help_str(limit=10_000)
print(json.dumps(found))
"""


def test_the_command_table_names_each_command_s_module_and_its_own_help():
    """C10: each table entry's module, imported alone, defines the command, and the table's help is the
    command's own short help (no drift); every command the modules register is in the table."""
    for module in sorted({module for module, _help in COMMANDS.values()}):
        done = python("-c", SHORT_HELP, module)
        assert done.returncode == 0, done.stderr
        for name, short in json.loads(done.stdout).items():
            assert short == COMMANDS[name][1], (name, short)
    group = typer.main.get_group(app)  # the tests import every module: all of them are registered now
    assert set(group.commands) <= set(COMMANDS), set(group.commands) - set(COMMANDS)


def test_version_and_python_m_statebook():
    """C11: `statebook --version` and `python -m statebook --version` print the installed version."""
    want = f"statebook {importlib.metadata.version('statebook')}"
    assert invoke("--version").stdout.strip() == want
    done = python("-m", "statebook", "--version")
    assert (done.returncode, done.stdout.strip()) == (0, want), done.stderr
    shown = python("-m", "statebook", "lifecycle", "ls", "--json")
    assert shown.returncode == 0 and "dispatch" in {r["type"] for r in json.loads(shown.stdout)}


# -- tables off a terminal ----------------------------------------------------------------------------------


def test_tables_through_a_pipe_keep_each_row_and_its_id_whole(tmp_path):
    """C12: off a terminal (typer's runner, a real pipe) a table row never wraps and an id is never cut,
    however narrow the terminal would be: each schedule's long name and its id are on one line."""
    db = f"sqlite:///{tmp_path / 'wide.db'}"
    names = [f"nightly-report-for-the-{team}-team-with-a-rather-long-schedule-name" for team in ("a", "b")]
    ids = []
    for name in names:
        made = invoke("--db", db, "schedule", "add", name, "--every", "3600", "--command", "/bin/true", "--json")
        assert made.exit_code == 0, made.output
        ids.append(json.loads(made.stdout)["id"])
    shown = invoke("--db", db, "schedule", "ls")
    piped = subprocess.run([sys.executable, "-m", "statebook", "--db", db, "schedule", "ls"], capture_output=True,
                           text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", "COLUMNS": "60"})
    for output in (shown.stdout, piped.stdout):
        for name, sid in zip(names, ids):
            assert any(name in line and sid in line for line in output.splitlines()), output
    facts = invoke("--db", db, "history", "schedule", ids[0])  # a long reason: the fact's row stays one line
    assert any("(new) -> active" in line and f"{names[0]} created" in line for line in facts.stdout.splitlines())
    assert max(len(line) for line in shown.stdout.splitlines()) > 80  # wider than the runner's 80 columns


def piped(*args: str, cwd) -> str:  # type: ignore[no-untyped-def]
    """``statebook ARGS``'s standard output read through a real pipe, a narrow terminal width in the environment."""
    out = subprocess.run([sys.executable, "-m", "statebook", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, timeout=120, cwd=cwd, env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", "COLUMNS": "60"})
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_demo_and_listings_through_a_pipe_never_wrap(tmp_path):
    """C12: the README's promise holds for every line, not only tables: `statebook demo > file` keeps each
    sentence, id and table row on one line (it wrapped at 80 columns), and so do `history` of a demo ticket and
    `runs show`, read through a real pipe."""
    shown = piped("demo", cwd=tmp_path)
    lines = shown.splitlines()
    created = next(line for line in lines if line.startswith("created tickets "))
    ids = [word for word in created.split() if len(word) == 32]
    assert len(ids) == 2 and created.endswith("(open)"), created
    assert any(line.startswith("bo tries to close it unresolved: rejected (edge): ") and line.endswith("open, resolved")
               for line in lines), shown
    assert any("user:ana" in line and "ticket.open.reported: reported by mail" in line for line in lines), shown
    assert any("operator:root" in line and "ticket.open.reopened: smoke again" in line for line in lines), shown
    assert max(len(line) for line in lines) > 80
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    name = "a-schedule-with-a-long-name-for-the-pipe"
    made = invoke("--db", db, "schedule", "add", name, "--every", "3600", "--command", "/bin/true", "--json")
    assert made.exit_code == 0, made.output
    history = piped("--db", db, "history", "schedule", json.loads(made.stdout)["id"], cwd=tmp_path)
    assert any("(new) -> active" in line and f"{name} created" in line for line in history.splitlines()), history
    fired = invoke("--db", db, "schedule", "fire", name, "--json")  # fails (no working directory): a run to show
    run_id = json.loads(fired.stdout)[0]["id"]
    run = piped("--db", db, "runs", "show", run_id, cwd=tmp_path)
    assert any(line.split() == ["id", run_id] for line in run.splitlines()), run
    assert any(line.startswith("error_detail") and line.endswith("never uses the daemon's cwd")
               for line in run.splitlines()), run


# -- --json on every listing --------------------------------------------------------------------------------


def walk(command: typer.main.click.Command, path: str = ""):  # type: ignore[name-defined]
    """(path, command) for every command below ``command``."""
    group = typer.main.get_command(app) if not path else command
    ctx = typer.Context(group)
    for name in group.list_commands(ctx):
        sub = group.get_command(ctx, name)
        where = f"{path} {name}".strip()
        yield where, sub
        if hasattr(sub, "list_commands"):
            yield from walk(sub, where)


def test_every_listing_command_takes_json():
    """C13: every command that lists rows (named ls, attempts, dead-letters, runs, history; a group of
    commands is not one) has --json."""
    listings = {path: cmd for path, cmd in walk(typer.main.get_command(app))
                if path.split()[-1] in LISTING_NAMES and not hasattr(cmd, "list_commands")}
    assert set(listings) >= LISTINGS, LISTINGS - set(listings)
    for path, cmd in listings.items():
        assert any("--json" in p.opts for p in cmd.params), f"{path} has no --json"


def _seed(url: str) -> dict[str, str]:
    async def go() -> dict[str, str]:
        book = await open_book(url, clock=FakeClock(START))
        try:
            did = await enqueue_dispatch(book, kind="k", deliver_to="seat-1")
            sent = await send_notification(book, recipient="ops", content={"text": "a"}, mode="guaranteed",
                                           channels=["email"])
            return {"dispatch": did, "notification": sent.id}
        finally:
            await book.engine.dispose()

    return asyncio.run(go())


def test_each_listing_s_json_parses(tmp_path):
    """C13: the --json of each listing is JSON (history: one object per line) holding the seeded rows."""
    db = f"sqlite:///{tmp_path / 'json.db'}"
    ids = _seed(db)
    made = invoke("--db", db, "schedule", "add", "nightly", "--every", "60", "--command", "/bin/true", "--json")
    sid = json.loads(made.stdout)["id"]
    cases = {
        "lifecycle ls": [], "dispatch ls": [], "notify ls": [], "notify attempts": [ids["notification"]],
        "notify dead-letters": [], "schedule ls": [], "schedule runs": ["nightly"], "channels ls": [],
        "history": ["dispatch", ids["dispatch"]],
    }
    assert set(cases) == LISTINGS
    for path, extra in cases.items():
        done = invoke("--db", db, *path.split(), *extra, "--json")
        assert done.exit_code == 0, (path, done.output)
        parsed = ([json.loads(line) for line in done.stdout.splitlines()] if path == "history"
                  else json.loads(done.stdout))
        assert parsed is not None, path
    assert ids["dispatch"] in {r["id"] for r in json.loads(invoke("--db", db, "dispatch", "ls", "--json").stdout)}
    assert sid in {r["id"] for r in json.loads(invoke("--db", db, "schedule", "ls", "--json").stdout)}


# -- bulk changes ask first ---------------------------------------------------------------------------------


async def _counts(url: str) -> tuple[int, ...]:
    book = await open_book(url, create=False)
    try:
        async with book.read() as conn:
            tables = (dispatch_outbox, facts_table, notifications, notification_retention_runs)
            return tuple([await conn.scalar(sa.select(sa.func.count()).select_from(t)) for t in tables])
    finally:
        await book.engine.dispose()


def counts(url: str) -> tuple[int, ...]:
    """Rows of dispatch_outbox, facts, notifications and retention runs."""
    return asyncio.run(_counts(url))


async def _ok(_to: str, _payload: str) -> bool:
    return True


@pytest.fixture
def seeded(db_url, backend) -> str:
    """Two delivered dispatches and one pending notification, last changed in 2023, on either backend."""

    async def go() -> None:
        book = await open_book(db_url, clock=FakeClock(START))
        try:
            if backend == "postgres":
                await reset_schema(book.engine)
            for seat in ("seat-1", "seat-2"):
                await enqueue_dispatch(book, kind="k", deliver_to=seat)
            await deliver_due_dispatches(book, transport=CallableTransport(_ok))
            await send_notification(book, recipient="ops", content={"text": "a"}, mode="guaranteed",
                                    channels=["email"])
        finally:
            await book.engine.dispose()

    asyncio.run(go())
    return db_url


BULK = {
    "dispatch purge": ["dispatch", "purge", "--before", "2100-01-01"],
    "notify retain": ["notify", "retain", "--before", "2024-06-01T00:00:00Z", "--horizon", "7d"],
}


@pytest.mark.parametrize("command", sorted(BULK))
def test_a_bulk_change_without_a_terminal_or_yes_is_refused_and_writes_nothing(seeded, command):
    """C14: without --yes and with no terminal on standard input, a bulk change is one line, exit 2, and
    nothing is written (no row, no fact, no retention run)."""
    was = counts(seeded)
    done = invoke("--db", seeded, *BULK[command])
    assert done.exit_code == 2, done.output
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--yes" in lines[0] and lines[0].startswith("error: "), done.stderr
    assert counts(seeded) == was


@pytest.mark.parametrize("command", sorted(BULK))
def test_a_bulk_change_answered_no_writes_nothing(seeded, command, monkeypatch):
    """C14: on a terminal the command says what it will do and asks; 'n' changes nothing (exit 1)."""
    monkeypatch.setattr(cli_app, "stdin_is_terminal", lambda: True)
    was = counts(seeded)
    done = invoke("--db", seeded, *BULK[command], input="n\n")
    assert done.exit_code == 1, done.output
    assert "Go ahead?" in done.stderr and "nothing was changed" in done.stderr
    assert counts(seeded) == was


def test_dispatch_purge_names_what_it_will_purge_then_yes_proceeds(seeded, monkeypatch):
    """C14: the question names how many dispatches and which; 'y' purges them, --yes purges without asking."""
    monkeypatch.setattr(cli_app, "stdin_is_terminal", lambda: True)
    listed = json.loads(invoke("--db", seeded, "dispatch", "ls", "--json").stdout)
    done = invoke("--db", seeded, *BULK["dispatch purge"], input="y\n")
    assert done.exit_code == 0, done.output
    assert "purges 2 dispatch(es)" in done.stderr and all(r["id"] in done.stderr for r in listed)
    assert counts(seeded)[0] == 0
    monkeypatch.setattr(cli_app, "stdin_is_terminal", lambda: False)
    again = invoke("--db", seeded, *BULK["dispatch purge"], "--yes")
    assert again.exit_code == 0 and "purged 0" in again.stderr, again.output


def test_notify_retain_with_yes_proceeds_without_a_terminal(seeded):
    """C14: --yes runs the retention (its run is recorded) with no question."""
    was = counts(seeded)
    done = invoke("--db", seeded, *BULK["notify retain"], "--yes", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["dry_run"] is False and "Go ahead?" not in done.stderr
    assert counts(seeded)[3] == was[3] + 1
