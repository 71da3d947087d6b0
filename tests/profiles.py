"""How big the Hypothesis runs are, per profile (``HYPOTHESIS_PROFILE``), in one place.

``ci`` (what ``make test`` and CI run) and the everyday default share the sizes each test names.
``deep`` (``make test-deep``: nightly, or before a release) runs ten times the examples of every
property and every state machine, the machines' examples are longer (their own module says by how
much), and the soaks run ten times as long. specs/testing.md has the table.
"""

from __future__ import annotations

import os

DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
EXAMPLES_FACTOR = 10 if DEEP else 1
DEFAULT_EXAMPLES = 100
"""Hypothesis's own default max_examples: what a ``@given`` test with no size of its own runs under ``ci``."""


def examples(count: int) -> int:
    """``count`` examples under ``ci``; ten times as many under ``deep``."""
    return count * EXAMPLES_FACTOR


def soak_seconds(seconds: float) -> float:
    """How long a soak runs: ``seconds`` under ``ci``; ten times as long under ``deep``."""
    return seconds * EXAMPLES_FACTOR
