"""statebook side by side with pgqueuer, procrastinate and a raw-SQL floor, in one run.

    make bench                                   # = .venv/bin/python tests/bench/run.py (quick sizes)
    .venv/bin/python tests/bench/run.py --full   # the issue's sizes (long)
    .venv/bin/python tests/bench/run.py --only W1,W3 --rounds 5 --profile
    .venv/bin/python tests/bench/run.py --baseline main --only W1,W2,W3   # also measure main (baseline.py)
    .venv/bin/python tests/bench/run.py --durable --only W1,W2,W3     # fsync on (make bench-durable)

PostgreSQL comes from ``--pg-url`` or ``STATEBOOK_TEST_PG_URL`` (the bench creates and drops
``bench_*`` databases there), otherwise from a throwaway cluster (tests/pgcluster.py). Prints a
table (PASS/FAIL against the issue's targets; speed is never a test assertion) and writes
tests/bench/results.json. Method and latest figures: specs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent))
sys.path.insert(0, str(BENCH_DIR))

import pgcluster  # noqa: E402

from common import (CONCURRENCY, BATCH, Line, SqliteFiles, Sizes, drop_databases, durability_line,  # noqa: E402
                    machine, pg_server_version, recreate_databases, render_table, server_durability)

WORKLOADS = ("W1", "W2", "W3", "W4", "W5", "W6", "W7", "memory", "W2p")
COMPARED = ("W1", "W2", "W3")
"""The workloads whose statebook contenders ``--baseline`` also measures for the baseline revision."""
DATABASES = ("statebook", "floor", "pgqueuer", "procrastinate", "w4_small", "w4_large", "w6", "w7_statebook",
             "w7_eventsourcing", "dbos")
BASELINE_DATABASE = "statebook_baseline"
WORKING_DATABASE = "statebook_working"
"""The working tree's child's database in a ``--baseline`` run: like the baseline's, one nothing else opens
(the in-process contenders keep a book open on ``bench_statebook``, and a side sharing it read 0.82x against
an identical baseline on the PostgreSQL drain)."""
PAIRS = 8
"""Default ``--pairs``. Two runs of the same revision differ by up to 15% on a shared 2-core machine;
with 8 pairs in each of 5 rounds the median's 95% interval is about +-5% (specs/performance.md)."""
RESULTS = BENCH_DIR / "results.json"
RESULTS_DURABLE = BENCH_DIR / "results-durable.json"

_T0 = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - _T0:6.0f}s] {message}", flush=True)


async def bench(base_url: str, sizes: Sizes, only: list[str], profile: bool, out: Path,
                baseline: Any = None, working: Any = None, pairs: int = 1, durable: bool = False) -> int:
    """Run ``only``; with ``baseline`` and ``working`` (baseline.Install of REV and of the working
    tree) W1-W3 also measure that revision, each side on its own install."""
    import floor
    import scaling
    import scheduler_side
    import workloads

    durability = await server_durability(base_url)
    if durable and set(durability.values()) != {"on"}:
        log(f"--durable: the server runs {durability}; durable figures need all three on")
        return 2
    floor.SQLITE_SYNCHRONOUS = "FULL" if durable else "NORMAL"
    mode = durability_line(durable, durability, floor.SQLITE_SYNCHRONOUS)

    names = {db: f"bench_{db}" for db in (*DATABASES, *((BASELINE_DATABASE, WORKING_DATABASE) if baseline else ()))}
    urls = await recreate_databases(base_url, list(names.values()))
    pg = {db: urls[name] for db, name in names.items()}
    version = await pg_server_version(base_url)
    await workloads.pg_schema(pg["floor"])
    files = SqliteFiles()
    ctx = workloads.Ctx(sizes, pg, files, await workloads.make_template(files), log)
    if baseline is not None:
        from baseline import Sides

        ctx.sides = Sides(str(working.python), str(baseline.python), pg[WORKING_DATABASE], pg[BASELINE_DATABASE],
                          files.dir / "sides", log, repeat=pairs)
        compared = [w for w in only if w in COMPARED]
        log(f"baseline {baseline.short}: compared in {', '.join(compared) or 'none of the selected workloads'}"
            f"{'' if compared else ' (only ' + ', '.join(COMPARED) + ' compare)'}; each pair runs {pairs} times per round, order alternating")
    runners = {
        "W1": workloads.w1, "W2": workloads.w2, "W3": workloads.w3, "W4": workloads.w4, "W5": workloads.w5,
        "W6": lambda c: scheduler_side.w6({"postgresql": pg["w6"], "sqlite": f"sqlite:///{c.sqlite_path('w6')}"},
                                          sizes.w6_schedules, sizes.w6_due, sizes.rounds, log),
        "W7": _w7, "memory": workloads.memory, "W2p": scaling.w2p,
    }
    host = {**machine(), "postgresql": version}
    log(mode)
    log(f"sizes: {sizes.mode}, {sizes.rounds} rounds; concurrency {CONCURRENCY}, batch {BATCH}; machine {host}")
    lines: list[Line] = []
    timings: dict[str, float] = {}
    failed: list[str] = []
    try:
        for name in only:
            t = time.perf_counter()
            log(f"== {name}")
            try:
                lines += await runners[name](ctx)
            except Exception as exc:  # one broken workload must not hide the others
                traceback.print_exc()
                failed.append(name)
                lines.append(Line(name, "-", "", None, note=f"error: {type(exc).__name__}: {exc}"[:120]))
            timings[name] = round(time.perf_counter() - t, 1)
            log(f"{name} took {timings[name]:.0f}s")
    finally:
        files.cleanup()
    table = render_table(lines)
    print("\n" + mode + "\n" + table + "\n", flush=True)
    for note in scaling.notes(lines):
        print(note, flush=True)
    for ln in lines:  # a line a peer cannot run says why (W7's DBOS batch enqueue, eventsourcing's drain)
        if ln.statebook is None and ln.note.startswith("n/a: "):
            print(f"  {ln.workload} ({ln.backend}) vs {ln.reference}: {ln.note.removeprefix('n/a: ')}", flush=True)
    if baseline is not None:
        print(f"baseline = {baseline.short} ({baseline.sha[:12]}); working tree = {REPO}; 'baseline' is its "
              "figure (its ratio against the same peer/floor), 'vs baseline' = working / baseline in the "
              "line's unit", flush=True)
        reasons: dict[str, list[str]] = {}
        for name, why in ctx.sides.errors.items():
            reasons.setdefault(why, []).append(name.removesuffix("@baseline"))
        for why, names in reasons.items():
            print(f"  baseline n/a for {', '.join(names)}: {why}", flush=True)
        print(flush=True)
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %z"), "machine": host,
        "loadavg_1m_at_end": machine().get("loadavg_1m"), "sizes": asdict(sizes), "concurrency": CONCURRENCY,
        "batch": BATCH, "durable": durable,
        "durability": {**durability, "sqlite_floor_synchronous": floor.SQLITE_SYNCHRONOUS,
                       "sqlite_statebook_synchronous": "NORMAL"},
        "workload_seconds": timings,
        "total_seconds": round(time.perf_counter() - _T0, 1), "table": table,
        "lines": [ln.to_json() for ln in lines],
    }
    if baseline is not None:
        result["baseline"] = {**baseline.describe(), "statebook_imported_from": ctx.sides.seen,
                              "compared": [w for w in only if w in COMPARED], "n/a": ctx.sides.errors}
    out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {out}; total {result['total_seconds']:.0f}s")
    if profile:
        import hotpaths

        print(await hotpaths.profile_all(pg["statebook"], ["W1", "W2"], ["sqlite", "postgresql"]), flush=True)
    if not base_url_is_throwaway(base_url):
        await drop_databases(base_url, list(names.values()))
    if failed:
        log(f"workload(s) {', '.join(failed)} raised; see the tracebacks above")
    return 1 if failed else 0  # a missed target is a FAIL line, not an exit status


async def _w7(ctx: Any) -> list[Line]:
    import w7  # imports dbos and eventsourcing (the bench extra) only when W7 runs

    return await w7.w7(ctx)


_THROWAWAY: set[str] = set()
REPO = BENCH_DIR.parent.parent


def base_url_is_throwaway(url: str) -> bool:
    return url in _THROWAWAY


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="sizes that fit 15 minutes on 2 cores (default)")
    size.add_argument("--full", action="store_true", help="the issue's sizes (1,000,000-row history; long)")
    parser.add_argument("--rounds", type=int, help="rounds per figure (default 3; at least 3 for a median)")
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(WORKLOADS)}")
    parser.add_argument("--pg-url", help="PostgreSQL server to use (default: STATEBOOK_TEST_PG_URL or throwaway)")
    parser.add_argument("--profile", action="store_true", help="also print pyinstrument profiles of W1/W2")
    parser.add_argument("--json", type=Path, help=f"where to write results (default {RESULTS.name}, with --durable "
                                                  f"{RESULTS_DURABLE.name}, in {BENCH_DIR})")
    parser.add_argument("--durable", action="store_true",
                        help="a throwaway cluster with fsync, synchronous_commit and full_page_writes on, and the "
                             "floor's SQLite at synchronous=FULL (with --pg-url the server must already run so)")
    parser.add_argument("--baseline", metavar="REV",
                        help=f"also measure git revision REV (installed in a temporary virtualenv) in the same "
                             f"rounds as the working tree, for {', '.join(COMPARED)}; adds the 'baseline' and "
                             f"'vs baseline' columns")
    parser.add_argument("--pairs", type=int, default=PAIRS, metavar="K",
                        help=f"with --baseline: run each (working, baseline) pair K times per round, back to "
                             f"back in alternating order; 'vs baseline' is the median of the paired ratios with "
                             f"a 95%% interval (default {PAIRS})")
    parser.add_argument("--keep-baseline", metavar="DIR", type=Path,
                        help="with --baseline: install REV under DIR and keep it (reused when DIR holds REV)")
    return parser


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Sizes, list[str]]:
    """The options, the sizes they select and the workloads to run, in order."""
    parser = build_parser()
    args = parser.parse_args(argv)
    sizes = Sizes.full() if args.full else Sizes.quick()
    if args.rounds:
        from dataclasses import replace

        sizes = replace(sizes, rounds=args.rounds)
    only = [w.strip() for w in args.only.split(",")] if args.only else list(WORKLOADS)
    unknown = sorted(set(only) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    if args.keep_baseline is not None and not args.baseline:
        parser.error("--keep-baseline needs --baseline REV")
    if args.baseline is not None and not args.baseline.strip():
        parser.error("--baseline needs a revision")
    if args.json is None:
        args.json = RESULTS_DURABLE if args.durable else RESULTS
    return args, sizes, only


def _terminate(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # the same clean-up as Ctrl-C


def main(argv: list[str] | None = None) -> int:
    args, sizes, only = parse_args(argv)
    install = working = None
    signal.signal(signal.SIGTERM, _terminate)
    try:
        if args.baseline:
            from baseline import BaselineError, Install

            try:
                install = Install.prepare(args.baseline, args.keep_baseline, log)
                working = Install.working(log)
            except BaselineError as exc:
                print(f"--baseline {args.baseline}: {exc}", file=sys.stderr)
                return 2
        return _run(args, sizes, only, install, working)
    except KeyboardInterrupt:
        log("interrupted; the installs, SQLite files and child processes are cleaned up")
        return 130
    finally:
        if working is not None:
            working.cleanup()
        if install is not None:
            install.cleanup()
            if install.keep:
                log(f"kept the baseline install in {install.root}")


def _run(args: argparse.Namespace, sizes: Sizes, only: list[str], install: Any, working: Any) -> int:
    url = args.pg_url or os.environ.get("STATEBOOK_TEST_PG_URL")
    if url:
        return asyncio.run(bench(url, sizes, only, args.profile, args.json, install, working, args.pairs,
                                 args.durable))
    bindir = pgcluster.find_pg_bin()
    if bindir is None:
        print(f"no PostgreSQL: set STATEBOOK_TEST_PG_URL or install server binaries under {pgcluster.PG_ROOT}/*/bin",
              file=sys.stderr)
        return 2
    log(f"starting a throwaway PostgreSQL cluster{' (durable: fsync on)' if args.durable else ''} under "
        f"{tempfile.gettempdir()}")
    with pgcluster.throwaway_cluster(bindir, durable=args.durable) as url:
        _THROWAWAY.add(url)
        return asyncio.run(bench(url, sizes, only, args.profile, args.json, install, working, args.pairs,
                                 args.durable))


if __name__ == "__main__":
    sys.exit(main())
