"""Notifications and what hangs off them, as the public reads return them (specs/notifications.md).

:class:`Notification` (``get_notification``, ``list_notifications``, ``resolve_notification``),
:class:`DeadLetter` (``list_dead_letters``), :class:`ChannelAttempt` (``notification_attempts``),
:class:`NotificationResponse` (``get_response``, ``ack_notification``, ``dismiss_notification``), and the
dispatches an answer or a timeout enqueues: :class:`FollowUp`, :class:`TimeoutCallback`.
"""

from __future__ import annotations

from typing import Any, Self

from statebook.outbox.record import Record, Time


class Notification(Record):
    """One notification with its canonical obligation's answer (N24, N34): ``obligation_owner_id`` is
    itself when it owns its obligation (or has none); a follower's ``effective_ack_status`` is its owner's,
    with ``ack_inherited``."""

    id: str
    recipient: str
    content: Any
    mode: str
    channels: list[str]
    cycle: int
    attempts: int
    cycle_attempts: int
    max_cycle_attempts: int
    dead_letter: bool
    next_attempt_at: Time | None = None
    claim_id: str | None = None
    lease_until: Time | None = None
    delivered_channel: str | None = None
    last_error: str | None = None
    created_at: Time
    principal: str
    source: str
    idempotency_key: str | None = None
    content_hash: str
    obligation_key: str | None = None
    obligation_window: float | None = None
    dedup_claim_id: str | None = None
    obligation_owner_id: str
    generation: int
    dedup_successor_id: str | None = None
    resolved_at: Time | None = None
    resolved_by: str | None = None
    resolution: str | None = None
    replayed_in: str | None = None
    response_timeout: float | None = None
    timeout_callback: str | None = None
    status: str
    version: int
    updated_at: Time
    status_reason_code: str
    status_reason_summary: str
    effective_ack_status: str | None = None
    ack_inherited: bool = False

    @classmethod
    def answered(cls, row: Any, answer: str | None) -> Self:
        """The notification of ``row`` with ``answer``, the status of its canonical obligation's response."""
        values = dict(row._mapping) if hasattr(row, "_mapping") else dict(row)
        owner = values.get("obligation_owner_id") or values["id"]
        # Stored as dedup_key/dedup_window; the Python surface says obligation (specs/glossary.md).
        values.setdefault("obligation_key", values.pop("dedup_key", None))
        values.setdefault("obligation_window", values.pop("dedup_window", None))
        values.update(obligation_owner_id=owner, effective_ack_status=answer,
                      ack_inherited=answer is not None and owner != values["id"])
        return cls.from_row(values)


class DeadLetter(Notification):
    """A dead letter (N26) with what blocks its replay now: both None when a replay would be accepted."""

    replay_blocked_by: str | None = None
    replay_block_reason: str | None = None


class ChannelAttempt(Record):
    """One channel observation of a notification (N7-N10): which channel, in which cycle and attempt, how
    it ended, and whether the provider may have delivered twice."""

    id: str
    notification_id: str
    cycle: int
    attempt: int
    channel: str
    position: int
    claim_id: str
    lease_until: Time
    provider_retries: int
    duplicate_risk: bool
    detail: str | None = None
    made_at: Time
    started_at: Time | None = None
    ended_at: Time | None = None
    status: str
    version: int
    updated_at: Time
    status_reason_code: str
    status_reason_summary: str


class NotificationResponse(Record):
    """The answer a notification's obligation waits for (N31-N39), as an operator or host sees it."""

    id: str
    status: str
    started_at: Time
    due_at: Time
    timeout_callback: str | None = None
    responder: str | None = None
    responded_at: Time | None = None
    note: str | None = None
    version: int


class FollowUp(Record):
    """A provider follow-up of an answer (N45): the dispatch that tells an incident the human answered."""

    id: str
    status: str
    deliver_to: str
    dedup_key: str | None = None
    attempt: int
    last_error: str | None = None


class TimeoutCallback(Record):
    """The host callback a response timeout enqueued (N38), as a dispatch: where it stands."""

    id: str
    status: str
    deliver_to: str
    attempt: int
    max_attempts: int
    next_attempt_at: Time
    last_error: str | None = None
    created_at: Time
