"""Drop the pre-migration version stamp ``statebook_schema``: ``statebook_alembic_version`` replaces it.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Drop ``statebook_schema`` when present (a database built from 0001 onwards never had it)."""
    if sa.inspect(op.get_bind()).has_table("statebook_schema"):
        op.drop_table("statebook_schema")
