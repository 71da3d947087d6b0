"""The launch boundary (S7): argv validation, cwd rules, process groups, deadlines, stderr tail, reports."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from pathlib import Path

import pytest

from statebook.scheduler.engine import SchedulerEngine
from statebook.scheduler.launcher import (
    STDERR_TAIL_BYTES, Launch, LaunchRefused, build_launch, spawn_and_wait,
)

from sched_helpers import make, runs_of, settings

PY = sys.executable


def sched(**over):
    base = {"action_kind": "command", "action_command": PY, "action_command_args": ["-c", "pass"]}
    base.update(over)
    return base


@pytest.mark.parametrize(
    "over, needle",
    [
        ({"action_kind": "agent", "action_prompt": "hi", "action_model": "--evil"}, "model"),
        ({"action_kind": "agent", "action_prompt": "hi", "action_model": "gpt 4"}, "model"),
        ({"action_kind": "play", "action_play": "-rf"}, "play"),
        ({"action_kind": "flow", "action_prompt": "x", "action_extra_args": ["--unsafe"]}, "flag"),
        ({"action_kind": "command", "action_command": "/no/such/binary"}, "not an executable"),
        ({"action_kind": "engine"}, "no argv builder"),
    ],
)
def test_argv_refusals(tmp_path, over, needle):
    """S7: invalid tokens, flag-like extra arguments and unknown kinds are refused before any spawn."""
    with pytest.raises(LaunchRefused, match=needle):
        build_launch(sched(**over), {}, executable=[PY, "-c", "pass"], fallback_cwd=str(tmp_path))


def test_profile_argv_puts_double_dash_before_free_form_positionals(tmp_path):
    """S7: the prompt (rendered with the trigger context) and extra args follow `--`; no shell anywhere."""
    launch = build_launch(
        sched(action_kind="agent", action_model="m-1", action_agent="reviewer", action_prompt="run {chain_from}; rm -rf /",
              action_extra_args=["notes.md"]),
        {"chain_from": "abc"}, executable=[PY, "-m", "li"], fallback_cwd=str(tmp_path),
    )
    assert launch.argv == [PY, "-m", "li", "agent", "--model", "m-1", "--agent", "reviewer", "--",
                           "notes.md", "run abc; rm -rf /"]


def test_profile_kinds_need_the_executable_setting(tmp_path):
    """S7: without launcher.executable the profile kinds fail with a clear launch error."""
    with pytest.raises(LaunchRefused, match="launcher.executable") as err:
        build_launch(sched(action_kind="flow", action_prompt="x"), {}, executable=None, fallback_cwd=str(tmp_path))
    assert err.value.reason == "schedule_run.failed.launch_error"


def test_cwd_never_falls_back_to_the_daemon_cwd(tmp_path):
    """S7: no action_cwd/project/launcher.cwd → refused with missing_cwd; a stale action_cwd falls through."""
    with pytest.raises(LaunchRefused, match="never uses the daemon") as err:
        build_launch(sched(), {}, fallback_cwd=None)
    assert err.value.reason == "schedule_run.failed.missing_cwd"
    launch = build_launch(sched(action_cwd=str(tmp_path / "gone"), action_project="p"), {},
                          projects={"p": str(tmp_path)}, fallback_cwd=None)
    assert launch.cwd == str(tmp_path)


async def test_flow_yaml_temp_file_is_removed_after_the_run(tmp_path):
    """S7: flow_yaml is written to a temp file passed by path and removed afterwards."""
    stub = tmp_path / "li.py"
    stub.write_text("import sys, pathlib; p = sys.argv[sys.argv.index('--file') + 1]; "
                    "sys.stderr.write(pathlib.Path(p).read_text())")
    launch = build_launch(sched(action_kind="flow_yaml", action_flow_yaml="steps: [a, b]\n"), {},
                          executable=[PY, str(stub)], fallback_cwd=str(tmp_path))
    assert launch.tmp_path and os.path.exists(launch.tmp_path)
    result = await spawn_and_wait(launch, run_id="r1", deadline=30)
    assert result.exit_code == 0 and "steps: [a, b]" in result.stderr_tail
    assert not os.path.exists(launch.tmp_path)


async def test_stderr_tail_env_and_result_report(tmp_path):
    """S7: only the last 2,048 stderr bytes are kept; the run id and a result file path are in the env."""
    code = textwrap.dedent("""
        import json, os, sys
        sys.stderr.write("x" * 5000 + "END")
        json.dump({"cost_usd": 0.25, "tokens": 42, "ignored": 1}, open(os.environ["STATEBOOK_RESULT_FILE"], "w"))
        sys.exit(0 if os.environ["STATEBOOK_RUN_ID"] == "run-7" else 9)
    """)
    result = await spawn_and_wait(Launch([PY, "-c", code], str(tmp_path)), run_id="run-7", deadline=30)
    assert result.exit_code == 0
    assert len(result.stderr_tail) == STDERR_TAIL_BYTES and result.stderr_tail.endswith("END")
    assert result.report == {"cost_usd": 0.25, "tokens": 42}


async def test_deadline_times_out_and_kills_the_group(tmp_path):
    """S7: a child running past the deadline is terminated with its group; timed_out is reported."""
    pidfile = tmp_path / "grandchild.pid"
    code = textwrap.dedent(f"""
        import subprocess, sys, time
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pidfile)!r}, "w").write(str(p.pid))
        time.sleep(60)
    """)
    result = await spawn_and_wait(Launch([PY, "-c", code], str(tmp_path)), run_id="r", deadline=1.5, grace=1.0)
    assert result.timed_out
    await _assert_gone(int(pidfile.read_text()))


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


async def test_shutdown_tears_down_the_process_group(book, clock, tmp_path):
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
    await eng.fire_now(s["id"])
    for _ in range(100):
        if pidfile.exists() and len(pidfile.read_text().split()) == 2:
            break
        await asyncio.sleep(0.05)
    pids = [int(p) for p in pidfile.read_text().split()]
    await eng.stop()
    for pid in pids:
        await _assert_gone(pid)
    run = (await runs_of(book, s["id"]))[0]
    assert (run["status"], run["status_reason_code"]) == ("cancelled", "schedule_run.cancelled.shutdown")
    assert run["pid"] == pids[0]


async def test_operator_cancel_kills_a_real_process_group(book, clock, tmp_path):
    """S11: `runs cancel` marks the run cancelled; the owning engine kills its group on the next tick."""
    from statebook.scheduler.runs import cancel_run

    s = await make(book, action_command_args=["-c", "import time; time.sleep(60)"], action_cwd=str(tmp_path))
    eng = SchedulerEngine(book, settings(str(tmp_path)), clock=clock)
    await eng.start(loop=False)
    run_id = await eng.fire_now(s["id"])
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
    run = (await runs_of(book, s["id"]))[0]
    assert (run["status"], run["status_reason_code"]) == ("cancelled", "schedule_run.cancelled.operator")
    await eng.stop()


async def test_missing_cwd_is_a_failed_run_not_the_daemon_cwd(book, clock):
    """S7: with no usable cwd the run is written failed (missing_cwd) and nothing is spawned."""
    s = await make(book)
    eng = SchedulerEngine(book, settings(tmp_cwd="/nonexistent/dir"), clock=clock)
    await eng.fire_now(s["id"])
    await eng.wait_idle()
    run = (await runs_of(book, s["id"]))[0]
    assert (run["status"], run["status_reason_code"]) == ("failed", "schedule_run.failed.missing_cwd")
    assert run["pid"] is None
    await eng.stop()
