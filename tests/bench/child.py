"""One side's statebook contenders in a process of its own (``run.py --baseline``).

    <python> tests/bench/child.py '{"label": ..., "pg": URL, "sqlite_dir": DIR}'

``<python>`` is the interpreter of the side: the working tree's virtualenv, or the temporary one the
baseline revision is installed in. This file and the drivers it calls (``statebook_side``,
``common``) always come from the WORKING tree's ``tests/bench`` (this directory is put first on
``sys.path``); ``statebook`` itself is whatever that interpreter has installed. So both sides run
the same measuring code against their own engine.

Protocol, one JSON object per line. The child first prints ``{"ready": true, "statebook": FILE}``
(or ``{"ready": false, "error": ...}`` when the drivers cannot be imported against that install).
Then for every request read from stdin (``{"op": ..., "backend": "postgresql"|"sqlite", ...}``)
it prints ``{"ok": true, "value": ..., "cpu": SECONDS}`` or ``{"ok": false, "error": ...}``; the
request ``{"op": "close"}`` ends it. Replies are prefixed with :data:`MARK` so stray output of the
library cannot be mistaken for one.

A PostgreSQL request runs on one book kept for the child's life (truncated before each request,
as the in-process bench does between rounds); a SQLite request runs on a fresh file copied from a
template this child's statebook created. Seeding is outside the measured region, as in process.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

MARK = "@bench-child@ "


def reply(message: dict[str, Any]) -> None:
    sys.stdout.write(MARK + json.dumps(message) + "\n")
    sys.stdout.flush()


class Side:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.label = config.get("label", "child")
        self.pg_url: str | None = config.get("pg")
        self.dir = Path(config["sqlite_dir"])
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pg_book: Any = None
        self.template: Path | None = None
        self.n = 0

    async def book(self, backend: str) -> tuple[Any, Path | None]:
        import statebook_side as sb
        from statebook.adapters.db import open_book

        if backend == "postgresql":
            if self.pg_url is None:
                raise RuntimeError("this child was started without a PostgreSQL URL")
            if self.pg_book is None:
                self.pg_book = await open_book(self.pg_url)
            await sb.empty(self.pg_book)  # the same statement on both sides (not the side's reset_schema)
            return self.pg_book, None
        if backend != "sqlite":
            raise ValueError(f"unknown backend {backend!r}")
        if self.template is None:
            self.template = self.dir / "template.db"
            book = await open_book(f"sqlite:///{self.template}")
            await book.engine.dispose()
        self.n += 1
        path = self.dir / f"{self.label}-{self.n}.db"
        shutil.copyfile(self.template, path)
        return await open_book(f"sqlite:///{path}"), path

    async def release(self, book: Any, path: Path | None) -> None:
        if path is None:
            return
        await book.engine.dispose()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)

    async def run(self, request: dict[str, Any]) -> tuple[Any, float]:
        import statebook_side as sb
        from common import METER

        op, backend = request["op"], request["backend"]
        runs = {
            "enqueue_single": lambda b: sb.enqueue_single(b, request["n"]),
            "enqueue_batches": lambda b: sb.enqueue_batches(b, request["total"], request["batch"]),
            "drain": lambda b: sb.drain(b, request["n"]),
            "latency": lambda b: sb.latency(b, request["samples"],
                                            listen_url=self.pg_url if request.get("listen") else None),
        }
        if op not in runs:
            raise ValueError(f"unknown op {op!r}")
        book, path = await self.book(backend)
        try:
            METER.cpu = 0.0
            value = await runs[op](book)
            return value, METER.cpu
        finally:
            await self.release(book, path)

    async def close(self) -> None:
        if self.pg_book is not None:
            await self.pg_book.engine.dispose()
            self.pg_book = None


async def serve(config: dict[str, Any]) -> None:
    try:
        import statebook.lifecycle

        import statebook_side  # noqa: F401  (the working tree's drivers against this install)
    except Exception as exc:  # the baseline lacks something the drivers import: every cell is n/a
        reply({"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return
    reply({"ready": True, "statebook": statebook.lifecycle.__file__, "python": sys.executable})
    side = Side(config)
    try:
        while True:
            line = sys.stdin.readline()  # between requests only: nothing is being measured here
            if not line:
                break
            request = json.loads(line)
            if request.get("op") == "close":
                break
            try:
                value, cpu = await side.run(request)
            except Exception as exc:
                traceback.print_exc(file=sys.stderr)
                reply({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]})
            else:
                reply({"ok": True, "value": value, "cpu": cpu})
    finally:
        await side.close()


if __name__ == "__main__":
    asyncio.run(serve(json.loads(sys.argv[1])))
