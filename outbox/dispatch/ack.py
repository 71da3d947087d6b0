"""The acknowledgement tier (specs/outbox.md O10): a consumer presents the row's token."""

from __future__ import annotations

import hmac

import sqlalchemy as sa

from statebook.lifecycle import Actor, Book, EntityNotFound, Reason, TransitionRejected, transition

from . import checks
from .errors import AckRejected
from .schema import dispatch_outbox

CONSUMER_ACTOR = Actor("consumer", "ack_dispatch")
ACKABLE = ("pending", "delivering")


async def _read(book: Book, dispatch_id: str) -> sa.Row[str, int, str | None] | None:
    t = dispatch_outbox
    async with book.read() as conn:
        return (
            await conn.execute(
                sa.select(t.c.status, t.c.ack_required, t.c.ack_token).where(t.c.id == dispatch_id)
            )
        ).first()


def _token_matches(stored: str | None, presented: object) -> bool:
    if stored is None or not isinstance(presented, str):
        return False
    # Constant time: the comparison does not reveal how many leading characters matched.
    return hmac.compare_digest(stored.encode(), presented.encode())


async def ack_dispatch(book: Book, dispatch_id: str, ack_token: str, *, actor: Actor = CONSUMER_ACTOR,
                       note: str | None = None) -> bool:
    """Acknowledge a dispatch; True when it is (now or already) acked, False when a race lost.

    Raises ``LookupError`` (:class:`EntityNotFound`) for a missing row and ``ValueError``
    (:class:`AckRejected`) when no acknowledgement was requested or the token is wrong. A repeated
    correct ack of an acked row returns True and writes nothing. A row that already left the
    acknowledgement tier (dead_letter, expired) cannot be acked: :class:`TransitionRejected`.
    ``note`` (who acknowledged and why, at most 500 characters) is kept in the fact's summary.
    """
    checks.book_arg(book)
    checks.dispatch_id(dispatch_id)
    checks.text_arg("ack_token", ack_token)  # its form only: the message never shows the token
    checks.actor(actor)
    summary = checks.with_note("acknowledged with the dispatch's token", checks.note(note))
    row = await _read(book, dispatch_id)
    if row is None:
        raise EntityNotFound(f"dispatch {dispatch_id!r} does not exist")
    if not row.ack_required:
        raise AckRejected(f"dispatch {dispatch_id} did not request an acknowledgement (ack_required is false)")
    if not _token_matches(row.ack_token, ack_token):
        raise AckRejected(f"wrong acknowledgement token for dispatch {dispatch_id}")
    if row.status == "acked":
        return True
    if row.status not in ACKABLE:
        raise TransitionRejected(
            f"dispatch {dispatch_id} is {row.status!r}; only a pending or delivering dispatch can be acknowledged"
            " (an operator may retry it first)",
            rule="edge",
        )
    outcome = await transition(
        book, "dispatch", dispatch_id, "acked", expected=row.status,
        reason=Reason("dispatch.acked.consumer", summary), actor=actor, on_conflict="return",
    )
    if outcome.applied:
        return True
    # Lost a race. A concurrent correct ack is success too; anything else is not.
    again = await _read(book, dispatch_id)
    return again is not None and again.status == "acked"
