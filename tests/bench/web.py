"""The console's pages on a big database (issue 28): 100,000 dispatches with 1,000,000 facts, on SQLite and
PostgreSQL; the server-side time of the overview, a list page (the first and the 1,000th, reached by
following ``next`` cursors) and an entity's page, each the median of several requests, against 150 ms.

    make bench-web                      # both backends, the issue's sizes (a few minutes of seeding)
    .venv/bin/python tests/bench/web.py --entities 20000 --backends sqlite

Not a timed test: it prints a table and exits 1 when a page misses its target. The history is written with
the bulk path of ``seed.py`` (COPY on PostgreSQL, ``executemany`` on SQLite): each dispatch is created, fails
three or four attempts (``delivering`` -> ``pending``) and then delivers or dead-letters, nine or eleven facts,
ten on average, every chain valid (the entity page's verify passes). A request is handled in this process
through httpx's ASGI transport, so the time is the app's (routing, reads, template) plus the client's few
microseconds, no network.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent))
sys.path.insert(0, str(BENCH_DIR))

from common import SqliteFiles, run_with_postgres  # noqa: E402
from rows import claim_patch, dispatch_params, fact_params, head_of, new_dispatch, step  # noqa: E402
from seed import PgTarget, SqliteTarget, Target  # noqa: E402

TARGET_MS = 150.0
CHUNK = 5_000
PAGE = 50
DEEP_PAGE = 1_000


def history(now: float, n: int) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
    """Dispatch ``n``: created, three (odd n) or four (even n) failed attempts, then delivered (even) or
    dead-lettered (odd); 11 or 9 facts."""
    row, created = new_dispatch(now, n)
    facts = [created]
    at = now
    for _ in range(4 if n % 2 == 0 else 3):
        for target, reason, patch in (("delivering", "dispatch.delivering.attempt", None),
                                      ("pending", "dispatch.pending.transport_failed", {"last_error": "refused"})):
            at += 0.001
            head = head_of(row)
            fact, cols = step(head, target, reason, "delivery", at, patch or claim_patch(head, at))
            row.update(cols)
            facts.append(fact)
    end = (("delivered", "dispatch.delivered.transport_ok", {"last_error": None}) if n % 2 == 0
           else ("dead_letter", "dispatch.dead_letter.max_attempts", {"last_error": "refused"}))
    for target, reason, patch in (("delivering", "dispatch.delivering.attempt", None), end):
        at += 0.001
        head = head_of(row)
        fact, cols = step(head, target, reason, "delivery", at, patch or claim_patch(head, at))
        row.update(cols)
        facts.append(fact)
    return dispatch_params(row), [fact_params(f) for f in facts]


async def seed(entities: int, targets: list[Target], base: float) -> tuple[float, int]:
    """Write ``entities`` dispatches and their facts to every target; (seconds, facts)."""
    t0, total = time.perf_counter(), 0
    for first in range(0, entities, CHUNK):
        rows: list[tuple[Any, ...]] = []
        facts: list[tuple[Any, ...]] = []
        for i in range(first, min(first + CHUNK, entities)):
            row, mine = history(base + i * 0.01, i)
            rows.append(row)
            facts.extend(mine)
        for target in targets:
            await target.write(rows, facts)
        total += len(facts)
        print(f"  seeded {first + len(rows):,} entities, {total:,} facts", file=sys.stderr, flush=True)
    for target in targets:
        await target.finish()
    return time.perf_counter() - t0, total


@contextlib.asynccontextmanager
async def console_client(book: Any) -> AsyncIterator[tuple[Any, bool]]:
    """An httpx client speaking ASGI to the console over ``book`` in local mode (no sign-in configured, a
    loopback client acts as the operator), and whether this build serves the overview."""
    import httpx

    from statebook.adapters.web import create_app
    from statebook.adapters.web.app import part_modules

    app = create_app(book)
    has_overview = bool(part_modules(("overview",)))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://console.bench") as client:
            yield client, has_overview


async def timed(client: Any, path: str, repeat: int) -> tuple[float, int]:
    """The median milliseconds of ``repeat`` GETs of ``path`` (after one warm-up) and the last status."""
    response = await client.get(path)
    spent = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        response = await client.get(path)
        spent.append((time.perf_counter() - t0) * 1000)
    return statistics.median(spent), response.status_code


async def measure(backend: str, url: str, repeat: int) -> list[tuple[str, str, float | None, str]]:
    """Each page's median time on the book at ``url``: (backend, page, ms or None when skipped, note)."""
    import httpx

    from statebook.adapters.db import open_book
    from statebook.adapters.web.queries import browse
    book = await open_book(url, create=False)
    lines: list[tuple[str, str, float | None, str]] = []
    try:
        async with console_client(book) as (client, has_overview):
            if has_overview:
                ms, status = await timed(client, "/", repeat)
                lines.append((backend, "overview /", ms, f"HTTP {status}"))
            else:
                lines.append((backend, "overview /", None, "skipped: no overview route in this build"))
            ms, status = await timed(client, f"/lifecycles/dispatch?limit={PAGE}", repeat)
            lines.append((backend, "list, first page", ms, f"HTTP {status}"))
            page = await browse(book, "dispatch", limit=PAGE)
            for _ in range(DEEP_PAGE - 2):
                page = await browse(book, "dispatch", limit=PAGE, after=page.next)
            assert page.next is not None, "fewer entities than the 1,000th page needs"
            ms, status = await timed(client, f"/lifecycles/dispatch?limit={PAGE}&after={page.next}", repeat)
            lines.append((backend, f"list, page {DEEP_PAGE:,}", ms, f"HTTP {status}"))
            ms, status = await timed(client, f"/lifecycles/dispatch?status=dead_letter&limit={PAGE}", repeat)
            lines.append((backend, "list, status filter", ms, f"HTTP {status}"))
            entity_id = page.rows[-1]["id"]
            facts = page.rows[-1]["version"]
            ms, status = await timed(client, f"/e/dispatch/{entity_id}", repeat)
            lines.append((backend, f"entity page ({facts} facts)", ms, f"HTTP {status}"))
            ms, status = await timed(client, f"/e/dispatch/{entity_id}/verify", repeat)
            lines.append((backend, "verify this entity", ms, f"HTTP {status}"))
            ms, status = await timed(client, "/lifecycles", repeat)
            lines.append((backend, "lifecycles (counts)", ms, f"HTTP {status}"))
            # No index serves "contains": a text that matches nothing reads every row. Shown, not judged.
            ms, status = await timed(client, f"/lifecycles/dispatch?text=no-such-text&limit={PAGE}", repeat)
            lines.append((backend, "list, text matching none", ms, f"HTTP {status}; info: a full scan, no target"))
    except httpx.HTTPError as exc:
        lines.append((backend, "requests", None, f"failed: {exc}"))
    finally:
        await book.engine.dispose()
    return lines


async def prepared(url: str) -> None:
    """An empty database at the head revision with the built-in schema (the seeder writes into it)."""
    from statebook.adapters.db import open_book

    book = await open_book(url)
    await book.engine.dispose()


def render(lines: list[tuple[str, str, float | None, str]], seeded: str) -> tuple[str, bool]:
    out = [seeded, "", f"{'backend':<10} {'page':<26} {'median ms':>10} {'target':>7}  verdict  note",
           "-" * 78]
    ok = True
    for backend, page, ms, note in lines:
        if ms is None:
            out.append(f"{backend:<10} {page:<26} {'-':>10} {TARGET_MS:>7.0f}  -        {note}")
            continue
        if "info:" in note:
            out.append(f"{backend:<10} {page:<26} {ms:>10.1f} {'-':>7}  -        {note}")
            continue
        passed = ms <= TARGET_MS and note.startswith("HTTP 200")
        ok &= passed
        out.append(f"{backend:<10} {page:<26} {ms:>10.1f} {TARGET_MS:>7.0f}  {'PASS' if passed else 'FAIL':<7}  {note}")
    return "\n".join(out), ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--repeat", type=int, default=7, help="requests per page (the median is reported)")
    parser.add_argument("--pg-url", help="an existing server (default: a throwaway cluster)")
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if args.entities < PAGE * DEEP_PAGE:
        parser.error(f"--entities must be at least {PAGE * DEEP_PAGE:,} for the {DEEP_PAGE:,}th page of {PAGE}")
    base = time.time() - args.entities * 0.01 - 86_400
    lines: list[tuple[str, str, float | None, str]] = []
    seeded: list[str] = []
    files = SqliteFiles()

    async def job(pg_url: str | None) -> None:
        urls: dict[str, str] = {}
        targets: list[Target] = []
        if "sqlite" in backends:
            path = files.fresh("web")
            urls["sqlite"] = f"sqlite:///{path}"
            await prepared(urls["sqlite"])
            targets.append(SqliteTarget(str(path)))
        if pg_url is not None:
            urls["postgres"] = pg_url
            await prepared(pg_url)
            targets.append(PgTarget(pg_url))
        spent, facts = await seed(args.entities, targets, base)  # one history, written to every backend
        seeded.append(f"{', '.join(urls)}: {args.entities:,} entities, {facts:,} facts, seeded in {spent:.0f} s")
        for backend, url in urls.items():
            lines.extend(await measure(backend, url, args.repeat))

    try:
        if "postgres" in backends:
            run_with_postgres(args.pg_url, job)
        else:
            asyncio.run(job(None))
    finally:
        files.cleanup()
    table, ok = render(lines, "\n".join(seeded))
    print(table)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
