"""O8: `statebook run --for N` tells the story of its own run, consistent with the database and the log format.

Each test runs the real daemon (a subprocess) on a fresh SQLite file, then reads the database to check what the
story said: the runs this daemon recorded, the dispatch whose history it printed, the deliveries it counted.
"""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXE = str(Path(sys.executable).parent / "statebook")
EXAMPLE = ROOT / "examples" / "statebook.toml"


def env(tmp_path: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "STATEBOOK_NOTIFY_LOG": str(tmp_path / "notified.log"), "HOME": str(tmp_path)}


def run(tmp_path: Path, *args: str, config: Path = EXAMPLE) -> subprocess.CompletedProcess[str]:
    """`statebook run --config CONFIG ARGS` in ``tmp_path`` (the example's database is ./statebook.db)."""
    done = subprocess.run([EXE, "run", "--config", str(config), *args], capture_output=True, text=True, timeout=180,
                          cwd=tmp_path, env=env(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def query(tmp_path: Path, sql: str, *params: object) -> list[tuple]:
    with sqlite3.connect(tmp_path / "statebook.db") as db:
        return db.execute(sql, params).fetchall()


def daemon_of(story: str) -> str:
    found = re.search(r"^this run \(daemon (\S+)\): ", story, re.M)
    assert found, story
    return found.group(1)


def counted(text: str) -> dict[str, int]:
    """``completed 2, cancelled 1`` -> {"completed": 2, "cancelled": 1}."""
    return {k: int(v) for k, v in re.findall(r"([a-z_]+) (\d+)", text)}


def runs_said(story: str) -> dict[str, int]:
    """The runs by status the story's first line names: ``runs 4 (completed 3, cancelled 1)``."""
    line = story.splitlines()[0]
    found = re.search(r"runs (\d+)(?: \(([^)]*)\))?", line)
    assert found, line
    by_status = counted(found.group(2) or "")
    assert sum(by_status.values()) == int(found.group(1)), line
    return by_status


def runs_recorded(tmp_path: Path, daemon: str) -> dict[str, int]:
    return dict(query(tmp_path, "SELECT status, count(*) FROM schedule_runs WHERE daemon_id = ? GROUP BY status",
                      daemon))


def history_printed(story: str) -> str | None:
    found = re.search(r"^history of dispatch (\w{32}), delivered in this run:$", story, re.M)
    return found.group(1) if found else None


def deliveries_said(story: str) -> dict[str, int]:
    found = re.search(r"^this run's dispatch deliveries: (\d+) attempted; (.*)$", story, re.M)
    assert found, story
    return {"attempted": int(found.group(1)), **counted(found.group(2))}


def check_against_the_database(tmp_path: Path, story: str, started: float) -> str:
    """The story's runs are this daemon's rows; its history is of a dispatch of this daemon's runs, delivered
    during the run; its deliveries are the delivery facts written during the run. Returns the daemon id."""
    daemon = daemon_of(story)
    assert runs_said(story) == runs_recorded(tmp_path, daemon)
    delivered = query(tmp_path, "SELECT count(*) FROM status_transitions WHERE entity_type = 'dispatch' AND "
                                "reason_code = 'dispatch.delivered.transport_ok' AND at >= ?", started)[0][0]
    assert deliveries_said(story).get("delivered", 0) == delivered
    shown = history_printed(story)
    if shown is not None:
        [(run_daemon, at)] = query(tmp_path, "SELECT r.daemon_id, d.updated_at FROM dispatch_outbox d JOIN "
                                             "schedule_runs r ON r.id = d.schedule_run_id WHERE d.id = ?", shown)
        assert run_daemon == daemon and at >= started
    else:
        assert "no dispatch of this run was delivered" in story
    assert story.splitlines()[-1].startswith("database: ") and "verify ok" in story.splitlines()[-1]
    return daemon


def test_a_second_run_tells_only_its_own_story(tmp_path):
    """O8 (issue 25: a second `make run` said `fired 2, skipped 0, ...; runs 3 (completed 2, skipped 1)` and
    printed the history of a dispatch an earlier run delivered): the runs it names are the runs this daemon
    recorded, by status, skipped ones with why (an occurrence missed while no daemon ran); the history it prints
    is of a dispatch this run delivered, or it says none was; the deliveries are the ones written during it."""
    first_started = time.time()
    first = run(tmp_path, "--for", "5").stdout
    check_against_the_database(tmp_path, first, first_started)
    time.sleep(4)  # the example's schedule fires every 3 s: an occurrence falls due while no daemon runs
    started = time.time()
    second = run(tmp_path, "--for", "1").stdout
    daemon = check_against_the_database(tmp_path, second, started)
    assert runs_recorded(tmp_path, daemon).get("skipped", 0) >= 1
    assert "missed while no daemon ran" in second.splitlines()[0]


def test_under_log_format_json_the_story_is_json_records(tmp_path):
    """O8, O5: with `--log-format json` every line the run writes is a JSON object — the story too: one
    `run_summary` record carrying this run's runs and deliveries, the history it shows and the database's
    verify; nothing is printed as plain text."""
    started = time.time()
    done = run(tmp_path, "--for", "5", "--log-format", "json")
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line parses
    [summary] = [r for r in records if r.get("event") == "run_summary"]
    daemon = summary["daemon_id"]
    assert summary["runs"] == runs_recorded(tmp_path, daemon)
    delivered = query(tmp_path, "SELECT count(*) FROM status_transitions WHERE entity_type = 'dispatch' AND "
                                "reason_code = 'dispatch.delivered.transport_ok' AND at >= ?", started)[0][0]
    assert summary["deliveries"]["dispatch"]["delivered"] == delivered >= 1
    assert summary["verify"] == {"ok": True, "findings": 0}
    moves = [(h["from"], h["to"]) for h in summary["delivered_history"]]
    assert moves[:3] == [(None, "pending"), ("pending", "delivering"), ("delivering", "delivered")]


def running(tmp_path: Path) -> bool:
    try:
        return bool(query(tmp_path, "SELECT 1 FROM schedule_runs WHERE status = 'running'"))
    except sqlite3.OperationalError:  # the schema is not there yet
        return False


def test_a_run_in_flight_at_a_stop_is_said_to_be_cancelled_at_shutdown(tmp_path):
    """O8: a run still running when the daemon is stopped (SIGTERM) is cancelled — a real state, counted as
    such — and the story says why (running when the daemon stopped), as the database records it."""
    config = tmp_path / "slow.toml"
    config.write_text(EXAMPLE.read_text().replace("interval_sec = 3", "interval_sec = 1").replace(
        """action_command_args = ["-c", "print('hello from statebook')"]""",
        """action_command_args = ["-c", "import time; time.sleep(60)"]"""))
    started = time.time()
    proc = subprocess.Popen([EXE, "run", "--config", str(config)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path, env=env(tmp_path))
    deadline = time.time() + 90
    while time.time() < deadline and not (tmp_path / "statebook.db").exists():
        time.sleep(0.2)
    while time.time() < deadline and not running(tmp_path):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    story, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, story
    daemon = check_against_the_database(tmp_path, story, started)
    assert runs_recorded(tmp_path, daemon).get("cancelled", 0) >= 1
    assert "cancelled" in story.splitlines()[0] and "running when the daemon stopped" in story.splitlines()[0]


def test_for_lets_a_run_it_fired_finish_before_it_stops(tmp_path):
    """O8 (issue 25: `make run` ended with `cancelled 1` every time — its last fire fell on the stop): when
    `--for N` ends, runs in flight may finish (up to `FOR_GRACE_SECONDS`) before the daemon stops, so a run
    fired just before is completed, not cancelled."""
    config = tmp_path / "short.toml"
    config.write_text(EXAMPLE.read_text().replace(
        """action_command_args = ["-c", "print('hello from statebook')"]""",
        """action_command_args = ["-c", "import time; time.sleep(2)"]"""))
    started = time.time()
    story = run(tmp_path, "--for", "4", config=config).stdout  # the fire at 3 s ends at about 5 s, before the next
    daemon = check_against_the_database(tmp_path, story, started)
    assert runs_recorded(tmp_path, daemon) == {"completed": 1}
