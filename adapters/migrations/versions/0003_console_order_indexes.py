"""Indexes for the console's keyset pages: each built-in lifecycle table that grows without bound gets one led
by the columns its entities are listed by (``created_at, id`` where the table has ``created_at``, else
``updated_at, id``), so a page deep in the list reads as few rows as the first (specs/performance.md,
"Console pages").

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

INDEXES = (
    ("ix_schedule_runs_created", "schedule_runs", ["created_at", "id"]),
    ("ix_channel_attempts_updated", "channel_attempts", ["updated_at", "id"]),
    ("ix_dedup_claims_updated", "dedup_claims", ["updated_at", "id"]),
    ("ix_notification_responses_updated", "notification_responses", ["updated_at", "id"]),
)


def upgrade() -> None:
    """Create the four indexes (plain b-trees, the same DDL on both backends)."""
    for name, table, columns in INDEXES:
        op.create_index(name, table, columns, unique=False)
