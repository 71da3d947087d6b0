"""The notifications' tables: ``notifications``, ``channel_attempts`` and ``rate_buckets`` (specs/notifications.md).

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
    sa.Column("next_attempt_at", sa.Float, nullable=False),
    # The fencing token of the current claim and the end of its lease (NULL between claims).
    sa.Column("claim_id", sa.String(32), nullable=True),
    sa.Column("lease_until", sa.Float, nullable=True),
    sa.Column("delivered_channel", sa.String(32), nullable=True),
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    # The due scan: (due time, id) order over the statuses a worker claims from.
    status_index("ix_notifications_due", "next_attempt_at", "id", where="active"),
    # Newest first for listing; the dead-letter view and retention read settled rows by age.
    sa.Index("ix_notifications_created", "created_at", "id"),
    status_index("ix_notifications_settled", "status", "updated_at", where="terminal"),
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
