"""statebook's Alembic revisions, one file each, applied in order by ``statebook db upgrade``."""
