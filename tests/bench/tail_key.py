"""What the tail key costs the write path on PostgreSQL: the working tree against a baseline revision.

A fact that follows another (a transition, a tombstone) stores as ``tx_id`` the higher of its transaction's id
and its entity's previous fact's (specs/lifecycle.md L13a): one more index lookup (``uq_fact_version``) per fact
in the statement that writes it. This measures the paths that pay it, each side in a child process of its own
on the same server, the two sides alternating first and second round by round:

- ``transitions/s``: one ``transition`` after another, each its own transaction (the lookup's worst case: one
  fact per statement);
- ``W2 drain del/s``: ``tests/bench/statebook_side.drain`` (claim, deliver, finalize: two following facts per
  dispatch, ``BATCH`` rows per statement, ``CONCURRENCY`` in flight);
- ``W1 batch enq/s``: ``enqueue_dispatches`` in batches of 500, creation facts only (the control: unchanged).

The baseline is exported with ``git archive`` and imported from a directory of links placed first on the
child's ``PYTHONPATH`` (no install: it runs on this virtualenv's packages). Printed, never asserted.

    .venv/bin/python tests/bench/tail_key.py --baseline REV [--rounds 5] [--n 1000] [--drain 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent))
sys.path.insert(0, str(BENCH_DIR))

from common import REPO_DIR, median, run_with_postgres  # noqa: E402

PARTS = ("lifecycle", "adapters", "outbox", "scheduler")
"""The folders the package ``statebook`` maps (pyproject.toml); ``statebook`` itself is a namespace."""


async def measure(url: str, n: int, drain: int) -> dict[str, float]:
    """One side's figures on a fresh schema (runs in the child, on whichever statebook it imports)."""
    import statebook_side as sb
    from statebook.adapters.db import reset_schema
    from statebook.lifecycle import Actor, Reason, create, transition

    book = await sb.fresh_book(url)
    try:
        system = Actor("system", "bench")
        values = dict(kind="bench", deliver_to="log:", payload={"n": 0}, next_attempt_at=0.0, created_at=0.0)
        ids = [f"bench{i:06d}" for i in range(n)]
        for entity_id in ids:
            await create(book, "dispatch", values=values, entity_id=entity_id, status="pending",
                         reason=Reason("dispatch.pending.enqueued", "bench"), actor=system)
        start = time.perf_counter()
        for entity_id in ids:
            await transition(book, "dispatch", entity_id, "delivering", expected="pending", guards={"attempt": 0},
                             patch={"attempt": 1}, reason=Reason("dispatch.delivering.attempt", "bench"),
                             actor=system)
        transitions = n / (time.perf_counter() - start)
        await reset_schema(book.engine)
        drained = drain / await sb.drain(book, drain)
        await reset_schema(book.engine)
        enqueued = 5 * drain / await sb.enqueue_batches(book, 5 * drain, 500)
        return {"transitions/s": transitions, "W2 drain del/s": drained, "W1 batch enq/s": enqueued}
    finally:
        await book.engine.dispose()


def links(rev: str, root: Path) -> Path:
    """``rev``'s tree under ``root`` and a directory holding ``statebook`` as links to its folders."""
    archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=REPO_DIR, capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(root / "tree", filter="data")
    package = root / "site" / "statebook"
    package.mkdir(parents=True)
    for part in PARTS:
        (package / part).symlink_to(root / "tree" / part)
    return root / "site"


def side(url: str, site: Path | None, n: int, drain: int) -> dict[str, float]:
    """One round of one side in a child process (``site``: the baseline's, first on its path)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if site is not None:
        env["PYTHONPATH"] = str(site)
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps([url, n, drain])], env=env,
                         capture_output=True, text=True, check=True, cwd=BENCH_DIR)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    source = Path(got.pop("source")).resolve()
    expected = (site / "statebook" / "adapters").resolve() if site is not None else REPO_DIR / "adapters"
    if source.parent != expected:
        raise RuntimeError(f"the child imported statebook from {source}, not from {expected}")
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=False, metavar="REV", help="the revision to compare against")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=1000, help="sequential transitions per round")
    parser.add_argument("--drain", type=int, default=3000, help="dispatches drained per round")
    parser.add_argument("--pg-url", help="PostgreSQL URL (default: a throwaway cluster)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        url, n, drain = json.loads(args.child)
        import statebook.adapters

        print(json.dumps({"source": statebook.adapters.__file__, **asyncio.run(measure(url, n, drain))}))
        return
    with tempfile.TemporaryDirectory(prefix="statebook-tail-key-") as tmp:
        sides: dict[str, Path | None] = {"working tree": None}
        if args.baseline:
            sides[f"baseline {args.baseline}"] = links(args.baseline, Path(tmp))
        figures: dict[str, dict[str, list[float]]] = {name: {} for name in sides}

        async def rounds(url: str) -> None:
            for r in range(args.rounds):
                order = list(sides) if r % 2 == 0 else list(reversed(sides))
                for name in order:
                    got = await asyncio.to_thread(side, url, sides[name], args.n, args.drain)
                    for key, value in got.items():
                        figures[name].setdefault(key, []).append(value)
                print(f"round {r + 1}/{args.rounds}: " + "; ".join(
                    f"{name}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in figures[name].items()) for name in sides),
                    flush=True)

        run_with_postgres(args.pg_url, rounds)
    keys = list(next(iter(figures.values())))
    print(f"\nmedians of {args.rounds} rounds (PostgreSQL; n={args.n} transitions, {args.drain} drained, "
          f"{5 * args.drain} enqueued in batches of 500)")
    print("| side | " + " | ".join(keys) + " |\n|---|" + "---|" * len(keys))
    for name in sides:
        print(f"| {name} | " + " | ".join(f"{median(figures[name][k]):,.0f}" for k in keys) + " |")
    if args.baseline:
        base = f"baseline {args.baseline}"
        print("| working / baseline | " + " | ".join(
            f"{median(figures['working tree'][k]) / median(figures[base][k]):.3f}x" for k in keys) + " |")


if __name__ == "__main__":
    main()
