"""How big the Hypothesis runs are, per profile (``HYPOTHESIS_PROFILE``), in one place.

``ci`` (what ``make test`` and CI run) and the everyday default share the sizes each test names.
``deep`` (``make test-deep``: nightly, or before a release) runs ten times the examples of every
property and every state machine; the machines' examples are longer too (their own module says by
how much). specs/testing.md has the table.
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
