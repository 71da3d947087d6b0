"""The outbox's errors. Each is a StatebookError and the builtin its callers expect (specs/outbox.md O4, O10, O22)."""

from __future__ import annotations

from statebook.lifecycle import StatebookError
from statebook.lifecycle.errors import InvalidArgument


class DispatchInvalid(InvalidArgument):
    """An outbox argument is invalid; nothing was written (an :class:`InvalidArgument`, so a ``ValueError``).

    ``argument`` names the public argument (``max_attempts``, ``before``, ``deliver_to``); ``rule``
    the rule it broke (the :mod:`statebook.lifecycle.inputs` rules, or ``dash``, ``payload``,
    ``future``, ``status``, ``bound``, ``conflict``).
    """


class AckRejected(StatebookError, ValueError):
    """An acknowledgement was refused: none was requested, or the token is wrong."""
