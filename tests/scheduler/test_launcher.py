"""The launch boundary (S7): argv validation, cwd rules, process groups, deadlines, stderr tail, reports."""

from __future__ import annotations

import os
import textwrap

import pytest

from statebook.scheduler.launcher import (
    STDERR_TAIL_BYTES, Launch, LaunchRefused, build_launch, spawn_and_wait,
)


from conformance.scheduler.cases_launcher import PY, _assert_gone, sched


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


