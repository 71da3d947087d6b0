"""The argv transport: whole-element substitution, no shell, stdin, timeout, captured errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from statebook.outbox import ArgvTransport, deliver_due_dispatches, enqueue_dispatch

from .support import row

NASTY_ROUTE = "seat-1; touch PWNED_ROUTE && echo $(id) `id` | cat > /dev/null & \"'*"
NASTY_BODY = {"cmd": "$(touch PWNED_BODY)", "x": "`touch PWNED_BODY2`; rm -rf ~ | >&2 \\ \n'\""}


def recorder_script(tmp_path: Path) -> Path:
    """A command that writes its argv and stdin to capture.json in its working directory."""
    script = tmp_path / "capture.py"
    out = tmp_path / "capture.json"
    script.write_text(
        "import json, sys\n"
        f"json.dump({{'argv': sys.argv[1:], 'stdin': sys.stdin.read()}}, open({str(out)!r}, 'w'))\n"
    )
    return script


def captured(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "capture.json").read_text())


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


BAD_TEMPLATES = [
    None,
    [],
    "notify {deliver_to}",
    ["notify", "{payload}"],
    ["{deliver_to}", "x"],
    ["notify", "{deliver_to} "],
]


class ArgvTransportCases:
    """This module's cases: mixed into OutboxConformance, so each backend runs them (tests/conformance)."""

    async def test_shell_metacharacters_in_route_and_payload_are_inert_argv(self, book, tmp_path, monkeypatch):
        """O13: route and payload arrive as exactly one argv element each, byte for byte; nothing the
        metacharacters describe happens (no file is created)."""
        monkeypatch.chdir(tmp_path)
        script = recorder_script(tmp_path)
        did = await enqueue_dispatch(book, kind="k", deliver_to=NASTY_ROUTE, body=NASTY_BODY)
        transport = ArgvTransport([sys.executable, str(script), "--to", "{deliver_to}", "{payload}"])
        assert (await deliver_due_dispatches(book, transport=transport))["delivered"] == 1
        got = captured(tmp_path)
        assert got["argv"][:2] == ["--to", NASTY_ROUTE]
        assert json.loads(got["argv"][2]) == {**(await row(book, did)).payload, "attempt": 1}  # O1
        assert json.loads(got["argv"][2])["body"] == NASTY_BODY
        assert got["stdin"] == ""
        assert not any(tmp_path.glob("PWNED*")) and not any(Path.cwd().glob("PWNED*"))

    async def test_without_a_payload_element_the_payload_goes_to_stdin(self, book, tmp_path, monkeypatch):
        """O13: with no ``{payload}`` element the JSON payload is the command's stdin; substitution is
        whole-element only (``--to={deliver_to}`` stays literal)."""
        monkeypatch.chdir(tmp_path)
        script = recorder_script(tmp_path)
        did = await enqueue_dispatch(book, kind="k", deliver_to=NASTY_ROUTE, body=NASTY_BODY)
        transport = ArgvTransport([sys.executable, str(script), "{deliver_to}", "--to={deliver_to}"])
        assert (await deliver_due_dispatches(book, transport=transport))["delivered"] == 1
        got = captured(tmp_path)
        assert got["argv"] == [NASTY_ROUTE, "--to={deliver_to}"]
        assert json.loads(got["stdin"]) == {**(await row(book, did)).payload, "attempt": 1}  # O1
        assert not any(tmp_path.glob("PWNED*"))

    @pytest.mark.parametrize("template", BAD_TEMPLATES, ids=[repr(t) for t in BAD_TEMPLATES])
    async def test_an_invalid_or_missing_template_fails_the_row_and_does_not_crash(self, book, template):
        """O13: deliver_due_dispatches with an unusable notify_template records a failure on each
        claimed row (last_error names the template problem) instead of raising."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="r")
        counts = await deliver_due_dispatches(book, notify_template=template)
        assert counts["attempted"] == 1 and counts["retried"] == 1
        r = await row(book, did)
        assert r.status == "pending" and "template" in r.last_error

    async def test_a_missing_executable_is_a_failed_row(self, book, tmp_path):
        """O13: a command that cannot be started is that row's failure."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="r")
        counts = await deliver_due_dispatches(book, notify_template=[str(tmp_path / "no-such-cmd"), "{deliver_to}"])
        assert counts["retried"] == 1
        assert "could not start" in (await row(book, did)).last_error
