"""``--app module:attr``: the CLI, the daemon and ``verify`` load the application's registry.

A tiny application module is written to ``tmp_path`` and put on ``sys.path``; the commands then work
on its own entity type. Bad ``--app`` values are one-line errors with a non-zero exit.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sqlite3
import sys
import textwrap
import uuid

import pytest
from typer.testing import CliRunner

from statebook.adapters.cli import app
from statebook.adapters.db import open_book
from statebook.adapters.errors import ConfigError
from statebook.adapters.registry import load_registry
from statebook.adapters.settings import load_settings
from statebook.lifecycle import Actor, FakeClock, Reason, Registry, create, transition

runner = CliRunner()
START = 1_700_000_000.0

APP_SOURCE = '''
import sqlalchemy as sa

from statebook.adapters.registry import builtin_registry
from statebook.lifecycle import Lifecycle, Registry, edges, managed_table

META = sa.MetaData()
tickets = managed_table(
    "app_tickets",
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("title", sa.Text, nullable=False),
    meta=META,
)
TICKET = Lifecycle(
    entity_type="ticket",
    table=tickets,
    statuses=("open", "closed"),
    initial={"open"},
    terminal={"closed"},
    edges=edges("open", "closed"),
    reason_prefixes={"ticket"},
    reasons={"ticket.open.created", "ticket.closed.fixed"},
)
registry = builtin_registry(seal=False)
registry.register(TICKET)
registry.seal()


def make_registry():
    return registry


only_tickets = Registry([TICKET]).seal()
not_a_registry = 42


def broken():
    raise RuntimeError("no registry today")
'''


@pytest.fixture
def app_module(tmp_path, monkeypatch) -> str:
    """The name of a fresh application module importable from ``sys.path``."""
    name = f"sbapp_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / f"{name}.py").write_text(textwrap.dedent(APP_SOURCE))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delenv("STATEBOOK_APP", raising=False)
    yield name
    sys.modules.pop(name, None)


async def _seed(url: str, registry: Registry) -> str:
    clock = FakeClock(START)
    book = await open_book(url, registry=registry, clock=clock)
    try:
        made = await create(book, "ticket", values={"title": "printer on fire"}, status="open",
                            reason=Reason("ticket.open.created"), actor=Actor("user", "ann"))
        clock.advance(5)
        await transition(book, "ticket", made.entity_id, "closed", expected="open",
                         reason=Reason("ticket.closed.fixed"), actor=Actor("user", "ann"))
        return made.entity_id
    finally:
        await book.engine.dispose()


@pytest.fixture
def seeded(tmp_path, app_module):
    path = tmp_path / "app.db"
    registry = importlib.import_module(app_module).registry
    return path, asyncio.run(_seed(f"sqlite:///{path}", registry))


def invoke(*args: str, **env: str | None):
    return runner.invoke(app, list(args), env={"STATEBOOK_DB": None, "STATEBOOK_APP": None, **env})


def assert_one_line_error(result, *fragments: str) -> None:
    assert result.exit_code not in (0, None), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, f"{fragment!r} missing from {result.stderr!r}"


# -- the application's types, through every command ------------------------------------------


def test_lifecycle_commands_show_the_applications_types(app_module):
    """L19: `lifecycle ls/show/graph` list the --app registry's lifecycles, not just the built-ins."""
    spec = f"{app_module}:registry"
    ls = invoke("--app", spec, "lifecycle", "ls")
    assert ls.exit_code == 0, ls.output
    assert " ticket " in ls.stdout and " app_tickets " in ls.stdout and " dispatch " in ls.stdout
    show = invoke("--app", spec, "lifecycle", "show", "ticket")
    assert show.exit_code == 0, show.output
    assert "ticket.closed.fixed" in show.stdout
    graph = invoke("--app", spec, "lifecycle", "graph", "ticket", "--format", "text")
    assert graph.exit_code == 0 and "-> closed" in graph.stdout
    # Without --app the type is unknown, and the error says how to name the application.
    assert_one_line_error(invoke("lifecycle", "show", "ticket"), "'ticket'", "need --app module:attr")
    assert "need --app" not in invoke("--app", spec, "lifecycle", "show", "nope").stderr


@pytest.mark.parametrize("how", ["option", "short_option", "environment", "callable"])
def test_history_and_replay_read_the_applications_entities(seeded, app_module, how):
    """L19: `history` and `replay` work on the application's entity type; STATEBOOK_APP and a callable work too."""
    path, ticket_id = seeded
    spec = f"{app_module}:{'make_registry' if how == 'callable' else 'registry'}"
    prefix = {"option": ["--app", spec], "short_option": ["-a", spec], "callable": ["--app", spec]}.get(how, [])
    env = {"STATEBOOK_APP": spec} if how == "environment" else {}
    history = invoke(*prefix, "--db", str(path), "history", "ticket", ticket_id, "--json", **env)
    assert history.exit_code == 0, history.output
    facts = [json.loads(line) for line in history.stdout.splitlines()]
    assert [f["status"] for f in facts] == ["open", "closed"]
    state = json.loads(invoke(*prefix, "--db", str(path), "replay", "ticket", ticket_id, **env).stdout)
    assert state["status"] == "closed" and state["title"] == "printer on fire"


def test_history_of_an_application_type_without_app_says_so(seeded):
    """L19: reading an application's entity without --app is a one-line error pointing at --app."""
    path, ticket_id = seeded
    assert_one_line_error(invoke("--db", str(path), "history", "ticket", ticket_id), "'ticket'", "--app module:attr")


def test_verify_checks_the_applications_rows(seeded, app_module):
    """L19: `verify --app` counts the application's facts and finds a tampered row of its type."""
    path, ticket_id = seeded
    spec = f"{app_module}:registry"
    clean = invoke("--app", spec, "--db", str(path), "verify", "--json")
    assert clean.exit_code == 0, clean.output
    assert json.loads(clean.stdout)["facts"] >= 2
    with sqlite3.connect(path) as db:
        db.execute("UPDATE app_tickets SET title = 'nothing happened' WHERE id = ?", (ticket_id,))
    tampered = invoke("--app", spec, "--db", str(path), "verify", "--json")
    assert tampered.exit_code == 1, tampered.output
    findings = json.loads(tampered.stdout)["findings"]
    assert any(f["entity_type"] == "ticket" and f["entity_id"] == ticket_id for f in findings), findings


# -- bad values --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "attr, fragments",
    [
        ("NOCOLON", ["must be module:attr", "myapp.lifecycles:registry"]),
        ("MOD:", ["must be module:attr"]),
        ("sbapp_missing_module_xyz:registry", ["no module named 'sbapp_missing_module_xyz'", "PYTHONPATH"]),
        ("MOD:nothing", ["has no attribute 'nothing'", "registries it defines: only_tickets, registry"]),
        ("MOD:not_a_registry", ["is a int, not a statebook Registry"]),
        ("MOD:broken", ["calling broken() failed: RuntimeError: no registry today"]),
    ],
    ids=["no_colon", "no_attr", "missing_module", "missing_attr", "wrong_type", "callable_fails"],
)
def test_a_bad_app_is_a_one_line_error(app_module, attr, fragments):
    """L19: every bad --app value exits non-zero with one line saying what was wrong and what would be right."""
    spec = attr.replace("NOCOLON", app_module).replace("MOD", app_module)
    for args in (("lifecycle", "ls"), ("verify",)):
        assert_one_line_error(invoke("--app", spec, "--db", "/nonexistent/x.db", *args), *fragments)
    with pytest.raises(ConfigError):
        load_registry(spec)


def test_an_app_module_that_fails_at_import_is_named(tmp_path, monkeypatch):
    """L19: a declaration refused while the module registers it is reported as the module's failure, in one line."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "sbapp_refused.py").write_text(
        "from statebook.adapters.registry import builtin_registry\n"
        "from statebook.outbox import DISPATCH\n"
        "registry = builtin_registry(seal=False)\n"
        "registry.register(DISPATCH)\n"
    )
    try:
        assert_one_line_error(invoke("--app", "sbapp_refused:registry", "lifecycle", "ls"),
                              "importing 'sbapp_refused' failed", "already registered")
    finally:
        sys.modules.pop("sbapp_refused", None)


# -- settings and the daemon -------------------------------------------------------------------


def test_the_settings_key_and_environment_name_the_app(tmp_path, app_module):
    """L19: `app = "module:attr"` in the TOML; STATEBOOK_APP overrides it; a malformed value is a ConfigError."""
    toml = tmp_path / "s.toml"
    toml.write_text(f'app = "{app_module}:registry"\n')
    assert load_settings(toml, environ={}).app == f"{app_module}:registry"
    assert load_settings(toml, environ={"STATEBOOK_APP": "other:reg"}).app == "other:reg"
    toml.write_text('app = "no_colon_here"\n')
    with pytest.raises(ConfigError, match="app must be module:attr"):
        load_settings(toml, environ={})


def test_dispatch_deliver_loads_the_settings_app(tmp_path, app_module):
    """L19: `dispatch deliver` opens its book on the app the settings name (a wrong one is a one-line error)."""
    db = tmp_path / "d.db"
    toml = tmp_path / "s.toml"
    toml.write_text(f'db = "sqlite:///{db}"\napp = "{app_module}:not_a_registry"\n')
    assert_one_line_error(invoke("dispatch", "deliver", "--once", "--config", str(toml)), "not a statebook Registry")
    toml.write_text(f'db = "sqlite:///{db}"\napp = "{app_module}:registry"\n'
                    '[dispatch]\nnotify_template = ["/bin/true", "{deliver_to}"]\n')  # deliver needs a transport
    db.touch()
    ok = invoke("dispatch", "deliver", "--once", "--config", str(toml))
    assert ok.exit_code == 0, ok.output
    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "app_tickets" in tables, "the book was opened on the application's registry"


def test_the_daemon_loads_the_app_and_needs_the_builtins(tmp_path, app_module):
    """L19: `run` loads the app registry (--app or the settings key); one without the built-ins is refused in one line."""
    toml = tmp_path / "s.toml"
    toml.write_text(f'db = "sqlite:///{tmp_path / "r.db"}"\napp = "{app_module}:only_tickets"\n')
    assert_one_line_error(invoke("run", "--config", str(toml), "--for", "0.1"),
                          "the daemon drives dispatch, schedule, schedule_run", "lacks", "builtin_registry(seal=False)")
    assert_one_line_error(invoke("--app", f"{app_module}:nothing", "run", "--config", str(toml), "--for", "0.1"),
                          "has no attribute 'nothing'")


def test_the_daemon_runs_the_applications_registry(tmp_path, app_module):
    """L19: `run` with the settings' app key opens its book on that registry (its tables exist, verify is ok)."""
    db = tmp_path / "r.db"
    toml = tmp_path / "s.toml"
    toml.write_text(f'db = "sqlite:///{db}"\napp = "{app_module}:registry"\n')
    result = invoke("run", "--config", str(toml), "--for", "0.2")
    assert result.exit_code == 0, result.output
    assert "verify ok" in result.stdout
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'app_tickets'").fetchone() == (1,)
