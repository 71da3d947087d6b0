"""L20: arguments the engine refuses (lifecycle/inputs.py), the same way on every backend, before any write."""

from __future__ import annotations


class InputCases:
    """Conformance cases for the engine's boundary."""
