"""What the engine asks of leadership (S10, S14-S17): lead or stand by, fence a fire, tell stale owners.

The composition root injects an implementation (``adapters/leader.py``: a lease row with a heartbeat
and a fencing epoch, beside each daemon's liveness signal). The engine calls :meth:`Leader.is_leader`
once per tick — which is also when a daemon's heartbeat is renewed —; its ``Firing`` calls
:meth:`Leader.fence` as the first statement of every transaction that writes for an automatic fire, and
``recovery.reap`` asks :meth:`Leader.stale_owners` when the leader reaps runs. Without an injected
leader (tests, ``statebook schedule fire``) the engine always leads and fences nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from statebook.lifecycle import Book



class Leader(Protocol):
    """Who may fire schedules: the scheduler asks before each tick and fences each fire's transaction."""

    async def is_leader(self) -> bool:
        """Renew this daemon's heartbeat and the lease (or take over a lease released, or whose holder died or
        went silent); True while leading."""
        ...

    async def fence(self, tx: Book) -> int | None:
        """Inside ``tx``: the epoch this daemon leads under, held until ``tx`` ends; LeadershipLost if
        the lease has another holder or epoch now."""
        ...

    async def stale_owners(self, owners: Iterable[str]) -> set[str]:
        """The daemons among ``owners`` whose heartbeat is older than the lease (their runs may be reaped)."""
        ...

    def holds(self, now: float) -> bool:
        """Whether the lease this daemon fires under is still its own at ``now`` by its last renewal: a fire
        committed under the lease is launched only while this holds (S16)."""
        ...


class Unfenced:
    """Always the leader; fences nothing and knows no heartbeats (one engine, no coordination)."""

    async def is_leader(self) -> bool:
        """Always True: a single daemon leads."""
        return True

    async def fence(self, tx: Book) -> int | None:
        """No fence: returns None."""
        return None

    async def stale_owners(self, owners: Iterable[str]) -> set[str]:
        """None: with one daemon no owner is stale."""
        return set()

    def holds(self, now: float) -> bool:
        """Always True."""
        return True
