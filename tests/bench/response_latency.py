"""Timeout-to-callback latency on an idle daemon (specs/notifications.md N35, N36).

One ``statebook run`` (in process, the system clock; a 0.2 s tick, since the producer is another book and
SQLite has no cross-process wake-up) delivers N notifications through an in-process email channel, each with a 1 s response timeout and a host callback, spaced ``--spacing`` seconds apart
so the daemon is idle between them. Nobody answers: each response times out, and the callback records
the wall time it was called. Prints, per backend, the median and p99 of:

- ``deadline -> timed out``: the timeout pass's lag behind the deadline (``responded_at - due_at``);
- ``timed out -> callback``: the callback dispatch's delivery after the timeout committed;
- ``deadline -> callback``: the whole latency a host sees.

    .venv/bin/python tests/bench/response_latency.py [--n 40] [--spacing 0.1] [--pg-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: pgcluster

CALLBACK_MODULE = """
import json, pathlib, time
OUT = pathlib.Path(__file__).with_name("calls.jsonl")
async def page(event):
    with OUT.open("a") as f:
        f.write(json.dumps({"at": time.time(), **event}) + "\\n")
def email():
    from statebook.outbox.notifications.scripted import ScriptedChannel
    return ScriptedChannel("email", ["success"])
"""


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


async def one_backend(url: str, n: int, spacing: float, work: Path) -> dict[str, list[float]]:
    from statebook.adapters.daemon import run_daemon
    from statebook.adapters.db import open_book, reset_schema
    from statebook.adapters.settings import load_settings
    from statebook.outbox.notifications import get_response, send_notification

    calls = work / "calls.jsonl"
    calls.unlink(missing_ok=True)
    toml = work / "bench.toml"
    toml.write_text(f'db = "{url}"\n[scheduler]\ntick_seconds = 0.2\n[notifications]\ndeadline_seconds = 2\n'
                    'channels = { email = "bench_callbacks:email" }\ncallbacks = { page = "bench_callbacks:page" }\n')
    book = await open_book(url)
    if book.dialect == "postgresql":
        await reset_schema(book.engine)
    await book.engine.dispose()

    async def produce() -> list[str]:
        producer = await open_book(url)
        ids = []
        try:
            await asyncio.sleep(0.5)  # the daemon is up and idle
            for _ in range(n):
                accepted = await send_notification(producer, recipient="ops", content={"text": "x"}, mode="guaranteed",
                                                   channels=["email"], response_timeout=1.0, timeout_callback="page")
                ids.append(accepted.id)
                await asyncio.sleep(spacing)
        finally:
            await producer.engine.dispose()
        return ids

    daemon = asyncio.ensure_future(run_daemon(load_settings(toml, environ={}), run_for=0.5 + n * spacing + 3.0))
    ids = await produce()
    await daemon
    reader = await open_book(url)
    try:
        responses = {i: await get_response(reader, i) for i in ids}
    finally:
        await reader.engine.dispose()
    called = {e["notification_id"]: e for e in map(json.loads, calls.read_text().splitlines())} if calls.exists() else {}
    out: dict[str, list[float]] = {"deadline -> timed out": [], "timed out -> callback": [], "deadline -> callback": []}
    for i in ids:
        r, c = responses[i], called.get(i)
        if r is None or r.status != "timed_out" or c is None:
            raise SystemExit(f"notification {i}: response {r and r['status']}, callback {'seen' if c else 'missing'}")
        out["deadline -> timed out"].append(r.responded_at.timestamp() - r.due_at.timestamp())
        out["timed out -> callback"].append(c["at"] - r.responded_at.timestamp())
        out["deadline -> callback"].append(c["at"] - r.due_at.timestamp())
    return out


async def measure(urls: dict[str, str], n: int, spacing: float, work: Path) -> None:
    print(f"{n} notifications, 1 s response timeout, {spacing:g} s apart; latencies in milliseconds")
    print("| backend | span | median | p99 | max |")
    print("|---|---|---|---|---|")
    for backend, url in urls.items():
        figures = await one_backend(url, n, spacing, work)
        for span, values in figures.items():
            ms = [v * 1000 for v in values]
            print(f"| {backend} | {span} | {statistics.median(ms):.1f} | {pct(ms, 99):.1f} | {max(ms):.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40)
    parser.add_argument("--spacing", type=float, default=0.1)
    parser.add_argument("--pg-url", help="PostgreSQL URL (default: a throwaway cluster)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="statebook-latency-"))
    (work / "bench_callbacks.py").write_text(CALLBACK_MODULE)
    sys.path.insert(0, str(work))
    sqlite = f"sqlite:///{work / 'latency.db'}"
    started = time.perf_counter()
    if args.pg_url:
        asyncio.run(measure({"sqlite": sqlite, "postgresql": args.pg_url}, args.n, args.spacing, work))
    else:
        import pgcluster

        with pgcluster.throwaway_cluster() as url:
            asyncio.run(measure({"sqlite": sqlite, "postgresql": url}, args.n, args.spacing, work))
    print(f"took {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
