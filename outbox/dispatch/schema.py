"""The ``dispatch_outbox`` table (specs/outbox.md) plus the lifecycle columns."""

from __future__ import annotations

import sqlalchemy as sa

from statebook.lifecycle import managed_table
from statebook.lifecycle.schema import status_index

DISPATCH_STATUSES = ("pending", "delivering", "delivered", "acked", "dead_letter", "expired")
TERMINAL_STATUSES = ("delivered", "acked", "dead_letter", "expired")
"""The built-in ``dispatch`` lifecycle's statuses, as :data:`~statebook.outbox.DISPATCH` declares them.

The table does not list them: its status CHECK and the partial indexes below are built from the
registry's ``dispatch`` lifecycle when the schema is created, so an extended dispatch is admitted."""

dispatch_outbox = managed_table(
    "dispatch_outbox",
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("deliver_to", sa.Text, nullable=False),
    sa.Column("payload", sa.JSON, nullable=False),
    sa.Column("dedup_key", sa.Text, nullable=True),
    sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
    sa.Column("max_attempts", sa.Integer, nullable=False, server_default="8"),
    sa.Column("next_attempt_at", sa.Float, nullable=False),
    sa.Column("ack_required", sa.Integer, nullable=False, server_default="0"),
    sa.Column("ack_token", sa.Text, nullable=True),
    # Provenance links. The outbox design we follow declares foreign keys to sessions and schedule_runs; the outbox may
    # not depend on the scheduler, so these stay plain references.
    sa.Column("session_id", sa.Text, nullable=True),
    sa.Column("schedule_run_id", sa.Text, nullable=True),
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=True),
    # Beyond that design: a fencing token written by each claim. The attempt counter alone repeats after
    # an operator retry resets it, so a finalization guards on the claim id as well.
    sa.Column("claim_id", sa.String(32), nullable=True),
    sa.Index(
        "idx_dispatch_outbox_dedup",
        "dedup_key",
        unique=True,
        sqlite_where=sa.text("dedup_key IS NOT NULL"),
        postgresql_where=sa.text("dedup_key IS NOT NULL"),
    ),
    # That design indexes (status, next_attempt_at); scans here order by (next_attempt_at, created_at, id)
    # — due time, then event time, then id — which that column order cannot serve (every scan would read
    # and sort all due rows). Same name; partial on the lifecycle's active statuses, which contain the
    # scan's (attempts.ACTIVE), so the planner can use it.
    status_index("idx_dispatch_outbox_due", "next_attempt_at", "created_at", "id", where="active"),
    # list_dispatches (newest first) and retention / bulk purge (status, age) read these.
    sa.Index("idx_dispatch_outbox_created", "created_at", "id"),
    # Partial on settled statuses, so a planner never prefers it for the due scan.
    status_index("idx_dispatch_outbox_settled", "status", "updated_at", where="terminal"),
)
