"""The outbox's errors. Each is a StatebookError and the builtin its callers expect (specs/outbox.md O4, O10)."""

from __future__ import annotations

from statebook.lifecycle import StatebookError


class DispatchInvalid(StatebookError, ValueError):
    """An enqueue or query argument is invalid; nothing was written."""


class AckRejected(StatebookError, ValueError):
    """An acknowledgement was refused: none was requested, or the token is wrong."""
