"""The layering as a whole: the import-linter contracts of pyproject.toml (``[tool.importlinter]``) hold.

``adapters`` -> ``scheduler`` -> ``outbox`` -> ``lifecycle`` (lifecycle imports nothing of ours), only adapters
import adapters, no module of ``adapters/migrations`` imports its own package (the cycle issue 27 removed), and
logging does not depend on the CLI. The source folders are installed under other names (pyproject's
``package-dir``), which import-linter cannot follow, so each check runs on a copy laid out as installed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("lifecycle", "outbox", "scheduler", "adapters")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def installed_tree(dest: Path) -> Path:
    """A copy of the sources as the ``statebook`` package (``dest/statebook/lifecycle``, ...); ``dest``."""
    package = dest / "statebook"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for part in PARTS:
        shutil.copytree(ROOT / part, package / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with pyproject.toml's contracts on ``tree`` (no cache written anywhere)."""
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", str(ROOT / "pyproject.toml")], cwd=tree,
                          env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=300)


def test_the_import_contracts_hold(tmp_path):
    result = lint_imports(installed_tree(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


BREAKS = {
    "lifecycle imports the outbox": ("lifecycle/leak.py", "import statebook.outbox\n", "lifecycle imports nothing"),
    "outbox imports the scheduler": ("outbox/leak.py", "import statebook.scheduler\n", "lifecycle imports nothing"),
    "scheduler imports adapters": ("scheduler/leak.py", "import statebook.adapters.db\n",
                                   "only adapters import adapters"),
    "the migrations cycle": ("adapters/migrations/leak.py", "from . import HEAD\n", "never imports the package"),
    "logging imports the CLI": ("adapters/logs.py", "from .cli.funnel import classify\n",
                                "do not depend on the command line"),
    "notifications import dispatch internals": ("outbox/notifications/leak.py",
                                                "from statebook.outbox.dispatch import attempts\n",
                                                "not on dispatch's internals"),
}


@pytest.mark.parametrize("case", sorted(BREAKS))
def test_a_broken_contract_fails_the_check(tmp_path, case):
    """Each contract catches the edge it forbids (the test above would then fail)."""
    path, line, contract = BREAKS[case]
    tree = installed_tree(tmp_path)
    target = tree / "statebook" / path
    target.write_text((target.read_text() if target.exists() else "") + line)
    result = lint_imports(tree)
    assert result.returncode == 1, result.stdout + result.stderr
    broken = result.stdout.split("Broken contracts", 1)[-1]
    assert contract in " ".join(broken.split()), result.stdout
