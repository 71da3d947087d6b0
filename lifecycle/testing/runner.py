"""How a lifecycle machine runs as a test: its Hypothesis profiles, and shrinking within a time budget.

A state machine on a database costs about a second an example, and Hypothesis shrinks a failure for up
to five minutes: a bug found in twelve seconds was reported after six minutes in CI. Hypothesis has no
setting that bounds shrinking (:class:`~hypothesis.Phase` turns it on or off), so :func:`run_machine`
bounds it with public means: the run keeps its failing examples in an in-memory example database (each
one Hypothesis shrinks further replaces the last); an example that ends with an exception starts the
clock; the first example to begin after :data:`SHRINK_SECONDS` stops the run instead of starting; a
second run replays the smallest failing example from the database (no generation, no shrinking), and
Hypothesis prints and raises it as it reports any failure — with a note that shrinking was cut short.

A derandomised profile (``ci``) keeps fixed examples: the database needs ``derandomize`` off, so the run
is seeded from the machine's name instead. Without a budget (``deep``) the machine runs as one ordinary
Hypothesis test.
"""

from __future__ import annotations

import os
import sys
import time
import unittest
import zlib
from collections.abc import Callable, Iterable

from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis.database import ExampleDatabase
from hypothesis.errors import HypothesisException
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

__all__ = ["PROFILES", "SHRINK_SECONDS", "machine_settings", "register_profiles", "run_machine"]

PROFILES: dict[str, dict[str, int]] = {
    "ci": {"max_examples": 25, "stateful_step_count": 25},
    "deep": {"max_examples": 300, "stateful_step_count": 80},
}
"""Examples and steps per Hypothesis profile name; any other profile runs as ``ci``."""

SHRINK_SECONDS: dict[str, float | None] = {"ci": 30.0, "deep": None}
"""How long :func:`run_machine` shrinks a failure per profile (None: as long as Hypothesis does)."""


def profile_name(profile: str | None = None) -> str:
    """``profile``, else ``$HYPOTHESIS_PROFILE``, as one of :data:`PROFILES` (``ci`` for any other)."""
    name = profile or os.environ.get("HYPOTHESIS_PROFILE") or "ci"
    return name if name in PROFILES else "ci"


def machine_settings(profile: str | None = None) -> settings:
    """Settings for a lifecycle machine: ``profile`` (default ``$HYPOTHESIS_PROFILE``) from
    :data:`PROFILES`, no deadline (database round trips vary)."""
    chosen = PROFILES[profile_name(profile)]
    return settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=chosen["max_examples"],
                    stateful_step_count=chosen["stateful_step_count"])


def register_profiles() -> None:
    """Register the Hypothesis profiles ``ci`` and ``deep`` with the machine's sizes (no deadline), for
    ``settings.load_profile``."""
    for name in PROFILES:
        settings.register_profile(name, machine_settings(name))


class ShrinkBudgetSpent(KeyboardInterrupt):
    """Raised when the next example would start after the shrink budget. Hypothesis stops at once on an
    interruption, recording nothing of the example (any other exception would be judged as the example's
    outcome); :func:`run_machine` catches it before anything else sees it."""


class Corpus(ExampleDatabase):
    """An in-memory example database that stops recording once ``closed``: the example Hypothesis saves
    as it is stopped by :class:`ShrinkBudgetSpent` never failed."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: dict[bytes, set[bytes]] = {}
        self.closed = False

    def save(self, key: bytes, value: bytes) -> None:
        """Record ``value`` under ``key`` (unless closed)."""
        if not self.closed:
            self.entries.setdefault(key, set()).add(value)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        """The values recorded under ``key``."""
        yield from sorted(self.entries.get(key, ()))

    def delete(self, key: bytes, value: bytes) -> None:
        """Forget ``value`` under ``key``."""
        self.entries.get(key, set()).discard(value)


def run_machine(machine: Callable[[], RuleBasedStateMachine], profile: str | None = None) -> None:
    """Run ``machine`` (a state machine class) as one test under :func:`machine_settings`, shrinking a
    failure for at most ``SHRINK_SECONDS[profile]`` (see the module docstring); raises the failure."""
    name = profile_name(profile)
    chosen = machine_settings(name)
    budget = SHRINK_SECONDS[name]
    if budget is None or Phase.shrink not in chosen.phases:
        run_state_machine_as_test(machine, settings=chosen)  # type: ignore[arg-type]
        return
    corpus = Corpus()
    failures: list[tuple[float, Exception]] = []  # the first failure: when, and what

    def factory() -> RuleBasedStateMachine:
        if failures and time.monotonic() > failures[0][0] + budget:
            corpus.closed = True  # the example Hypothesis saves as it stops never ran
            raise ShrinkBudgetSpent(f"shrinking stopped after {budget:.0f} s")
        instance = machine()
        ambient = sys.exc_info()[1]
        teardown = instance.teardown

        def watched() -> None:
            # Hypothesis calls teardown in a ``finally``: the exception ending the example is in flight. Its
            # own (an exhausted example, a rejected assumption) are no failure of the machine.
            error = sys.exc_info()[1]
            failed = isinstance(error, Exception) and not isinstance(error, HypothesisException)
            if not failures and failed and error is not ambient:
                assert isinstance(error, Exception)  # what ``failed`` says
                failures.append((time.monotonic(), error))
            teardown()

        instance.teardown = watched  # type: ignore[method-assign]
        return instance

    factory.__name__ = factory.__qualname__ = getattr(machine, "__qualname__", "machine")
    if chosen.derandomize:  # the database needs derandomize off; a fixed seed keeps the examples fixed
        label = f"{getattr(machine, '__module__', '')}.{factory.__qualname__}"
        factory = seed(zlib.crc32(label.encode()))(factory)
    shared = settings(chosen, derandomize=False, database=corpus)
    try:
        run_state_machine_as_test(factory, settings=shared)  # type: ignore[arg-type]
        return
    except ShrinkBudgetSpent:
        pass
    corpus.closed = False
    failures[:] = [(float("inf"), failures[0][1])]  # no budget for the replay
    try:
        run_state_machine_as_test(factory, settings=settings(shared, phases=[Phase.reuse]))  # type: ignore[arg-type]
    except unittest.SkipTest:  # nothing to replay: keep the failure as it first happened
        pass
    except Exception as smallest:
        smallest.add_note(f"(statebook: shrinking stopped after {budget:.0f} s, the '{name}' profile's budget: "
                          "this is the smallest failing example found by then; HYPOTHESIS_PROFILE=deep shrinks "
                          "without a budget)")
        raise
    raise failures[0][1]  # not replayed (a flaky machine): the failure as it first happened
