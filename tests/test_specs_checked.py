"""Every "Checked by:" list in specs/ names test files (in tests/ or the kit's lifecycle/testing/) that exist
and tests defined in them.

A rule is only as good as the test named under it; a renamed or moved test would otherwise leave the
spec pointing at nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATH = re.compile(r"((?:tests|lifecycle/testing)/[\w/]+\.py)")  # the kit's case suites ship in the package
NAME = re.compile(r"`(test_\w+)`")


def checked_by_blocks(text: str) -> list[str]:
    """The text of each "Checked by" list: from the marker to the next blank line or heading."""
    blocks = []
    for match in re.finditer(r"Checked by:?", text):
        rest = text[match.end():]
        end = re.search(r"\n\s*\n|\n#", rest)
        blocks.append(rest[: end.start()] if end else rest)
    return blocks


def references(text: str) -> list[tuple[str, str | None]]:
    """(test file, test name or None) for every file and the backticked test names after it."""
    found: list[tuple[str, str | None]] = []
    for block in checked_by_blocks(text):
        parts = PATH.split(block)
        for path, tail in zip(parts[1::2], parts[2::2]):
            names = NAME.findall(tail)
            found += [(path, name) for name in names] or [(path, None)]
    return found


def missing(spec_dir: Path = ROOT / "specs") -> list[str]:
    problems = []
    for spec in sorted(spec_dir.glob("*.md")):
        for path, name in references(spec.read_text()):
            file = ROOT / path
            if not file.exists():
                problems.append(f"{spec.name}: {path} does not exist")
            elif name and not re.search(rf"\bdef {name}\b", file.read_text()):
                problems.append(f"{spec.name}: {path} defines no {name}")
    return problems


def test_every_checked_by_reference_exists():
    problems = missing()
    assert not problems, "\n".join(problems)


def test_a_wrong_reference_is_reported(tmp_path):
    (tmp_path / "x.md").write_text("## X1\n\nChecked by:\n- tests/test_specs_checked.py — `test_not_there`,\n"
                                   "  `test_a_wrong_reference_is_reported`\n- tests/nowhere.py\n")
    assert missing(tmp_path) == ["x.md: tests/test_specs_checked.py defines no test_not_there",
                                 "x.md: tests/nowhere.py does not exist"]
