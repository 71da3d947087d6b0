"""Callers that go wrong around a transaction: the commit is lost to them, their own work fails, the
connection drops. Each wraps an operation ``op(book) -> Outcome`` run on a book bound by ``book.begin()``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ..book import Book
from ..engine import Outcome, transition
from ..reasons import Reason
from .model import TransitionCmd

__all__ = ["AmbiguousCommit", "CallerAborted", "ConnectionDropped", "commit_then_fail", "drop_connection",
           "join_then_abort", "send"]

Op = Callable[[Book], Awaitable[Outcome]]


class AmbiguousCommit(Exception):
    """The transaction committed, but the caller got an error instead of the outcome."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__("connection lost after COMMIT")
        self.outcome = outcome


class CallerAborted(Exception):
    """The caller's own work failed inside the transaction it shared with the engine."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__("caller failed before COMMIT")
        self.outcome = outcome


class ConnectionDropped(Exception):
    """The transaction's connection was closed before COMMIT; ``outcome`` is what the engine had
    answered inside it (None when the drop came first), ``error`` what the block then raised."""

    def __init__(self, outcome: Outcome | None, error: BaseException | None) -> None:
        super().__init__(f"connection dropped before COMMIT ({type(error).__name__ if error else 'no error'})")
        self.outcome = outcome
        self.error = error


def send(cmd: TransitionCmd) -> Op:
    """The engine call for a model command, on whatever book it is given."""

    def op(book: Book) -> Awaitable[Outcome]:
        return transition(
            book, cmd.entity_type, cmd.entity_id, cmd.target, reason=Reason(cmd.reason_code, cmd.reason_summary),
            actor=cmd.actor, expected=cmd.expected, guards=dict(cmd.guards), patch=dict(cmd.patch),
            idempotency_key=cmd.idempotency_key, on_conflict="return",  # the model predicts conflicts as outcomes
        )

    return op


async def commit_then_fail(book: Book, op: Op) -> Outcome:
    """Run ``op`` in a transaction that commits, then raise :class:`AmbiguousCommit`."""
    async with book.begin() as tx:
        out = await op(tx)
    raise AmbiguousCommit(out)


async def join_then_abort(book: Book, op: Op) -> Outcome:
    """Run ``op`` in a transaction, then fail inside it (:class:`CallerAborted`): it rolls back."""
    async with book.begin() as tx:
        out = await op(tx)
        raise CallerAborted(out)


async def drop_connection(book: Book, op: Op, *, before: bool = False) -> Outcome:
    """Run ``op`` in a transaction whose connection is closed (invalidated: the driver's connection
    is closed under SQLAlchemy) after ``op`` — or, with ``before``, ahead of it. Always raises
    :class:`ConnectionDropped`; whatever happened, nothing may have committed."""
    out: Outcome | None = None
    try:
        async with book.begin() as tx:
            assert tx.conn is not None
            if before:
                await tx.conn.invalidate()
            out = await op(tx)
            if not before:
                await tx.conn.invalidate()
    except Exception as exc:  # noqa: BLE001 - every failure is an outcome here; the machine judges the writes
        raise ConnectionDropped(out, exc) from exc
    raise ConnectionDropped(out, None)
