"""specs/extending.md is a tested guide: every code block on the page runs, in order, in an empty directory.

- ```python title="NAME.py"``` blocks are the application's module: appended to NAME.py, importable.
- plain ```python``` blocks run in one namespace, top-level ``await`` allowed.
- ```sh``` blocks: ``export NAME=value`` sets the environment; each ``statebook ...`` line runs the CLI and must
  exit 0.
"""

from __future__ import annotations

import ast
import asyncio
import re
import shlex
import sys
from pathlib import Path

from typer.testing import CliRunner

from statebook.adapters.cli import app

GUIDE = Path(__file__).resolve().parents[2] / "specs" / "extending.md"
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.S | re.M)


def blocks() -> list[tuple[str, str, str]]:
    """(language, title or "", body) for each fenced block of the guide, in order."""
    found = []
    for lang, info, body in FENCE.findall(GUIDE.read_text()):
        title = re.search(r'title="([^"]+)"', info)
        found.append((lang, title.group(1) if title else "", body))
    return found


def test_the_guide_has_every_kind_of_block():
    """L19: the guide shows a module, code that uses it and the command line — and the README links it."""
    kinds = {(lang, bool(title)) for lang, title, _ in blocks()}
    assert {("python", True), ("python", False), ("sh", False)} <= kinds
    assert all(lang in ("python", "sh") for lang, _, _ in blocks()), "a block this test would not run"
    assert "specs/extending.md" in (GUIDE.parents[1] / "README.md").read_text()
    assert "## 5. Changing a policy" in GUIDE.read_text()


def test_every_block_of_the_guide_runs(tmp_path, monkeypatch):
    """L19: each block of specs/extending.md, in order: the module imports, the code runs, each command exits 0."""
    module_names = {title[:-3] for _, title, _ in blocks() if title}
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("STATEBOOK_DB", "STATEBOOK_APP"):
        monkeypatch.delenv(name, raising=False)
    for name in module_names:
        sys.modules.pop(name, None)
    env: dict[str, str | None] = {"STATEBOOK_DB": None, "STATEBOOK_APP": None}
    namespace: dict[str, object] = {"__name__": "guide"}
    ran = 0
    try:
        for number, (lang, title, body) in enumerate(blocks(), 1):
            if title:
                with (tmp_path / title).open("a") as module:
                    module.write(body + "\n")
            elif lang == "python":
                code = compile(body, f"{GUIDE.name} block {number}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)

                async def go() -> None:
                    result = eval(code, namespace)  # noqa: S307 - the guide's own code
                    if asyncio.iscoroutine(result):
                        await result

                asyncio.run(go())
            else:
                for line in body.splitlines():
                    words = shlex.split(line, comments=True)
                    if not words:
                        continue
                    if words[0] == "export":
                        key, _, value = words[1].partition("=")
                        env[key] = value
                        continue
                    assert words[0] == "statebook", f"block {number}: only statebook commands run here: {line!r}"
                    result = CliRunner().invoke(app, words[1:], env=env)
                    assert result.exit_code == 0, f"block {number}: {line!r} exited {result.exit_code}:\n{result.output}"
                    ran += 1
    finally:
        for name in module_names:
            sys.modules.pop(name, None)
    assert ran >= 5, "the command-line block ran"
    assert (tmp_path / "app.db").exists()
