"""What the notification state machine (test_stateful_notifications.py) checks, apart from its rules.

The database is the state: :func:`snapshot` reads every notification and channel_attempt row and
every fact of both (purged ones included), and :func:`problems` states the delivery invariants of
specs/notifications.md against it. ``written_by`` maps a notification fact's id to the claim token
of the lease whose finalization the machine saw applied, so "the outcome is written only under the
current claim" is checked per fact, not only per call.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Book, Fact, Registry
from statebook.lifecycle.facts import facts_table
from statebook.lifecycle.replay import check_entity, fold
from statebook.outbox.notifications import notifications
from statebook.outbox.notifications.schema import channel_attempts
from statebook.outbox.notifications.channels import CHANNEL_NAMES, PERSISTENT_ORDER

CLAIMS = frozenset({"notification.pending.claimed", "notification.pending.reclaimed",
                    "notification.pending.rate_limit_cleared"})
SETTLED = "notification.delivered.recorded_success"
OUTCOMES = frozenset({"notification.pending.retry", "notification.delivered.channel_success",
                      "notification.failed.cycle_exhausted", "notification.failed.best_effort",
                      "notification.rate_limited.no_token", SETTLED})
MAY_HAVE_REACHED = ("started", "unknown", "success")
TERMINAL = frozenset({"delivered", "failed", "deduplicated"})

SEEN: Counter[str] = Counter()
"""How often each interesting path ran; the tests print it (``pytest -s``)."""


def event(what: str) -> None:
    SEEN[what] += 1


@dataclass
class Snapshot:
    rows: dict[str, dict[str, Any]]  # notifications
    attempts: dict[str, dict[str, Any]]  # channel_attempts
    facts: dict[tuple[str, str], list[Fact]]  # (entity_type, id) -> facts in commit order

    def notification_facts(self, nid: str) -> list[Fact]:
        return self.facts.get(("notification", nid), [])

    def observations(self, nid: str) -> list[dict[str, Any]]:
        """The notification's channel observations in the order they were first written."""
        first = {aid: self.facts[("channel_attempt", aid)][0].seq for aid in self.attempts}
        return sorted((a for a in self.attempts.values() if a["notification_id"] == nid), key=lambda a: first[a["id"]])

    def first_status(self, attempt_id: str) -> str | None:
        return self.facts[("channel_attempt", attempt_id)][0].status


async def snapshot(book: Book) -> Snapshot:
    f = facts_table
    async with book.read() as conn:
        rows = {r.id: dict(r._mapping) for r in (await conn.execute(sa.select(notifications))).fetchall()}
        attempts = {r.id: dict(r._mapping) for r in (await conn.execute(sa.select(channel_attempts))).fetchall()}
        found = (await conn.execute(sa.select(f).where(f.c.entity_type.in_(("notification", "channel_attempt")))
                                    .order_by(f.c.seq))).fetchall()
    facts: dict[tuple[str, str], list[Fact]] = defaultdict(list)
    for r in found:
        facts[(r.entity_type, r.entity_id)].append(Fact.from_row(r))
    return Snapshot(rows, attempts, dict(facts))


def states(facts: list[Fact]) -> list[tuple[dict[str, Any], Fact]]:
    """(the entity as it was right before each fact, the fact), from the second fact on."""
    out = []
    for i in range(1, len(facts)):
        out.append((fold(facts[:i]) or {}, facts[i]))
    return out


def problems(snap: Snapshot, registry: Registry, written_by: dict[str, str],
             effects: list[tuple[str, str, int]], admitted_seen: set[tuple[str, str, int]]) -> list[str]:
    found: list[str] = []
    lcs = {t: registry.get(t) for t in ("notification", "channel_attempt")}
    # L7: row == fold of facts, chain and edges, for both lifecycles.
    for (etype, eid), facts in snap.facts.items():
        row = (snap.rows if etype == "notification" else snap.attempts).get(eid)
        found += [f"L7 {x.kind}: {etype} {eid} {x.detail}" for x in check_entity(lcs[etype], eid, facts, row)]
    for eid in snap.rows.keys() - {i for t, i in snap.facts if t == "notification"}:
        found.append(f"L7: notification {eid} has a row but no facts")
    for eid in snap.attempts.keys() - {i for t, i in snap.facts if t == "channel_attempt"}:
        found.append(f"L7: channel_attempt {eid} has a row but no facts")

    for nid, row in snap.rows.items():
        facts = snap.notification_facts(nid)
        obs = snap.observations(nid)
        claims = {f.patch["claim_id"]: f for f in facts if f.reason_code in CLAIMS}
        # N5: outcomes (and claims) only under the claim current at the time.
        for before, f in states(facts):
            code = f.reason_code
            if code in CLAIMS:
                if before["status"] not in ("pending", "rate_limited"):
                    found.append(f"N5: {nid} claimed from {before['status']!r}")
                if (code == "notification.pending.reclaimed") != (before["claim_id"] is not None):
                    found.append(f"N5: {nid} {code} while the claim was {before['claim_id']!r}")
                if (code == "notification.pending.rate_limit_cleared") != (before["status"] == "rate_limited"):
                    found.append(f"N8: {nid} {code} from {before['status']!r}")
                if before["claim_id"] is not None and f.at < before["lease_until"]:
                    found.append(f"N4: {nid} reclaimed at {f.at} before its lease ended at {before['lease_until']}")
                if f.at < before["next_attempt_at"]:
                    found.append(f"N9: {nid} claimed at {f.at}, before it was due at {before['next_attempt_at']} "
                                 f"({code} from {before['status']})")
                if f.patch.get("claim_id") in (None, before["claim_id"]):
                    found.append(f"N5: {nid} claimed without a fresh token")
                found += _no_success_left_behind(snap, row, before, f, obs)
            elif code in OUTCOMES or code == "notification.failed.cycle_exhausted":
                if before["status"] != "pending" or before["claim_id"] is None:
                    found.append(f"N5: {nid} {code} written while unclaimed ({before['status']}, {before['claim_id']})")
                writer = written_by.get(f.id)
                if writer is not None and writer != before["claim_id"]:
                    found.append(f"N5: {nid} {code} written by lease {writer[:8]} under claim "
                                 f"{str(before['claim_id'])[:8]}")
                lapsed = f.patch.get("last_error") == "the lease lapsed without an outcome"  # claim's dead letter
                if lapsed and f.at < before["lease_until"]:
                    found.append(f"N2: {nid} dead-lettered by a claimant at {f.at} before the lease ended at "
                                 f"{before['lease_until']} ({f.reason_summary}; {f.actor_id})")
                if lapsed:
                    found += _no_success_left_behind(snap, row, before, f, obs)
                if code == SETTLED and f.at < before["lease_until"]:
                    found.append(f"N10a: {nid} settled from its record at {f.at}, before the lease ended at "
                                 f"{before['lease_until']}")
                if code == "notification.rate_limited.no_token":
                    if f.patch.get("cycle_attempts") != before["cycle_attempts"] - 1:
                        found.append(f"N8: {nid} rate_limited kept the claim's place in the cycle "
                                     f"({before['cycle_attempts']} -> {f.patch.get('cycle_attempts')})")
                    mine = [a for a in obs if a["claim_id"] == before["claim_id"]]
                    if not mine or any(a["status"] != "rate_limited" or a["started_at"] is not None for a in mine):
                        found.append(f"N8: {nid} rate_limited after observations "
                                     f"{[(a['channel'], a['status']) for a in mine]}")
                if code in ("notification.delivered.channel_success", SETTLED):
                    channel = f.patch.get("delivered_channel")
                    ok = [a for a in obs if a["claim_id"] == before["claim_id"] and a["channel"] == channel
                          and a["status"] == "success" and a["cycle"] == before["cycle"]
                          and snap.facts[("channel_attempt", a["id"])][-1].seq < f.seq]
                    if not ok:
                        found.append(f"N1: {nid} delivered via {channel!r} without a SUCCESS under its claim")
                    if row["mode"] == "guaranteed" and channel not in PERSISTENT_ORDER:
                        found.append(f"N1: GUARANTEED {nid} delivered via {channel!r}")
            elif f.status is not None:
                found.append(f"N5: {nid} unexpected fact {code}")
        if row["status"] == "rate_limited" and row["delivered_channel"] is not None:
            found.append(f"N8: rate_limited {nid} counts a delivery via {row['delivered_channel']}")
        if row["status"] == "delivered" and row["delivered_channel"] is None:
            found.append(f"N1: {nid} delivered without a channel")
        # N2: attempts per cycle.
        if not row["cycle_attempts"] <= row["max_cycle_attempts"]:
            found.append(f"N2: {nid} cycle_attempts {row['cycle_attempts']} > {row['max_cycle_attempts']}")
        spent: dict[int, set[int]] = defaultdict(set)
        for a in obs:
            if not (a["status"] == "rate_limited" and a["started_at"] is None):
                spent[a["cycle"]].add(a["attempt"])
        for cycle, numbers in spent.items():
            if len(numbers) > row["max_cycle_attempts"]:
                found.append(f"N2: {nid} cycle {cycle} spent attempts {sorted(numbers)}")
        budget = Counter(f.reason_code for f in facts)
        used = sum(budget[c] for c in CLAIMS) - budget["notification.rate_limited.no_token"]
        if used > row["max_cycle_attempts"]:
            found.append(f"N2: {nid} used {used} attempts of a {row['max_cycle_attempts']}-attempt cycle")
        # N1: the fallback order of every attempt.
        by_attempt: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for a in obs:
            by_attempt[a["attempt"]].append(a)
        for number, seen in by_attempt.items():
            names = [a["channel"] for a in seen]
            if len(set(names)) != len(names) or any(n not in row["channels"] for n in names):
                found.append(f"N1: {nid} attempt {number} observed {names} of {row['channels']}")
            if any(a["position"] != row["channels"].index(a["channel"]) + 1 for a in seen):
                found.append(f"N1: {nid} attempt {number} positions {[(a['channel'], a['position']) for a in seen]}")
            claim = claims.get(seen[0]["claim_id"])
            if claim is None or any(a["claim_id"] != seen[0]["claim_id"] for a in seen) \
                    or claim.patch.get("attempts") != number:
                found.append(f"N5: {nid} attempt {number} observations are not under the claim of that attempt")
            if row["mode"] != "guaranteed":
                continue
            order = [CHANNEL_NAMES.index(n) for n in names]
            if order != sorted(order):
                found.append(f"N1: {nid} attempt {number} ran {names}, out of the fallback order")
            succeeded = [i for i, a in enumerate(seen) if a["status"] == "success" and a["channel"] in PERSISTENT_ORDER]
            if succeeded and any(a["channel"] in PERSISTENT_ORDER for a in seen[succeeded[0] + 1:]):
                found.append(f"N1: {nid} attempt {number} went on after a persistent success: {names}")
        found += _risk_stays_with_the_cycle(snap, nid, obs)
    # N5: every provider effect had its started fact before it, under that notification+channel+attempt.
    started = {(a["notification_id"], a["channel"], a["attempt"]) for aid, a in snap.attempts.items()
               if snap.first_status(aid) == "started"}
    for key in effects:
        if key not in admitted_seen or key not in started:
            found.append(f"N5: provider effect {key} without a started fact before it")
    for aid, a in snap.attempts.items():
        first = snap.first_status(aid)
        if (first == "started") != (a["started_at"] is not None):
            found.append(f"N5: channel_attempt {aid} started_at {a['started_at']} but first fact {first}")
    # N10b: the record bounds the provider's receipts: at most 1 + provider_retries effects per admitted observation.
    made = Counter(effects)
    for a in snap.attempts.values():
        key = (a["notification_id"], a["channel"], a["attempt"])
        if a["started_at"] is not None and made[key] > 1 + a["provider_retries"]:
            found.append(f"N10b: {key} made {made[key]} provider effects; its observation ({a['status']}) records "
                         f"{a['provider_retries']} retries")
    return found


def _qualifies(row: dict[str, Any], channel: str) -> bool:
    return row["mode"] != "guaranteed" or channel in PERSISTENT_ORDER


def _no_success_left_behind(snap: Snapshot, row: dict[str, Any], before: dict[str, Any], f: Fact,
                            obs: list[dict[str, Any]]) -> list[str]:
    """N10a: a claim (or a lapsed last attempt's dead letter) never replaces a claim that recorded a qualifying
    success before it: that success settles the notification instead of another send."""
    if before["claim_id"] is None:
        return []
    left = [a["channel"] for a in obs if a["claim_id"] == before["claim_id"] and a["cycle"] == before["cycle"]
            and a["status"] == "success" and _qualifies(row, a["channel"])
            and snap.facts[("channel_attempt", a["id"])][-1].seq < f.seq]
    return [f"N10a: {row['id']} {f.reason_code} past the success of {left} its lapsed claim recorded"] if left else []


def _status_at(facts: list[Fact], seq: int) -> str | None:
    """An entity's status right before fact ``seq`` was written (None: it did not exist yet)."""
    status = None
    for x in facts:
        if x.seq >= seq:
            break
        status = x.status
    return status


def _risk_stays_with_the_cycle(snap: Snapshot, nid: str, obs: list[dict[str, Any]]) -> list[str]:
    """N10b: every send admitted after an earlier attempt of its cycle may have reached the person (an
    ``unknown`` or a ``success`` on record before the admission) carries duplicate_risk."""
    found = []
    for a in obs:
        if a["started_at"] is None or a["duplicate_risk"]:
            continue
        admitted = snap.facts[("channel_attempt", a["id"])][0].seq
        earlier = [b for b in obs if b["cycle"] == a["cycle"] and b["attempt"] < a["attempt"]
                   and _status_at(snap.facts[("channel_attempt", b["id"])], admitted) in MAY_HAVE_REACHED]
        if earlier:
            found.append(f"N10b: {nid} attempt {a['attempt']} {a['channel']} was admitted without duplicate_risk after "
                         f"{[(b['attempt'], b['channel'], b['status']) for b in earlier]} of its cycle")
    return found
