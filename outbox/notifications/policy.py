"""The notifications' lifecycles: ``notification``, ``channel_attempt`` and ``rate_bucket`` (specs/notifications.md).

A ``notification`` is an obligation to reach a recipient through its selected channels. Its
statuses are the seed's delivery states; ``rate_limited`` is not terminal (it is due again when a
bucket refills) and never counts as delivered. Each claim is a ``pending -> pending`` transition that
writes a fresh fencing token (``claim_id``) and the lease's end; every outcome is fenced by it.

A ``channel_attempt`` is one channel observation: created ``started`` when the provider admits the
send (``channel_attempt.started.admitted``, the seed's CHANNEL_ATTEMPT_STARTED), then moved to its one
result (``channel_attempt.<outcome>.observed``, CHANNEL_ATTEMPT_RESULT); an observation with no admission (not started,
or no rate-limit token) is created in its result directly. Results are terminal: a late completion
never rewrites one.

A ``rate_bucket`` is a token bucket per (channel, scope) in the database, so every worker on every
host draws from the same one; each draw is a guarded transition in the transaction that records the
attempt it pays for.
"""

from __future__ import annotations

import dataclasses

from statebook.lifecycle import Lifecycle, edges

from .schema import channel_attempts, dedup_claims, notification_responses, notifications, rate_buckets

NOTIFY_CHANNEL = "statebook_notification"
"""PostgreSQL channel NOTIFYed when a notification is accepted (worker wake-ups)."""

OPERATOR = "operator"

NOTIFICATION_STATUSES = ("pending", "delivered", "failed", "deduplicated", "rate_limited")
NOTIFICATION_TERMINAL = frozenset({"delivered", "failed", "deduplicated"})

NOTIFICATION_REASONS = frozenset({
    "notification.pending.accepted",          # intake
    "notification.pending.claimed",           # a worker's claim: a fresh fencing token and lease
    "notification.pending.reclaimed",         # a claim of a lapsed lease
    "notification.pending.retry",             # the attempt failed; backoff within the cycle
    "notification.pending.released",          # a claim given back without using the cycle's budget
    "notification.delivered.channel_success",  # a qualifying channel succeeded
    "notification.failed.cycle_exhausted",    # GUARANTEED: the cycle's attempts are used up (dead letter)
    "notification.failed.best_effort",        # BEST_EFFORT: no channel succeeded (no dead letter)
    "notification.rate_limited.no_token",     # no selected channel had a token; due when one refills
    "notification.deduplicated.owner_delivered",  # a follower satisfied by its owner's delivery (part 2)
    "notification.pending.following",         # intake: a live owner holds the obligation (part 2)
    "notification.deduplicated.window",       # intake: a delivered owner's window covers it (part 2)
    "notification.pending.promoted",          # elected successor of a failed owner (part 2)
    "notification.pending.relinked",          # a follower handed to its owner's successor (part 2)
    "notification.pending.replayed",          # an operator replayed a failure: a new cycle (part 2)
    "notification.failed.resolved",           # an operator resolved a dead letter (part 2)
    "notification.failed.replay_covered",     # a failed descendant taken over by a replayed cycle (part 2)
    "notification.pending.rate_limit_cleared",  # a claim of a rate-limited notification
    "notification.purged.operator",
    "notification.purged.retention",
})

NOTIFICATION_PATCH = frozenset({
    "cycle", "attempts", "cycle_attempts", "dead_letter", "next_attempt_at", "claim_id", "lease_until",
    "delivered_channel", "last_error", "obligation_owner_id", "generation", "dedup_successor_id",
    "resolved_at", "resolved_by", "resolution", "replayed_in",
})

NOTIFICATION_V1 = Lifecycle(
    entity_type="notification",
    table=notifications,
    statuses=NOTIFICATION_STATUSES,
    initial={"pending", "deduplicated"},
    terminal=NOTIFICATION_TERMINAL,
    edges=(
        *edges("pending", "pending", "delivered", "failed", "rate_limited", "deduplicated"),
        *edges("rate_limited", "pending"),
        # Recovery of a failure is an operator's: replay (a new cycle), resolve, or a replay covering it.
        *edges("failed", "pending", "failed", actors=OPERATOR),
    ),
    patch_fields=NOTIFICATION_PATCH,
    reason_prefixes={"notification"},
    reasons=NOTIFICATION_REASONS,
    same_status="edge",
    description="An obligation to reach a recipient through its channels: claimed under a lease, attempted "
                "channel by channel, delivered, failed (dead-lettered) or rate-limited.",
    notify_channel=NOTIFY_CHANNEL,
    accepts=(),
)
"""The notification policy before a recorded success could settle a notification (issue 25), under which
databases written until then hold their facts; :data:`NOTIFICATION` accepts them (specs/lifecycle.md
L12c). Frozen: a later change adds a declaration, it never edits this one."""

NOTIFICATION = dataclasses.replace(NOTIFICATION_V1, reasons=NOTIFICATION_REASONS | {
    "notification.delivered.recorded_success",  # the next claim settled it from its lapsed claim's success (N10a)
}, accepts=(NOTIFICATION_V1,))
"""The built-in ``notification`` lifecycle: :data:`NOTIFICATION_V1` and the settlement from a recorded
success, accepting the facts written under :data:`NOTIFICATION_V1`."""

ATTEMPT_STATUSES = ("started", "success", "rejected", "unknown", "not_started", "rate_limited")
ATTEMPT_RESULTS = frozenset(ATTEMPT_STATUSES) - {"started"}
STARTED_REASON = "channel_attempt.started.admitted"
"""The seed's CHANNEL_ATTEMPT_STARTED: the provider admitted a send (the only way into ``started``)."""
RETRIED_REASON = "channel_attempt.started.retried"
"""A guarded provider retry of an admitted send, recorded before its effect (``provider_retries`` + 1):
not another start, a count the observation's closer can trust (N10b)."""
RESULT_REASONS = {outcome: f"channel_attempt.{outcome}.observed" for outcome in sorted(ATTEMPT_RESULTS)}
"""The seed's CHANNEL_ATTEMPT_RESULT, one code per result status: ``channel_attempt.<outcome>.observed``."""

CHANNEL_ATTEMPT_V1 = Lifecycle(
    entity_type="channel_attempt",
    table=channel_attempts,
    statuses=ATTEMPT_STATUSES,
    initial={"started", "not_started", "rate_limited"},
    terminal=ATTEMPT_RESULTS,
    edges=tuple(edges("started", "success", "rejected", "unknown", "rate_limited")),
    patch_fields={"provider_retries", "duplicate_risk", "detail", "ended_at"},
    reason_prefixes={"channel_attempt"},
    reasons={STARTED_REASON, *RESULT_REASONS.values(), "channel_attempt.purged.retention"},
    same_status="edge",
    description="One channel observation of a notification attempt: started at the provider's send "
                "admission, then its one result; made under the lease it names.",
    accepts=(),
)
"""The channel_attempt policy before provider retries were recorded (issue 25); :data:`CHANNEL_ATTEMPT`
accepts its facts. Frozen, as :data:`NOTIFICATION_V1`."""

CHANNEL_ATTEMPT = dataclasses.replace(
    CHANNEL_ATTEMPT_V1,
    edges=(*CHANNEL_ATTEMPT_V1.edges, *edges("started", "started", patch=("provider_retries",))),
    reasons=CHANNEL_ATTEMPT_V1.reasons | {RETRIED_REASON},
    description="One channel observation of a notification attempt: started at the provider's send "
                "admission, each guarded provider retry recorded before its effect, then its one result; "
                "made under the lease it names.",
    accepts=(CHANNEL_ATTEMPT_V1,),
)
"""The built-in ``channel_attempt`` lifecycle: :data:`CHANNEL_ATTEMPT_V1` and the recorded provider retry
(``started -> started``, N10b), accepting the facts written under :data:`CHANNEL_ATTEMPT_V1`."""

RESPONSE_STATUSES = ("pending", "acked", "dismissed", "timed_out")
RESPONSE_REASONS = frozenset({
    "notification_response.pending.delivered",   # the first qualifying delivery starts the deadline
    "notification_response.acked.responder",      # a human acknowledged it
    "notification_response.dismissed.responder",  # a human dismissed it
    "notification_response.timed_out.deadline",   # nobody answered before the deadline
    "notification_response.purged.retention",
})

NOTIFICATION_RESPONSE = Lifecycle(
    entity_type="notification_response",
    table=notification_responses,
    statuses=RESPONSE_STATUSES,
    initial={"pending"},
    terminal={"acked", "dismissed", "timed_out"},
    edges=(
        *edges("pending", "acked", "dismissed", patch=("responder", "responded_at")),
        *edges("pending", "timed_out", patch=("responded_at",)),
    ),
    patch_fields={"responder", "responded_at", "note"},
    reason_prefixes={"notification_response"},
    reasons=RESPONSE_REASONS,
    same_status="edge",
    description="A human's answer to a delivered notification: acknowledged, dismissed, or timed out at its "
                "deadline (which starts at the first qualifying delivery); a timeout enqueues its host callback "
                "(a dispatch, dedup key timeout:<id>) in the same transaction.",
    accepts=(),
)

DEDUP_CLAIM = Lifecycle(
    entity_type="dedup_claim",
    table=dedup_claims,
    statuses=("owned", "satisfied", "released"),
    initial={"owned"},
    terminal=set(),
    edges=(
        *edges("owned", "owned", "satisfied", "released", guard=("owner_id", "generation")),
        *edges("satisfied", "owned", guard=("owner_id", "generation")),
        *edges("released", "owned", guard=("owner_id", "generation")),
    ),
    patch_fields={"owner_id", "generation", "window_until"},
    purgeable=frozenset(),  # never: its id is its obligation's, and a purged id is never reused
    reason_prefixes={"dedup_claim"},
    reasons={"dedup_claim.owned.acquired", "dedup_claim.owned.succeeded", "dedup_claim.owned.replayed",
             "dedup_claim.satisfied.owner_delivered", "dedup_claim.released.owner_failed"},
    same_status="edge",
    description="Who owns one semantic obligation (recipient, obligation key, mode) now, in which generation, "
                "and until when a delivery suppresses duplicates; every change of owner is compared on "
                "owner and generation.",
    accepts=(),
)

RATE_BUCKET = Lifecycle(
    entity_type="rate_bucket",
    table=rate_buckets,
    statuses=("open", "retired"),
    initial={"open"},
    terminal={"retired"},
    edges=(*edges("open", "open", guard=("tokens", "refilled_at")), *edges("open", "retired", actors=OPERATOR)),
    patch_fields={"tokens", "refilled_at", "capacity", "refill_per_second"},
    reason_prefixes={"rate_bucket"},
    reasons={"rate_bucket.open.created", "rate_bucket.open.drawn", "rate_bucket.open.resized",
             "rate_bucket.open.held", "rate_bucket.retired.operator"},
    same_status="edge",
    description="A token bucket per (channel, scope), shared by every worker: each draw is a guarded "
                "transition in the transaction that records the attempt it pays for.",
    accepts=(),
)

from .schema import notification_retention_runs  # noqa: E402  (kept with the lifecycle it serves)

RETENTION_RUN = Lifecycle(
    entity_type="notification_retention",
    table=notification_retention_runs,
    statuses=("running", "completed", "failed"),
    initial={"running"},
    terminal={"completed", "failed"},
    edges=tuple(edges("running", "completed", "failed")),
    patch_fields={"ended_at", "counts", "error"},
    reason_prefixes={"notification_retention"},
    reasons={"notification_retention.running.started", "notification_retention.completed.finished",
             "notification_retention.failed.error"},
    same_status="edge",
    description="One explicit retention run over the notifications: its cutoff and idempotency horizon, "
                "whether it was a dry run, and what it removed and protected, per kind.",
    accepts=(),
)
