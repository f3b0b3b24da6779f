"""Alembic environment. Configured from code (registry_db.migrate), never from an alembic.ini:
the caller hands over an open connection in `config.attributes["connection"]`."""

from alembic import context

from oscar_zoo.registry_db.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata,
                  render_as_batch=connection.dialect.name == "sqlite", compare_type=True)
with context.begin_transaction():
    context.run_migrations()
