"""A reference model of notification ownership, for test_stateful_ownership.py.

Plain Python, written from the rules of issue 13 and specs/notifications.md N13-N29 — not from
``outbox/notifications``: it knows requests, obligations, owners, followers, successors, claims and
windows, and nothing of rows, locks or facts. The machine drives the real book and this model side by
side and compares them after every step.

The rules it encodes, each where it is applied:

- idempotency (N13): a scope's first request is the one; the same content again returns it, other
  content is a conflict; nothing is written either way (:meth:`Model.expect_intake`);
- an arrival (N15-N19, N21, N23) owns a free obligation, follows a live owner (also after the window:
  N16), is satisfied at once inside a delivered owner's window (N18), and owns again after a failure
  (N19) or after a delivered window expired (N21) (:meth:`Model.accept`);
- an owner's success satisfies its followers at once (N18); its terminal failure elects the oldest
  follower (created_at, then id: N20) with a higher generation, relinks the others, keeps the window
  and records the successor, or releases the obligation when nobody follows (:meth:`Model.attempt`);
- a replay (N25-N28) is refused for the first reason that applies, in the order of N27, and otherwise
  takes the obligation with a new generation and window and covers the failed descendants down the
  successor chain (:meth:`Model.replay_block`, :meth:`Model.replay`);
- a resolve (N29) takes an unresolved dead letter out of the view (:meth:`Model.resolve`);
- retention (N14, N30) removes settled notifications past the cutoff and the horizon unless something
  still relies on them, and frees their idempotency keys; claims stay
  (:meth:`Model.retention`, :meth:`Model.forget`).

Cycles (N2) as far as ownership needs them: a GUARANTEED owner has 3 attempts per cycle, backoff 1 s
then 2 s, then a dead letter; a BEST_EFFORT one fails after its first failed attempt, without one.
Rate limits (N8) as far as ownership needs them: while the email bucket is held empty an attempt is
``rate_limited`` — still live, its place in the cycle given back, due when the next token comes — so an
owner may wait there, and a replay of its failed former owner is ``owner_pending`` all the same (N27).
A window ends at ``window_until``: at that instant it has expired (``now >= window_until``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

CYCLE_ATTEMPTS = 3
LIVE = ("pending", "rate_limited")
BUCKET_RATE = 1000.0
"""The email bucket's refill rate and capacity in the ownership machine."""

Obligation = tuple[str, str, str]  # (recipient, obligation_key, mode)


@dataclass(frozen=True)
class Request:
    """One intake's arguments. ``content`` is everything the idempotency hash binds (N13): all but the key."""

    recipient: str
    text: str
    mode: str
    idempotency_key: str | None
    obligation_key: str | None
    window: float | None

    @property
    def content(self) -> tuple:
        return (self.recipient, self.text, self.mode, self.obligation_key, self.window)

    @property
    def obligation(self) -> Obligation | None:
        return None if self.obligation_key is None else (self.recipient, self.obligation_key, self.mode)


@dataclass
class Note:
    """A notification as the rules see it."""

    id: str
    request: Request
    created_at: float
    status: str = "pending"
    owner: str | None = None  # the owner it follows, or that satisfied it (None: it owns, or has no key)
    generation: int = 0
    successor: str | None = None
    cycle: int = 1
    attempts: int = 0
    cycle_attempts: int = 0
    dead_letter: bool = False
    due: float | None = None  # None: not work (a follower, or terminal)
    resolved: bool = False
    replayed_in: str | None = None

    @property
    def order(self) -> tuple[float, str]:
        return (self.created_at, self.id)

    @property
    def owns(self) -> bool:
        """A live owner of an obligation: the notification that is delivering it."""
        return self.request.obligation is not None and self.status in LIVE and self.owner is None


@dataclass
class Claim:
    owner: str
    generation: int
    status: Literal["owned", "satisfied", "released"]
    window_until: float


@dataclass(frozen=True)
class Expect:
    """What an intake must do: ``existing`` (return ``id``), ``conflict`` (with ``id``), or ``new`` —
    created as ``role`` (owner, follower, satisfied), linked to ``owner`` at ``generation``."""

    kind: Literal["existing", "conflict", "new"]
    id: str | None = None
    role: str | None = None
    owner: str | None = None
    generation: int = 0


@dataclass
class Model:
    notes: dict[str, Note] = field(default_factory=dict)
    claims: dict[Obligation, Claim] = field(default_factory=dict)
    scopes: dict[str, str] = field(default_factory=dict)  # idempotency key -> the id it accepted
    elections: int = 0  # how many successors were elected (the machine reports it)
    bucket_held: float | None = None  # the email bucket holds no token up to this instant (None: no bucket)
    limited: int = 0  # how many attempts found no token (the machine reports it)

    # -- the email channel's rate-limit bucket (N8, N42) -------------------------------------------

    def hold(self, now: float, seconds: float) -> None:
        """The bucket is emptied so that its next token comes ``seconds`` from ``now`` (a shorter hold never
        shortens a longer one). Its rate (:data:`BUCKET_RATE` tokens a second, as many at most) refills far
        more than a pass can draw within a second, and the machine's clock moves in whole seconds while a
        hold is a half: an attempt finds a token exactly when the hold has passed."""
        until = now + seconds - 1.0 / BUCKET_RATE  # the refill starts one token's time before
        self.bucket_held = until if self.bucket_held is None else max(self.bucket_held, until)

    # -- intake ------------------------------------------------------------------------------------

    def expect_intake(self, req: Request, now: float) -> Expect:
        if req.idempotency_key is not None and req.idempotency_key in self.scopes:
            nid = self.scopes[req.idempotency_key]
            same = self.notes[nid].request.content == req.content
            return Expect("existing" if same else "conflict", nid)
        ob = req.obligation
        if ob is None:
            return Expect("new", role="plain")
        claim = self.claims.get(ob)
        if claim is None:
            return Expect("new", role="owner", generation=1)
        if claim.status == "owned":  # N16: whatever the window says
            return Expect("new", role="follower", owner=claim.owner, generation=claim.generation)
        if claim.status == "satisfied" and now < claim.window_until:
            return Expect("new", role="satisfied", owner=claim.owner, generation=claim.generation)
        return Expect("new", role="owner", generation=claim.generation + 1)  # N19, N21

    def accept(self, req: Request, nid: str, now: float) -> Expect:
        """Apply an intake the book created as ``nid``; returns what the model expected of it."""
        want = self.expect_intake(req, now)
        assert want.kind == "new", f"the book created {nid} for {req}, the model expected {want}"
        note = Note(nid, req, now, generation=want.generation)
        if want.role in ("plain", "owner"):
            note.due = now
        if want.role == "owner":
            assert req.obligation is not None and req.window is not None
            self.claims[req.obligation] = Claim(nid, want.generation, "owned", now + req.window)
        elif want.role == "follower":
            note.owner = want.owner
        elif want.role == "satisfied":
            note.owner, note.status = want.owner, "deduplicated"
        self.notes[nid] = note
        if req.idempotency_key is not None:
            self.scopes[req.idempotency_key] = nid
        return want

    def obligation_owner(self, nid: str) -> str:
        """What reads call the canonical owner (N24): the owner followed, or the notification itself."""
        return self.notes[nid].owner or nid

    # -- delivery ----------------------------------------------------------------------------------

    def due(self, now: float) -> list[str]:
        return sorted(n.id for n in self.notes.values()
                      if n.status in LIVE and n.due is not None and n.due <= now)

    def deliver(self, now: float, step_of) -> list[str]:  # noqa: ANN001
        """Passes at ``now`` until nothing is due (a promoted successor is due at once); returns the
        notifications attempted, in the order the model took them."""
        took = []
        while due := self.due(now):
            for nid in due:
                took.append(nid)
                self.attempt(nid, step_of(nid), now)
        return took

    def attempt(self, nid: str, step: str, now: float) -> None:
        n = self.notes[nid]
        assert n.status in LIVE and n.owner is None, f"{nid} is not work: {n}"
        n.attempts += 1
        if self.bucket_held is not None and now <= self.bucket_held:
            # N8: no token: rate_limited, its place in the cycle given back, due when the token comes.
            n.status, n.due = "rate_limited", now + (max(0.0, self.bucket_held - now) + 1.0 / BUCKET_RATE)
            self.limited += 1
            return
        n.status = "pending"
        n.cycle_attempts += 1
        if step == "success":
            n.status, n.due = "delivered", None
            self._delivered(n)
            return
        if n.request.mode == "guaranteed" and n.cycle_attempts < CYCLE_ATTEMPTS:
            n.due = now + 2.0 ** (n.cycle_attempts - 1)
            return
        n.status, n.due = "failed", None
        n.dead_letter = n.request.mode == "guaranteed"
        self._failed(n, now)

    def followers(self, owner: str) -> list[Note]:
        return sorted((f for f in self.notes.values() if f.owner == owner and f.status == "pending"),
                      key=lambda f: f.order)

    def _delivered(self, n: Note) -> None:
        ob = n.request.obligation
        if ob is None:
            return
        claim = self.claims[ob]
        assert claim.owner == n.id and claim.status == "owned", (n, claim)
        claim.status = "satisfied"  # the window is the one the owner acquired (or inherited)
        for f in self.followers(n.id):
            f.status = "deduplicated"

    def _failed(self, n: Note, now: float) -> None:
        ob = n.request.obligation
        if ob is None:
            return
        claim = self.claims[ob]
        assert claim.owner == n.id and claim.status == "owned", (n, claim)
        followers = self.followers(n.id)
        if not followers:
            claim.status = "released"  # N19: nothing is suppressed by a failure
            return
        successor, rest = followers[0], followers[1:]  # N20: the oldest
        generation = claim.generation + 1
        successor.owner, successor.generation, successor.due = None, generation, now
        for f in rest:
            f.owner, f.generation = successor.id, generation
        claim.owner, claim.generation = successor.id, generation  # the window is kept
        n.successor = successor.id
        self.elections += 1

    # -- recovery ----------------------------------------------------------------------------------

    def replay_block(self, nid: str, now: float) -> tuple[str, str | None] | None:
        """Why ``nid`` cannot be replayed now (reason, blocked_by), in the order of N27; None: it can."""
        n = self.notes[nid]
        if n.status != "failed":
            return ("not_failed", None)
        if n.resolved:
            return ("resolved", None)
        if n.replayed_in is not None:
            return ("covered_by_replay", n.replayed_in)
        link, seen = n.successor, {nid}
        while link is not None:
            if link in seen or link not in self.notes:
                return ("successor_lineage_unresolved", link)
            seen.add(link)
            s = self.notes[link]
            if s.status in LIVE:
                return ("successor_pending", link)
            if s.status == "delivered":
                return ("successor_delivered", link)
            if s.status != "failed":
                return ("successor_lineage_unresolved", link)
            link = s.successor
        ob = n.request.obligation
        claim = None if ob is None else self.claims.get(ob)
        if claim is not None and claim.owner != nid:
            if claim.status == "owned":
                return ("owner_pending", claim.owner)
            if claim.status == "satisfied" and now < claim.window_until:
                return ("owner_delivered_in_window", claim.owner)
        return None

    def replay(self, nid: str, now: float) -> tuple[str, ...]:
        """Apply an accepted replay; the failed descendants it covers, down the successor chain."""
        assert self.replay_block(nid, now) is None
        n = self.notes[nid]
        n.status, n.cycle, n.cycle_attempts, n.dead_letter, n.due = "pending", n.cycle + 1, 0, False, now
        ob = n.request.obligation
        if ob is not None:
            claim = self.claims[ob]
            assert n.request.window is not None
            claim.owner, claim.generation, claim.status = nid, claim.generation + 1, "owned"
            claim.window_until = now + n.request.window  # N28: a NEW window
            n.generation = claim.generation
        covered = []
        link = n.successor
        while link is not None:
            s = self.notes[link]
            if s.status == "failed" and not s.resolved and s.replayed_in is None:
                s.replayed_in, s.dead_letter = nid, False
                covered.append(s.id)
            link = s.successor
        return tuple(covered)

    def can_resolve(self, nid: str) -> bool:
        n = self.notes[nid]
        return n.status == "failed" and n.dead_letter and not n.resolved

    def resolve(self, nid: str) -> None:
        assert self.can_resolve(nid)
        n = self.notes[nid]
        n.resolved, n.dead_letter = True, False

    def dead_letters(self) -> list[str]:
        return sorted(n.id for n in self.notes.values() if n.status == "failed" and n.dead_letter)

    def failures(self) -> list[str]:
        return [n.id for n in self.notes.values() if n.status == "failed"]

    # -- what the book must show -------------------------------------------------------------------

    def row(self, nid: str) -> dict:
        """The columns of ``nid``'s row the rules decide."""
        n = self.notes[nid]
        return {"status": n.status, "obligation_owner_id": n.owner, "generation": n.generation,
                "dedup_successor_id": n.successor, "cycle": n.cycle, "attempts": n.attempts,
                "cycle_attempts": n.cycle_attempts, "dead_letter": int(n.dead_letter),
                "next_attempt_at": n.due, "resolved": n.resolved, "replayed_in": n.replayed_in}

    def claim_row(self, ob: Obligation) -> dict:
        c = self.claims[ob]
        return {"status": c.status, "owner_id": c.owner, "generation": c.generation, "window_until": c.window_until}


    # -- retention (N14, N30) ---------------------------------------------------------------------

    def retention(self, *, before: float, edge: float, now: float, updated: dict[str, float]
                  ) -> tuple[set[str], set[Obligation]]:
        """What a run with cutoff ``before`` and horizon edge ``edge`` removes: the notifications, then the
        claims. A notification goes when it is settled (delivered, deduplicated, or failed without a
        pending dead letter), changed before the cutoff and created before the edge, owns no claim and no
        satisfied claim whose window is still open, hands its obligation to no unsettled successor or
        replay, and no notification that stays names it as its owner or its replay (to a fixpoint: a
        linker that goes frees its target). ``updated`` is each row's last change (the book's, read back)."""
        def settled(n: Note) -> bool:
            return n.status in ("delivered", "deduplicated") or (n.status == "failed" and not n.dead_letter)

        def holds_claim(nid: str) -> bool:
            return any(c.owner == nid and (c.status == "owned" or (c.status == "satisfied" and now < c.window_until))
                       for c in self.claims.values())

        def live(nid: str | None) -> bool:
            return nid is not None and nid in self.notes and self.notes[nid].status in LIVE

        going = {nid for nid, n in self.notes.items()
                 if settled(n) and updated[nid] < before and n.created_at < edge and not holds_claim(nid)
                 and not live(n.successor) and not live(n.replayed_in)}
        changed = True
        while changed:
            kept = {nid for nid in self.notes if nid not in going}
            relied = {t for m in kept for t in (self.notes[m].owner, self.notes[m].replayed_in) if t is not None}
            changed = bool(going & relied)
            going -= relied
        claims: set[Obligation] = set()  # claims stay: a claim's id is its obligation's, never reused
        return going, claims

    def forget(self, notes: set[str], claims: set[Obligation]) -> None:
        """Apply a retention run: the notifications and claims are gone, their idempotency keys free."""
        for nid in notes:
            del self.notes[nid]
        for ob in claims:
            del self.claims[ob]
        self.scopes = {key: nid for key, nid in self.scopes.items() if nid not in notes}
