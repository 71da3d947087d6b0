"""The CLI's error funnel: every refusal is one line on stderr and a code from one table (specs/cli.md).

The regression cases of issue 10 that reach the command line, run in process with typer's runner on both
backends where a database is involved; each checks the exit code, the line, and that nothing was written.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from statebook.adapters.cli import app
from statebook.adapters.db import open_book, reset_schema
from statebook.lifecycle import FakeClock
from statebook.lifecycle.facts import facts_table
from statebook.outbox import CallableTransport, deliver_due_dispatches, dispatch_outbox, enqueue_dispatch
from statebook.scheduler.schema import schedules

runner = CliRunner()
START = 1_700_000_000.0


def invoke(*args: str, **env: str | None):
    return runner.invoke(app, list(args), env={"STATEBOOK_DB": None, "STATEBOOK_APP": None, "STATEBOOK_DEBUG": None,
                                               **env})


def assert_one_line(result, code: int, *fragments: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, f"{fragment!r} missing from {result.stderr!r}"


async def _counts(url: str) -> tuple[int, int, int]:
    book = await open_book(url, create=False)
    try:
        async with book.read() as conn:
            count = lambda t: conn.scalar(sa.select(sa.func.count()).select_from(t))  # noqa: E731
            return await count(dispatch_outbox), await count(schedules), await count(facts_table)
    finally:
        await book.engine.dispose()


def counts(url: str) -> tuple[int, int, int]:
    """Rows of dispatch_outbox and schedules, and facts (status_transitions)."""
    return asyncio.run(_counts(url))


async def _delivered(_deliver_to: str, _payload: str) -> bool:
    return True


@pytest.fixture
def seeded(db_url, backend) -> str:
    """A database on either backend holding two delivered dispatches, last changed in 2023."""

    async def go() -> None:
        book = await open_book(db_url, clock=FakeClock(START))
        try:
            if backend == "postgres":
                await reset_schema(book.engine)
            for seat in ("seat-1", "seat-2"):
                await enqueue_dispatch(book, kind="k", deliver_to=seat)
            await deliver_due_dispatches(book, transport=CallableTransport(_delivered))
        finally:
            await book.engine.dispose()

    asyncio.run(go())
    return db_url


# -- times, durations and counts: refused before any query (issue 10, case 1 and 2) -------------------


@pytest.mark.parametrize("before", ["nan", "inf", "-inf", "1e400", "-5", "0001-01-01T00:00:00Z"])
def test_purge_before_a_time_that_is_not_one_purges_nothing(seeded, before):
    """C3: `dispatch purge --before nan` (which purged every finished dispatch on PostgreSQL) is refused,
    the same on both backends, naming --before; no row or fact changes (dry run or not)."""
    was = counts(seeded)
    for extra in ((), ("--dry-run",)):
        assert_one_line(invoke("--db", seeded, "dispatch", "purge", "--before", before, *extra), 2, "--before")
    assert counts(seeded) == was


@pytest.mark.parametrize("at", ["nan", "inf", "1e400", "-1"])
def test_schedule_add_at_a_time_that_is_not_one_is_one_line(seeded, at):
    """C3, C4: `schedule add x --at nan|inf|1e400` was a ValueError traceback; now exit 2 naming --at."""
    was = counts(seeded)
    assert_one_line(invoke("--db", seeded, "schedule", "add", "x", "--at", at, "--command", "/bin/true"), 2, "--at")
    assert counts(seeded) == was


@pytest.mark.parametrize("option, value", [("--every", "99999999999"), ("--every", "0"), ("--max-runs", "2147483648"),
                                           ("--budget-usd", "nan"), ("--budget-tokens", "-1")])
def test_schedule_add_counts_out_of_range_are_refused_alike(seeded, option, value):
    """C3: `schedule add --every 99999999999` was accepted on SQLite and a database error on PostgreSQL."""
    was = counts(seeded)
    args = ["schedule", "add", "x", "--command", "/bin/true", option, value]
    if option != "--every":
        args += ["--every", "60"]
    result = invoke("--db", seeded, *args)
    assert_one_line(result, 2)
    assert option in result.stderr or option.lstrip("-").replace("-", "_") in result.stderr
    assert counts(seeded) == was


def test_a_cron_without_a_fire_time_is_one_line(seeded):
    """C4: `schedule add x --cron '0 0 31 2 *'` was a CroniterBadDateError traceback; now one line, exit 2."""
    was = counts(seeded)
    assert_one_line(invoke("--db", seeded, "schedule", "add", "x", "--cron", "0 0 31 2 *", "--command", "/bin/true"), 2)
    assert counts(seeded) == was


@pytest.mark.parametrize("args", [["dispatch", "ls", "--limit", "99999999999999999999"],
                                  ["schedule", "runs", "x", "--limit", "0"], ["run", "--for", "nan"],
                                  ["replay", "dispatch", "x", "--as-of", "inf"]])
def test_other_counts_and_times_are_refused(seeded, args):
    """C3: --limit, --for and --as-of follow the API's rules (inputs.integer/duration/timestamp)."""
    was = counts(seeded)
    assert_one_line(invoke("--db", seeded, *args), 2, args[-2])
    assert counts(seeded) == was


# -- configuration (case 2) ------------------------------------------------------------------------------


def test_log_level_that_is_not_one_is_one_line(tmp_path):
    """C4: `run --log-level LOUD` was a ValueError traceback."""
    assert_one_line(invoke("--db", str(tmp_path / "x.db"), "run", "--log-level", "LOUD", "--for", "0"), 2,
                    "--log-level", "LOUD", "INFO")


@pytest.mark.parametrize("case", ["missing", "not_toml", "unknown_key", "unknown_section", "bad_value", "env_value",
                                  "env_section"])
def test_every_settings_error_is_one_line_exit_2(tmp_path, case):
    """C2, C4: settings errors, which loaded outside the funnel, are one line and exit 2 — for `run`, `schedule
    fire` and `dispatch deliver` alike; nothing is created."""
    config = tmp_path / "s.toml"
    env: dict[str, str] = {}
    body = {"not_toml": "[scheduler\n", "unknown_key": "[scheduler]\ntick_secs = 5\n",
            "unknown_section": "[schedulerx]\ntick_seconds = 5\n", "bad_value": "[scheduler]\ntick_seconds = -1\n"}
    if case in body:
        config.write_text(body[case])
    elif case != "missing":
        config.write_text("")
        env = {"env_value": {"STATEBOOK_SCHEDULER__TICK_SECONDS": "abc"},
               "env_section": {"STATEBOOK_SCHEDULERX__TICK_SECONDS": "5"}}[case]
    fragment = {"missing": "does not exist", "not_toml": "not valid TOML", "unknown_key": "did you mean 'tick_seconds'",
                "unknown_section": "did you mean 'scheduler'", "bad_value": "scheduler.tick_seconds",
                "env_value": "scheduler.tick_seconds", "env_section": "did you mean 'scheduler'"}[case]
    db = tmp_path / "none.db"
    for args in (["run", "--config", str(config), "--for", "0"], ["schedule", "fire", "x", "--config", str(config)],
                 ["dispatch", "deliver", "--once", "--config", str(config)]):
        assert_one_line(invoke("--db", str(db), *args, **env), 2, fragment)
    assert not db.exists()


def test_postgres_without_asyncpg_says_what_to_install(monkeypatch):
    """C4: a PostgreSQL URL without asyncpg installed was an ImportError traceback."""
    monkeypatch.setitem(sys.modules, "asyncpg", None)
    assert_one_line(invoke("--db", "postgresql://ann:s3cret@localhost/x", "verify"), 2, "statebook[postgres]")


def test_an_unreachable_database_is_one_masked_line():
    """C7: a database that cannot be reached is "database error: ..." in one line, exit 2, password masked."""
    result = invoke("--db", "postgresql://ann:s3cret@127.0.0.1:1/x", "verify")
    assert_one_line(result, 2, "database error")
    assert "s3cret" not in result.output


def test_a_time_of_5000_digits_is_one_short_line(tmp_path):
    """C3 (issue 25): a time typed as 5,000 digits is refused in one line that does not echo them all."""
    db = f"sqlite:///{tmp_path / 'long.db'}"
    for args in (("dispatch", "purge", "--before", "1" + "0" * 5000, "--yes"),
                 ("dispatch", "purge", "--before", "x" * 5000, "--yes")):
        result = invoke("--db", db, *args)
        assert_one_line(result, 2, "--before")
        assert len(result.stderr) < 300, len(result.stderr)


def test_a_sqlite_path_that_is_a_directory_is_named(tmp_path):
    """C7b: a SQLite path naming a directory is one line naming the path and saying it is a directory (not
    SQLite's "unable to open database file"), exit 2, and nothing is created in the directory."""
    folder = tmp_path / "data"
    folder.mkdir()
    for url in (str(folder), f"sqlite:///{folder}"):
        for args in (("dispatch", "ls"), ("db", "upgrade"), ("verify",)):
            result = invoke("--db", url, *args)
            assert_one_line(result, 2, str(folder), "is a directory")
            assert "unable to open" not in result.stderr
    assert list(folder.iterdir()) == []


def test_a_refused_postgres_connection_names_the_host_and_port():
    """C7b: a PostgreSQL server that refuses the connection (or a host that does not resolve) is one line
    naming the host and port the URL gave, never the password, exit 2."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for host in ("127.0.0.1", "localhost"):
        result = invoke("--db", f"postgresql://ann:s3cret@{host}:{port}/books", "dispatch", "ls")
        assert_one_line(result, 2, "database error", f"{host}:{port}", "refused")
        assert "s3cret" not in result.output
    result = invoke("--db", "postgresql://ann:s3cret@db.invalid/books", "verify")
    assert_one_line(result, 2, "database error", "db.invalid:5432")
    assert "s3cret" not in result.output


def test_urls_and_tokens_are_masked():
    """C6: a password in any echoed URL, and token=/password= values, never reach the line."""
    from statebook.adapters.masking import mask

    assert mask("malformed database URL 'postgresql://ann:s3cret@db:5432/x'") == \
        "malformed database URL 'postgresql://ann:***@db:5432/x'"
    assert "hunter2" not in mask("GET https://h/x?token=hunter2&a=1")
    assert mask("sqlite:///./statebook.db") == "sqlite:///./statebook.db"
    result = invoke("--db", "mysql://ann:s3cret@db/x", "verify")
    assert_one_line(result, 2, "unsupported database")
    assert "s3cret" not in result.output


# -- exit codes (case 4) ---------------------------------------------------------------------------------


def test_a_failed_manual_run_exits_1(tmp_path):
    """C5: `schedule fire` whose run ends failed (missing_cwd) exited 0; now 1, with one line naming the run."""
    db = f"sqlite:///{tmp_path / 'f.db'}"
    made = invoke("--db", db, "schedule", "add", "f", "--every", "60", "--command", "/bin/true",
                  "--cwd", str(tmp_path / "no_such_dir"))
    assert made.exit_code == 0, made.output
    result = invoke("--db", db, "schedule", "fire", "f")
    assert_one_line(result, 1, "ended failed", "missing_cwd")
    assert "failed" in result.stdout


def test_retry_in_a_wrong_state_exits_2(seeded):
    """C5: `dispatch retry` of a delivered dispatch exited 1; a wrong state is refused input, exit 2."""
    with_url = seeded
    ids = asyncio.run(_ids(with_url))
    was = counts(with_url)
    assert_one_line(invoke("--db", with_url, "dispatch", "retry", ids[0]), 2, "only dead_letter or expired")
    assert counts(with_url) == was


async def _ids(url: str) -> list[str]:
    book = await open_book(url, create=False)
    try:
        async with book.read() as conn:
            return list((await conn.execute(sa.select(dispatch_outbox.c.id).order_by(dispatch_outbox.c.id))).scalars())
    finally:
        await book.engine.dispose()


# -- the funnel itself (case 5 and 7) --------------------------------------------------------------------


def _explode(*_args, **_kwargs):
    raise RuntimeError("boom\nsecond line postgresql://u:pw@h/db")


def test_a_bug_is_one_line_and_debug_shows_the_traceback(tmp_path, monkeypatch):
    """C6: an unexpected exception is "internal error: <Type>: <msg> (run with --debug ...)", exit 1;
    --debug or STATEBOOK_DEBUG=1 prints the traceback as well, with the same exit code."""
    import statebook.adapters.cli.lifecycle as lifecycle_cli

    monkeypatch.setattr(lifecycle_cli, "verify", _explode)
    db = tmp_path / "b.db"
    assert invoke("--db", str(db), "db", "upgrade").exit_code == 0  # an empty file is refused (specs/migrations.md M1)
    result = invoke("--db", str(db), "verify")
    assert_one_line(result, 1, "internal error: RuntimeError: boom", "--debug")
    assert "pw@" not in result.stderr
    for args, env in ((["--debug"], {}), ([], {"STATEBOOK_DEBUG": "1"})):
        loud = invoke(*args, "--db", str(db), "verify", **env)
        assert loud.exit_code == 1
        assert "Traceback" in loud.stderr and "RuntimeError: boom" in loud.stderr


def test_an_interrupt_exits_130(tmp_path, monkeypatch):
    """C7: Ctrl-C (KeyboardInterrupt) in a command exits 130 with one line."""
    import statebook.adapters.cli.lifecycle as lifecycle_cli

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(lifecycle_cli, "verify", interrupted)
    db = tmp_path / "i.db"
    assert invoke("--db", str(db), "db", "upgrade").exit_code == 0
    assert_one_line(invoke("--db", str(db), "verify"), 130, "interrupted")


def test_usage_errors_and_unknown_entities_exit_2(tmp_path):
    """C4, C5, C7: a bad option, an unknown command or option (typer's usage errors: its box was 5-19 lines)
    and an unknown entity are one line, exit 2."""
    assert_one_line(invoke("dispatch", "ls", "--limit", "many"), 2, "'--limit'", "see 'statebook dispatch ls --help'")
    assert_one_line(invoke("nosuch"), 2, "No such command 'nosuch'", "see 'statebook --help'")
    assert_one_line(invoke("--bogus"), 2, "--bogus")
    assert_one_line(invoke("schedule", "runs"), 2, "see 'statebook schedule runs --help'")  # a missing argument
    db = f"sqlite:///{tmp_path / 'u.db'}"
    invoke("--db", db, "schedule", "add", "u", "--every", "60", "--command", "/bin/true")
    assert_one_line(invoke("--db", db, "schedule", "show", "nope"), 2)
    assert_one_line(invoke("--db", str(tmp_path / "missing.db"), "verify"), 2, "does not exist")


# -- damaged history (case 6) ----------------------------------------------------------------------------


def _schedule_with_history(tmp_path) -> tuple[str, str]:
    path = tmp_path / "h.db"
    db = f"sqlite:///{path}"
    made = invoke("--db", db, "schedule", "add", "h", "--every", "60", "--command", "/bin/true", "--json")
    assert made.exit_code == 0, made.output
    invoke("--db", db, "schedule", "disable", "h")
    invoke("--db", db, "schedule", "enable", "h")
    with sqlite3.connect(path) as conn:
        (entity_id,) = conn.execute("SELECT id FROM schedules").fetchone()
    return str(path), entity_id


@pytest.mark.parametrize("damage", ["invalid_json", "missing_fact"])
def test_replay_and_history_of_damaged_history_are_a_finding(tmp_path, damage):
    """C8: replay and history on damaged history (a fact's JSON made invalid, a middle fact deleted) printed a
    traceback or a state folded over the gap; now one line, exit 1 (a finding), and replay prints no state."""
    path, entity_id = _schedule_with_history(tmp_path)
    with sqlite3.connect(path) as conn:
        if damage == "invalid_json":
            conn.execute("UPDATE status_transitions SET patch = '{not json' WHERE version = 2")
        else:
            conn.execute("DELETE FROM status_transitions WHERE version = 2")
    replay = invoke("--db", path, "replay", "schedule", entity_id)
    assert_one_line(replay, 1, "damaged", "statebook verify")
    assert replay.stdout == ""
    assert_one_line(invoke("--db", path, "history", "schedule", entity_id), 1, "damaged")
    assert invoke("--db", path, "verify").exit_code == 1
