"""Growth curves: how drain, verify and scheduler evaluation cost grow with the data beside them.

    .venv/bin/python tests/bench/growth.py                  # 10k, 100k, 1M history rows (several minutes)
    .venv/bin/python tests/bench/growth.py --quick          # 10k, 100k
    .venv/bin/python tests/bench/growth.py --sizes 10000,50000 --pg-url postgresql://...

For each history size, both backends get that many delivered dispatches (3 facts each, seed.py);
then the drain rate of a fixed batch of due dispatches next to them (statebook_side.claim_deliver,
as W4) and a full ``verify`` of every fact (statebook_side.verify_rate, as W5). The scheduler
evaluates 10 to 10,000 schedules, none due and a tenth due (scheduler_side.Bench, as W6).
Prints a Markdown table, writes specs/performance-growth.png and tests/bench/growth.json.
PostgreSQL comes from ``--pg-url``, otherwise from a throwaway cluster (tests/pgcluster.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent))
sys.path.insert(0, str(BENCH_DIR))

from common import REPO_DIR, SqliteFiles, drop_databases, machine, median, recreate_databases  # noqa: E402

PG, SQ = "postgresql", "sqlite"
BACKENDS = (PG, SQ)
SIZES = (10_000, 100_000, 1_000_000)
QUICK = (10_000, 100_000)
SCHEDULES = (10, 100, 1_000, 10_000)
DUE = 1_000
"""Due dispatches enqueued and drained per round, whatever the history (W4's batch)."""
PNG = REPO_DIR / "specs" / "performance-growth.png"
JSON = BENCH_DIR / "growth.json"
HISTORY_DB, SCHEDULE_DB = "growth_history", "growth_schedules"

Results = dict[str, Any]
"""``{"drain"|"verify"|"scheduler": {backend: [point, ...]}}``; a point is a dict with ``x`` (rows,
facts or schedules), the figure(s) and the samples they are the median of."""

_T0 = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - _T0:6.0f}s] {message}", file=sys.stderr, flush=True)


# -- measuring ---------------------------------------------------------------------------------

async def history_points(pg_base: str, sizes: Sequence[int], rounds: int, files: SqliteFiles) -> Results:
    """Drain and verify points for every history size on both backends (one seeded database each)."""
    import seed
    import statebook_side as sb
    import workloads
    from statebook.adapters.db import open_book

    out: Results = {"drain": {b: [] for b in BACKENDS}, "verify": {b: [] for b in BACKENDS}}
    template = await workloads.make_template(files)
    for rows in sizes:
        pg_url = (await recreate_databases(pg_base, [HISTORY_DB]))[HISTORY_DB]
        await workloads.pg_schema(pg_url)
        path = files.fresh(f"history-{rows}")
        shutil.copyfile(template, path)
        took = await seed.seed_history(rows, [seed.PgTarget(pg_url), seed.SqliteTarget(str(path))])
        log(f"seeded {rows:,} delivered dispatches ({3 * rows:,} facts) on both backends in {took:.1f}s")
        books = {PG: await open_book(pg_url), SQ: await open_book(f"sqlite:///{path}")}
        try:
            drains: dict[str, list[float]] = {b: [] for b in BACKENDS}
            for r in range(rounds):
                for backend, book in books.items():
                    drains[backend].append(DUE / await sb.claim_deliver(book, DUE))
                    log(f"    drain {rows:,} round {r + 1}/{rounds} {backend}: {drains[backend][-1]:,.0f} del/s")
            verifies: dict[str, list[float]] = {b: [] for b in BACKENDS}
            facts = {}
            for r in range(rounds):
                for backend, book in books.items():
                    rate, facts[backend] = await sb.verify_rate(book)
                    verifies[backend].append(rate)
                    log(f"    verify {facts[backend]:,} facts round {r + 1}/{rounds} {backend}: {rate:,.0f} facts/s")
        finally:
            for book in books.values():
                await book.engine.dispose()
            files.drop(path)
        for backend in BACKENDS:
            out["drain"][backend].append({"x": rows, "rate": median(drains[backend]), "samples": drains[backend]})
            rate = median(verifies[backend])
            out["verify"][backend].append({"x": facts[backend], "rows": rows, "rate": rate,
                                           "seconds": facts[backend] / rate, "samples": verifies[backend]})
    return out


async def scheduler_points(pg_base: str, counts: Sequence[int], rounds: int, files: SqliteFiles) -> Results:
    """One evaluation pass over ``n`` schedules, none due and a tenth due, on both backends."""
    import scheduler_side

    out: Results = {"scheduler": {b: [] for b in BACKENDS}}
    for n in counts:
        due = max(1, n // 10)
        pg_url = (await recreate_databases(pg_base, [SCHEDULE_DB]))[SCHEDULE_DB]
        path = files.fresh(f"schedules-{n}")
        for backend, url in ((PG, pg_url), (SQ, f"sqlite:///{path}")):
            bench = scheduler_side.Bench(url, n, due)
            none, some = [], []
            try:
                await bench.open(log)
                for _ in range(rounds):
                    some.append(await bench.some_due())
                    none.append(await bench.none_due())
            finally:
                if hasattr(bench, "engine"):
                    await bench.close()
            log(f"    {n:,} schedules on {backend}: none due {median(none):.1f} ms, {due:,} due {median(some):.1f} ms")
            out["scheduler"][backend].append({"x": n, "due": due, "none_ms": median(none), "due_ms": median(some),
                                              "samples": {"none": none, "due": some}})
        files.drop(path)
    return out


# -- the table and the plot --------------------------------------------------------------------

def _growth(points: Sequence[dict[str, Any]], key: str, i: int) -> str:
    """Point ``i``'s figure against the smallest size's, e.g. ``0.93x``."""
    first = points[0][key]
    return f"{points[i][key] / first:.2f}x" if first else "-"


def render_table(results: Results) -> str:
    """One Markdown row per measurement and size; each cell also shows the figure against the smallest size."""
    rows: list[tuple[str, ...]] = []

    def add(key: str, title: str, label: Callable[[dict[str, Any]], str],
            cell: Callable[[Sequence[dict[str, Any]], int], str]) -> None:
        if key not in results:
            return
        pg, sq = results[key][PG], results[key][SQ]
        for i, point in enumerate(pg):
            rows.append((title if i == 0 else "", label(point), cell(pg, i), cell(sq, i)))

    add("drain", f"drain {DUE:,} due (del/s)", lambda p: f"{p['x']:,} rows",
        lambda ps, i: f"{ps[i]['rate']:,.0f} ({_growth(ps, 'rate', i)})")
    add("verify", "verify (s, facts/s)", lambda p: f"{p['x']:,} facts",
        lambda ps, i: f"{ps[i]['seconds']:,.2f} s, {ps[i]['rate']:,.0f}/s ({_growth(ps, 'rate', i)})")
    add("scheduler", "scheduler evaluate, none due (ms)", lambda p: f"{p['x']:,} schedules",
        lambda ps, i: f"{ps[i]['none_ms']:,.1f} ({_growth(ps, 'none_ms', i)})")
    add("scheduler", "scheduler evaluate, a tenth due (ms)", lambda p: f"{p['x']:,} ({p['due']:,} due)",
        lambda ps, i: f"{ps[i]['due_ms']:,.1f} ({_growth(ps, 'due_ms', i)})")
    header = ("measurement", "size", "postgresql (vs smallest)", "sqlite (vs smallest)")
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]

    def line(r: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"

    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def plot(results: Results, path: Path) -> None:
    """One subplot per measurement, log-x (and log-y where the figure spans decades), a line per backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    style = {PG: {"color": "tab:blue", "marker": "o"}, SQ: {"color": "tab:orange", "marker": "s"}}
    drain, verify, sched = axes
    for backend in BACKENDS:
        if "drain" in results:
            ps = results["drain"][backend]
            drain.plot([p["x"] for p in ps], [p["rate"] for p in ps], label=backend, **style[backend])
        if "verify" in results:
            ps = results["verify"][backend]
            verify.plot([p["x"] for p in ps], [p["seconds"] for p in ps], label=backend, **style[backend])
        if "scheduler" in results:
            ps = results["scheduler"][backend]
            sched.plot([p["x"] for p in ps], [p["due_ms"] for p in ps], label=f"{backend}, a tenth due",
                       **style[backend])
            sched.plot([p["x"] for p in ps], [p["none_ms"] for p in ps], label=f"{backend}, none due",
                       linestyle="--", **style[backend])
    drain.set(title=f"drain {DUE:,} due dispatches", xlabel="delivered dispatches in history",
              ylabel="deliveries / s")
    drain.set_ylim(bottom=0)
    verify.set(title="verify, whole history", xlabel="facts", ylabel="seconds", yscale="log")
    sched.set(title="scheduler: one evaluation pass", xlabel="schedules", ylabel="ms", yscale="log")
    for ax in axes:
        ax.set_xscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- the script --------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        help="history sizes in delivered dispatches (default %(default)s)")
    parser.add_argument("--quick", action="store_true", help=f"history sizes {','.join(map(str, QUICK))} only")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per figure, median reported (default 3)")
    parser.add_argument("--pg-url", help="PostgreSQL server to use (default: a throwaway cluster)")
    parser.add_argument("--png", type=Path, default=PNG, help="where to write the plot (default %(default)s)")
    parser.add_argument("--json", type=Path, default=JSON, help="where to write the raw numbers (default %(default)s)")
    args = parser.parse_args(argv)
    try:
        args.sizes = list(QUICK) if args.quick else [int(s.replace("_", "")) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes takes comma-separated integers, e.g. 10000,100000; got {args.sizes!r}")
    return args


async def measure(pg_base: str, sizes: Sequence[int], rounds: int) -> Results:
    files = SqliteFiles()
    try:
        results = await history_points(pg_base, sizes, rounds, files)
        results.update(await scheduler_points(pg_base, SCHEDULES, rounds, files))
    finally:
        files.cleanup()
        await drop_databases(pg_base, [HISTORY_DB, SCHEDULE_DB])
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    host = machine()
    log(f"history sizes {args.sizes}, schedules {list(SCHEDULES)}, {args.rounds} rounds; machine {host}")
    if args.pg_url is None:
        import pgcluster

        with pgcluster.throwaway_cluster() as url:
            results = asyncio.run(measure(url, args.sizes, args.rounds))
    else:
        results = asyncio.run(measure(args.pg_url, args.sizes, args.rounds))
    table = render_table(results)
    print(table)
    plot(results, args.png)
    total = round(time.perf_counter() - _T0, 1)
    args.json.write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M:%S %z"), "machine": host,
                                     "loadavg_1m_at_end": machine().get("loadavg_1m"), "due": DUE,
                                     "rounds": args.rounds, "total_seconds": total, "table": table,
                                     **results}, indent=2) + "\n")
    log(f"wrote {args.png} and {args.json}; total {total:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
