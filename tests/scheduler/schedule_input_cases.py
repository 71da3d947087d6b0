"""S18: bad input to the scheduler's public functions is refused with a StatebookError and writes nothing."""

from __future__ import annotations


class SchedulerInputCases:
    """Conformance cases: each bad input the same refusal on every backend."""
