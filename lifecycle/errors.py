"""The exception family. Every error says what was wrong and what would be right."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .plan import Outcome


class StatebookError(Exception):
    """Root of every error statebook raises on purpose."""


class InvalidArgument(StatebookError, ValueError):
    """An argument breaks the rule its parameter or column states (:mod:`.inputs`); nothing was written.

    ``argument`` names it (``dispatch_outbox.max_attempts``, ``before``); ``rule`` names the rule
    (``type``, ``utf8``, ``nul``, ``length``, ``empty``, ``range``, ``finite``, ``json``, ``depth``,
    ``size``, or a part's own).
    """

    def __init__(self, message: str, *, argument: str, rule: str) -> None:
        super().__init__(message)
        self.argument = argument
        self.rule = rule


class PolicyError(StatebookError):
    """A lifecycle declaration or registry operation is invalid."""


class RegistrySealed(PolicyError):
    """The registry was sealed; policies can no longer be added or replaced."""


class UnknownEntityType(StatebookError, LookupError):
    """No lifecycle is registered for the entity type."""


class EntityNotFound(StatebookError, LookupError):
    """The entity's row does not exist."""


class TransitionRejected(StatebookError):
    """The policy forbids this command; nothing was written.

    ``rule`` names the rule that refused it (``edge``, ``actor``, ``patch``, ``guard``, ``reason``,
    ``initial``, ``status``).
    """

    def __init__(self, message: str, *, rule: str) -> None:
        super().__init__(message)
        self.rule = rule


class TransitionConflict(StatebookError):
    """A single command lost its compare-and-set: the row was not in an expected status, or a guarded
    column held another value; nothing was written (specs/lifecycle.md L4).

    Raised by ``transition``, ``apply`` and ``purge`` unless the caller passes ``on_conflict="return"``
    (then ``outcome`` is returned instead); the batch forms always return outcomes. ``expected`` are the
    statuses the command expected, ``actual`` and ``version`` the row's as the command read it (None when
    not known), ``guards`` the guarded columns that differed (empty when the status did not match),
    ``target`` the status asked for (None for a purge). Guard values are left out of the message.
    """

    def __init__(self, outcome: Outcome, *, expected: tuple[str, ...], target: str | None,
                 guards: tuple[str, ...] = ()) -> None:
        self.outcome = outcome
        self.entity_type = outcome.entity_type
        self.entity_id = outcome.entity_id
        self.expected = expected
        self.target = target
        self.actual = outcome.status
        self.version = outcome.version
        self.guards = guards
        super().__init__(self._message())

    def _message(self) -> str:
        what = f"purge of {self.entity_type} {self.entity_id!r}" if self.target is None else (
            f"transition of {self.entity_type} {self.entity_id!r} to {self.target!r}")
        wanted = " or ".join(map(repr, self.expected))
        if self.actual is None:
            found = f"expected {wanted}, but the row changed before the write"
        elif self.actual in self.expected:
            differed = ", ".join(self.guards) or "a guarded column"
            found = f"status {self.actual!r} (version {self.version}) as expected, but {differed} differed"
        else:
            found = f"expected {wanted}, found {self.actual!r} (version {self.version})"
        return (f"{what} lost its compare-and-set: {found}; nothing written. Read the row again and decide, "
                "or pass on_conflict=\"return\" to get the conflict as an Outcome")


class UnknownReason(TransitionRejected):
    """The reason code is not declared by the lifecycle."""

    def __init__(self, message: str) -> None:
        super().__init__(message, rule="reason")


class IdempotencyMismatch(StatebookError):
    """An idempotency key was reused for a different request; nothing was written. A transition's key is
    scoped to its entity (specs/lifecycle.md L9), a notification intake's to (principal, source)
    (specs/notifications.md N13). A new request needs a new key."""


class DuplicateEntity(StatebookError):
    """``create`` was asked to insert an id that already exists."""


class StorageError(StatebookError):
    """The database refused or failed a statement in a way statebook did not plan for.

    ``orig`` is the driver's exception (for logs; it is not part of the contract).
    """

    def __init__(self, message: str, *, orig: BaseException | None = None) -> None:
        super().__init__(message)
        self.orig = orig


class StorageUnavailable(StorageError):
    """The database could not be reached or stayed busy: the connection was lost, the server is down,
    or SQLite's lock was held past the busy timeout. Nothing of the failed unit was committed; retry."""


class ConstraintViolation(StorageError):
    """A constraint of the schema (NOT NULL, CHECK, a foreign key, a unique index) refused a write;
    nothing of the unit was committed. ``unique`` tells a unique index from the others."""

    def __init__(self, message: str, *, orig: BaseException | None = None, unique: bool = False) -> None:
        super().__init__(message, orig=orig)
        self.unique = unique


class SchemaMismatch(StatebookError):
    """The database's tables do not admit what the registry declares (e.g. a status its CHECK refuses)."""
