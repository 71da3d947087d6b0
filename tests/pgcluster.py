"""A throwaway PostgreSQL cluster for the test suite.

``throwaway_cluster()`` runs ``initdb`` into a fresh temporary directory,
starts a server on a free 127.0.0.1 port with durability switched off (``durable=True``:
fsync, synchronous_commit and full_page_writes on, as production runs; the bench's ``--durable``),
creates a ``statebook_test`` database, yields its URL, and on exit stops the
server and deletes the directory.  When run as root, the server binaries run
as the ``postgres`` user (PostgreSQL refuses to run as root).

``STATEBOOK_PG_BINDIR`` overrides where the binaries are looked for; point it
at a directory without ``initdb`` to simulate a machine without PostgreSQL.

``make_template()`` and ``database_from()`` give each pytest-xdist worker a
database of its own on that one cluster: the schema is built once, in a
template, and every worker's database is a copy of it (CREATE DATABASE ...
TEMPLATE copies files; it does not run DDL again).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

PG_ROOT = Path("/usr/lib/postgresql")
DBNAME = "statebook_test"
SERVER_USER = "postgres"


def find_pg_bin() -> Path | None:
    """The ``bin`` directory of the newest installed PostgreSQL, or None."""
    override = os.environ.get("STATEBOOK_PG_BINDIR")
    if override is not None:
        path = Path(override)
        return path if (path / "initdb").is_file() else None
    candidates = []
    for bindir in PG_ROOT.glob("*/bin"):
        version = bindir.parent.name
        if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file():
            key = tuple(int(part) for part in re.findall(r"\d+", version))
            candidates.append((key, bindir))
    return max(candidates)[1] if candidates else None


TEMPLATE = "statebook_template"


def _with_database(url: str, name: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).set(database=name).render_as_string(hide_password=False)


def _admin(url: str, *statements: str) -> None:
    """Run ``statements`` in autocommit on ``url``'s server (CREATE/DROP DATABASE cannot run in a transaction)."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from statebook.adapters.db import normalize_url

    async def run() -> None:
        # The maintenance database: a database cannot be dropped or copied by a session connected to it.
        engine = create_async_engine(normalize_url(_with_database(url, "postgres")), isolation_level="AUTOCOMMIT")
        try:
            async with engine.connect() as conn:
                for statement in statements:
                    await conn.exec_driver_sql(statement)
        finally:
            await engine.dispose()

    _run_async(run)


def _run_async(work) -> None:
    """``asyncio.run(work())`` in a thread of its own: a session fixture may be set up inside a running loop."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, work()).result()


def make_template(server_url: str, name: str = TEMPLATE) -> str:
    """(Re)create database ``name`` on the server of ``server_url`` with the built-in schema; return its name."""
    from statebook.adapters.db import open_book

    _admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"')

    async def build() -> None:
        book = await open_book(_with_database(server_url, name))
        await book.engine.dispose()  # a template must have no connections when it is copied

    _run_async(build)
    return name


def database_from(server_url: str, name: str, template: str = TEMPLATE) -> str:
    """A fresh database ``name``, a copy of ``template``, on the server of ``server_url``; return its URL."""
    _admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)',
           f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return _with_database(server_url, name)


def drop_database(server_url: str, name: str) -> None:
    _admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _as_server_user(cmd: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", SERVER_USER, "--", *cmd]
    return cmd


def _run(cmd: list[str], cwd: Path, *, as_server: bool = True) -> None:
    full = _as_server_user(cmd) if as_server else cmd
    proc = subprocess.run(full, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(full)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )


def _log_tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no server log)"


def _postmaster_pid(datadir: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int((datadir / "postmaster.pid").read_text().splitlines()[0])
    return None


def _set_child_subreaper(on: bool) -> bool:
    """Linux: adopt orphaned descendants, so the postmaster that ``pg_ctl start``
    leaves behind becomes our child and we can reap it on stop instead of
    leaving a zombie for init (which, in some containers, is slow to reap)."""
    with contextlib.suppress(OSError, AttributeError):
        return ctypes.CDLL(None, use_errno=True).prctl(36, int(on), 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    return False


def _reap(pid: int | None, timeout: float = 10.0) -> None:
    if pid is None:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:  # not ours (no subreaper support): init reaps it
            return
        time.sleep(0.02)


@contextlib.contextmanager
def throwaway_cluster(bindir: Path | None = None, *, durable: bool = False) -> Iterator[str]:
    """Start a disposable cluster; yield ``postgresql://postgres@127.0.0.1:PORT/statebook_test``."""
    bindir = bindir or find_pg_bin()
    if bindir is None:
        raise FileNotFoundError(f"no PostgreSQL binaries (initdb, pg_ctl) under {PG_ROOT}/*/bin")
    root = Path(tempfile.mkdtemp(prefix="statebook-pg-"))
    datadir, sockdir, log = root / "data", root / "sock", root / "server.log"
    started = False
    try:
        sockdir.mkdir()
        if os.geteuid() == 0:
            for path in (root, sockdir):
                shutil.chown(path, SERVER_USER, SERVER_USER)
        _run(
            [str(bindir / "initdb"), "-D", str(datadir), "-A", "trust", "-U", "postgres",
             "--no-sync", "--encoding", "UTF8", "--locale", "C"],
            root,
        )
        for attempt in range(5):
            port = _free_port()
            durability = "on" if durable else "off"
            opts = (
                f"-p {port} -k {sockdir} -c listen_addresses=127.0.0.1 -c fsync={durability}"
                f" -c synchronous_commit={durability} -c full_page_writes={durability} -c max_connections=200"
            )
            subreaper = _set_child_subreaper(True)
            try:
                _run([str(bindir / "pg_ctl"), "-D", str(datadir), "-l", str(log), "-w",
                      "-t", "60", "-o", opts, "start"], root)
                started = True
                break
            except RuntimeError as exc:
                # Someone may have taken the port between probing and binding; retry.
                if attempt == 4 or "already in use" not in _log_tail(log):
                    raise RuntimeError(f"{exc}\n--- server log ---\n{_log_tail(log)}") from None
            finally:
                if subreaper:
                    _set_child_subreaper(False)
        createdb = bindir / "createdb"
        _run([str(createdb), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", DBNAME],
             root, as_server=False)
        yield f"postgresql://postgres@127.0.0.1:{port}/{DBNAME}"
    finally:
        if started:
            pid = _postmaster_pid(datadir)
            try:
                _run([str(bindir / "pg_ctl"), "-D", str(datadir), "-m", "immediate", "-w",
                      "-t", "30", "stop"], root)
            except RuntimeError:
                if pid is not None:  # last resort: signal the postmaster directly
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGQUIT)
            _reap(pid)
        shutil.rmtree(root, ignore_errors=True)
