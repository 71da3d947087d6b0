"""W1 and W2 with the daemon's automatic checkpoints on and off (issue 31: within 5% of off).

The statebook side of W1 (enqueue one dispatch at a time) and W2 (drain pending dispatches) runs in interleaved
rounds (ABBA, after a warm-up round, on one book as a daemon keeps one), on SQLite and (``--pg``) PostgreSQL. "On" runs a :class:`Checkpointer` beside the
workload in the same event loop, as ``statebook run`` does, with a small ``every_facts`` and a short tick by default, so it checkpoints many
times per round (each checkpoint reads the whole log twice: its tree head and its consistency proof, and each tick
counts the settled facts); ``--every 10000 --tick 30`` is the daemon's default (one checkpoint when it starts). Printed:
each round's rate, the medians, and on/off; and how many checkpoints the "on" rounds published.

    .venv/bin/python tests/bench/checkpoint_overhead.py [--rounds 5] [--w1 3000] [--w2 3000] [--every 1000] [--tick 0.05] [--pg]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import statebook_side as sb  # noqa: E402
from common import run_with_postgres  # noqa: E402

from statebook.adapters.checkpoints import Checkpointer, DirectorySink  # noqa: E402
from statebook.adapters.db import open_book, reset_schema  # noqa: E402
from statebook.adapters.note import Signer  # noqa: E402
from statebook.lifecycle import Book  # noqa: E402


@contextlib.asynccontextmanager
async def checkpoints(book: Book, every: int, on: bool, tick: float) -> AsyncIterator[Checkpointer | None]:
    """A checkpointer running beside the block (``on``), stopped and awaited after it."""
    if not on:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="statebook-cp-") as folder:
        worker = Checkpointer(book, Signer.generate("bench.statebook/log"), DirectorySink(Path(folder)),
                              every_seconds=3600, every_facts=every, tick_seconds=tick)
        task = asyncio.create_task(worker.run_until_stopped())
        try:
            yield worker
        finally:
            worker.stop()
            await task


async def rounds(name: str, book: Book, reset: Callable[[], Awaitable[None]],
                 work: Callable[[Book], Awaitable[float]], n: int, count: int, every: int, tick: float) -> None:
    """``count`` pairs of rounds (ABBA order) after one warm-up round, all on one ``book``: a daemon's pool is
    long-lived, and a book opened per round made the side whose checkpointer opened the pool's second connection
    (asyncpg's setup of a new connection) pay for it inside its timed round — 14-18% of W1 on PostgreSQL."""
    rates: dict[bool, list[float]] = {False: [], True: []}
    published = 0
    order = [False]  # the warm-up round, not counted
    for number in range(count):
        order += [False, True] if number % 2 == 0 else [True, False]  # ABBA: no side always runs second
    for at, on in enumerate(order):
        await reset()
        async with checkpoints(book, every, on, tick) as worker:
            seconds = await work(book)
        if worker is not None:
            published += worker.taken
        if at:
            rates[on].append(n / seconds)
    off, on_ = statistics.median(rates[False]), statistics.median(rates[True])
    print(f"{name}: off {off:,.0f}/s, on {on_:,.0f}/s (on/off {on_ / off:.3f}); rounds off "
          f"{', '.join(f'{r:,.0f}' for r in rates[False])}; on {', '.join(f'{r:,.0f}' for r in rates[True])}; "
          f"{published} checkpoints published in the 'on' rounds", flush=True)


async def on_backend(label: str, url: str, args: argparse.Namespace) -> None:
    book = await open_book(url)
    try:
        async def reset() -> None:
            await reset_schema(book.engine)
            if book.engine.dialect.name == "postgresql":
                await sb.empty(book)

        await rounds(f"W1 {label} (enqueue {args.w1:,} one at a time)", book, reset,
                     lambda b: sb.enqueue_single(b, args.w1), args.w1, args.rounds, args.every, args.tick)
        await rounds(f"W2 {label} (drain {args.w2:,})", book, reset, lambda b: sb.drain(b, args.w2), args.w2,
                     args.rounds, args.every, args.tick)
    finally:
        await book.engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--w1", type=int, default=3000)
    parser.add_argument("--w2", type=int, default=3000)
    parser.add_argument("--every", type=int, default=1000, help="checkpoint every N facts (default 1000)")
    parser.add_argument("--tick", type=float, default=0.05,
                        help="how often the checkpointer asks whether one is due (the daemon: its tick, 30 s)")
    parser.add_argument("--pg", action="store_true", help="also on PostgreSQL (a throwaway cluster, or --pg-url)")
    parser.add_argument("--pg-url", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="statebook-cpb-") as folder:
        asyncio.run(on_backend("SQLite", f"sqlite:///{folder}/bench.db", args))
    if args.pg or args.pg_url:
        run_with_postgres(args.pg_url, lambda url: on_backend("PostgreSQL", url, args))


if __name__ == "__main__":
    main()
