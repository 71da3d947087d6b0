"""The README's "Test your lifecycles in CI" lines run as written: its Python block, saved as a user's
test file beside the ``ticketing`` module docs/how-to/testing.md shows (the application's registry: the
built-ins and ``ticket``), passes under pytest with the plugin on a scratch SQLite database, in
pytest-asyncio's default mode (no asyncio setting)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_kit_lines_pass_as_written(tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Test your lifecycles in CI"):]
    [block] = re.findall(r"```python\n(.*?)```", section[: section.index("\n## ", 5)], re.S)
    (tmp_path / "test_statebook.py").write_text(block)
    guide = (ROOT / "docs" / "how-to" / "testing.md").read_text()
    [module] = [b for b in re.findall(r"```python\n(.*?)```", guide, re.S) if b.startswith("# ticketing.py")]
    (tmp_path / "ticketing.py").write_text(module)
    env = {**os.environ, "HYPOTHESIS_PROFILE": "ci", "SCRATCH_DB": f"sqlite:///{tmp_path / 'scratch.db'}"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_statebook.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert re.search(r"\b(\d+) passed", done.stdout) and int(re.search(r"(\d+) passed", done.stdout).group(1)) > 10
