"""What the response state machine (test_stateful_responses.py) knows and checks, apart from its rules.

Written from specs/notifications.md N31-N37, not from the code: the database is the state;
:func:`snapshot` reads the notifications, their responses, the timeout callbacks (dispatches of kind
``notification.timeout``) and every fact of the three; :func:`expected_answer`, :func:`expected_expiry`
and :func:`due_order` say what a step should do given the snapshot before it; :func:`problems` states
the invariants that hold after every step.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Book, Fact
from statebook.lifecycle.facts import facts_table
from statebook.outbox import dispatch_outbox
from statebook.outbox.notifications import notifications
from statebook.outbox.notifications.schema import notification_responses

KIND = "notification.timeout"
TERMINAL = frozenset({"acked", "dismissed", "timed_out"})
ANSWERS = frozenset({"acked", "dismissed"})
CALLBACK_TERMINAL = frozenset({"delivered", "dead_letter"})
DUE = frozenset({"pending", "delivering"})

SEEN: Counter[str] = Counter()
"""How often each interesting path ran; the tests print it (``pytest -s``)."""


def event(what: str) -> None:
    SEEN[what] += 1


@dataclass
class Snapshot:
    notes: dict[str, dict[str, Any]]  # notifications
    responses: dict[str, dict[str, Any]]
    callbacks: dict[str, dict[str, Any]]  # dispatches of kind notification.timeout
    facts: dict[tuple[str, str], list[Fact]]

    def of(self, entity_type: str, entity_id: str) -> list[Fact]:
        return self.facts.get((entity_type, entity_id), [])

    def callbacks_for(self, response_id: str) -> list[dict[str, Any]]:
        return [c for c in self.callbacks.values() if c["dedup_key"] == f"timeout:{response_id}"]

    def response_view(self) -> tuple[dict, int]:
        """Everything an answer that changes nothing must leave as it was."""
        return self.responses, sum(len(v) for (t, _), v in self.facts.items() if t == "notification_response")


async def snapshot(book: Book) -> Snapshot:
    f = facts_table
    async with book.read() as conn:
        notes = {r.id: dict(r._mapping) for r in (await conn.execute(sa.select(notifications))).fetchall()}
        responses = {r.id: dict(r._mapping) for r in (await conn.execute(sa.select(notification_responses))).fetchall()}
        callbacks = {r.id: dict(r._mapping) for r in (await conn.execute(
            sa.select(dispatch_outbox).where(dispatch_outbox.c.kind == KIND))).fetchall()}
        found = (await conn.execute(sa.select(f).where(f.c.entity_type.in_(
            ("notification", "notification_response", "dispatch"))).order_by(f.c.seq))).fetchall()
    facts: dict[tuple[str, str], list[Fact]] = defaultdict(list)
    for r in found:
        facts[(r.entity_type, r.entity_id)].append(Fact.from_row(r))
    return Snapshot(notes, responses, callbacks, dict(facts))


def body(callback: dict[str, Any]) -> dict[str, Any]:
    payload = callback["payload"]
    envelope = json.loads(payload) if isinstance(payload, str) else payload
    return dict(envelope.get("body") or {})


# -- what each step should do (N33, N34, N35, N36) --------------------------------------------------


def answers_for(snap: Snapshot, nid: str) -> str:
    """N34: the response that answers for a notification: its owner's for a follower."""
    row = snap.notes[nid]
    return row["obligation_owner_id"] or nid


def expected_answer(snap: Snapshot, nid: str, who: str, target: str, now: float) -> tuple[str, str | None]:
    """("recorded", response id) | ("original", response id) | ("conflict", why), per N33."""
    rid = answers_for(snap, nid)
    r = snap.responses.get(rid)
    if r is None:
        return "conflict", "no response (none expected, or not delivered yet)"
    if r["status"] in TERMINAL:
        if r["status"] == target and r["responder"] == who:
            return "original", rid
        return "conflict", f"already {r['status']} by {r['responder']}"
    if now >= r["due_at"]:
        return "conflict", "late"
    return "recorded", rid


def expected_expiry(snap: Snapshot, now: float, limit: int) -> list[str]:
    """N35: due pending responses by (due time, id), at most ``limit``."""
    due = sorted((r["due_at"], i) for i, r in snap.responses.items() if r["status"] == "pending" and r["due_at"] <= now)
    return [i for _, i in due[:limit]]


def due_order(snap: Snapshot, now: float) -> list[str]:
    """N36 / O11: due callbacks (pending, or delivering with a lapsed lease) by (due, event time, id)."""
    due = sorted((c["next_attempt_at"], c["created_at"], i) for i, c in snap.callbacks.items()
                 if c["status"] in DUE and c["next_attempt_at"] <= now)
    return [i for _, _, i in due]


def sends(facts: list[Fact]) -> int:
    """Attempts a callback used: its claims, less those released unsent (O21 gives such an attempt back)."""
    claims = sum(1 for f in facts if f.status == "delivering")
    return claims - sum(1 for f in facts if f.reason_code == "dispatch.pending.released")


# -- invariants ------------------------------------------------------------------------------------


def problems(snap: Snapshot, recorded: dict[str, tuple], calls: dict[str, list[dict]], max_attempts: int) -> list[str]:
    """The invariants after every step. ``recorded`` holds each terminal response's attribution as
    first seen (the machine adds new ones after the check); ``calls`` the callback events by notification."""
    found: list[str] = []
    # N31: a response exists exactly when a notification expecting one was delivered; its deadline
    # counts from the first delivery.
    for nid, n in snap.notes.items():
        delivered = [f for f in snap.of("notification", nid) if f.status == "delivered"]
        r = snap.responses.get(nid)
        expects = n["response_timeout"] is not None and bool(delivered)
        if r is None:
            if expects:
                found.append(f"N31: {nid[:8]} was delivered at {delivered[0].at} expecting an answer, but has no response")
            continue
        if not expects:
            found.append(f"N31: {nid[:8]} has a response ({r['status']}) but "
                         + ("expects none" if n["response_timeout"] is None else "was never delivered"))
            continue
        if r["started_at"] != delivered[0].at or r["due_at"] != r["started_at"] + n["response_timeout"]:
            found.append(f"N31: {nid[:8]} started {r['started_at']} due {r['due_at']}, first delivery at "
                         f"{delivered[0].at} + {n['response_timeout']}")
        if r["timeout_callback"] != n["timeout_callback"]:
            found.append(f"N36: {nid[:8]} response callback {r['timeout_callback']!r} != {n['timeout_callback']!r}")
    for rid, r in snap.responses.items():
        facts = snap.of("notification_response", rid)
        where = f"response {rid[:8]}"
        if rid not in snap.notes:
            found.append(f"N31: {where} has no notification")
        if not facts or facts[0].status != "pending" or facts[0].reason_code != "notification_response.pending.delivered":
            found.append(f"N31: {where} was not created pending by a delivery: {[f.reason_code for f in facts]}")
        # N32: one transition out of pending, never another after it.
        if len(facts) > 2 or (r["status"] in TERMINAL) != (len(facts) == 2):
            found.append(f"N32: {where} is {r['status']} with facts {[f.status for f in facts]}")
        if r["status"] == "pending":
            if (r["responder"], r["responded_at"]) != (None, None):
                found.append(f"N32: pending {where} has an attribution {r['responder']} {r['responded_at']}")
        elif r["status"] in ANSWERS:
            last = facts[-1]
            if r["responder"] is None or not r["started_at"] <= r["responded_at"] < r["due_at"]:
                found.append(f"N33: {where} {r['status']} by {r['responder']} at {r['responded_at']}, "
                             f"window [{r['started_at']}, {r['due_at']})")
            if f"{last.actor_type}:{last.actor_id}" != r["responder"] or last.at != r["responded_at"]:
                found.append(f"N32: {where} fact actor {last.actor_type}:{last.actor_id} at {last.at} != row")
        elif r["status"] == "timed_out":
            if r["responder"] is not None or r["responded_at"] < r["due_at"]:
                found.append(f"N35: {where} timed out at {r['responded_at']} (due {r['due_at']}) by {r['responder']}")
        # N32/N33: the first terminal attribution stands forever.
        if rid in recorded and attribution(r) != recorded[rid]:
            found.append(f"N33: {where} attribution changed from {recorded[rid]} to {attribution(r)}")
    for rid in recorded:
        if rid not in snap.responses:
            found.append(f"N33: response {rid[:8]} vanished")
    # N36: one callback per timeout that has one, carrying the timeout fact's id; bounded attempts.
    for rid, r in snap.responses.items():
        cbs = snap.callbacks_for(rid)
        wants = r["status"] == "timed_out" and r["timeout_callback"] is not None
        if len(cbs) != (1 if wants else 0):
            found.append(f"N36: response {rid[:8]} ({r['status']}, callback {r['timeout_callback']}) has "
                         f"{len(cbs)} callback dispatches")
            continue
        if not wants:
            continue
        [cb] = cbs
        timeout_fact = snap.of("notification_response", rid)[-1]
        b = body(cb)
        expect = {"event_id": timeout_fact.id, "notification_id": rid, "due_at": r["due_at"],
                  "timed_out_at": r["responded_at"]}
        if b != expect:
            found.append(f"N36: callback {cb['id'][:8]} body {b} != {expect}")
        if cb["deliver_to"] != f"callback:{r['timeout_callback']}":
            found.append(f"N36: callback {cb['id'][:8]} goes to {cb['deliver_to']}")
        first = snap.of("dispatch", cb["id"])[0]
        if (cb["created_at"], first.at, first.patch.get("next_attempt_at")) != (r["responded_at"],) * 3:
            found.append(f"N36/N39: callback {cb['id'][:8]} created {cb['created_at']} (fact {first.at}, due "
                         f"{first.patch.get('next_attempt_at')}), the timeout at {r['responded_at']}")
        n_sends = sends(snap.of("dispatch", cb["id"]))
        if cb["max_attempts"] != max_attempts or cb["attempt"] != n_sends or n_sends > cb["max_attempts"]:
            found.append(f"N36: callback {cb['id'][:8]} attempt {cb['attempt']}, {n_sends} attempts used, max "
                         f"{cb['max_attempts']} (wanted {max_attempts})")
        if cb["status"] == "dead_letter" and cb["attempt"] != cb["max_attempts"]:
            found.append(f"N36: callback {cb['id'][:8]} dead-lettered at attempt {cb['attempt']} of {cb['max_attempts']}")
        got = calls.get(rid, [])
        if len(got) > n_sends:
            found.append(f"N36: callback of {rid[:8]} ran {len(got)} times in {n_sends} attempts")
        if any(e != expect for e in got):
            found.append(f"N36: callback of {rid[:8]} saw events {got}, the timeout is {expect}")
    for cid, cb in snap.callbacks.items():
        rid = (cb["dedup_key"] or "").removeprefix("timeout:")
        if rid not in snap.responses:
            found.append(f"N36: callback {cid[:8]} ({cb['dedup_key']}) has no response")
    for nid in calls:
        if not snap.callbacks_for(nid):
            found.append(f"N36: a callback ran for {nid[:8]}, which has no callback dispatch")
    return found


def attribution(r: dict[str, Any]) -> tuple:
    return (r["status"], r["responder"], r["responded_at"], r["note"], r["started_at"], r["due_at"], r["version"])
