"""CPU of one W7 transition on SQLite, split between the event loop's thread and the rest of the process
(aiosqlite's thread, where SQLite itself runs): N entities moved through W7's chain by ten callers, three
runs on fresh files. The split says whether a change to the Python around a transition can move W7, or only
a change to what SQLite is asked to do.

usage: .venv/bin/python tests/bench/transition_cpu.py [--entities 400] [--runs 3] [--profile]
(specs/performance.md, "Issue 29's targets, one run")
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import tempfile
import time
from pathlib import Path

from statebook.adapters.db import open_book
from statebook.lifecycle import NewEntity, Reason, create_many, transition

from durable_peers import callers
from w7 import ACTOR, CHAIN, PARCEL, registry


async def one_run(entities: int, profile: bool) -> tuple[float, float, float]:
    """(transitions/s, process CPU us per transition, event-loop thread CPU us per transition)."""
    with tempfile.TemporaryDirectory() as folder:
        book = await open_book(f"sqlite+aiosqlite:///{Path(folder) / 'w7.db'}", registry=registry())
        try:
            refs = [os.urandom(8).hex() for _ in range(entities)]
            await create_many(book, PARCEL.entity_type,
                              [NewEntity({"id": ref}, CHAIN[0], Reason(f"parcel.{CHAIN[0]}.step"), ACTOR)
                               for ref in refs])

            async def move(ref: str) -> None:
                for source, target in zip(CHAIN, CHAIN[1:]):
                    await transition(book, PARCEL.entity_type, ref, target, expected=source,
                                     reason=Reason(f"parcel.{target}.step"), actor=ACTOR)

            profiler = cProfile.Profile(time.thread_time) if profile else None
            thread0, process0, wall0 = time.thread_time(), time.process_time(), time.perf_counter()
            if profiler:
                profiler.enable()
            await callers(refs, move)
            if profiler:
                profiler.disable()
            thread1, process1, wall1 = time.thread_time(), time.process_time(), time.perf_counter()
        finally:
            await book.engine.dispose()
    n = entities * (len(CHAIN) - 1)
    if profiler:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
    return n / (wall1 - wall0), (process1 - process0) / n * 1e6, (thread1 - thread0) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entities", type=int, default=400)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="cProfile the last run (event-loop thread CPU)")
    args = parser.parse_args()
    for run in range(args.runs):
        rate, process, loop = asyncio.run(one_run(args.entities, args.profile and run == args.runs - 1))
        print(f"run {run + 1}: {rate:,.0f} transitions/s; CPU per transition {process:,.0f} us, "
              f"of which the event loop's thread {loop:,.0f} us")


if __name__ == "__main__":
    main()
