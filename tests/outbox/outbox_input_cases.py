"""O22: bad input to the outbox's public functions is refused with a StatebookError and writes nothing."""

from __future__ import annotations


class OutboxInputCases:
    """Conformance cases: each bad input the same refusal on every backend."""
