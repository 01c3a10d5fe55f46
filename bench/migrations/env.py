"""Alembic environment of privbench's results store: migrations run on the connection the caller hands over.

privbench drives Alembic from code (bench/migrate.py), never from an ``alembic.ini``; the caller puts an open
SQLAlchemy connection into ``config.attributes["connection"]`` so the migration runs in the caller's transaction.
"""

from __future__ import annotations

from alembic import context

from bench.schema import Base

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only reached when someone runs the alembic CLI by hand
    raise RuntimeError("privbench migrations run through `privbench db upgrade --db URL`, not the alembic CLI")

context.configure(connection=connection, target_metadata=Base.metadata,
                  render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
