"""statebook's Alembic environment: it runs on the connection :func:`statebook.adapters.migrations.upgrade`
hands it (``config.attributes["connection"]``), never on a URL of its own, with statebook's version table."""

from alembic import context

from statebook.adapters.migrations.stamp import VERSION_TABLE

connection = context.config.attributes["connection"]
context.configure(connection=connection, version_table=VERSION_TABLE, render_as_batch=True,
                  transaction_per_migration=False)
with context.begin_transaction():
    context.run_migrations()
