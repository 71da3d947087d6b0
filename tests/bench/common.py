"""Shared pieces of the benchmark: sizes, rounds, databases, result lines and the table.

Every figure is the median of several rounds; contenders run interleaved (A B A B ...) on fresh
databases, so drift on a shared machine hits every contender alike. Ratios within one run are the
result; absolute numbers are noise.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg

T = TypeVar("T")

BENCH_DIR = Path(__file__).resolve().parent
TESTS_DIR = BENCH_DIR.parent
REPO_DIR = TESTS_DIR.parent

# Fixed for every contender of a drain: in-flight deliveries and rows fetched per claim/scan.
CONCURRENCY = 10
BATCH = 100
W3_IDLE_GAP = 0.005
"""Seconds the harness waits after a delivery before the next W3 enqueue (the worker goes idle)."""


@dataclass(frozen=True)
class Sizes:
    """How much work each workload does. ``quick`` fits ``make bench`` in 15 minutes on 2 cores;
    ``full`` is the issue's sizes (an hour or more while statebook's SQLite drain is slow)."""

    mode: str
    rounds: int
    w1_single: int
    w1_batch_total: int
    w1_batch: int
    w2_drain: int
    w2_drain_procrastinate: int
    w3_samples: int
    w4_due: int
    w4_small: int
    w4_large: int
    w5_facts: int
    w6_schedules: int
    w6_due: int
    memory_drain: int

    @classmethod
    def quick(cls) -> Sizes:
        return cls("quick", rounds=3, w1_single=2_000, w1_batch_total=5_000, w1_batch=500, w2_drain=3_000,
                   w2_drain_procrastinate=2_000, w3_samples=500, w4_due=1_000, w4_small=10_000, w4_large=100_000,
                   w5_facts=100_000, w6_schedules=10_000, w6_due=1_000, memory_drain=5_000)

    @classmethod
    def full(cls) -> Sizes:
        return cls("full", rounds=3, w1_single=20_000, w1_batch_total=20_000, w1_batch=500, w2_drain=10_000,
                   w2_drain_procrastinate=10_000, w3_samples=500, w4_due=1_000, w4_small=10_000,
                   w4_large=1_000_000, w5_facts=1_000_000, w6_schedules=10_000, w6_due=1_000,
                   memory_drain=100_000)


@dataclass
class Line:
    """One row of the result table."""

    workload: str
    backend: str
    unit: str
    statebook: float | None
    reference: str = ""
    other: float | None = None
    ratio: float | None = None
    target: str = ""
    passed: bool | None = None
    note: str = ""
    samples: dict[str, list[float]] = field(default_factory=dict)
    cpu_us: tuple[float, float] | None = None
    """Client CPU per operation, microseconds: (statebook, reference)."""
    compared: bool = False
    """Set by a ``--baseline`` run on every line it measured the baseline for (see baseline.py)."""
    baseline: float | None = None
    """The baseline revision's median in the line's unit (None: not compared, or n/a)."""
    baseline_note: str = ""
    """Why a compared line has no baseline figure (the child's error)."""
    baseline_cpu_us: float | None = None
    """The baseline's client CPU per operation, microseconds (in its own process)."""
    paired: list[float] = field(default_factory=list)
    """Working / baseline for each pair of runs made back to back (``interleave(repeat=...)``)."""

    @property
    def verdict(self) -> str:
        if self.passed is None:
            return "n/a" if self.statebook is None else "info"
        return "PASS" if self.passed else "FAIL"

    @property
    def baseline_ratio(self) -> float | None:
        """The baseline's figure against the same reference as ``ratio``."""
        if self.baseline is None or not self.other or self.ratio is None:
            return None
        return self.baseline / self.other

    @property
    def vs_baseline(self) -> float | None:
        """Working tree / baseline in the line's unit (above 1 is better for rates, worse for times): the
        median of the paired ratios when there are pairs, else the ratio of the two medians."""
        if self.baseline is None or not self.baseline or self.statebook is None:
            return None
        return median(self.paired) if self.paired else self.statebook / self.baseline

    @property
    def vs_baseline_ci(self) -> tuple[float, float] | None:
        """A 95% confidence interval of :attr:`vs_baseline` (None with fewer than 6 pairs)."""
        return median_ci(self.paired) if self.baseline is not None else None

    def to_json(self) -> dict[str, Any]:
        out = {**asdict(self), "verdict": self.verdict}
        if self.compared:
            out.update(baseline_ratio=self.baseline_ratio, vs_baseline=self.vs_baseline,
                       vs_baseline_ci=self.vs_baseline_ci)
        else:  # a run without --baseline writes the lines it always wrote
            for key in ("compared", "baseline", "baseline_note", "baseline_cpu_us", "paired"):
                del out[key]
        return out


class Meter:
    """The measured region of the current run: its wall-clock start and the client CPU spent in it.

    CPU is this process's user + system time (``time.process_time``): the Python side of every
    contender, which a loaded machine disturbs far less than wall time. Server CPU is not in it.
    """

    def __init__(self) -> None:
        self.cpu = 0.0
        self.t0 = 0.0
        self._c0 = 0.0

    def start(self) -> float:
        # Every measured region starts from a collected heap: otherwise whether a full collection (tens of ms)
        # falls inside a 3,000-delivery run depends on what the seeding before it allocated, and one
        # contender pays it in some runs and not in others (about +-10% on a PostgreSQL drain).
        gc.collect()
        self._c0 = time.process_time()
        self.t0 = time.perf_counter()
        return self.t0

    def stop(self) -> float:
        """Seconds since :meth:`start`; adds the CPU spent since then to ``cpu``."""
        elapsed = time.perf_counter() - self.t0
        self.cpu += time.process_time() - self._c0
        return elapsed


METER = Meter()


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def median_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free confidence interval of the median: the order statistics ``(x[j], x[n-1-j])``
    with the largest ``j`` whose binomial tail ``P(X <= j) <= (1 - confidence) / 2`` for X ~ B(n, 1/2).
    None when ``n`` is too small for any such ``j`` (n < 6 at 95%)."""
    ordered = sorted(v for v in values if v == v)
    n = len(ordered)
    tail, j, cumulative = (1 - confidence) / 2, -1, 0.0
    for i in range(n // 2):
        cumulative += math.comb(n, i) / 2**n
        if cumulative > tail:
            break
        j = i
    return None if j < 0 else (ordered[j], ordered[n - 1 - j])


def throughput_line(workload: str, backend: str, unit: str, sb: list[float], ref_name: str, ref: list[float],
                    at_least: float | None, note: str = "", cpu: tuple[float, float] | None = None) -> Line:
    """Higher is better (ops/s); the ratio is statebook/reference and must be >= ``at_least``.

    ``cpu``: client CPU microseconds per operation (statebook, reference), medians over rounds.
    """
    s, o = median(sb), median(ref)
    ratio = s / o if o else None
    passed = None if at_least is None or ratio is None else ratio >= at_least
    target = f">= {at_least:g}x" if at_least is not None else ""
    return Line(workload, backend, unit, s, ref_name, o, ratio, target, passed, note,
                {"statebook": sb, ref_name: ref}, cpu)


def cpu_per_op(cpu: dict[str, list[float]], sb: str, ref: str, n_sb: int, n_ref: int | None = None) -> tuple[float, float]:
    """Median client CPU per operation in microseconds for two contenders of an ``interleave``."""
    return median(cpu[sb]) / n_sb * 1e6, median(cpu[ref]) / (n_ref or n_sb) * 1e6


def round_order(contenders: Sequence[tuple[str, Any]], r: int,
                alternate: Sequence[tuple[str, str]] = ()) -> list[tuple[str, Any]]:
    """The contenders of round ``r`` (0-based): as given, with each ``alternate`` pair swapped in odd rounds.

    A ``--baseline`` run pairs every statebook contender with its baseline (working tree first in
    rounds 1, 3, ..., baseline first in rounds 2, 4, ...), so neither side always runs warmer.
    """
    order = list(contenders)
    if r % 2:
        at = {name: i for i, (name, _) in enumerate(order)}
        for a, b in alternate:
            i, j = at[a], at[b]
            order[i], order[j] = order[j], order[i]
    return order


async def interleave(rounds: int, contenders: Sequence[tuple[str, Callable[[], Awaitable[float]]]],
                     log: Callable[[str], None], cpu: dict[str, list[float]] | None = None,
                     alternate: Sequence[tuple[str, str]] = (), repeat: int = 1) -> dict[str, list[float]]:
    """Run each contender once per round, in order (A B A B ...); collect one figure per run.

    With ``cpu`` each run's client CPU in its measured region (see :data:`METER`) is collected too.
    ``alternate``: pairs of contender names whose order swaps every other round (:func:`round_order`).
    ``repeat``: each ``alternate`` pair runs that many times per round, back to back, its order
    swapping every time (A B, B A, A B, ...), so the i-th figures of the two names form a pair made
    under the same conditions (``Line.paired``).
    """
    out: dict[str, list[float]] = {name: [] for name, _ in contenders}
    partner = {a: b for a, b in alternate} | {b: a for a, b in alternate}
    runs = dict(contenders)

    async def one(name: str, label: str) -> None:
        METER.cpu = 0.0
        value = await runs[name]()
        out[name].append(value)
        if cpu is not None:
            cpu.setdefault(name, []).append(METER.cpu)
        log(f"    round {label} {name}: {value:,.1f}")

    for r in range(rounds):
        done: set[str] = set()
        for name, _ in round_order(contenders, r, alternate):
            if name in done:
                continue
            if name not in partner:
                await one(name, f"{r + 1}/{rounds}")
                continue
            first, second = name, partner[name]
            done |= {first, second}
            for k in range(repeat):
                order = (first, second) if k % 2 == 0 else (second, first)
                for n in order:
                    await one(n, f"{r + 1}/{rounds}" + (f" pair {k + 1}/{repeat}" if repeat > 1 else ""))
    return out


# -- databases ---------------------------------------------------------------------------------

def pg_database_url(base: str, name: str) -> str:
    """``base`` with its database name replaced."""
    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


async def recreate_databases(base: str, names: Sequence[str]) -> dict[str, str]:
    """Drop and create one database per contender on the server of ``base``; their URLs by name."""
    conn = await asyncpg.connect(base)
    try:
        for name in names:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return {name: pg_database_url(base, name) for name in names}


async def drop_databases(base: str, names: Sequence[str]) -> None:
    """Drop the databases ``names`` on the server of ``base`` (the end of a run)."""
    conn = await asyncpg.connect(base)
    try:
        for name in names:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def run_with_postgres(pg_url: str | None, job: Callable[[str], Awaitable[T]]) -> T:
    """``asyncio.run(job(url))`` on ``pg_url``, or on a throwaway cluster (tests/pgcluster.py) when None."""
    if pg_url:
        return asyncio.run(job(pg_url))
    import pgcluster

    with pgcluster.throwaway_cluster() as url:
        return asyncio.run(job(url))


async def pg_server_version(url: str) -> str:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval("SHOW server_version")
    finally:
        await conn.close()


DURABILITY_SETTINGS = ("fsync", "synchronous_commit", "full_page_writes")


async def server_durability(url: str) -> dict[str, str]:
    """The server's ``fsync``, ``synchronous_commit`` and ``full_page_writes`` (``--durable`` wants all on)."""
    conn = await asyncpg.connect(url)
    try:
        return {name: await conn.fetchval(f"SHOW {name}") for name in DURABILITY_SETTINGS}
    finally:
        await conn.close()


def durability_line(durable: bool, server: dict[str, str], sqlite_floor: str) -> str:
    """The line printed above the table: which mode the figures were measured in."""
    settings = ", ".join(f"{k}={v}" for k, v in server.items())
    return (f"mode: {'durable' if durable else 'fast (durability off)'}: PostgreSQL {settings}; SQLite: "
            f"statebook synchronous=NORMAL (adapters/db.py, no setting), floor synchronous={sqlite_floor}")


class SqliteFiles:
    """Fresh SQLite file paths under one temporary directory, removed at the end."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="statebook-bench-"))
        self.n = 0

    def fresh(self, label: str) -> Path:
        self.n += 1
        path = self.dir / f"{label}-{self.n}.db"
        return path

    def drop(self, path: Path) -> None:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{path}{suffix}")

    def cleanup(self) -> None:
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    info: dict[str, Any] = {"nproc": os.cpu_count()}
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["mem_total_mb"] = int(line.split()[1]) // 1024
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError):
        info["loadavg_1m"] = float(Path("/proc/loadavg").read_text().split()[0])
    import platform
    import sqlite3

    info["python"] = platform.python_version()
    info["sqlite"] = sqlite3.sqlite_version
    return info


# -- the table ---------------------------------------------------------------------------------

def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if value != value:  # NaN
        return "-"
    if unit.startswith("ms") or unit == "MB" or unit == "s":
        return f"{value:,.1f} {unit}"
    return f"{value:,.0f} {unit}"


def _baseline_cells(ln: Line) -> tuple[str, str]:
    """The ``baseline`` and ``vs baseline`` cells of a line."""
    if not ln.compared:
        return "-", "-"
    if ln.baseline is None or ln.baseline != ln.baseline:
        return "n/a", "n/a"  # why: ``baseline_note``, printed under the table and kept in results.json
    ratio = ln.baseline_ratio
    cell = _fmt(ln.baseline, ln.unit) + (f" ({ratio:.2f}x)" if ratio is not None else "")
    vs, ci = ln.vs_baseline, ln.vs_baseline_ci
    if vs is None:
        return cell, "-"
    return cell, f"{vs:.2f}x" + (f" [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else "")


def render_table(lines: Sequence[Line]) -> str:
    """The result table; with a ``baseline`` and a ``vs baseline`` column when a line was compared."""
    with_baseline = any(ln.compared for ln in lines)
    header: tuple[str, ...] = ("workload", "backend", "statebook", "peer/floor", "ratio", "target", "result",
                               "client CPU/op")
    if with_baseline:
        header = (*header[:5], "baseline", "vs baseline", *header[5:])
    rows = []
    for ln in lines:
        ref = f"{ln.reference} {_fmt(ln.other, ln.unit)}" if ln.reference else "-"
        ratio = f"{ln.ratio:.2f}x" if ln.ratio is not None else "-"
        cpu = f"{ln.cpu_us[0]:,.0f} / {ln.cpu_us[1]:,.0f} us" if ln.cpu_us else "-"
        row: tuple[str, ...] = (ln.workload, ln.backend, _fmt(ln.statebook, ln.unit) if ln.statebook is not None
                                else (ln.note or "n/a"), ref, ratio, ln.target or "-", ln.verdict, cpu)
        if with_baseline:
            if ln.cpu_us and ln.baseline_cpu_us is not None:  # the steadier figure on a loaded machine
                row = (*row[:-1], f"{row[-1]}, baseline {ln.baseline_cpu_us:,.0f} us")
            row = (*row[:5], *_baseline_cells(ln), *row[5:])
        rows.append(row)
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]

    def fmt_row(r: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"

    out = [fmt_row(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [fmt_row(r) for r in rows]
    return "\n".join(out)
