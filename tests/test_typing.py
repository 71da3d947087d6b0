"""statebook type-checks the way its users check their code (issue 30).

- ``mypy --strict`` (pyproject's ``[tool.mypy]``) passes on the public parts: ``statebook.lifecycle``,
  ``statebook.outbox``, ``statebook.scheduler`` and ``statebook.adapters``;
- the Python blocks of the README and the tutorial, saved as a user's modules side by side, pass
  ``mypy --strict`` and pyright's strict mode: declarations take the sets and lists a user writes, ``tx.conn``
  is a connection, not an Optional;
- both read statebook as installed. ``make venv``'s editable install is setuptools' strict link tree, which a
  checker follows (the default editable install of a ``package-dir`` mapping is an import hook they cannot see:
  every import of statebook would be ``import-not-found``); the wheel ships ``py.typed`` in every part.

The mypy runs share one cache (``.mypy_cache`` at the root, what a developer's own ``mypy`` run uses too), so
only the first run of a machine analyses SQLAlchemy and pydantic.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MYPY_CACHE = ROOT / ".mypy_cache"
PARTS = ("statebook.lifecycle", "statebook.outbox", "statebook.scheduler", "statebook.adapters")
FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.S | re.M)
# The pages whose Python blocks are a user's code, each with the modules of other pages its blocks import.
PAGES = {
    "README.md": {"ticketing.py": "docs/how-to/testing.md"},
    "docs/tutorial.md": {},
    "docs/how-to/testing.md": {},
}
# What a user naturally writes beside the docs' examples: lists, sets and a generator where a declaration
# takes statuses, codes and edges, an edge's actors as a set, and the bound book's connection used directly.
DECLARATIONS = '''
import sqlalchemy as sa

from statebook.adapters.db import open_book
from statebook.lifecycle import Lifecycle, Registry, edges, managed_table
from statebook.lifecycle.policy import Edge

orders = managed_table("orders", sa.Column("id", sa.String(32), primary_key=True), sa.Column("note", sa.Text))
ORDER = Lifecycle(
    entity_type="order", table=orders, statuses=["new", "paid", "shipped"], initial={"new"},
    terminal=["shipped"], edges=[*edges("new", "paid"), Edge("paid", "shipped", actors={"warehouse"})],
    patch_fields=(c for c in ("note",)), reason_prefixes=["order"], reasons={"order.paid.ok", "order.shipped.ok"},
    purgeable={"shipped"},
)
SMALLER = ORDER.extend(statuses=["held"], edges=edges("paid", "held", actors=["ops"]), reasons={"order.held.ok"})


async def note(registry: Registry) -> int:
    book = await open_book("sqlite:///./orders.db", registry=registry)
    async with book.begin() as tx:
        result = await tx.conn.execute(orders.select())
        return len(result.fetchall())
'''


def readable(output: str) -> str:
    """mypy's output with each installed path (a link of the editable tree) shown as its source file."""
    def source(match: re.Match[str]) -> str:
        path = Path(match.group(1)).resolve()
        return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else match.group(1)
    return re.sub(r"^(\S+\.py)(?=:)", source, output, flags=re.M)


def mypy(*args: str, cwd: Path, python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    """``python -m mypy ARGS`` in ``cwd`` with the shared cache, reading packages from ``python``'s install."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MYPY", "PYTHONPATH"))}
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(MYPY_CACHE), "--python-executable",
                           python, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def user_modules(page: str, folder: Path) -> list[str]:
    """Write the Python blocks of ``page`` into ``folder`` as a user's modules; their names.

    A block is saved under its title (``title="tickets.py"``), the name its first line gives (``# ticketing.py``)
    or ``block_N.py``; the modules it imports from another page (``PAGES``) are written beside it."""
    folder.mkdir(parents=True)
    names = []
    for number, (info, body) in enumerate(FENCE.findall((ROOT / page).read_text()), 1):
        names.append(_block_name(info, body) or f"block_{number}.py")
        (folder / names[-1]).parent.mkdir(parents=True, exist_ok=True)
        (folder / names[-1]).write_text(body)
    for name, other in PAGES[page].items():
        [body] = [b for info, b in FENCE.findall((ROOT / other).read_text()) if _block_name(info, b) == name]
        (folder / name).write_text(body)
    assert names, f"{page} has no python block"
    return names


def _block_name(info: str, body: str) -> str | None:
    """The module name a block gives itself: its title (``title="tickets.py"``) or its first line (``# ticketing.py``)."""
    named = re.search(r'title="([^"]+)"', info) or re.match(r"# (\w+\.py)\n", body)
    return named.group(1) if named else None


def test_the_public_parts_pass_mypy_strict():
    """pyproject's ``[tool.mypy]`` (strict) holds on the four parts, every module of each."""
    done = mypy(*(arg for part in PARTS for arg in ("-p", part)), cwd=ROOT)
    assert done.returncode == 0, readable(done.stdout)[-6000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout


@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_pages_code_passes_mypy_strict_as_a_users_module(page, tmp_path):
    """A user who copies the page's blocks into modules of their own and runs ``mypy --strict`` sees no error."""
    names = user_modules(page, tmp_path / "app")
    done = mypy("--strict", *names, cwd=tmp_path / "app")
    assert done.returncode == 0, f"{page}:\n{done.stdout[-6000:]}{done.stderr[-2000:]}"


def test_what_a_user_naturally_writes_passes_mypy_strict(tmp_path):
    """Lists, sets and a generator in a declaration and ``tx.conn`` used as a connection, without a cast."""
    (tmp_path / "orders.py").write_text(DECLARATIONS)
    done = mypy("--strict", "orders.py", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def test_the_readme_and_the_tutorial_pass_pyright_strict(tmp_path):
    """pyright in strict mode, on the same modules as mypy, with this interpreter's install (one run: each
    folder is an execution environment of its own, so its modules import each other)."""
    folders = ["README", "tutorial", "orders"]
    user_modules("README.md", tmp_path / "README")
    user_modules("docs/tutorial.md", tmp_path / "tutorial")
    (tmp_path / "orders").mkdir()
    (tmp_path / "orders" / "orders.py").write_text(DECLARATIONS)
    config = {"typeCheckingMode": "strict", "executionEnvironments": [{"root": name} for name in folders]}
    (tmp_path / "pyrightconfig.json").write_text(json.dumps(config))
    done = subprocess.run([str(BIN / "pyright"), "--pythonpath", sys.executable, *folders], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert re.search(r"^0 errors", done.stdout, re.M), done.stdout[-3000:]


def test_the_wheel_ships_py_typed_and_type_checks(tmp_path):
    """The wheel, installed on its own (no link tree), gives mypy the same types: ``py.typed`` in every part."""
    # Built from a copy: setuptools reuses the tree's build/lib, where a file the wheel no longer ships may linger.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "build", "site", "*.egg-info", "__pycache__",
                                                                 "*.db", "bench", "browser"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"),
                            str(source)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    [wheel] = (tmp_path / "dist").glob("statebook-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        files = set(archive.namelist())
        packages = {name.rsplit("/", 1)[0] for name in files if name.endswith("/__init__.py")}
        parts = {"/".join(("statebook", part.split(".")[1])) for part in PARTS}
        missing = sorted(part for part in parts if f"{part}/py.typed" not in files)
        assert not missing, f"the wheel has no py.typed in {missing}"
        assert all(any(f"{p}/".startswith(f"{part}/") for part in parts) for p in packages - {"statebook"})
        # A virtualenv of its own holds the wheel; the dependencies are this interpreter's (a .pth names its
        # site-packages after the venv's own, so the wheel's statebook is found first, the link tree never).
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
        python = tmp_path / "venv" / "bin" / "python"
        site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                   capture_output=True, text=True, check=True).stdout.strip())
        archive.extractall(site)
    (site / "zz_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    where = subprocess.run([str(python), "-c", "import statebook.lifecycle as m; print(m.__file__)"],
                           capture_output=True, text=True, timeout=120)
    assert where.stdout.strip().startswith(str(site)), where.stdout + where.stderr
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "orders.py").write_text(DECLARATIONS)
    done = mypy("--strict", "orders.py", cwd=tmp_path / "app", python=str(python))
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
