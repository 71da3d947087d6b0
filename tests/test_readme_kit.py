"""The kit's guide and the README's "Test your lifecycles in CI" lines run as written: every block of
docs/how-to/testing.md runs in order in an empty directory (the ``ticketing`` module, the user's test files, the
CI commands: ``statebook check`` and pytest with the plugin on a scratch SQLite database, in pytest-asyncio's
default mode), and the README's Python block is the guide's ``tests/test_statebook.py``, so it runs too."""

from __future__ import annotations

import re
from pathlib import Path

from test_docs import blocks, run_page

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "how-to" / "testing.md"


def test_the_readme_block_is_the_guide_s_test_file() -> None:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Test your lifecycles in CI"):]
    [block] = re.findall(r"```python\n(.*?)```", section[: section.index("\n## ", 5)], re.S)
    [guide] = [body for _, title, body in blocks(GUIDE) if title == "tests/test_statebook.py"]
    assert block == guide, "the README's kit lines and docs/how-to/testing.md's tests/test_statebook.py differ"


def test_every_block_of_the_kit_guide_runs(tmp_path: Path) -> None:
    outputs = "\n".join(run_page(GUIDE, tmp_path))
    passed = re.search(r"\b(\d+) passed", outputs)
    assert passed and int(passed.group(1)) > 10, outputs[-3000:]
    assert "failed" not in outputs
