"""The CLI surface (S11) and the example daemon end to end (S12)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from statebook.adapters.cli import app

ROOT = Path(__file__).resolve().parents[2]


def cli(db: str, *args: str):
    result = CliRunner().invoke(app, ["--db", db, *args])
    return result


def test_schedule_commands_round_trip(tmp_path):
    """S11: add, ls, show, disable, enable, fire (in-process, waits), runs, runs show, rm — with --json."""
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    r = cli(db, "schedule", "add", "greet", "--every", "60", "--command", sys.executable, "--arg", "-c",
            "--arg", "print('hi')", "--cwd", str(tmp_path), "--notify-kind", "run_ended", "--notify-to", "ops", "--json")
    assert r.exit_code == 0, r.output
    created = json.loads(r.output)
    assert created["status"] == "active" and created["notify"] == {"kind": "run_ended", "deliver_to": "ops"}
    assert "greet" in cli(db, "schedule", "ls").output
    assert json.loads(cli(db, "schedule", "disable", "greet", "--json").output)["status"] == "paused"
    assert json.loads(cli(db, "schedule", "enable", "greet", "--json").output)["status"] == "active"
    fired = cli(db, "schedule", "fire", "greet", "--json")
    assert fired.exit_code == 0, fired.output
    runs = json.loads(fired.output)
    assert [r["status"] for r in runs] == ["completed"]
    listed = json.loads(cli(db, "schedule", "runs", "greet", "--json").output)
    assert [r["id"] for r in listed] == [runs[0]["id"]]
    shown = json.loads(cli(db, "runs", "show", runs[0]["id"], "--json").output)
    assert [h["to"] for h in shown["history"]] == ["running", "completed"]
    assert json.loads(cli(db, "schedule", "rm", "greet", "--json").output)["status"] == "deleted"
    assert "greet" not in cli(db, "schedule", "ls").output


def test_reads_return_frozen_models_that_json_prints(tmp_path):
    """S11: get_schedule, list_schedules, get_run and list_runs return Schedule and ScheduleRun models
    (frozen, times as aware datetimes, no engine head); ``schedule show/ls/runs`` and ``runs show`` print
    their dumps."""
    import asyncio

    import pytest
    from pydantic import ValidationError

    from statebook.adapters.db import open_book
    from statebook.scheduler import Schedule, ScheduleRun, get_run, get_schedule, list_runs, list_schedules

    db = f"sqlite:///{tmp_path / 'cli.db'}"
    assert cli(db, "schedule", "add", "greet", "--every", "60", "--command", sys.executable, "--arg", "-c",
               "--arg", "pass", "--cwd", str(tmp_path)).exit_code == 0
    assert cli(db, "schedule", "fire", "greet").exit_code == 0

    async def read():
        book = await open_book(db)
        try:
            schedule = await get_schedule(book, "greet")
            runs = await list_runs(book, schedule.id)
            return schedule, await list_schedules(book), runs, await get_run(book, runs[0].id)
        finally:
            await book.engine.dispose()

    schedule, listed, runs, run = asyncio.run(read())
    assert isinstance(schedule, Schedule) and listed == [schedule] and schedule.enabled is True
    assert isinstance(run, ScheduleRun) and runs == [run] and run.status == "completed"
    assert schedule.next_fire_at.tzinfo is not None and run.fired_at <= run.ended_at
    with pytest.raises(ValidationError):
        schedule.status = "paused"
    assert "chain_hash" not in schedule.dump() and "last_fact_id" not in run.dump()
    shown = json.loads(cli(db, "schedule", "show", "greet", "--json").output)
    assert shown == {**schedule.dump(), "recent_runs": [run.dump()]}
    assert json.loads(cli(db, "schedule", "ls", "--json").output) == [schedule.dump()]
    assert json.loads(cli(db, "schedule", "runs", "greet", "--json").output) == [run.dump()]
    assert json.loads(cli(db, "runs", "show", run.id, "--json").output).items() >= run.dump().items()


def test_cli_refusals_are_one_line_errors(tmp_path):
    """S2, S11: invalid input exits 2 with a message naming the problem."""
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    r = cli(db, "schedule", "add", "x", "--every", "0", "--command", "true")
    assert r.exit_code == 2 and "--every" in r.output
    r = cli(db, "schedule", "add", "x", "--every", "5", "--cron", "* * * * *", "--command", "true")
    assert r.exit_code == 2 and "exactly one trigger" in r.output
    cli(db, "schedule", "add", "y", "--every", "5", "--command", "true", "--cwd", str(tmp_path))
    r = cli(db, "runs", "cancel", "nope")
    assert r.exit_code == 2 and "does not exist" in r.output


def test_example_daemon_fires_notifies_and_verifies(tmp_path):
    """S12: `statebook run --config examples/statebook.toml --for N` fires the sample, delivers its dispatch, verifies."""
    exe = Path(sys.executable).parent / "statebook"
    proc = subprocess.run(
        [str(exe), "run", "--config", str(ROOT / "examples" / "statebook.toml"), "--for", "5"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "STATEBOOK_NOTIFY_LOG": str(tmp_path / "notified.log")},
    )
    assert proc.returncode == 0, proc.stderr
    assert "verify ok" in proc.stdout
    assert "completed" in proc.stdout and "delivered" in proc.stdout
    lines = (tmp_path / "notified.log").read_text().splitlines()
    assert lines and json.loads(lines[0])["body"]["schedule"] == "hello"
    assert (tmp_path / "statebook.db").exists()
