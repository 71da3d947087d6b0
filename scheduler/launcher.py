"""From a schedule to a child process: argv builders, cwd resolution, and an isolated spawn.

argv only, never a shell. ``command`` is built in; agent/flow/fanout/play/flow_yaml form a launcher
profile whose executable is a setting. A refused action raises :class:`LaunchRefused` carrying the
run's reason code; nothing is spawned.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from statebook.lifecycle.codec import loads_checked

from .errors import LaunchRefused

STDERR_TAIL_BYTES = 2048
KILL_GRACE_SECONDS = 5.0
_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}$")


@dataclass
class Launch:
    """What to start for a run: argv, working directory, extra environment and a temporary file to remove
    afterwards.
    """

    argv: list[str]
    cwd: str
    tmp_path: str | None = None
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class ProcessResult:
    """How a child process ended: exit code (None if killed), the tail of its stderr, whether it timed out and its
    report.
    """

    exit_code: int | None
    stderr_tail: str
    timed_out: bool = False
    report: dict[str, Any] = field(default_factory=dict)


def check_token(value: str | None, what: str) -> str:
    """Return ``value`` when it is a safe identifier for an argv element; raises ``LaunchRefused`` naming ``what``
    otherwise.
    """
    if value is None or not _TOKEN.match(value):
        raise LaunchRefused(
            f"{what} {value!r} is not a valid identifier (letters, digits and . _ : / @ + -, not starting with '-')"
        )
    return value


def check_extra_args(args: Sequence[str] | None) -> list[str]:
    """The extra arguments as a list; raises ``LaunchRefused`` for a non-string or one that looks like a flag."""
    out = []
    for arg in args or ():
        if not isinstance(arg, str):
            raise LaunchRefused(f"extra argument {arg!r} must be a string")
        if arg.startswith("-"):
            raise LaunchRefused(f"extra argument {arg!r} looks like a flag; flag-like extra arguments are refused")
        out.append(arg)
    return out


def render(template: str, context: Mapping[str, Any]) -> str:
    """Replace ``{key}`` for keys of the trigger context; other braces stay as written."""
    out = template
    for key, value in context.items():
        out = out.replace("{" + key + "}", str(value))
    return out


Builder = Callable[[Mapping[str, Any], Mapping[str, Any], list[str] | None], tuple[list[str], str | None]]


def build_command(schedule: Mapping[str, Any], context: Mapping[str, Any], _exe: list[str] | None) -> tuple[list[str], str | None]:
    """The argv of a ``command`` action (the executable resolved on PATH); raises ``LaunchRefused`` for a missing or
    non-executable command or bad arguments.
    """
    command = (schedule.get("action_command") or "").strip()
    if not command:
        raise LaunchRefused("action kind 'command' needs action_command")
    resolved = command if os.path.isabs(command) else shutil.which(command)
    if resolved is None or not os.access(resolved, os.X_OK):
        raise LaunchRefused(f"command {command!r} is not an executable file or on PATH", "schedule_run.failed.launch_error")
    args = schedule.get("action_command_args") or []
    if not all(isinstance(a, str) for a in args):
        raise LaunchRefused("action_command_args must be a list of strings")
    return [resolved, *(render(a, context) for a in args)], None


def _profile(exe: list[str] | None, kind: str) -> list[str]:
    if not exe:
        raise LaunchRefused(
            f"action kind {kind!r} needs the launcher profile: set launcher.executable (e.g. [\"li\"])",
            "schedule_run.failed.launch_error",
        )
    head = exe[0] if os.path.isabs(exe[0]) else shutil.which(exe[0])
    if head is None:
        raise LaunchRefused(f"launcher executable {exe[0]!r} is not found", "schedule_run.failed.launch_error")
    return [head, *exe[1:]]


def build_profile(schedule: Mapping[str, Any], context: Mapping[str, Any], exe: list[str] | None) -> tuple[list[str], str | None]:
    """The argv (and a temporary file, if any) of a profile action such as ``play`` or ``flow``; raises
    ``LaunchRefused`` for a bad value.
    """
    kind = schedule["action_kind"]
    argv = [*_profile(exe, kind), kind if kind != "flow_yaml" else "flow"]
    if schedule.get("action_model"):
        argv += ["--model", check_token(schedule["action_model"], "model")]
    if schedule.get("action_agent"):
        argv += ["--agent", check_token(schedule["action_agent"], "agent")]
    tmp_path = None
    if kind == "play":
        argv += ["--play", check_token(schedule.get("action_play"), "play")]
    if kind == "flow_yaml":
        text = schedule.get("action_flow_yaml") or ""
        if not text.strip():
            raise LaunchRefused("action kind 'flow_yaml' needs non-empty action_flow_yaml")
        fd, tmp_path = tempfile.mkstemp(prefix="statebook-flow-", suffix=".yaml")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        argv += ["--file", tmp_path]
    positionals = check_extra_args(schedule.get("action_extra_args"))
    if schedule.get("action_prompt"):
        positionals.append(render(schedule["action_prompt"], context))
    if positionals:
        argv += ["--", *positionals]
    return argv, tmp_path


BUILDERS: dict[str, Builder] = {
    "command": build_command,
    "agent": build_profile,
    "flow": build_profile,
    "fanout": build_profile,
    "play": build_profile,
    "flow_yaml": build_profile,
}


def resolve_cwd(schedule: Mapping[str, Any], projects: Mapping[str, str], fallback: str | None) -> str:
    """action_cwd if it exists → the project's path → the launcher cwd setting; never the daemon's cwd."""
    tried = []
    for label, path in (
        ("action_cwd", schedule.get("action_cwd")),
        ("project", projects.get(schedule.get("action_project") or schedule.get("project") or "")),
        ("launcher.cwd", fallback),
    ):
        if path:
            if os.path.isdir(path):
                return path
            tried.append(f"{label}={path}")
    detail = ", ".join(tried) if tried else "none of action_cwd, a project path or launcher.cwd is set"
    raise LaunchRefused(f"no working directory for the run ({detail}); statebook never uses the daemon's cwd",
                        "schedule_run.failed.missing_cwd")


def build_launch(schedule: Mapping[str, Any], context: Mapping[str, Any], *, executable: list[str] | None = None,
                 projects: Mapping[str, str] | None = None, fallback_cwd: str | None = None) -> Launch:
    """The :class:`Launch` of a schedule's action in ``context``; raises ``LaunchRefused`` for an unknown action
    kind or a bad action.
    """
    kind = schedule.get("action_kind")
    builder = BUILDERS.get(kind or "")
    if builder is None:
        raise LaunchRefused(f"action kind {kind!r} has no argv builder; known: {', '.join(sorted(BUILDERS))}")
    cwd = resolve_cwd(schedule, projects or {}, fallback_cwd)
    argv, tmp_path = builder(schedule, context, executable)
    return Launch(argv=argv, cwd=cwd, tmp_path=tmp_path)


def _killpg(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def terminate_group(proc: asyncio.subprocess.Process, grace: float = KILL_GRACE_SECONDS) -> None:
    """SIGTERM the child's process group, wait ``grace`` seconds, then SIGKILL whatever is left."""
    _killpg(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except asyncio.TimeoutError:
        pass
    # The leader may be gone while grandchildren linger in its group: always sweep with SIGKILL.
    _killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(proc.wait(), grace)


async def spawn_and_wait(
    launch: Launch,
    *,
    run_id: str,
    deadline: float,
    stdout_log: str | None = None,
    on_spawn: Callable[[int], Any] | None = None,
    grace: float = KILL_GRACE_SECONDS,
) -> ProcessResult:
    """Run the child in its own session; terminate its group on timeout or cancellation."""
    fd, result_file = tempfile.mkstemp(prefix=f"statebook-result-{run_id}-", suffix=".json")
    os.close(fd)
    os.unlink(result_file)
    env = {**os.environ, **launch.env, "STATEBOOK_RUN_ID": run_id, "STATEBOOK_RESULT_FILE": result_file}
    stdout: Any = asyncio.subprocess.DEVNULL
    log_fh = None
    if stdout_log:
        log_fh = open(stdout_log, "ab")  # noqa: SIM115 - closed in finally
        stdout = log_fh
    try:
        try:
            proc = await asyncio.create_subprocess_exec(
                *launch.argv, cwd=launch.cwd, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=stdout,
                stderr=asyncio.subprocess.PIPE, start_new_session=True,
            )
        except OSError as exc:
            raise LaunchRefused(f"could not start {launch.argv[0]!r}: {exc}", "schedule_run.failed.launch_error") from exc
        tail = bytearray()

        async def drain() -> None:
            assert proc.stderr is not None
            while chunk := await proc.stderr.read(4096):
                tail.extend(chunk)
                del tail[:-STDERR_TAIL_BYTES]

        drainer = asyncio.create_task(drain())
        timed_out = False
        try:
            if on_spawn is not None:
                maybe = on_spawn(proc.pid)
                if asyncio.iscoroutine(maybe):
                    await maybe
            code: int | None = await asyncio.wait_for(proc.wait(), deadline)
        except asyncio.TimeoutError:
            timed_out = True
            await terminate_group(proc, grace)
            code = proc.returncode
        except asyncio.CancelledError:
            await asyncio.shield(terminate_group(proc, grace))
            drainer.cancel()
            raise
        # The leader exited; whatever is left in its group must not outlive the run.
        _killpg(proc.pid, signal.SIGKILL)
        try:
            await asyncio.wait_for(drainer, 2.0)
        except asyncio.TimeoutError:
            drainer.cancel()
        return ProcessResult(code, tail.decode("utf-8", "replace"), timed_out, _read_report(result_file))
    finally:
        if log_fh is not None:
            log_fh.close()
        for path in (launch.tmp_path, result_file):
            if path:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)


def _read_report(path: str) -> dict[str, Any]:
    """The child's optional ``{"cost_usd": .., "tokens": ..}``; anything else is ignored."""
    try:  # by statebook's JSON rules: a cost or token count past 64 bits or not finite is no report
        data = loads_checked(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    out: dict[str, Any] = {}
    if isinstance(data.get("cost_usd"), int | float):
        out["cost_usd"] = float(data["cost_usd"])
    if isinstance(data.get("tokens"), int):
        out["tokens"] = int(data["tokens"])
    return out
