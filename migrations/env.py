"""Alembic environment: runs the migrations against the URL it is given, or DATABASE_URL."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine

from photo_publish.adapters.database import sqlalchemy_url

url = context.config.get_main_option("sqlalchemy.url") or os.environ.get("DATABASE_URL")
if not url:
    raise SystemExit("DATABASE_URL is not set")

# One connection, one transaction per migration run: PostgreSQL's DDL is transactional.
engine = create_engine(sqlalchemy_url(url))
with engine.begin() as connection:
    # Two deployments migrating at once would race on the version table: one waits for the other.
    connection.exec_driver_sql("SELECT pg_advisory_xact_lock(7012943)")
    context.configure(connection=connection, transactional_ddl=True)
    context.run_migrations()
engine.dispose()
