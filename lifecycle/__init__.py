"""statebook.lifecycle — declare lifecycles, move entities through them, replay and verify history.

Knows no dispatch and no schedule: those are lifecycles declared by ``statebook.outbox`` and
``statebook.scheduler``. Imports nothing else of statebook.
"""

from .book import Book
from .clock import SYSTEM_CLOCK, Clock, FakeClock, SystemClock
from .engine import Command, NewEntity, Outcome, apply, apply_many, create, create_many, purge, purge_many, transition
from .errors import (
    ConstraintViolation,
    DuplicateEntity,
    EntityNotFound,
    IdempotencyMismatch,
    PolicyError,
    RegistrySealed,
    StatebookError,
    StorageError,
    StorageUnavailable,
    TransitionRejected,
    UnknownEntityType,
    UnknownReason,
)
from .facts import Cursor, Fact, facts_table, tail
from .policy import Edge, Lifecycle, Registry, edges, validate
from .reasons import Actor, Reason, check_reason_code
from .replay import Finding, Report, as_of, export_jsonl, fold, history, read_row, replay, verify
from .store import Store
from .schema import LIFECYCLE_COLUMNS, data_columns, managed_table, metadata

__all__ = [
    "LIFECYCLE_COLUMNS", "SYSTEM_CLOCK", "Actor", "Book", "Clock", "Command", "ConstraintViolation", "Cursor", "DuplicateEntity", "Edge",
    "EntityNotFound", "Fact", "FakeClock", "Finding", "IdempotencyMismatch", "Lifecycle", "Outcome",
    "PolicyError", "Reason", "Registry", "RegistrySealed", "Report", "StatebookError", "StorageError", "StorageUnavailable", "Store", "SystemClock",
    "TransitionRejected", "UnknownEntityType", "UnknownReason", "NewEntity", "apply", "apply_many", "as_of", "create_many", "check_reason_code", "create",
    "data_columns", "edges", "export_jsonl", "facts_table", "fold", "history", "managed_table", "metadata",
    "purge", "purge_many", "read_row", "replay", "tail", "transition", "validate", "verify",
]
