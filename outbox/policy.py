"""The built-in ``dispatch`` lifecycle (seed ADR-0059 D5, the registry's closed edge graph)."""

from __future__ import annotations

from statebook.lifecycle import Lifecycle, edges

from .schema import DISPATCH_STATUSES, TERMINAL_STATUSES, dispatch_outbox

NOTIFY_CHANNEL = "statebook_dispatch"
"""PostgreSQL channel NOTIFYed when a dispatch is created or retried (worker wake-ups)."""

OPERATOR = "operator"

DISPATCH_REASONS = frozenset(
    {
        "dispatch.pending.enqueued",
        "dispatch.delivering.attempt",
        "dispatch.delivering.reclaimed",
        "dispatch.delivered.transport_ok",
        "dispatch.pending.transport_failed",
        "dispatch.pending.awaiting_ack",
        "dispatch.pending.operator_retry",
        "dispatch.acked.consumer",
        "dispatch.dead_letter.max_attempts",
        "dispatch.dead_letter.ack_timeout",
        "dispatch.expired.deadline",
        "dispatch.purged.operator",
        "dispatch.purged.retention",
    }
)

DISPATCH = Lifecycle(
    entity_type="dispatch",
    table=dispatch_outbox,
    statuses=DISPATCH_STATUSES,
    initial={"pending"},
    terminal=TERMINAL_STATUSES,
    edges=(
        *edges("pending", "delivering", "expired", "acked"),
        *edges("delivering", "delivering", guard="attempt"),
        *edges("delivering", "pending", "delivered", "acked", "dead_letter", "expired"),
        *edges(
            "dead_letter", "pending", actors=OPERATOR, patch=("attempt", "next_attempt_at", "last_error")
        ),
        *edges("expired", "pending", actors=OPERATOR, patch=("attempt", "next_attempt_at", "last_error")),
    ),
    patch_fields={"attempt", "next_attempt_at", "last_error", "claim_id"},
    reason_prefixes={"dispatch"},
    reasons=DISPATCH_REASONS,
    same_status="edge",
    description="A durable outbound notification: claimed, sent by a transport, retried, acknowledged.",
    notify_channel=NOTIFY_CHANNEL,
)

DUE_STATUSES = DISPATCH.active
"""The statuses a delivery scan claims from: ``pending`` (to send) and ``delivering`` (a lapsed lease),
the built-in lifecycle's non-terminal ones. Statuses an application adds are not the worker's to claim."""
