"""The built-in ``dispatch`` lifecycle (specs/outbox.md, specs/dispatch.md: the closed edge graph)."""

from __future__ import annotations

import dataclasses

from statebook.lifecycle import Lifecycle, edges

from .schema import DISPATCH_STATUSES, TERMINAL_STATUSES, dispatch_outbox

NOTIFY_CHANNEL = "statebook_dispatch"
"""PostgreSQL channel NOTIFYed when a dispatch is created or retried (worker wake-ups)."""

OPERATOR = "operator"

DISPATCH_V1_REASONS = frozenset(
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
"""The reason codes of the first declaration (:data:`DISPATCH_V1`)."""

DISPATCH_V2_REASONS = DISPATCH_V1_REASONS | {
    "dispatch.pending.released",  # a lease skipped before its send gives its attempt back (O21)
}
"""The reason codes of the second declaration (:data:`DISPATCH_V2`)."""

DISPATCH_REASONS = DISPATCH_V2_REASONS | {
    "dispatch.pending.operator_expedited",  # an operator makes a pending dispatch due now (O23)
}

DISPATCH_V1 = Lifecycle(
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
    reasons=DISPATCH_V1_REASONS,
    same_status="edge",
    description="A durable outbound notification: claimed, sent by a transport, retried, acknowledged.",
    notify_channel=NOTIFY_CHANNEL,
)
"""The dispatch policy before ``dispatch.pending.released`` (fingerprint ``866724ec4c6fc103``), under
which databases written until then hold their facts; :data:`DISPATCH` accepts them (specs/lifecycle.md
L12c). Frozen: a later change to the built-in policy adds a declaration, it never edits this one."""

DISPATCH_V2 = dataclasses.replace(DISPATCH_V1, reasons=DISPATCH_V2_REASONS, accepts=(DISPATCH_V1,))
""":data:`DISPATCH_V1` plus the release reason (O21), accepting the facts written under it (fingerprint
``e19234f507ba628f``): the policy databases written until the operator's expedite hold their facts under.
Frozen, as :data:`DISPATCH_V1` is."""

DISPATCH = dataclasses.replace(
    DISPATCH_V2,
    # An operator makes a pending dispatch due now (O23): the due time alone changes, compared-and-set.
    edges=(*DISPATCH_V2.edges,
           *edges("pending", "pending", actors=OPERATOR, patch="next_attempt_at", guard="next_attempt_at")),
    reasons=DISPATCH_REASONS,
    accepts=(DISPATCH_V2,),
)
"""The built-in ``dispatch`` lifecycle: :data:`DISPATCH_V2` plus the operator's ``pending -> pending``
expedite (O23), accepting the facts written under :data:`DISPATCH_V2` and :data:`DISPATCH_V1`."""

DUE_STATUSES = DISPATCH.active
"""The statuses a delivery scan claims from: ``pending`` (to send) and ``delivering`` (a lapsed lease),
the built-in lifecycle's non-terminal ones. Statuses an application adds are not the worker's to claim."""
