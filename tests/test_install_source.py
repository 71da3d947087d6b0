"""The README's install from source works before a release exists: a clone of the repository, installed with
``pip install ./statebook``, gives a working ``statebook`` package and CLI.

The check stays cheap (about five seconds): the clone is installed into a folder of its own (``--target``)
without its dependencies (this interpreter has them); pip builds it in isolation, as a user's pip does, with the
``setuptools>=77`` that pyproject.toml asks for.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_a_clone_installs_with_pip_and_its_cli_runs(tmp_path: Path) -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout of the repository")
    clone = tmp_path / "src" / "statebook"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{ROOT}", str(clone)], check=True, timeout=120)
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                           "--target", str(site), str(clone)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STATEBOOK_", "PYTHON"))}
    env["PYTHONPATH"] = str(site)
    code = ("import statebook.lifecycle, statebook.outbox, statebook.scheduler, statebook.adapters.cli; "
            "print(statebook.lifecycle.__file__)")
    where = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip().startswith(str(site)), where.stdout  # the installed copy, not this checkout
    db = f"sqlite:///{tmp_path / 'x.db'}"
    cli = subprocess.run([sys.executable, "-m", "statebook", "--db", db, "lifecycle", "ls"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and "dispatch" in cli.stdout, cli.stderr
