"""The argv transport: whole-element substitution, no shell, stdin, timeout, captured errors."""

from __future__ import annotations

import asyncio
import sys


from statebook.outbox import ArgvTransport

from conformance.outbox.cases_argv_transport import _alive


async def test_stderr_is_the_error_and_is_capped(tmp_path):
    """O13: a non-zero exit is a failure whose error is the stripped stderr (or ``exit N`` when
    stderr is empty), cut to 2,000 characters."""
    loud = tmp_path / "loud.py"
    loud.write_text("import sys\nsys.stderr.write('  ' + 'E' * 5000 + '\\n')\nsys.exit(3)\n")
    quiet = tmp_path / "quiet.py"
    quiet.write_text("import sys\nsys.exit(4)\n")
    result = await ArgvTransport([sys.executable, str(loud), "{deliver_to}"]).send("r", "{}")
    assert not result.ok and len(result.error) == 2000 and result.error.startswith("EEE")
    assert result.evidence == {"exit_code": 3}
    result = await ArgvTransport([sys.executable, str(quiet), "{deliver_to}"]).send("r", "{}")
    assert (result.ok, result.error) == (False, "exit 4")


async def test_a_slow_command_is_killed_with_its_children(tmp_path):
    """O13: at the timeout the command's whole process group is killed, a grandchild too."""
    pidfile = tmp_path / "grandchild.pid"
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text(f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n")
    slow = tmp_path / "slow.py"
    slow.write_text(f"import subprocess, sys\nsubprocess.run([sys.executable, {str(sleeper)!r}])\n")
    result = await ArgvTransport([sys.executable, str(slow), "{deliver_to}"], timeout=2.0).send("r", "{}")
    assert not result.ok and result.error.startswith("timeout") and result.evidence == {"timed_out": True}
    pid = int(pidfile.read_text())
    for _ in range(200):  # the kill is asynchronous: wait (generously) for the process to go
        if not _alive(pid):
            break
        await asyncio.sleep(0.025)
    assert not _alive(pid)


