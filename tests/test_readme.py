"""The README's Python code runs as written (issue 17): each ```python block is either run here, as a script in
a subprocess in an empty directory, or by a test of its own; a new block that neither runs fails this test."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
RUN_HERE = ("## A first lifecycle",)
RUN_ELSEWHERE = {"## Test your lifecycles in CI": "tests/test_readme_kit.py"}


def python_blocks() -> list[tuple[str, str]]:
    """(section heading, body) of each ```python block of the README, in order."""
    found = []
    heading = ""
    for part in re.split(r"^(## .*)$", README.read_text(), flags=re.M):
        if part.startswith("## "):
            heading = part.strip()
            continue
        found += [(heading, body) for body in re.findall(r"^```python\n(.*?)^```", part, re.S | re.M)]
    return found


def test_every_python_block_of_the_readme_is_run_by_a_test():
    """No block of the README goes unrun: each is run here or by the test named for its section."""
    for heading, _ in python_blocks():
        assert heading in RUN_HERE or heading in RUN_ELSEWHERE, f"a ```python block under {heading!r} runs nowhere"
    for test in RUN_ELSEWHERE.values():
        assert (ROOT / test).exists()


def test_the_first_example_runs_as_a_script(tmp_path):
    """The first example, saved as a file and run with python, exits 0 and prints its verify result."""
    [(_, body)] = [b for b in python_blocks() if b[0] in RUN_HERE]
    (tmp_path / "first.py").write_text(body)
    done = subprocess.run([sys.executable, "first.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "True"
    assert (tmp_path / "app.db").exists()
