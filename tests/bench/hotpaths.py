"""pyinstrument profiles of statebook's hot paths (W1 enqueue, W2 drain) on one backend.

    .venv/bin/python tests/bench/hotpaths.py --workload W1 --backend sqlite
    .venv/bin/python tests/bench/run.py --profile      # all four, after the table

Prints the call tree (library frames collapsed) and the functions with the most self time.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import statebook_side as sb  # noqa: E402

SIZES = {"W1": 3_000, "W1-batch": 10_000, "W2": 5_000, "W5": 60_000, "W6": 1_000}
"""Operations per profile: enqueues, deliveries, facts verified, due schedules evaluated."""


def top_self(session: Any, limit: int = 15) -> list[tuple[float, str]]:
    """Functions ranked by self time (summed over every place they appear in the tree)."""
    totals: collections.Counter[str] = collections.Counter()

    def walk(frame: Any) -> None:
        if frame is None:
            return
        path = frame.file_path_short or frame.file_path or ""
        totals[f"{frame.function}  {path}:{frame.line_no}"] += frame.total_self_time
        for child in frame.children:
            walk(child)

    walk(session.root_frame())
    return [(t, name) for name, t in totals.most_common(limit)]


async def profile_one(workload: str, url: str) -> str:
    from pyinstrument import Profiler

    n = SIZES[workload]
    if workload == "W6":
        import scheduler_side

        bench = scheduler_side.Bench(url, 10_000, n)
        await bench.open(lambda _: None)
        book = bench.book
    else:
        book = await sb.fresh_book(url)
    try:
        if workload == "W2":
            await sb.enqueue_batches(book, n, 500)
        elif workload == "W5":
            import seed

            await book.engine.dispose()
            target = seed.PgTarget(url) if book.dialect == "postgresql" else seed.SqliteTarget(url.split("///", 1)[1])
            await seed.seed_history(n // 3, [target])
        profiler = Profiler(interval=0.001, async_mode="disabled")
        profiler.start()
        if workload == "W1":
            await sb.enqueue_single(book, n)
        elif workload == "W1-batch":
            await sb.enqueue_batches(book, n, 500)
        elif workload == "W2":
            await sb.drain_due(book, sb.Sink(), n)
        elif workload == "W5":
            await sb.verify_rate(book)
        else:
            await bench.some_due()
        profiler.stop()
    finally:
        if workload == "W6":
            await bench.close()
        else:
            await book.engine.dispose()
    session = profiler.last_session
    assert session is not None
    lines = [f"## {workload} on {book.dialect}: {n:,} operations in {session.duration:.2f}s under the profiler"]
    lines.append("top functions by self time (s):")
    lines += [f"  {t:7.3f}  {name}" for t, name in top_self(session)]
    lines.append(profiler.output_text(unicode=False, color=False, show_all=False, short_mode=False))
    return "\n".join(lines)


async def profile_all(pg_url: str | None, workloads: list[str], backends: list[str]) -> str:
    out = []
    tmp = Path(tempfile.mkdtemp(prefix="statebook-profile-"))
    for backend in backends:
        for i, workload in enumerate(workloads):
            if backend == "postgresql":
                if pg_url is None:
                    continue
                url = pg_url
            else:
                url = f"sqlite:///{tmp / f'profile-{i}.db'}"
            out.append(await profile_one(workload, url))
    return "\n\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=sorted(SIZES), action="append")
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], action="append")
    parser.add_argument("--pg-url", help="PostgreSQL URL (default: a throwaway cluster)")
    args = parser.parse_args()
    workloads = args.workload or ["W1", "W2"]
    backends = args.backend or ["sqlite", "postgresql"]
    if "postgresql" in backends and args.pg_url is None:
        import pgcluster

        with pgcluster.throwaway_cluster() as url:
            print(asyncio.run(profile_all(url, workloads, backends)))
        return
    print(asyncio.run(profile_all(args.pg_url, workloads, backends)))


if __name__ == "__main__":
    main()
