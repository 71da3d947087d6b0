"""The documentation's code is real: each tested page's blocks run, in order, in an empty directory.

- a block with ``title="NAME"`` (python, toml) is a file of the reader's project: written to NAME (a
  relative path: its folders are made);
- a ``sh`` block runs under ``bash -e`` with this interpreter's ``bin`` first on PATH, so ``python`` and
  ``statebook`` are the installed ones; ``export`` lines carry over to the later blocks; every command must
  exit 0;
- a ``text`` block is output shown to the reader and is not run.

A page whose blocks are of any other kind fails, so nothing on a tested page goes unrun.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.S | re.M)
TESTED = ("tutorial.md", "how-to/extend.md", "how-to/outbox.md", "how-to/scheduler.md", "how-to/notifications.md",
          "how-to/tracing.md", "how-to/fastapi.md", "how-to/sync.md", "how-to/anchors.md")  # how-to/testing.md: tests/test_readme_kit.py


def blocks(page: Path) -> list[tuple[str, str, str]]:
    """(language, title or "", body) of each fenced block of ``page``, in order."""
    found = []
    for lang, info, body in FENCE.findall(page.read_text()):
        title = re.search(r'title="([^"]+)"', info)
        found.append((lang, title.group(1) if title else "", body))
    return found


def run_page(page: Path, folder: Path) -> list[str]:
    """Run every block of ``page`` in ``folder``; returns the output of each sh block. Fails on the first error."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATEBOOK_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    exports: list[str] = []
    outputs = []
    for number, (lang, title, body) in enumerate(blocks(page), 1):
        if title:
            (folder / title).parent.mkdir(parents=True, exist_ok=True)
            (folder / title).write_text(body)
        elif lang == "sh":
            script = "\n".join(["set -euo pipefail", *exports, body])
            done = subprocess.run(["bash", "-c", script], cwd=folder, env=env, capture_output=True, text=True,
                                  timeout=300)
            assert done.returncode == 0, (f"{page.name} block {number} exited {done.returncode}:\n{body}\n"
                                          f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
            outputs.append(done.stdout)
            exports += [line for line in body.splitlines() if line.startswith("export ")]
        elif lang != "text":
            pytest.fail(f"{page.name} block {number} is a {lang!r} block without a title: this test would not run it")
    return outputs


@pytest.mark.parametrize("name", [name for name in TESTED if name != "tutorial.md"])
def test_every_block_of_the_page_runs(name, tmp_path):
    """Each block of the page, in order, in an empty directory: the files are written, each command exits 0."""
    page = DOCS / name
    kinds = {lang for lang, _, _ in blocks(page)}
    assert "sh" in kinds, f"{name} runs nothing"
    run_page(page, tmp_path)


def test_the_tutorial_shows_the_whole_story(tmp_path):
    """Every block of the tutorial runs, and its commands show what it promises: the delivery, the history and a
    passing verify."""
    outputs = "\n".join(run_page(DOCS / "tutorial.md", tmp_path))
    assert "dispatches 1 (delivered 1)" in outputs
    assert "verified 2 entities, 6 facts: ok" in outputs
    assert "verify: ok (2 entities, 6 facts)" in outputs
    assert "ops " in (tmp_path / "notifications.log").read_text()


def test_a_failing_block_fails_the_page(tmp_path):
    """The runner is able to fail: a command that exits non-zero stops the page with its output."""
    page = tmp_path / "broken.md"
    page.write_text("```sh\nstatebook --db sqlite:///./missing.db --no-such-option\n```\n")
    with pytest.raises(AssertionError, match="exited 2"):
        run_page(page, tmp_path)


def test_an_unrun_block_fails_the_page(tmp_path):
    """A python block without a title would not run, so a tested page may not have one."""
    page = tmp_path / "untitled.md"
    page.write_text("```python\nprint('never run')\n```\n")
    with pytest.raises(pytest.fail.Exception):
        run_page(page, tmp_path)


def _hooks():
    import importlib.util

    spec = importlib.util.spec_from_file_location("statebook_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_lists_every_command():
    """The generated CLI reference has a section for every command of the click tree, nested groups included."""
    import typer.main

    from statebook.adapters.cli import app

    text = _hooks().cli_reference()
    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="statebook")
    expected = []
    for name in root.list_commands(ctx):
        sub = root.get_command(ctx, name)
        expected.append(f"statebook {name}")
        if hasattr(sub, "list_commands"):
            sub_ctx = sub.context_class(sub, info_name=name, parent=ctx)
            expected += [f"statebook {name} {child}" for child in sub.list_commands(sub_ctx)]
    assert len(expected) > 30
    for command in expected:
        assert f"# `{command}`" in text, command
    assert "# `statebook dispatch retry`" in text and "`--status" in text
