"""The repository carries the license its package metadata names (issue 25, part 9)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_license_file_is_the_mit_license_the_metadata_names():
    """pyproject says ``license = "MIT"``; LICENSE holds that license with its holder and year, and the
    metadata ships it (``license-files``)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT"
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 statebook maintainers" in text
    assert 'THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND' in text
    assert "LICENSE" in project.get("license-files", [])
