"""No run stays ``running`` forever (S3, S17): runs of a daemon that is gone end ``failed``.

Gone: a dead pid on this host, or an engine of this process that is no longer alive (any engine sees
these), or — seen by the leader — a daemon whose heartbeat is older than the lease, on any host.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Container

import sqlalchemy as sa

from statebook.lifecycle import Book, Reason

from .leadership import Leader
from .runs import finalize_run
from .schema import schedule_runs

log = logging.getLogger("statebook.scheduler")

_LIVE_DAEMONS: set[str] = set()
"""daemon ids of engines alive in this process (a run owned by another id of this pid is orphaned)."""


def new_daemon_id() -> str:
    """``host:pid:random`` — the host and pid let an engine on the same host tell a dead owner (S3)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def owner_gone(daemon_id: str | None, me: str) -> bool:
    """Whether the daemon ``daemon_id`` is known to be gone from here (this host's pids, this process's engines)."""
    if not daemon_id:
        return True
    if daemon_id == me or daemon_id in _LIVE_DAEMONS:
        return False
    host, _, rest = daemon_id.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False  # another host: its liveness is not knowable from here
    pid = int(pid_text)
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


async def reap(book: Book, *, me: str, leader: Leader, leading: bool, executing: Container[str]) -> int:
    """End ``failed`` (daemon_died) every run left ``running`` by a daemon that is gone; returns how many.

    ``executing``: runs this engine is executing (never reaped); ``leading``: whether stale heartbeats
    on other hosts count too (S17)."""
    q = sa.select(schedule_runs.c.id, schedule_runs.c.daemon_id, schedule_runs.c.schedule_id).where(
        schedule_runs.c.status == "running"
    )
    async with book.read() as conn:
        rows = list(await conn.execute(q))
    others = {r.daemon_id for r in rows if r.daemon_id and r.daemon_id != me and r.daemon_id not in _LIVE_DAEMONS}
    stale = await leader.stale_owners(others) if others and leading else set()
    count = 0
    for row in rows:
        if row.id in executing:
            continue
        if row.daemon_id in stale:
            why = f"the heartbeat of daemon {row.daemon_id} is older than the lease; the run was not observed to end"
        elif owner_gone(row.daemon_id, me):
            why = f"daemon {row.daemon_id} is gone; the run was not observed to end"
        else:
            continue
        out = await finalize_run(book, row.id, "failed", reason=Reason(
            "schedule_run.failed.daemon_died", why, (f"daemon:{row.daemon_id}",)),
            patch={"error_detail": "owning daemon died"})
        count += out.applied
    if count:
        log.warning("recovered %d run(s) left running by a daemon that died", count)
    return count
