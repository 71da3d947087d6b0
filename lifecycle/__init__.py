"""statebook.lifecycle — declare lifecycles, move entities through them, replay and verify history.

Knows no dispatch and no schedule: those are lifecycles declared by ``statebook.outbox`` and
``statebook.scheduler``. Imports nothing else of statebook. The names below are what an application
needs; the rest stays importable from its module: every error from :mod:`.errors`, the storage port
from :mod:`.store`, ``apply``/``purge_many`` from :mod:`.engine`, ``fold``/``Report`` from :mod:`.replay`,
the facts table and the tailing reader from :mod:`.facts`, ``SystemClock`` from :mod:`.clock`.
"""

from .book import Book
from .clock import Clock, FakeClock
from .engine import Command, NewEntity, Outcome, apply_many, create, create_many, purge, transition
from .errors import EntityNotFound, StatebookError, TransitionConflict, TransitionRejected
from .facts import Fact
from .head import Head, head_columns
from .policy import Lifecycle, Registry, edges
from .reasons import Actor, Reason
from .replay import as_of, history, replay, verify
from .schema import managed_table

__all__ = [
    "Actor", "Book", "Clock", "Command", "EntityNotFound", "Fact", "FakeClock", "Head", "Lifecycle", "NewEntity", "Outcome",
    "Reason", "Registry", "StatebookError", "TransitionConflict", "TransitionRejected", "apply_many", "as_of", "create",
    "create_many", "edges", "head_columns", "history", "managed_table", "purge", "replay", "transition", "verify",
]
