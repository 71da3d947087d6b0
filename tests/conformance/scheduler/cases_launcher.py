"""The launch boundary (S7): argv validation, cwd rules, process groups, deadlines, stderr tail, reports."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from pathlib import Path


from statebook.scheduler.engine import SchedulerEngine

from .support import make, runs_of, settings

PY = sys.executable


def sched(**over):
    base = {"action_kind": "command", "action_command": PY, "action_command_args": ["-c", "pass"]}
    base.update(over)
    return base


async def _assert_gone(pid: int) -> None:
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        # a zombie of an orphan is reaped by init shortly after the kill
        await asyncio.sleep(0.1)
    status = Path(f"/proc/{pid}/status")
    assert status.exists() and "zombie" in status.read_text(), f"process {pid} survived"


class LauncherCases:
    """This module's cases: mixed into SchedulerConformance, so each backend runs them (tests/conformance)."""

    async def test_shutdown_tears_down_the_process_group(self, book, clock, tmp_path):
        """S7: stopping the engine cancels the run (cancelled.shutdown) and no child or grandchild survives."""
        pidfile = tmp_path / "pids"
        code = textwrap.dedent(f"""
            import os, subprocess, sys, time
            p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            open({str(pidfile)!r}, "w").write(f"{{os.getpid()}} {{p.pid}}")
            time.sleep(60)
        """)
        s = await make(book, action_command_args=["-c", code], action_cwd=str(tmp_path))
        eng = SchedulerEngine(book, settings(str(tmp_path)), clock=clock)
        await eng.start(loop=False)
        await eng.fire_now(s.id)
        for _ in range(100):
            if pidfile.exists() and len(pidfile.read_text().split()) == 2:
                break
            await asyncio.sleep(0.05)
        pids = [int(p) for p in pidfile.read_text().split()]
        await eng.stop()
        for pid in pids:
            await _assert_gone(pid)
        run = (await runs_of(book, s.id))[0]
        assert (run["status"], run["status_reason_code"]) == ("cancelled", "schedule_run.cancelled.shutdown")
        assert run["pid"] == pids[0]

    async def test_operator_cancel_kills_a_real_process_group(self, book, clock, tmp_path):
        """S11: `runs cancel` marks the run cancelled; the owning engine kills its group on the next tick."""
        from statebook.scheduler.runs import cancel_run

        s = await make(book, action_command_args=["-c", "import time; time.sleep(60)"], action_cwd=str(tmp_path))
        eng = SchedulerEngine(book, settings(str(tmp_path)), clock=clock)
        await eng.start(loop=False)
        run_id = await eng.fire_now(s.id)
        for _ in range(100):
            pid = eng.executor.pids.get(run_id)
            if pid:
                break
            await asyncio.sleep(0.05)
        assert pid, "the child never started"
        await cancel_run(book, run_id)
        await eng.tick()
        await eng.wait_idle()
        await _assert_gone(pid)
        run = (await runs_of(book, s.id))[0]
        assert (run["status"], run["status_reason_code"]) == ("cancelled", "schedule_run.cancelled.operator")
        await eng.stop()

    async def test_missing_cwd_is_a_failed_run_not_the_daemon_cwd(self, book, clock):
        """S7: with no usable cwd the run is written failed (missing_cwd) and nothing is spawned."""
        s = await make(book)
        eng = SchedulerEngine(book, settings(tmp_cwd="/nonexistent/dir"), clock=clock)
        await eng.fire_now(s.id)
        await eng.wait_idle()
        run = (await runs_of(book, s.id))[0]
        assert (run["status"], run["status_reason_code"]) == ("failed", "schedule_run.failed.missing_cwd")
        assert run["pid"] is None
        await eng.stop()
