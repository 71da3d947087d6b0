"""A delivery worker with named fault points, run as a subprocess by tests/conformance/outbox/cases_kill.py.

Usage: ``python tests/conformance/outbox/kill_worker.py DB_URL NOW [TRANSPORT_LOG]``

It runs one pass of the pipeline step by step (scan, settle, claim, execute, finalize) at the
explicit time ``NOW`` with an in-process transport that always succeeds and appends
``dispatch_id attempt`` to ``TRANSPORT_LOG`` (when given) before returning. With
``STATEBOOK_FAULT=<point>`` it SIGKILLs itself at that point, the way a crashed host would stop:
no exception handler, no finally block, no rollback message to the server.

Fault points: ``after_scan``, ``after_claim``, ``after_transport`` (the transport ran, finalize
did not), ``after_finalize``. ``in_pass`` runs one ``deliver_due_dispatches`` pass instead (one
transport at a time) and dies inside its third send, after logging it: the batch was claimed in one
transaction, some outcomes may be recorded, the rest are not. It prints one JSON line with what it
did when it survives.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

from statebook.adapters.db import open_book
from statebook.lifecycle import FakeClock
from statebook.outbox import CallableTransport, TransportResult, deliver_due_dispatches
from statebook.outbox.dispatch.attempts import scan
from statebook.outbox.dispatch.steps import claim, execute, finalize, settle

FAULT = os.environ.get("STATEBOOK_FAULT", "")
FAULT_POINTS = {"", "after_scan", "after_claim", "after_transport", "after_finalize", "in_pass"}
KILL_ON_SEND = 3


def fault_point(name: str) -> None:
    if FAULT == name:
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)


async def main(url: str, now: float, log_path: str | None) -> dict[str, list]:
    if FAULT not in FAULT_POINTS:
        raise SystemExit(f"unknown STATEBOOK_FAULT {FAULT!r}; use one of {sorted(FAULT_POINTS - {''})}")
    book = await open_book(url, clock=FakeClock(now), create=False)

    sends = 0

    async def send(deliver_to: str, payload: str) -> TransportResult:
        nonlocal sends
        sends += 1
        if log_path:
            dispatch_id = json.loads(payload)["dispatch_id"]
            with open(log_path, "a", encoding="utf-8") as log:
                log.write(f"{dispatch_id} {current[1] if FAULT != 'in_pass' else '?'}\n")
        if FAULT == "in_pass" and sends == KILL_ON_SEND:
            fault_point("in_pass")
        return TransportResult(ok=True, error=None)

    transport = CallableTransport(send)
    current: list = [None, None]
    done: dict[str, list] = {"claimed": [], "settled": [], "outcomes": []}
    if FAULT == "in_pass":
        try:
            return {"pass": [await deliver_due_dispatches(book, now=now, transport=transport, concurrency=1)]}
        finally:
            await book.engine.dispose()
    try:
        candidates = await scan(book, now=now)
        fault_point("after_scan")
        for candidate in candidates:
            settled = await settle(book, candidate, now=now)
            if settled is not None:
                done["settled"].append([candidate.dispatch_id, settled])
                continue
            lease = await claim(book, candidate, now=now)
            if lease is None:
                continue
            done["claimed"].append([lease.dispatch_id, lease.attempt])
            fault_point("after_claim")
            current[:] = [lease.dispatch_id, lease.attempt]
            result = await execute(lease, transport)
            fault_point("after_transport")
            outcome = await finalize(book, lease, result, now=now)
            done["outcomes"].append([lease.dispatch_id, outcome])
            fault_point("after_finalize")
    finally:
        await book.engine.dispose()
    return done


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        raise SystemExit("usage: kill_worker.py DB_URL NOW [TRANSPORT_LOG]")
    result = asyncio.run(main(sys.argv[1], float(sys.argv[2]), sys.argv[3] if len(sys.argv) == 4 else None))
    print(json.dumps(result), flush=True)
