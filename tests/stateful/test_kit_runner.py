"""K2: the kit's ``ci`` profile shrinks a failure within a time budget and then reports the smallest failing
example found by then, as Hypothesis reports any failure; the search itself is the profile's (same examples and
steps). Issue 25 part 6: a bug found in 12 s was reported after more than 5 minutes of shrinking.

The machine here is pure Python, each step slowed down, so shrinking is slow the way a database makes it; the
orders example measures the same on a real machine (tests/test_examples_orders.py).
"""

from __future__ import annotations

import time
import unittest

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from statebook.lifecycle.testing import runner
from statebook.lifecycle.testing.runner import PROFILES, SHRINK_SECONDS, machine_settings, run_machine

STEP_SECONDS = 0.02


class Counter(RuleBasedStateMachine):
    """Fails once the total passes 40: found at once, but hundreds of slow examples to shrink."""

    examples = 0

    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        type(self).examples += 1

    @rule(n=st.integers(0, 10))
    def add(self, n: int) -> None:
        time.sleep(STEP_SECONDS)
        self.total += n

    @rule()
    def wait(self) -> None:
        time.sleep(STEP_SECONDS)

    @invariant()
    def small(self) -> None:
        assert self.total <= 40, f"total {self.total}"


def test_the_search_is_the_profiles():
    """K2: bounding the shrink changes nothing of the search: the ci and deep sizes are the documented ones."""
    assert PROFILES == {"ci": {"max_examples": 25, "stateful_step_count": 25},
                        "deep": {"max_examples": 300, "stateful_step_count": 80}}
    assert machine_settings("ci").max_examples == 25 and machine_settings("ci").stateful_step_count == 25
    assert SHRINK_SECONDS["ci"] is not None and SHRINK_SECONDS["ci"] <= 30 and SHRINK_SECONDS["deep"] is None


@pytest.mark.parametrize("derandomize", [True, False])
def test_a_failure_is_reported_when_the_budget_is_spent(monkeypatch: pytest.MonkeyPatch, derandomize: bool):
    """K2: with a 1 s budget the slow machine's failure is reported about a second after it was found — the
    smallest example found by then, printed and raised by Hypothesis, with a note saying shrinking stopped —
    derandomised (the ci profile in CI) or not."""
    from hypothesis import settings

    monkeypatch.setitem(SHRINK_SECONDS, "ci", 1.0)
    parent = settings.get_profile("ci") if derandomize else settings(derandomize=False)
    monkeypatch.setattr(runner, "machine_settings",
                        lambda profile=None: settings(parent, deadline=None, **PROFILES["ci"]))

    class Slow(Counter):
        examples = 0

    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"total \d+") as failure:
        run_machine(Slow, "ci")
    took = time.monotonic() - started
    notes = "\n".join(getattr(failure.value, "__notes__", []))
    print(f"\nreported after {took:.1f} s and {Slow.examples} examples")
    assert "shrinking stopped after 1 s" in notes, notes
    assert "state = Slow()" in notes and "state.add(n=" in notes, notes  # Hypothesis's own report of the steps
    # The bound is the rule: found within the first examples, then 1 s of shrinking and one replay (generous:
    # the shared machine may be slow); unbounded, Hypothesis shrinks this machine for minutes.
    assert took < 20, took


def test_a_failure_that_shrinks_within_the_budget_is_reported_as_hypothesis_reports_it():
    """K2: a failure cheap to shrink is shrunk completely and reported without a note."""

    class Quick(Counter):
        examples = 0

        @rule(n=st.integers(0, 10))
        def add(self, n: int) -> None:
            self.total += n

        @rule()
        def wait(self) -> None:
            pass

    with pytest.raises(AssertionError, match=r"total 4[1-9]") as failure:
        run_machine(Quick, "ci")
    notes = "\n".join(getattr(failure.value, "__notes__", []))
    assert "shrinking stopped" not in notes and "state = Quick()" in notes


def test_a_passing_machine_passes():
    """K2: no failure, no report."""

    class Fine(Counter):
        @rule(n=st.integers(0, 10))
        def add(self, n: int) -> None:
            pass

        @rule()
        def wait(self) -> None:
            pass

    run_machine(Fine, "ci")


def test_hypothesis_stopping_an_example_is_no_failure(monkeypatch: pytest.MonkeyPatch):
    """K2: Hypothesis ends an example that draws too much with an exception of its own (StopTest, in flight in
    teardown like a failure); that starts no shrink budget, and a machine that never fails passes (before: with
    the clock started, the budget ran out and the replay found nothing to run)."""
    from hypothesis import HealthCheck, settings

    monkeypatch.setitem(SHRINK_SECONDS, "ci", 0.0)
    monkeypatch.setattr(runner, "machine_settings", lambda profile=None: settings(
        deadline=None, suppress_health_check=list(HealthCheck), **PROFILES["ci"]))

    class Greedy(RuleBasedStateMachine):
        stopped = 0

        @rule(values=st.lists(st.integers(), min_size=4000, max_size=4000))  # past the choice budget in a step or two
        def take(self, values: list[int]) -> None:
            pass

        def teardown(self) -> None:
            import sys

            if sys.exc_info()[1] is not None:
                type(self).stopped += 1

    try:
        run_machine(Greedy, "ci")
    except unittest.SkipTest as skipped:  # what the replay of nothing raised
        pytest.fail(f"a machine that never fails was skipped: {skipped}")
    assert Greedy.stopped > 0  # Hypothesis did stop examples on its own
