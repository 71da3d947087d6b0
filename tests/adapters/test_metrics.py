"""O3, O4, O8: a real daemon started with ``--metrics-port 0`` serves /metrics whose families equal
``statebook stats --json`` of the same database; the server stops with the daemon; the run's story
ends with a delivered dispatch's full history and ``verify ok``."""

from __future__ import annotations

import asyncio
import json
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from statebook.adapters.metrics import Metrics
from statebook.lifecycle import Book
from statebook.outbox import enqueue_dispatch

ROOT = Path(__file__).resolve().parents[2]
EXE = str(Path(sys.executable).parent / "statebook")
WAIT = 90.0  # seconds a step may take on a loaded machine before the test gives up (not a timed assert)


def settings(tmp_path: Path, db: str | None = None) -> Path:
    """A daemon that fires one run soon after it starts, notifies through examples/notify.py, then idles."""
    toml = tmp_path / "statebook.toml"
    toml.write_text(f"""
db = "{db or f'sqlite:///{tmp_path / "metrics.db"}'}"
[scheduler]
tick_seconds = 0.5
[launcher]
cwd = "{tmp_path}"
[dispatch]
notify_template = ["{{python}}", "{ROOT / 'examples' / 'notify.py'}", "{{deliver_to}}", "{{payload}}"]
[[scheduler.schedules]]
name = "once"
trigger_type = "at"
at_time = {time.time() + 2.0}
missed_fire_policy = "run_once"
action_kind = "command"
action_command = "{{python}}"
action_command_args = ["-c", "print('hi')"]
notify = {{ kind = "run_ended", deliver_to = "console" }}
""")
    return toml


def env(tmp_path: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "STATEBOOK_NOTIFY_LOG": str(tmp_path / "notified.log"), "HOME": str(tmp_path)}


def samples(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """sample name -> sorted labels -> value."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def by(found: dict, name: str, *keys: str) -> dict:
    """One sample family as nested dicts keyed by the label values ``keys``."""
    out: dict = {}
    for labels, value in found.get(name, {}).items():
        d = dict(labels)
        node = out
        for k in keys[:-1]:
            node = node.setdefault(d[k], {})
        node[d[keys[-1]]] = int(value)
    return out


class Daemon:
    """``statebook run`` in a subprocess; its stderr (JSON log lines) read by a thread."""

    def __init__(self, tmp_path: Path, *args: str, db: str | None = None) -> None:
        self.proc = subprocess.Popen([EXE, "run", "--config", str(settings(tmp_path, db)), *args], cwd=tmp_path,
                                     env=env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)

    def wait_for(self, predicate) -> dict:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                assert self.proc.poll() is None, f"the daemon exited: {''.join(self.seen)}"
                continue
            self.seen.append(line)
            record = json.loads(line)
            if predicate(record):
                return record
        raise AssertionError(f"no such log line within {WAIT}s: {''.join(self.seen)}")

    def stop(self) -> tuple[str, list[str]]:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.stdout is not None
        out = self.proc.stdout.read()  # stderr stays the reader thread's
        self.proc.wait(timeout=WAIT)
        self.reader.join(timeout=WAIT)
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return out, self.seen


def scrape(url: str) -> dict:
    response = httpx.get(url, timeout=10)
    assert response.status_code == 200
    return samples(response.text)


def fresh(db_url: str, backend: str) -> str:
    """``db_url`` with an empty statebook schema (PostgreSQL is shared by the session's tests)."""
    if backend == "postgres":
        from statebook.adapters.db import open_book, reset_schema

        async def reset() -> None:
            import sqlalchemy as sa

            from statebook.adapters.migrations import VERSION_TABLE
            from statebook.adapters.registry import builtin_registry
            from statebook.lifecycle.schema import schema_for

            book = await open_book(db_url)
            await reset_schema(book.engine)
            # Another test's own tables (an application's lifecycle) would be verify findings here: drop them.
            ours = set(schema_for(builtin_registry()).tables) | {VERSION_TABLE}
            async with book.engine.begin() as conn:
                names = await conn.run_sync(lambda c: sa.inspect(c).get_table_names())
                for name in sorted(set(names) - ours):
                    await conn.exec_driver_sql(f'DROP TABLE IF EXISTS "{name}" CASCADE')
            await book.engine.dispose()

        asyncio.run(reset())
    return db_url


def test_metrics_of_a_running_daemon_equal_statebook_stats(tmp_path, db_url, backend):
    """O3: the scrape's families equal `statebook stats --json` of the same database; O5: every stderr
    line is JSON; O4: the endpoint is gone once the daemon stops."""
    db = fresh(db_url, backend)
    daemon = Daemon(tmp_path, "--for", "120", "--metrics-port", "0", "--metrics-every", "0.2", "--log-format", "json",
                    db=db)
    try:
        port = daemon.wait_for(lambda r: "metrics_port" in r)["metrics_port"]
        url = f"http://127.0.0.1:{port}/metrics"
        daemon.wait_for(lambda r: r.get("outcome") == "delivered" and "dispatch_id" in r)
        deadline = time.monotonic() + WAIT
        while by(scrape(url), "statebook_deliveries_total", "lifecycle", "outcome").get("dispatch", {}).get("delivered") != 1:
            assert time.monotonic() < deadline, "the snapshot never showed the delivery"
            time.sleep(0.2)
        time.sleep(1.0)  # the one run's trailing writes, then a refresh
        stats = json.loads(subprocess.run([EXE, "--db", db, "stats", "--json"],
                                          capture_output=True, text=True, check=True, env=env(tmp_path)).stdout)
        time.sleep(0.6)  # at least two refreshes after the stats were read: the same, quiet database
        found = scrape(url)
    finally:
        out, logged = daemon.stop()
    assert by(found, "statebook_entities", "lifecycle", "status") == {k: v for k, v in stats["entities"].items() if v}
    assert by(found, "statebook_transitions_total", "lifecycle", "reason") == stats["transitions"]
    assert by(found, "statebook_deliveries_total", "lifecycle", "outcome") == stats["deliveries"]
    assert by(found, "statebook_attempts_total", "lifecycle") == stats["attempts"]
    assert by(found, "statebook_due", "lifecycle") == {k: v["count"] for k, v in stats["due"].items()}
    assert by(found, "statebook_scheduler_decisions_total", "decision") == stats["scheduler"]
    assert by(found, "statebook_runs", "status") == stats["runs"]
    assert stats["runs"] == {"completed": 1} and stats["deliveries"]["dispatch"]["delivered"] == 1
    assert found["statebook_rate_limit_waits_total"][()] == stats["rate_limit_waits"]
    # In-process counters beside the snapshot: this daemon's own deliveries and leadership.
    assert by(found, "statebook_daemon_deliveries_total", "lifecycle", "outcome")["dispatch"]["delivered"] == 1
    assert found["statebook_daemon_leader"][()] == 1.0
    # O9: the verify it ran at start says what `statebook verify` says (the shared PostgreSQL database may hold
    # another test's table: an unregistered_table finding, in both).
    verified = subprocess.run([EXE, "--db", db, "verify"], capture_output=True, text=True, env=env(tmp_path))
    assert (found["statebook_verify_findings"][(("kind", "any"),)] == 0.0) == (verified.returncode == 0)
    # Every stderr line is one JSON object with the fields, one per delivery outcome, run end and leadership.
    records = [json.loads(line) for line in logged]
    assert all({"ts", "level", "logger", "message"} <= set(r) for r in records)
    assert len([r for r in records if r.get("dispatch_id") and r.get("outcome")]) == 1
    assert [r["outcome"] for r in records if r.get("run_id") and r.get("outcome")] == ["completed"]
    assert [r["leader"] for r in records if r.get("event") == "leadership"] == [True, False]
    assert "verify ok" in out.splitlines()[-1]
    with pytest.raises(httpx.TransportError):
        httpx.get(url, timeout=2)


def test_make_run_tells_the_story_of_the_run(tmp_path):
    """O8: the per-run summary, a delivered dispatch's whole history (enqueued, attempt, delivered), then
    `verify ok` on the last line; the payload the example's receiver logged says it was attempt 1 (O1)."""
    proc = subprocess.run([EXE, "run", "--config", str(ROOT / "examples" / "statebook.toml"), "--for", "5"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("this run (daemon ") and "runs 0" not in lines[0]
    start = next(i for i, line in enumerate(lines) if line.startswith("history of dispatch "))
    history = lines[start + 1:-1]
    moves = [line.split()[3:6] for line in history]
    assert moves[:3] == [["-", "->", "pending"], ["pending", "->", "delivering"], ["delivering", "->", "delivered"]]
    assert "verify ok" in lines[-1]
    sent = [json.loads(line) for line in (tmp_path / "notified.log").read_text().splitlines()]
    assert sent and all(p["attempt"] == 1 and p["schema_version"] == 2 and p["metadata"] == {} for p in sent)
    # Deliveries as they complete: one readable line each on stderr.
    assert any("dispatch.delivered" not in line and ": delivered" in line for line in proc.stderr.splitlines())


def test_a_busy_metrics_port_is_one_line_error(tmp_path):
    """O4: a port that cannot be bound is a one-line error and exit 2, nothing started."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([EXE, "run", "--config", str(settings(tmp_path)), "--for", "5", "--metrics-port",
                               str(port)], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env(tmp_path))
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"--metrics-port {port}" in errors[0]


async def test_a_registry_of_its_own_and_no_database_read_on_scrape(book: Book):
    """O3: each Metrics has its own registry (two coexist in one process); a scrape renders the last
    snapshot without reading the database (a row added after it is not shown until refresh)."""
    await enqueue_dispatch(book, kind="k", deliver_to="x")
    one, two = Metrics(book), Metrics(book)
    await one.refresh()
    await two.refresh()
    await enqueue_dispatch(book, kind="k", deliver_to="x")
    shown = by(samples(one.render().decode()), "statebook_entities", "lifecycle", "status")
    assert shown["dispatch"] == {"pending": 1}
    await one.refresh()
    assert by(samples(one.render().decode()), "statebook_entities", "lifecycle", "status")["dispatch"] == {"pending": 2}
    assert by(samples(two.render().decode()), "statebook_entities", "lifecycle", "status")["dispatch"] == {"pending": 1}
    assert "statebook_entities" not in __import__("prometheus_client").generate_latest().decode()


async def test_verify_findings_are_a_gauge_that_follows_forged_history(book: Book):
    """O9: a daemon serving metrics exposes its last verify: 0 findings on a clean history, then exactly the
    findings `verify` reports (by kind) once a fact is forged, with what it checked."""
    import sqlalchemy as sa

    from statebook.lifecycle import verify

    await enqueue_dispatch(book, kind="k", deliver_to="x")
    await enqueue_dispatch(book, kind="k", deliver_to="y")
    metrics = Metrics(book)
    before = await metrics.verify()  # clean, but for another test's table left in a shared PostgreSQL database
    found = samples(metrics.render().decode())
    assert {f.kind for f in before.findings} <= {"unregistered_table"}
    assert found["statebook_verify_findings"][(("kind", "any"),)] == len(before.findings)
    assert found["statebook_verify_checked"][(("what", "facts"),)] == before.facts == 2
    async with book.engine.begin() as conn:
        await conn.execute(sa.text("UPDATE status_transitions SET reason_summary = 'forged' "
                                   "WHERE seq = (SELECT min(seq) FROM status_transitions)"))
    forged = await metrics.verify()
    expected = await verify(book)
    found = samples(metrics.render().decode())
    assert len(forged.findings) == len(expected.findings) > len(before.findings)
    kinds = {f.kind for f in expected.findings}
    assert found["statebook_verify_findings"][(("kind", "any"),)] == len(expected.findings)
    for kind in kinds:
        assert found["statebook_verify_findings"][(("kind", kind),)] == sum(f.kind == kind for f in expected.findings)
