"""A light install (issue 27): the core imports no extra's library, the CLI runs on SQLite without any extra,
and a feature whose extra is missing is one line naming ``pip install 'statebook[EXTRA]'`` (exit 2).

Each check runs in a fresh interpreter. A missing extra is simulated by a ``sitecustomize`` on the child's
``PYTHONPATH`` that puts ``None`` in ``sys.modules`` for the hidden modules, so importing one fails as if it
were not installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from statebook.adapters.extras import EXTRAS, MissingExtra, require
from statebook.lifecycle import StatebookError

ROOT = Path(__file__).resolve().parent.parent
EXTRA_MODULES = sorted({m for modules in EXTRAS.values() for m in modules})
CORE = ("statebook.lifecycle", "statebook.outbox", "statebook.outbox.notifications", "statebook.scheduler",
        "statebook.adapters.db", "statebook.adapters.cli", "statebook.adapters.daemon")
HIDE = """import os, sys
for name in os.environ["STATEBOOK_TEST_HIDE"].split(","):
    sys.modules[name] = None
"""


def child_env(tmp_path: Path, hidden: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """The environment of a child without statebook settings, hiding ``hidden`` modules."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STATEBOOK_", "PYTHON"))}
    env["APPRISE_URLS"] = "json://127.0.0.1:9/hook"  # read before the channel is built (never sent to)
    if hidden:
        shim = tmp_path / "shim"
        shim.mkdir(exist_ok=True)
        (shim / "sitecustomize.py").write_text(HIDE)
        env |= {"PYTHONPATH": str(shim), "STATEBOOK_TEST_HIDE": ",".join(hidden)}
    return env


def statebook(tmp_path: Path, *args: str, hidden: list[str] | tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "statebook", *args], cwd=tmp_path, env=child_env(tmp_path, hidden),
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("module", CORE)
def test_a_core_import_loads_no_extra(tmp_path, module):
    code = (f"import importlib, sys; importlib.import_module({module!r}); "
            f"print(','.join(m for m in {EXTRA_MODULES!r} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=child_env(tmp_path), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"importing {module} loaded {result.stdout.strip()}"


STARTUP_HEAVY = ("sqlalchemy.ext.asyncio", "sqlalchemy.orm", "pydantic", "pydantic_settings", "rich", "alembic", "yaml",
                 "aiosqlite", "asyncpg", "typer")
"""What a start that does not need them must not import: the ORM sqlalchemy.ext.asyncio pulls in, settings,
rich, migrations, YAML, the database drivers, the command line."""
LIGHT = {
    "statebook.lifecycle": STARTUP_HEAVY,
    "statebook.adapters.cli": tuple(m for m in STARTUP_HEAVY if m != "typer") + ("sqlalchemy", "statebook.lifecycle"),
}
"""Module -> what importing it alone must not import (issue 30: the CLI's entry point and the core start light)."""


@pytest.mark.parametrize("module", sorted(LIGHT))
def test_the_core_and_the_cli_entry_point_import_no_heavy_module(tmp_path, module):
    """specs/cli.md C10: ``import statebook.lifecycle`` and the console script's module load none of LIGHT's names."""
    code = (f"import importlib, sys; importlib.import_module({module!r}); "
            f"print(','.join(sorted(m for m in sys.modules if m.startswith({LIGHT[module]!r}))))")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=child_env(tmp_path), capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"importing {module} loaded {result.stdout.strip()}"


def test_the_cli_runs_on_sqlite_without_any_extra(tmp_path):
    db = f"sqlite:///{tmp_path / 'light.db'}"
    for args in (["--help"], ["--db", db, "lifecycle", "ls"], ["--db", db, "db", "upgrade"], ["--db", db, "verify"],
                 ["--db", db, "dispatch", "ls"], ["--db", db, "export", "--bundle", str(tmp_path / "bundle")],
                 ["audit", "verify", str(tmp_path / "bundle")]):
        result = statebook(tmp_path, *args, hidden=EXTRA_MODULES)
        assert result.returncode == 0, (args, result.stdout, result.stderr)


UNTRACED = """import asyncio, sys, tempfile
from statebook.adapters.db import open_book
from statebook.lifecycle import tracing
from statebook.outbox import CallableTransport, TransportResult, deliver_due_dispatches, enqueue_dispatch

async def ok(deliver_to, payload):
    return TransportResult(True)

async def main():
    book = await open_book(f"sqlite:///{tempfile.mkdtemp()}/t.db")
    await enqueue_dispatch(book, kind="k", deliver_to="seat")
    counts = await deliver_due_dispatches(book, transport=CallableTransport(ok))
    await book.engine.dispose()
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry" and sys.modules[m] is not None)
    print(counts["delivered"], tracing.active(), loaded)

asyncio.run(main())
"""


@pytest.mark.parametrize("hidden", [(), ("opentelemetry",)], ids=["otel-installed", "otel-missing"])
def test_an_enqueue_and_its_delivery_import_no_opentelemetry_unless_tracing_is_enabled(tmp_path, hidden):
    """Tracing is off by default: the hot paths read the port's empty slot and never import the otel extra."""
    result = subprocess.run([sys.executable, "-c", UNTRACED], cwd=tmp_path, env=child_env(tmp_path, hidden),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1 None []", result.stdout


SECTIONS = {
    "slack": '[notifications.slack]\nwebhook_url = { env = "SLACK_WEBHOOK_URL" }\n',
    "email": '[notifications.email]\nhost = "smtp.example.org"\nsender = "a@example.org"\nto = "{recipient}@example.org"\n',
    "websocket": '[notifications.websocket]\nport = 8765\ntokens = { env = "WS_TOKENS" }\n',
    "apprise": '[notifications.apprise]\nurls = { env = "APPRISE_URLS" }\n',
    "tracing": "[tracing]\nenabled = true\n",
}


def test_a_command_that_sends_nothing_runs_beside_a_channel_whose_extra_is_missing(tmp_path):
    """The settings load without the channel's library; only using the channel asks for the extra."""
    (tmp_path / "statebook.toml").write_text(SECTIONS["slack"] + SECTIONS["email"] + SECTIONS["websocket"])
    db = f"sqlite:///{tmp_path / 'x.db'}"
    for args in (["db", "upgrade"], ["verify"], ["dispatch", "ls"]):
        result = statebook(tmp_path, "--db", db, *args, hidden=EXTRA_MODULES)
        assert result.returncode == 0, (args, result.stdout, result.stderr)


# case: (extra, hidden module, the settings section written to statebook.toml or None, argv, a word of the feature)
MISSING = {
    "postgres": ("postgres", "asyncpg", None, ["--db", "postgresql://ann:s3cret@localhost/x", "verify"], "postgresql"),
    "channels-slack": ("channels", "httpx", "slack", ["channels", "ls"], "Slack"),
    "channels-slack-run": ("channels", "httpx", "slack", ["run", "--for", "0"], "Slack"),
    "channels-email": ("channels", "aiosmtplib", "email", ["channels", "ls"], "email"),
    "channels-websocket": ("channels", "websockets", "websocket", ["channels", "ls"], "WebSocket"),
    "metrics": ("metrics", "prometheus_client", None, ["run", "--for", "0", "--metrics-port", "0"], "--metrics-port"),
    "audit-keygen": ("audit", "cryptography", None, ["checkpoint", "keygen", "--out", "key.pem"], "keygen"),
    "audit-sign": ("audit", "cryptography", None, ["checkpoint", "--sign", "key.pem"], "--sign"),
    "apprise": ("apprise", "apprise", "apprise", ["channels", "test", "apprise", "--to", "ops"], "apprise"),
    "otel": ("otel", "opentelemetry", "tracing", ["run", "--for", "0"], "tracing"),
}
NEEDS_DB = {"audit-sign"}


@pytest.mark.parametrize("case", sorted(MISSING))
def test_a_missing_extra_is_one_line_naming_the_pip_command(tmp_path, case):
    extra, hidden, section, args, feature = MISSING[case]
    if section:
        (tmp_path / "statebook.toml").write_text(SECTIONS[section])
    (tmp_path / "key.pem").write_text("not read: the extra is checked first\n")
    db = f"sqlite:///{tmp_path / 'x.db'}"
    if case in NEEDS_DB:
        assert statebook(tmp_path, "--db", db, "db", "upgrade").returncode == 0
    result = statebook(tmp_path, "--db", db, *args, hidden=[hidden])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert f"pip install 'statebook[{extra}]'" in lines[0] and feature in lines[0], lines[0]


def test_require_returns_the_module_or_names_the_extra():
    assert require("json", extra="metrics", feature="a test").__name__ == "json"
    with pytest.raises(MissingExtra) as caught:
        require("statebook_no_such_module", extra="audit", feature="signing (--sign)")
    assert isinstance(caught.value, StatebookError) and isinstance(caught.value, ImportError)
    assert str(caught.value) == ("signing (--sign): the 'audit' extra is not installed (no module "
                                 "statebook_no_such_module): pip install 'statebook[audit]'")
    with pytest.raises(ValueError, match="unknown extra 'graphs'"):
        require("json", extra="graphs", feature="a test")


def test_the_extras_are_the_ones_pyproject_declares():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRAS) <= set(declared)
    assert declared["all"] == [f"statebook[{','.join(EXTRAS)}]"]
    assert "statebook[all]" in declared["test"]


def test_channels_ls_prints_the_pip_command_of_a_missing_extra_as_written(tmp_path):
    """The table's cell is text: rich must not read ``[apprise]`` in ``statebook[apprise]`` as markup."""
    (tmp_path / "statebook.toml").write_text(SECTIONS["apprise"])
    result = statebook(tmp_path, "--db", f"sqlite:///{tmp_path / 'x.db'}", "channels", "ls", hidden=["apprise"])
    assert result.returncode == 0, result.stderr
    assert "statebook[apprise]" in "".join(result.stdout.split()), result.stdout
