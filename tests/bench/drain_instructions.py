"""Client instructions per PostgreSQL delivery, counted by callgrind (load does not change them).

usage: .venv/bin/python tests/bench/drain_instructions.py [--n 1000]

Runs this file twice under ``valgrind --tool=callgrind`` on a throwaway cluster: both runs enqueue and drain
``n`` dispatches three times; the second leaves out the last drain. The difference of their instruction totals
over ``n`` is one delivery's client work (start-up and the enqueues cancel). Two runs of one tree differ by
about 1% (specs/performance.md, "Client CPU per delivery").
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))


async def _drains(url: str, n: int, last: bool) -> None:
    import statebook_side as sb
    from statebook.adapters.db import open_book

    book = await open_book(url)
    try:
        for i in range(3):
            await sb.empty(book)
            await sb.enqueue_batches(book, n, 500)
            gc.collect()
            if i < 2 or last:
                await sb.drain_due(book, sb.Sink(), n)
    finally:
        await book.engine.dispose()


async def _schema(url: str) -> None:
    from statebook.adapters.db import open_book

    await (await open_book(url)).engine.dispose()


def _instructions(url: str, n: int, last: bool) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out", sys.executable, __file__,
             "--child", url, "--n", str(n), *(["--last"] if last else [])],
            capture_output=True, text=True, check=True)
    found = re.search(r"refs:\s+([\d,]+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction total in callgrind's output:\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--child", metavar="URL")
    parser.add_argument("--last", action="store_true")
    args = parser.parse_args()
    if args.child:
        asyncio.run(_drains(args.child, args.n, args.last))
        return
    import pgcluster

    with pgcluster.throwaway_cluster() as url:
        asyncio.run(_schema(url))  # created once here, so neither counted run pays for the migrations
        with_last, without = _instructions(url, args.n, True), _instructions(url, args.n, False)
    print(f"{(with_last - without) / args.n / 1000:.0f}k instructions per delivery ({args.n} deliveries)")


if __name__ == "__main__":
    main()
