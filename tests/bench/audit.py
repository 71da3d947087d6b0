"""What history an auditor can check costs (specs/audit.md): keyed hashing on writes, a checkpoint, verify.

On a SQLite file (the conformance suite's task lifecycle): writes of ``--entities`` entities with two
facts each, by single creates and transitions and by batches of 500, plain and keyed, alternating
rounds (median rows/s, the keyed/plain ratio, client CPU per fact); then, on one history of about
``--facts`` facts, the time of ``checkpoint`` and of ``verify`` plain, keyed, and with a checkpoint.

    .venv/bin/python tests/bench/audit.py [--rounds 5] [--entities 1000] [--facts 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from conformance.lifecycle.support import CREATED, STARTED, SYSTEM, prepare, task_registry, task_values  # noqa: E402

from statebook.adapters.db import connect  # noqa: E402
from statebook.lifecycle import Book, Command, FakeClock, NewEntity, apply_many, create, create_many, transition, verify  # noqa: E402
from statebook.lifecycle.chain import checkpoint, key_chain  # noqa: E402
from statebook.lifecycle.chainkey import ChainKey  # noqa: E402

KEY = ChainKey(b"bench-key-" * 4)


async def fresh(path: Path, keyed: bool) -> Book:
    path.unlink(missing_ok=True)
    engine = connect(f"sqlite:///{path}")
    await prepare(engine, FakeClock())
    book = Book(engine, task_registry(), FakeClock())
    if keyed:
        book = book.with_chain_key(KEY)
        await key_chain(book)
    return book


async def singles(book: Book, n: int, tag: str) -> None:
    for i in range(n):
        await create(book, "task", values=task_values(), status="open", reason=CREATED, actor=SYSTEM, entity_id=f"{tag}{i}")
        await transition(book, "task", f"{tag}{i}", "working", expected="open", guards={"attempt": 0},
                         patch={"attempt": 1}, reason=STARTED, actor=SYSTEM)


async def batches(book: Book, n: int, tag: str) -> None:
    for lo in range(0, n, 500):
        ids = [f"{tag}{i}" for i in range(lo, min(lo + 500, n))]
        await create_many(book, "task", [NewEntity({**task_values(), "id": i}, "open", CREATED, SYSTEM) for i in ids])
        await apply_many(book, [Command("task", i, "working", STARTED, SYSTEM, ("open",), {"attempt": 0},
                                        {"attempt": 1}) for i in ids])


async def writes(directory: Path, rounds: int, entities: int) -> None:
    for name, fn, n in (("single", singles, max(entities // 5, 100)), ("batch500", batches, entities * 5)):
        rates: dict[bool, list[float]] = {False: [], True: []}
        cpu: dict[bool, list[float]] = {False: [], True: []}
        for r in range(rounds):
            for keyed in ((False, True) if r % 2 == 0 else (True, False)):
                book = await fresh(directory / "w.db", keyed)
                wall, proc = time.perf_counter(), time.process_time()
                await fn(book, n, "e")
                wall, proc = time.perf_counter() - wall, time.process_time() - proc
                await book.engine.dispose()
                rates[keyed].append(2 * n / wall)
                cpu[keyed].append(proc / (2 * n) * 1e6)
        plain, keyed_ = statistics.median(rates[False]), statistics.median(rates[True])
        print(f"writes {name:9s} plain {plain:8.0f} facts/s ({statistics.median(cpu[False]):5.1f} us CPU/fact)   "
              f"keyed {keyed_:8.0f} facts/s ({statistics.median(cpu[True]):5.1f} us CPU/fact)   keyed/plain {keyed_ / plain:.3f}")


async def reads(directory: Path, rounds: int, facts: int) -> None:
    book = await fresh(directory / "r.db", True)
    await batches(book, facts // 2, "h")
    plain_book = Book(book.engine, book.registry, book.clock)
    times: dict[str, list[float]] = {k: [] for k in ("checkpoint", "verify plain", "verify keyed", "verify keyed+checkpoint")}
    body = None
    for _ in range(rounds):
        t = time.perf_counter()
        body = await checkpoint(book)
        times["checkpoint"].append(time.perf_counter() - t)
        for label, b, cp in (("verify plain", plain_book, None), ("verify keyed", book, None),
                             ("verify keyed+checkpoint", book, body)):
            t = time.perf_counter()
            report = await verify(b, checkpoint=cp, processes=0)
            times[label].append(time.perf_counter() - t)
            assert report.ok, report.findings[:3]
    assert body is not None
    print(f"history: {body['facts']} facts, {body['entities']} entities (SQLite, verify in one process)")
    base = statistics.median(times["verify plain"])
    for label, values in times.items():
        m = statistics.median(values)
        print(f"{label:24s} median {m:6.2f} s   ({m / base:.2f} x verify plain)")
    await book.engine.dispose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--entities", type=int, default=1000)
    parser.add_argument("--facts", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        await writes(Path(tmp), args.rounds, args.entities)
        await reads(Path(tmp), max(args.rounds // 2, 1) + 1, args.facts)


if __name__ == "__main__":
    asyncio.run(main())
