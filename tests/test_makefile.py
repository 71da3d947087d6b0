"""``make`` says what it installs while it installs (issue 30): no install runs quiet, each is announced first."""

from __future__ import annotations

import re
from pathlib import Path

MAKEFILE = Path(__file__).resolve().parent.parent / "Makefile"


def recipes() -> dict[str, list[str]]:
    """Target -> its recipe lines (tabs and line continuations joined)."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    text = MAKEFILE.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if line.startswith("\t") and current is not None:
            current.append(line.strip())
        elif re.match(r"^[^\s#=]+:(?!=)", line):
            current = found.setdefault(line.split(":", 1)[0], [])
        elif line.strip() and not line.startswith("#"):
            current = None
    return found


def test_every_install_is_announced_and_names_its_packages():
    """Each recipe that runs ``pip install`` echoes what it installs before it, and pip runs without ``-q`` so it
    names each package as it goes (no minute of silence); ``make docs`` says it builds the site."""
    installing = {target: lines for target, lines in recipes().items() if any("pip install" in l for l in lines)}
    assert {"$(VENV)/.stamp", "$(VENV)/.docs-stamp", "bench"} <= set(installing), sorted(installing)
    for target, lines in installing.items():
        first = next(i for i, line in enumerate(lines) if "pip install" in line)
        assert any("echo" in line for line in lines[:first]), (target, "no line says what is installed first")
        for line in lines:
            if "pip install" in line:
                assert not re.search(r"\s(-q+|--quiet)\b", line), (target, line)
    assert any(line.lstrip("@").startswith("echo") for line in recipes()["docs"]), "make docs says what it builds"
