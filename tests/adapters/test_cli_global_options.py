"""The global options (specs/cli.md C16): ``--db``, ``--app`` and ``--config`` before or after the command, at any
depth of a group; the two places typed differently are one error naming both; ``./statebook.toml`` is read when no
settings file is named, and said so on standard error only."""

from __future__ import annotations

import json
import sys
import textwrap
import uuid

import pytest
import typer
from typer.testing import CliRunner

from statebook.adapters.cli import app
from statebook.adapters.cli.app import COMMANDS
from statebook.adapters.cli import options
from statebook.adapters.cli.options import GLOBAL_OPTIONS

ENV = {"STATEBOOK_DB": None, "STATEBOOK_APP": None, "STATEBOOK_CONFIG": None, "STATEBOOK_DEBUG": None}

APP_SOURCE = '''
import sqlalchemy as sa

from statebook.lifecycle import Lifecycle, Registry, edges, managed_table

tickets = managed_table("opt_tickets", sa.Column("id", sa.String(32), primary_key=True), meta=sa.MetaData())
registry = Registry([Lifecycle(
    entity_type="ticket", table=tickets, statuses=("open", "closed"), initial={"open"}, terminal={"closed"},
    edges=edges("open", "closed"), reason_prefixes={"ticket"}, reasons={"ticket.open.created", "ticket.closed.fixed"},
)]).seal()
'''


def invoke(*args: str, **env: str | None):
    return CliRunner().invoke(app, list(args), env={**ENV, **env})


@pytest.fixture
def app_spec(tmp_path, monkeypatch) -> str:
    """``module:registry`` of a fresh application with one type, ``ticket``."""
    name = f"sbopt_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(APP_SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{name}:registry"
    sys.modules.pop(name, None)


@pytest.fixture
def db(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'opts.db'}"
    assert invoke("--db", url, "db", "upgrade").exit_code == 0
    return url


def one_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_db_before_or_after_the_command(db, tmp_path):
    """C16: `statebook --db X dispatch ls` and `statebook dispatch ls --db X` read the same database; a missing
    database after the command is refused as it is before it."""
    before, after = invoke("--db", db, "dispatch", "ls", "--json"), invoke("dispatch", "ls", "--db", db, "--json")
    assert (before.exit_code, after.exit_code) == (0, 0), (before.output, after.output)
    assert json.loads(before.stdout) == json.loads(after.stdout) == []
    missing = f"sqlite:///{tmp_path / 'nowhere.db'}"
    one_error(invoke("dispatch", "ls", "--db", missing), "nowhere.db", "does not exist")


def test_app_after_a_nested_command(app_spec):
    """C16: `statebook lifecycle ls --json --app mod:reg`, and `--app` between a group and its command."""
    for args in (["lifecycle", "ls", "--json", "--app", app_spec], ["lifecycle", "--app", app_spec, "ls", "--json"],
                 ["--app", app_spec, "lifecycle", "ls", "--json"]):
        shown = invoke(*args)
        assert shown.exit_code == 0, (args, shown.output)
        assert [row["type"] for row in json.loads(shown.stdout)] == ["ticket"], args


def test_config_after_the_command_is_read(tmp_path, db):
    """C16: `--config FILE` after a command that reads settings names the file it reads."""
    (tmp_path / "bad.toml").write_text("[nosuch]\nkey = 1\n")
    one_error(invoke("--db", db, "schedule", "add", "nightly", "--every", "3600", "--command", "/bin/true",
                     "--config", str(tmp_path / "bad.toml")), "nosuch", "bad.toml")


@pytest.mark.parametrize("args, fragments", [
    (["--db", "sqlite:///a.db", "dispatch", "ls", "--db", "sqlite:///b.db"],
     ["--db", "'sqlite:///a.db' after 'statebook'", "'sqlite:///b.db' after 'statebook dispatch ls'"]),
    (["lifecycle", "--app", "one:reg", "ls", "--app", "two:reg"],
     ["--app", "'one:reg' after 'statebook lifecycle'", "'two:reg' after 'statebook lifecycle ls'"]),
    (["--config", "a.toml", "run", "--config", "b.toml"],  # a command's own --config
     ["--config", "'a.toml' after 'statebook'", "'b.toml' after 'statebook run'"]),
    (["--app", "one:reg", "check", "--app", "two:reg"],  # check's own --app
     ["--app", "'one:reg' after 'statebook'", "'two:reg' after 'statebook check'"]),
])
def test_a_global_option_typed_twice_differently_is_one_error_naming_both(args, fragments):
    """C16: the two places disagree: one line naming both values and where each was typed, exit 2."""
    one_error(invoke(*args), *fragments)


def test_the_same_value_in_both_places_is_fine_and_the_command_line_beats_the_environment(db, tmp_path):
    """C16: the same value twice is no conflict; `$STATEBOOK_DB` is overridden by `--db` after the command."""
    assert invoke("--db", db, "dispatch", "ls", "--db", db, "--json").exit_code == 0
    elsewhere = f"sqlite:///{tmp_path / 'nowhere.db'}"
    assert invoke("dispatch", "ls", "--db", db, "--json", STATEBOOK_DB=elsewhere).exit_code == 0


def test_every_command_takes_the_global_options_after_its_name():
    """C16: every command and group of the tree accepts --db, --app and --config after its name (its own, or
    the global ones); their help says they may also come before."""
    root = typer.main.get_command(app)
    ctx = typer.Context(root)

    def walk(command, path):
        names = {name for param in command.params for name in getattr(param, "opts", ())}
        assert set(GLOBAL_OPTIONS) <= names, (path, set(GLOBAL_OPTIONS) - names)
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")

    for name in COMMANDS:
        walk(root.get_command(ctx, name), name)
    shown = invoke("dispatch", "ls", "--help")
    assert "--db" in shown.stdout and "may also come before the command" in shown.stdout


def test_statebook_toml_in_the_working_directory_is_read_and_named_on_stderr(tmp_path, monkeypatch):
    """C16: with no --config and no $STATEBOOK_CONFIG, ./statebook.toml is read and, on a terminal, one line on
    standard error names it; standard output stays the command's JSON. A file named by --config or
    $STATEBOOK_CONFIG is not announced; off a terminal nothing is (an error stays standard error's one line)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "statebook.toml").write_text('[notifications.webhook]\nurl = { env = "HOOK_URL" }\n'
                                             'secret = { env = "HOOK_SECRET" }\n')

    def configured(result) -> list[str]:
        assert result.exit_code == 0, result.output
        return [row["channel"] for row in json.loads(result.stdout)["channels"] if row["configured"]]

    piped = invoke("channels", "ls", "--json")
    assert configured(piped) == ["webhook"] and piped.stderr == ""
    monkeypatch.setattr(options, "stderr_is_terminal", lambda: True)
    shown = invoke("channels", "ls", "--json")
    assert configured(shown) == ["webhook"]
    assert shown.stderr.strip().splitlines() == ["statebook: settings read from ./statebook.toml (no --config given)"]
    (tmp_path / "other.toml").write_text("")
    for named in (invoke("--config", "other.toml", "channels", "ls", "--json"),
                  invoke("channels", "ls", "--json", STATEBOOK_CONFIG="other.toml")):
        assert configured(named) == [] and named.stderr == "", named.output


def test_the_settings_files_db_and_app_are_every_commands_defaults(tmp_path, monkeypatch, app_spec):
    """C16: the settings' ``db`` and ``app`` keys (./statebook.toml here) are what every command opens and loads
    when neither option nor $STATEBOOK_DB / $STATEBOOK_APP names one — `verify`, `lifecycle ls` and `check` as
    much as `run` (before: only the daemon and the channel commands read them, and `verify` looked for
    ./statebook.db). The file is read for these two keys alone, so a secret whose variable is unset does not stop
    a read; a value that is not text is one error naming the file."""
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'from-file.db'}"
    (tmp_path / "statebook.toml").write_text(
        f'db = "{url}"\napp = "{app_spec}"\n[notifications.webhook]\nurl = {{ env = "UNSET_HOOK_URL" }}\n'
        'secret = { env = "UNSET_HOOK_SECRET" }\n')
    assert invoke("db", "upgrade").exit_code == 0
    assert (tmp_path / "from-file.db").exists() and not (tmp_path / "statebook.db").exists()
    checked = invoke("verify", "--json")
    assert checked.exit_code == 0 and json.loads(checked.stdout)["ok"] is True, checked.output
    listed = invoke("lifecycle", "ls", "--json")
    assert [lc["type"] for lc in json.loads(listed.stdout)] == ["ticket"], listed.output
    assert invoke("check").exit_code == 0
    # The command line, then the environment, come first.
    elsewhere = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    one_error(invoke("--db", elsewhere, "verify"), "elsewhere.db", "does not exist")
    one_error(invoke("verify", STATEBOOK_DB=elsewhere), "elsewhere.db", "does not exist")
    (tmp_path / "statebook.toml").write_text("db = 3\n")
    one_error(invoke("history", "ticket", "t1"), "statebook.toml", "db is text")
    one_error(invoke("verify"), "statebook.toml", "db")
    (tmp_path / "statebook.toml").write_text("db = \n")
    one_error(invoke("history", "ticket", "t1"), "statebook.toml", "cannot read the settings")
