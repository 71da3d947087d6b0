"""``run.py --baseline REV``: the same statebook contenders, measured for REV too, in the same rounds.

The revision is exported from the repository (``git archive``) into a temporary directory and
installed, with the extras the bench needs, into a virtualenv of its own (:class:`Install`). The
working tree is installed the same way (:meth:`Install.working`: its tracked and untracked files as
they are now, not committed first), so the two sides differ only in statebook's code: same base
interpreter, same dependency versions, a regular install on both sides. An editable install reads
slower in some rounds than a regular install of the same commit, by more than the 5% a comparison
has to resolve. Both sides install the package ``statebook``, so neither is imported by the bench
process: each workload that compares starts one child process per side (``child.py``,
:class:`Child`), and every statebook contender of that workload becomes a pair of requests to them
(:class:`Sides`). The children run
the WORKING tree's drivers (``tests/bench/statebook_side.py``) against their own install; the
peers and the floor run in this process, once per round, as without ``--baseline``.

In round 1 the working tree's child runs first and the baseline's second, in round 2 the other
way round, and so on (``common.round_order``), both right where the in-process contender would
run, so drift and warm caches favour neither. Each side has its own PostgreSQL database on the
same server and its own fresh SQLite files. A request the baseline cannot serve (a driver calls
an API that revision lacks) makes that cell ``n/a``; the working tree's side failing is an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import BENCH_DIR, METER, REPO_DIR, Line, median

SUFFIX = "@baseline"
"""A baseline contender's name is its working-tree contender's name plus this."""
EXTRAS = "test,bench"
MARK = "@bench-child@ "  # child.MARK (child.py is not imported here: it is the other process's file)
Run = Callable[[], Awaitable[float]]


class BaselineError(RuntimeError):
    """The baseline revision cannot be resolved, exported or installed."""


class ChildError(RuntimeError):
    """A child process could not serve a request."""


def resolve(rev: str, repo: Path = REPO_DIR) -> tuple[str, str]:
    """The full commit id ``rev`` names in ``repo`` and its one-line description."""
    proc = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=repo,
                          capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise BaselineError(f"{rev!r} does not name a commit in {repo}")
    sha = proc.stdout.strip()
    subject = subprocess.run(["git", "log", "-1", "--format=%h %s", sha], cwd=repo, capture_output=True,
                             text=True).stdout.strip()
    return sha, subject


@dataclass
class Install:
    """REV's tree and a virtualenv with it installed, under ``root`` (removed by :meth:`cleanup`
    unless ``keep``; a kept directory is reused when it already holds the same commit)."""

    rev: str
    sha: str
    subject: str
    root: Path
    keep: bool

    @property
    def tree(self) -> Path:
        return self.root / "tree"

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def stamp(self) -> Path:
        return self.root / "baseline.json"

    @property
    def short(self) -> str:
        """The commit's id and subject, cut to fit a log line."""
        return self.subject if len(self.subject) <= 72 else self.subject[:71] + "…"

    def describe(self) -> dict[str, Any]:
        return {"rev": self.rev, "sha": self.sha, "subject": self.subject, "python": str(self.python),
                "kept_in": str(self.root) if self.keep else None}

    @classmethod
    def prepare(cls, rev: str, keep: Path | None, log: Callable[[str], None]) -> Install:
        sha, subject = resolve(rev)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
        root = keep.resolve() if keep is not None else Path(tempfile.mkdtemp(prefix="statebook-baseline-"))
        install = cls(rev, sha, subject, root, keep is not None)
        try:
            install.build(log)
        except BaseException:
            install.cleanup()
            raise
        return install

    @classmethod
    def working(cls, log: Callable[[str], None], repo: Path = REPO_DIR) -> Install:
        """The working tree as it is now (uncommitted edits and new files included), installed like a
        baseline into a temporary virtualenv; never kept, since the tree changes between runs."""
        root = Path(tempfile.mkdtemp(prefix="statebook-working-"))
        install = cls("working tree", "", f"working tree of {repo}", root, keep=False)
        try:
            log(f"working tree: copying it and installing it into {install.venv}")
            copy_worktree(repo, install.tree)
            install.make_venv("working tree")
        except BaseException:
            install.cleanup()
            raise
        return install

    def build(self, log: Callable[[str], None]) -> None:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(self.stamp.read_text())["sha"] == self.sha and self.python.exists():
                log(f"baseline {self.short}: reusing the install in {self.root}")
                return
        for stale in (self.tree, self.venv, self.stamp):
            if stale.is_dir():
                shutil.rmtree(stale)
            else:
                stale.unlink(missing_ok=True)
        log(f"baseline {self.short}: exporting {self.sha[:12]} and installing it into {self.venv}")
        archive = subprocess.run(["git", "archive", "--format=tar", self.sha], cwd=REPO_DIR, capture_output=True)
        if archive.returncode != 0:
            raise BaselineError(f"git archive {self.sha} failed: {archive.stderr.decode(errors='replace')}")
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(self.tree, filter="data")
        self.make_venv(self.rev)
        self.stamp.write_text(json.dumps({"sha": self.sha, "rev": self.rev}) + "\n")

    def make_venv(self, what: str) -> None:
        """A virtualenv from the bench's own base interpreter with :attr:`tree` installed (not editable)."""
        _check_run([sys.executable, "-m", "venv", str(self.venv)], f"creating the virtualenv for {what}")
        _check_run([str(self.python), "-m", "pip", "install", "-q", f"{self.tree}[{EXTRAS}]"],
                   f"installing {what} into its virtualenv")

    def cleanup(self) -> None:
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)


def copy_worktree(repo: Path, dest: Path) -> None:
    """Copy what ``git`` would see of ``repo`` now: tracked files as edited, and untracked files that
    are not ignored (a deleted tracked file is left out)."""
    listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                             capture_output=True)
    if listing.returncode != 0:
        raise BaselineError(f"git ls-files in {repo} failed: {listing.stderr.decode(errors='replace')}")
    for name in filter(None, listing.stdout.decode().split("\0")):
        src = repo / name
        if not src.is_file():
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def _check_run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise BaselineError(f"{what} failed ({' '.join(cmd)} exited {proc.returncode}):\n"
                            f"{(proc.stdout + proc.stderr)[-3000:]}")


def child_env() -> dict[str, str]:
    """The environment of a child: this one without PYTHONPATH, so only its own install is found."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


class Child:
    """One side's ``child.py`` process and its request/reply pipe."""

    def __init__(self, label: str, python: str, pg_url: str | None, sqlite_dir: Path) -> None:
        self.label, self.python, self.pg_url, self.sqlite_dir = label, python, pg_url, sqlite_dir
        self.proc: asyncio.subprocess.Process | None = None
        self.ready = False
        self.error: str | None = None
        self.statebook: str | None = None

    async def start(self) -> None:
        self.sqlite_dir.mkdir(parents=True, exist_ok=True)
        config = {"label": self.label, "pg": self.pg_url, "sqlite_dir": str(self.sqlite_dir)}
        self.proc = await asyncio.create_subprocess_exec(
            self.python, str(BENCH_DIR / "child.py"), json.dumps(config), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, cwd=self.sqlite_dir, env=child_env(), limit=1 << 24)
        try:
            hello = await self._read()
        except ChildError as exc:
            hello = {"ready": False, "error": str(exc)}
        self.ready, self.error, self.statebook = bool(hello.get("ready")), hello.get("error"), hello.get("statebook")

    async def _read(self) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            raw = await self.proc.stdout.readline()
            if not raw:
                code = await self.proc.wait()
                raise ChildError(f"the {self.label} child process exited with status {code}")
            text = raw.decode(errors="replace")
            if text.startswith(MARK):
                return json.loads(text[len(MARK):])
            print(f"[{self.label} child] {text.rstrip()}", flush=True)  # the library's own output

    async def call(self, op: str, backend: str, **args: Any) -> tuple[Any, float]:
        """Run one request in the child: its value and the client CPU seconds of its measured region."""
        if not self.ready or self.proc is None or self.proc.stdin is None:
            raise ChildError(self.error or f"the {self.label} child is not running")
        try:
            self.proc.stdin.write((json.dumps({"op": op, "backend": backend, **args}) + "\n").encode())
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ChildError(f"the {self.label} child process is gone ({exc})") from exc
        got = await self._read()
        if not got.get("ok"):
            raise ChildError(got.get("error") or "unknown error")
        return got["value"], float(got["cpu"])

    async def close(self) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        try:
            if proc.stdin is not None:
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    proc.stdin.write(b'{"op": "close"}\n')
                    await proc.stdin.drain()
                    proc.stdin.close()
            await asyncio.wait_for(proc.wait(), 30)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise


@dataclass
class Remote:
    """A statebook contender as a request ``child.py`` can serve.

    ``figure(name, value)`` turns the child's value (seconds, or W3's latencies) into the round's
    figure; ``name`` is the contender's name (with :data:`SUFFIX` for the baseline's run).
    """

    op: str
    backend: str
    args: dict[str, Any]
    figure: Callable[[str, Any], float]


@dataclass
class Sides:
    """What a ``--baseline`` run needs for each workload that compares."""

    work_python: str
    base_python: str
    pg_work: str
    pg_base: str
    sqlite_dir: Path
    log: Callable[[str], None]
    repeat: int = 1
    """Runs of each (working, baseline) pair per round, back to back (``interleave(repeat=...)``)."""
    errors: dict[str, str] = field(default_factory=dict)
    """Baseline contender name -> why it is n/a (it is not run again after its first failure)."""
    seen: dict[str, str] = field(default_factory=dict)
    """Where each side's child imported statebook from (logged once per run)."""
    _n: int = 0

    def children(self) -> tuple[Child, Child]:
        self._n += 1
        return (Child("working", self.work_python, self.pg_work, self.sqlite_dir / f"work-{self._n}"),
                Child("baseline", self.base_python, self.pg_base, self.sqlite_dir / f"base-{self._n}"))

    @contextlib.asynccontextmanager
    async def contenders(self, contenders: Sequence[tuple[str, Run]], remotes: dict[str, Remote],
                         children: tuple[Any, Any] | None = None
                         ) -> AsyncIterator[tuple[list[tuple[str, Run]], list[tuple[str, str]]]]:
        """``contenders`` with every one named in ``remotes`` replaced by the pair (working tree child,
        baseline child), and the pairs to alternate. ``children``: stand-ins for tests."""
        work, base = children or self.children()
        try:
            await work.start()
            await base.start()
            if not work.ready:
                raise RuntimeError(f"the working tree's child process failed to start: {work.error}")
            for child in (work, base):
                where = child.statebook if child.ready else f"n/a ({child.error})"
                if self.seen.get(child.label) != where:
                    self.seen[child.label] = where
                    self.log(f"{child.label} side: {child.python}, statebook from {where}")
            out: list[tuple[str, Run]] = []
            pairs: list[tuple[str, str]] = []
            for name, run in contenders:
                remote = remotes.get(name)
                if remote is None:
                    out.append((name, run))
                    continue
                out.append((name, self._runner(work, name, remote, strict=True)))
                out.append((name + SUFFIX, self._runner(base, name + SUFFIX, remote, strict=False)))
                pairs.append((name, name + SUFFIX))
            yield out, pairs
        finally:
            try:
                await base.close()
            finally:
                await work.close()

    def _runner(self, child: Any, key: str, remote: Remote, *, strict: bool) -> Run:
        async def go() -> float:
            if key in self.errors:
                return math.nan
            try:
                value, cpu = await child.call(remote.op, remote.backend, **remote.args)
            except ChildError as exc:
                if strict:
                    raise RuntimeError(f"{key} (working tree, in its child process): {exc}") from exc
                if str(exc) not in self.errors.values():  # each reason is logged once
                    self.log(f"    {key}: n/a ({exc})")
                self.errors[key] = str(exc)
                return math.nan
            METER.cpu = cpu
            return remote.figure(key, value)
        return go

    def compare(self, line: Line, key: str, values: dict[str, list[float]],
                cpu: dict[str, list[float]] | None = None, count: int | None = None) -> Line:
        """Give ``line`` (statebook contender ``key``) the baseline's median from ``values``; with
        ``cpu`` and ``count`` also its client CPU per operation."""
        line.compared = True
        name = key + SUFFIX
        got = [v for v in values.get(name, []) if v == v]
        if name in self.errors or not got:
            line.baseline_note = f"n/a ({self.errors.get(name, 'no figure')})"
            return line
        line.baseline = median(got)
        line.samples["baseline"] = got
        work = values.get(key, [])
        if len(work) == len(values[name]):  # interleave(repeat=...) made them pairwise, back to back
            line.paired = [w / v for w, v in zip(work, values[name]) if w == w and v == v and v]
        if cpu is not None and count and cpu.get(name):
            line.baseline_cpu_us = median(cpu[name]) / count * 1e6
        return line
