"""The notifications' tables: ``notifications``, ``channel_attempts``, ``dedup_claims`` and ``rate_buckets`` (specs/notifications.md).

Every table is managed: its status and data columns change only through the lifecycle engine.
The statuses are the lifecycles' (:mod:`.policy`); the CHECKs and partial-index predicates are
built from the registry when the schema is created, as for the dispatch outbox.
"""

from __future__ import annotations

import sqlalchemy as sa

from statebook.lifecycle import managed_table
from statebook.lifecycle.schema import status_index

notifications = managed_table(
    "notifications",
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("recipient", sa.Text, nullable=False),
    sa.Column("content", sa.JSON, nullable=False),
    sa.Column("mode", sa.String(16), nullable=False),
    # The selected channels in the order an attempt runs them (persistent ones in Slack, email,
    # PagerDuty order; WebSocket last), as a JSON list of names.
    sa.Column("channels", sa.JSON, nullable=False),
    sa.Column("cycle", sa.Integer, nullable=False, server_default="1"),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),  # cumulative, every cycle
    sa.Column("cycle_attempts", sa.Integer, nullable=False, server_default="0"),  # this cycle's
    sa.Column("max_cycle_attempts", sa.Integer, nullable=False, server_default="3"),
    sa.Column("dead_letter", sa.Integer, nullable=False, server_default="0"),
    # The due time; NULL while the notification is a follower (not work of its own until promoted).
    sa.Column("next_attempt_at", sa.Float, nullable=True),
    # The fencing token of the current claim and the end of its lease (NULL between claims).
    sa.Column("claim_id", sa.String(32), nullable=True),
    sa.Column("lease_until", sa.Float, nullable=True),
    sa.Column("delivered_channel", sa.String(32), nullable=True),
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    # Idempotency (part 2): the scope (principal, source, key), bound to a hash of the request's content.
    sa.Column("principal", sa.Text, nullable=False, server_default=""),
    sa.Column("source", sa.Text, nullable=False, server_default=""),
    sa.Column("idempotency_key", sa.Text, nullable=True),
    sa.Column("content_hash", sa.String(64), nullable=False),
    # Semantic deduplication (part 2): the key, its window, the claim it is counted under, the owner it
    # follows (NULL: it owns its obligation, or has no key), the owner's generation, and the successor
    # this notification handed its followers to when it failed.
    sa.Column("dedup_key", sa.Text, nullable=True),
    sa.Column("dedup_window", sa.Float, nullable=True),
    sa.Column("dedup_claim_id", sa.String(64), nullable=True),
    sa.Column("obligation_owner_id", sa.String(32), nullable=True),
    sa.Column("generation", sa.Integer, nullable=False, server_default="0"),
    sa.Column("dedup_successor_id", sa.String(32), nullable=True),
    # Recovery (part 2): an operator's resolution of a dead letter, and the replay that covers a failed
    # descendant (the notification whose replayed cycle took its obligation over).
    sa.Column("resolved_at", sa.Float, nullable=True),
    sa.Column("resolved_by", sa.Text, nullable=True),
    sa.Column("resolution", sa.Text, nullable=True),
    sa.Column("replayed_in", sa.String(32), nullable=True),
    # Response (part 3): how long a human has to answer once it is first delivered, and the host callback
    # a timeout invokes (a name registered with register_timeout_callback); NULL: no response expected.
    sa.Column("response_timeout", sa.Float, nullable=True),
    sa.Column("timeout_callback", sa.Text, nullable=True),
    # The due scan: (due time, id) order over the statuses a worker claims from.
    status_index("ix_notifications_due", "next_attempt_at", "id", where="active"),
    # Newest first for listing; the dead-letter view and retention read settled rows by age.
    sa.Index("ix_notifications_created", "created_at", "id"),
    status_index("ix_notifications_settled", "status", "updated_at", where="terminal"),
    # One acceptance per idempotency scope (rows without a key are NULL there: distinct).
    sa.Index("ux_notifications_idempotency", "principal", "source", "idempotency_key", unique=True),
    # An owner's followers, oldest first (successor election).
    sa.Index("ix_notifications_followers", "obligation_owner_id", "created_at", "id"),
)

channel_attempts = managed_table(
    "channel_attempts",
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("notification_id", sa.String(32), nullable=False),
    sa.Column("cycle", sa.Integer, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),  # the notification's cumulative attempt number
    sa.Column("channel", sa.String(32), nullable=False),
    sa.Column("position", sa.Integer, nullable=False),  # the channel's place in the attempt's run order, from 1
    # The lease the observation was made under: its claim token and end.
    sa.Column("claim_id", sa.String(32), nullable=False),
    sa.Column("lease_until", sa.Float, nullable=False),
    sa.Column("provider_retries", sa.Integer, nullable=False, server_default="0"),
    sa.Column("duplicate_risk", sa.Integer, nullable=False, server_default="0"),
    sa.Column("detail", sa.Text, nullable=True),
    sa.Column("made_at", sa.Float, nullable=False),  # when the observation was recorded first
    sa.Column("started_at", sa.Float, nullable=True),  # the send admission (NULL: never admitted)
    sa.Column("ended_at", sa.Float, nullable=True),
    # A notification's attempts, cycle by cycle, in the order they were made.
    sa.Index("ix_channel_attempts_notification", "notification_id", "cycle", "attempt", "position"),
    # The console lists them newest first, a keyset page at a time (adapters/web/queries.py).
    sa.Index("ix_channel_attempts_updated", "updated_at", "id"),
)

notification_responses = managed_table(
    "notification_responses",
    # The notification's own id: one response per notification that expects one.
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("started_at", sa.Float, nullable=False),  # the first qualifying delivery
    sa.Column("due_at", sa.Float, nullable=False),  # started_at + the notification's response_timeout
    sa.Column("timeout_callback", sa.Text, nullable=True),
    sa.Column("responder", sa.Text, nullable=True),  # "type:id" of the actor who answered (acked, dismissed)
    sa.Column("responded_at", sa.Float, nullable=True),  # the answer's or the timeout's time
    sa.Column("note", sa.Text, nullable=True),
    # The timeout pass: pending responses by deadline, then id.
    status_index("ix_notification_responses_due", "due_at", "id", where="active"),
    sa.Index("ix_notification_responses_updated", "updated_at", "id"),  # the console's keyset pages
)

dedup_claims = managed_table(
    "dedup_claims",
    # digest(recipient, dedup_key, mode): one claim per semantic obligation.
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("recipient", sa.Text, nullable=False),
    sa.Column("dedup_key", sa.Text, nullable=False),
    sa.Column("obligation", sa.String(16), nullable=False),  # the mode: a best-effort delivery satisfies no guaranteed one
    sa.Column("owner_id", sa.String(32), nullable=True),  # the notification that owns the obligation now
    sa.Column("generation", sa.Integer, nullable=False),  # raised at every change of owner
    sa.Column("window_until", sa.Float, nullable=False),  # the suppression window's end
    sa.Index("ix_dedup_claims_updated", "updated_at", "id"),  # the console's keyset pages
)

rate_buckets = managed_table(
    "rate_buckets",
    sa.Column("id", sa.String(300), primary_key=True),  # "<channel>:<scope>"
    sa.Column("channel", sa.String(32), nullable=False),
    sa.Column("scope", sa.Text, nullable=False),
    sa.Column("capacity", sa.Float, nullable=False),
    sa.Column("refill_per_second", sa.Float, nullable=False),
    sa.Column("tokens", sa.Float, nullable=False),
    sa.Column("refilled_at", sa.Float, nullable=False),
)

notification_retention_runs = managed_table(
    "notification_retention_runs",
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("cutoff", sa.Float, nullable=False),  # `before`: settled rows last changed earlier may go
    sa.Column("horizon", sa.Float, nullable=False),  # seconds: no idempotency record younger than this goes
    sa.Column("dry_run", sa.Integer, nullable=False),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("ended_at", sa.Float, nullable=True),
    # {"notification": {"removed": n, "protected": {...}}, "channel_attempt": {...}, "dedup_claim": {...}}
    sa.Column("counts", sa.JSON, nullable=False),
    sa.Column("error", sa.Text, nullable=True),
)

# Retention asks which retained notifications a replay covers (``replayed_in``): one lookup per batch.
sa.Index("ix_notifications_replayed_in", notifications.c.replayed_in)
# Retention asks which claims name a notification as their owner.
sa.Index("ix_dedup_claims_owner", dedup_claims.c.owner_id)
