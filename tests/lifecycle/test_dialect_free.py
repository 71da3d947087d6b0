"""L17: ``lifecycle/`` asks its store, never the dialect; verify's worker processes run what the backend names.

The first test reads the source of ``lifecycle/`` (no database): no comparison with a dialect's name,
no driver or SQLAlchemy dialect import, no import of ``statebook.adapters``. The others start real
worker processes (lifecycle/screen.py run as a script) on a function named ``module:function``.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

import statebook.lifecycle
from statebook.adapters.sqlite import SQLiteFile
from statebook.lifecycle.screen import Worker, WorkerError

LIFECYCLE = Path(statebook.lifecycle.__file__).parent
DRIVERS = {"sqlite3", "aiosqlite", "asyncpg", "psycopg", "psycopg2"}


def _offences(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            names = []
        for name in names:
            if name.split(".")[0] in DRIVERS or name.startswith(("sqlalchemy.dialects", "statebook.adapters")):
                found.append(f"{where} imports {name}")
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            texts = {o.value for o in operands if isinstance(o, ast.Constant) and isinstance(o.value, str)}
            spelled = {ast.unparse(o) for o in operands}
            if texts & {"sqlite", "postgresql"} or any("dialect" in s for s in spelled):
                found.append(f"{where} compares {ast.unparse(node)}")
    return found


def test_lifecycle_never_branches_on_the_dialect():
    offences = [o for path in sorted(LIFECYCLE.rglob("*.py")) for o in _offences(path)]
    assert offences == [], "dialect-specific code belongs to a backend (adapters/): " + "; ".join(offences)


def test_the_check_sees_a_branch(tmp_path):
    """The check itself: a branch of the shape verify used to have is caught."""
    sample = tmp_path / "sample.py"
    sample.write_text(textwrap.dedent("""
        import sqlite3
        def order(conn, column):
            if conn.dialect.name == "postgresql":
                return column.collate("C")
            return column
    """))
    assert len(_offences(sample)) == 2


async def test_a_worker_runs_the_function_its_backend_names(tmp_path):
    """The worker imports ``module:function`` from the directories given (standard library only: the
    SQLite reader brings neither SQLAlchemy nor the rest of statebook, so a worker starts fast)."""
    (tmp_path / "probe.py").write_text(textwrap.dedent("""
        import sys
        import sqlite_screen

        def loaded(*roots):
            return sqlite_screen.__name__, sorted({m.split(".")[0] for m in sys.modules} & set(roots))
    """))
    target, path = SQLiteFile.worker
    assert target == "sqlite_screen:screen_file"
    async with Worker.started("probe:loaded", [str(tmp_path), *path]) as worker:
        worker.send(("sqlalchemy", "statebook", "aiosqlite", "sqlite3"))
        assert await worker.reply() == ("sqlite_screen", ["sqlite3"])


async def test_a_worker_reports_a_failed_call_and_goes_on(tmp_path):
    (tmp_path / "probe.py").write_text("def half(n):\n    return 1 / n if n else {}['no']\n")
    async with Worker.started("probe:half", [str(tmp_path)]) as worker:
        worker.send((0,))
        worker.send((4,))
        with pytest.raises(WorkerError, match="KeyError"):
            await worker.reply()
        assert await worker.reply() == 0.25
