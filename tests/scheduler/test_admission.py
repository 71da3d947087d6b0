"""``admission.admit``, the one implementation of S5's gates, on plain rows and inputs (no database).

The tick calls it with its set of due schedules, the single-schedule paths (manual fire, a missed
fire's recovery run, a github event) with a set of one; these tests pin the order, the options and
how slots go to a set.
"""

from __future__ import annotations

from typing import Any

from statebook.scheduler.admission import DUE, ON_DEMAND, GateInputs, Slots, admit

NOW = 10_000.0
THRESHOLD = {"metric": "failed_runs", "op": "gte", "value": 1, "window_minutes": 5}


def row(sid: str, **over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"id": sid, "overlap_policy": "skip", "threshold_config": None, "last_alert_at": None,
                            "budget_usd": None, "budget_tokens": None, "max_runs": None}
    return {**base, **over}


def everything_refuses(sid: str = "s") -> tuple[dict[str, Any], GateInputs]:
    """A schedule every gate would refuse: threshold within bounds, running, over budget, max_runs used."""
    s = row(sid, threshold_config=THRESHOLD, budget_usd=1.0, max_runs=1)
    return s, GateInputs(metrics={sid: 0.0}, running={sid}, spent={sid: (2.0, 0)}, counted={sid: 1})


def gates_of(due: list[dict[str, Any]], inputs: GateInputs, slots: Slots, gates: Any = DUE) -> list[str]:
    return [v.gate for v in admit(due, inputs, slots, now=NOW, gates=gates)]


def test_the_earliest_gate_in_s5_order_decides():
    """S5: threshold → overlap → budget → max_runs → slot; peel the refusals off one at a time."""
    s, inputs = everything_refuses()
    slots = Slots(0)
    assert gates_of([s], inputs, slots) == ["threshold_ok"]
    inputs.metrics["s"] = 5.0
    assert gates_of([{**s, "last_alert_at": NOW - 60}], inputs, slots) == ["threshold_cooldown"]
    (verdict,) = admit([s], inputs, slots, now=NOW)
    assert (verdict.gate, verdict.alert) == ("overlap", {"metric": "failed_runs", "value": 5.0, "threshold": 1})
    inputs.running.clear()
    assert gates_of([s], inputs, slots) == ["budget"]
    inputs.spent["s"] = (0.5, 0)
    assert gates_of([s], inputs, slots) == ["max_runs"]
    inputs.counted["s"] = 0
    assert gates_of([s], inputs, slots) == ["capacity"]
    (fire,) = admit([s], inputs, Slots(1), now=NOW)
    assert fire.gate == "fire" and fire.handle is not None and fire.alert is not None


def test_on_demand_skips_threshold_and_overlap_only():
    """S5: a manual fire (and a recovery run) checks budget, max_runs and the slot, in that order."""
    s, inputs = everything_refuses()
    assert gates_of([s], inputs, Slots(1), ON_DEMAND) == ["budget"]
    inputs.spent["s"] = (0.0, 0)
    assert gates_of([s], inputs, Slots(1), ON_DEMAND) == ["max_runs"]
    inputs.counted["s"] = 0
    assert gates_of([s], inputs, Slots(0), ON_DEMAND) == ["capacity"]
    (fire,) = admit([s], inputs, Slots(1), now=NOW, gates=ON_DEMAND)
    assert fire.gate == "fire" and fire.alert is None


def test_a_set_gives_the_free_slots_to_the_earliest_and_a_refusal_takes_none():
    """S5: in due order, each fire takes a slot; a schedule refused by an earlier gate takes none."""
    slots = Slots(2)
    due = [row("a"), row("b", max_runs=1), row("c"), row("d")]
    inputs = GateInputs(counted={"b": 1})
    verdicts = admit(due, inputs, slots, now=NOW)
    assert [v.gate for v in verdicts] == ["fire", "max_runs", "fire", "capacity"]
    assert slots.used == 2
    for v in verdicts:
        if v.handle is not None:
            v.handle.release()
    assert slots.used == 0


def test_budget_in_tokens_and_overlap_allow():
    """S5: a token budget refuses like a cost budget; overlap ``allow`` is never refused for a running run."""
    s = row("t", overlap_policy="allow", budget_tokens=100)
    inputs = GateInputs(running={"t"}, spent={"t": (0.0, 100)})
    (verdict,) = admit([s], inputs, Slots(1), now=NOW)
    assert (verdict.gate, verdict.summary) == ("budget", "spent 100 of a 100-token budget")
