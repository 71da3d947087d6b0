"""The candidate and lease records a scan and a claim build for every delivery (statebook.outbox.core.lease).

The dispatch scan and claim build them with ``lifecycle.head.filled``, which skips the frozen dataclass's ``__init__``;
what they build must be the record the constructor would have built."""

from __future__ import annotations

import dataclasses

import pytest

from statebook.lifecycle import Actor, Head
from statebook.lifecycle.head import filled
from statebook.outbox.dispatch.attempts import Candidate, Lease, claim_command, with_head

ROW = {"id": "d1", "status": "pending", "version": 1, "last_fact_id": "f1", "chain_hash": "h1", "attempt": 0,
       "next_attempt_at": 10.0, "expires_at": None, "max_attempts": 3, "ack_required": 0, "kind": "k",
       "deliver_to": "to", "payload": '{"ack_token":null,"attempt":0}', "claim_id": None}


def test_a_filled_record_is_the_record_its_constructor_makes():
    fields = {f.name: f"v{i}" for i, f in enumerate(dataclasses.fields(Lease))}
    fast, slow = filled(Lease, **fields), Lease(**fields)
    assert fast == slow and repr(fast) == repr(slow) and hash(fast) == hash(slow)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.attempt = 2  # type: ignore[misc]


def test_the_scan_and_the_claim_build_every_field_of_their_records():
    candidate, head = with_head(ROW)
    assert candidate == Candidate(dispatch_id="d1", status="pending", attempt=0, next_attempt_at=10.0, expires_at=None,
                                  max_attempts=3, ack_required=False, kind="k", deliver_to="to",
                                  payload=ROW["payload"], head=head)
    assert head == Head("pending", 1, "f1", "h1", {"attempt": 0, "next_attempt_at": 10.0, "claim_id": None})
    claimed = claim_command(candidate, 11.0, Actor("system", "test"), timeout=5.0)
    assert claimed is not None
    command, lease = claimed
    names = {f.name for f in dataclasses.fields(Lease)}
    assert set(vars(lease)) == names, "the claim's lease must set every field"
    assert lease == Lease(**{name: getattr(lease, name) for name in names})
    assert (lease.attempt, lease.head, lease.timeout) == (1, None, 5.0)
    assert command.patch["claim_id"] == lease.claim_id
