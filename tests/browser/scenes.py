"""What the scenarios find in the database before a person opens the console, made through the public API
on the console's loop (``console.run(...)``), and a clock that can skip a backoff.

A scene is the story so far: a dead-lettered notification whose successor still holds its obligation,
a dispatch whose row someone edited with raw SQL, the notifications an overview shows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from statebook.outbox.notifications import (
    deliver_due_notifications, get_notification, send_notification,
)
from statebook.outbox.notifications.scripted import ScriptedChannel

OBLIGATION = "disk-full-db-1"
ALERT = {"title": "disk full on db-1", "body": "/var is at 97% and rising"}


class SkippingClock:
    """The wall clock, plus the seconds a scenario skipped (a backoff nobody wants to wait for)."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def now(self) -> float:
        return time.time() + self.skipped

    def advance(self, seconds: float) -> float:
        self.skipped += seconds
        return self.now()


@dataclass
class Switch:
    """A webhook channel whose provider fails until the scenario fixes it (``ok = True``)."""

    ok: bool = False
    channel: ScriptedChannel = field(init=False)

    def __post_init__(self) -> None:
        self.channel = ScriptedChannel("webhook", [lambda _: "success" if self.ok else "reject"])

    @property
    def channels(self) -> dict[str, Any]:
        return {"webhook": self.channel}


async def deliver(book: Any, switch: Switch) -> dict[str, int]:
    """One delivery pass, as the daemon's worker makes it."""
    return await deliver_due_notifications(book, switch.channels, deadline=5.0)


async def until_failed(book: Any, clock: SkippingClock, switch: Switch, notification_id: str) -> None:
    """Passes, skipping each backoff, until ``notification_id`` exhausted its cycle (a dead letter)."""
    for _ in range(10):
        await deliver(book, switch)
        row = await get_notification(book, notification_id)
        assert row is not None
        if row.status == "failed":
            return
        clock.advance(5)  # past the backoff (at most 2 s within a cycle)
    raise AssertionError(f"notification {notification_id} is still {row.status} after 10 passes")


async def dead_letter_with_a_pending_successor(book: Any, clock: SkippingClock, switch: Switch) -> tuple[str, str]:
    """Two alerts of one obligation: the owner exhausted its cycle (a dead letter) and the follower, elected
    its successor, now owns the obligation and is pending — so the owner's replay is blocked by it.
    Returns (owner id, successor id)."""
    owner = await send_notification(book, recipient="ops", content=ALERT, mode="guaranteed", channels=["webhook"],
                                    obligation_key=OBLIGATION)
    follower = await send_notification(book, recipient="ops", content=ALERT, mode="guaranteed",
                                       channels=["webhook"], obligation_key=OBLIGATION)
    await until_failed(book, clock, switch, owner.id)
    row = await get_notification(book, follower.id)
    assert row is not None and row.status == "pending", row
    return owner.id, follower.id


async def tampered_dispatch(book: Any) -> tuple[str, str]:
    """A dispatch, and a second one whose ``deliver_to`` someone then changed with raw SQL behind the engine's
    back (no fact records it). Returns (untouched id, tampered id)."""
    import sqlalchemy as sa

    from statebook.outbox import enqueue_dispatch

    clean = await enqueue_dispatch(book, kind="notify", deliver_to="ops", body={"text": "nightly backup done"})
    edited = await enqueue_dispatch(book, kind="notify", deliver_to="ops", body={"text": "payroll export ready"})
    async with book.engine.begin() as conn:
        await conn.execute(sa.text("UPDATE dispatch_outbox SET deliver_to = 'mallory' WHERE id = :id"), {"id": edited})
    return clean, edited


async def emailed_alert(book: Any, settings: Any) -> str:
    """An alert for the on-call team's mailbox that waits an hour for an answer, delivered by the email
    channel ``settings`` configure, with the response links the daemon's worker adds. Returns its id."""
    from statebook.adapters.channels.configure import build_channels
    from statebook.adapters.daemon import response_links

    accepted = await send_notification(book, recipient="oncall", content=ALERT, mode="guaranteed",
                                       channels=["email"], response_timeout=3600)
    built = build_channels(settings.notifications, clock=book.clock)
    try:
        counts = await deliver_due_notifications(book, built.channels, deadline=5.0,
                                                 links=response_links(settings, book))
    finally:
        await built.aclose()
    assert counts["delivered"] == 1, counts
    return accepted.id


def links_in(message: bytes) -> dict[str, str]:
    """The response links of an email as the SMTP server received it: label (``Acknowledge``) -> URL."""
    import email
    import re
    from email.policy import default

    body = email.message_from_bytes(message, policy=default).get_body(("plain",)).get_content()
    return dict(re.findall(r"^(Acknowledge|Dismiss): (\S+)\s*$", body, re.M))
