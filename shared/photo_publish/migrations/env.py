"""Alembic environment: the migrations against the URL it is given (or DATABASE_URL), in the
project's schema, with its own version table, then the runtime role's grants (photo_publish.migrate)."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import Connection, create_engine, text

from photo_publish.adapters.database import sqlalchemy_url
from photo_publish.adapters.tables import metadata
from photo_publish.migrate import ADVISORY_LOCK, LEGACY_VERSION_TABLE, VERSION_TABLE, RuntimeRole, Session

config = context.config
url = config.get_main_option("sqlalchemy.url") or os.environ.get("DATABASE_URL")
if not url:
    raise SystemExit("DATABASE_URL is not set")
schema: str | None = config.attributes.get("schema", os.environ.get("DB_SCHEMA") or None)
runtime_role: RuntimeRole | None = config.attributes.get("runtime_role")
lock_timeout_seconds: float | None = config.attributes.get("lock_timeout_seconds")
# The migrate function's run (photo_publish.migrate.within): its timeouts, and its stop.
session: Session | None = config.attributes.get("session")

# What the functions run, table by table: reads and the four kinds of row change, nothing else.
RUNTIME_GRANTS = "SELECT, INSERT, UPDATE, DELETE"


def take_over_legacy_history(connection: Connection) -> None:
    """A deployment from before the project had a version table of its own kept its history in
    Alembic's default one, which the app's own Alembic would read as its own: renamed to ours when
    it holds one of our revisions (and ours does not exist yet)."""
    ours = {script.revision for script in context.script.walk_revisions()}
    found = connection.scalar(
        text("SELECT to_regclass(:ours) IS NULL AND to_regclass(:legacy) IS NOT NULL"),
        {"ours": VERSION_TABLE, "legacy": LEGACY_VERSION_TABLE},
    )
    if found and connection.scalar(text(f"SELECT version_num FROM {LEGACY_VERSION_TABLE}")) in ours:
        connection.exec_driver_sql(f"ALTER TABLE {LEGACY_VERSION_TABLE} RENAME TO {VERSION_TABLE}")


def refuse_a_second_copy(connection: Connection, target: str) -> None:
    """A deployment from before DB_SCHEMA has its tables and history in the search path's schema:
    migrating a new, empty copy into `target` would hide its data from the functions. Refused, with
    what to do, when `target` holds no history of ours and the search path does."""
    if connection.scalar(text("SELECT to_regclass(:table)"), {"table": f"{target}.{VERSION_TABLE}"}):
        return
    ours = {script.revision for script in context.script.walk_revisions()}
    for table in (VERSION_TABLE, LEGACY_VERSION_TABLE):
        found = connection.scalar(text("SELECT to_regclass(:table)::text"), {"table": table})
        if found and connection.scalar(text(f"SELECT version_num FROM {found}")) in ours:
            raise RuntimeError(
                f"the project's tables are already in {found.rpartition('.')[0] or 'the search path'} "
                f"({found}), not in schema {target}: set DB_SCHEMA (DbSchema) to that schema, or to "
                "empty for the search path's, to keep using them; migrating would start an empty copy"
            )


def grant(connection: Connection, role: RuntimeRole) -> None:
    """The runtime role's login and rights on the project's tables, again at every run (idempotent):
    the tables of a new migration are granted by the same run that made them. By name, never all of
    a schema's: with no DB_SCHEMA the project shares `public` with the app's own tables."""
    name = f'"{role.name}"'
    # Roles are the server's, not the database's: another database's first deploy may create it at
    # the same moment (the advisory lock is this database's), and then it exists.
    connection.exec_driver_sql(
        f"DO $$ BEGIN CREATE ROLE {name} LOGIN;"
        " EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
    )
    if role.password is not None:
        # Its SCRAM verifier, made by libpq on this side: the password itself never travels in a
        # statement, which an error would log (here and in the server's log).
        pgconn = connection.connection.driver_connection.pgconn  # type: ignore[union-attr]
        verifier = pgconn.encrypt_password(role.password.encode(), role.name.encode(), b"scram-sha-256")
        connection.exec_driver_sql(f"ALTER ROLE {name} LOGIN PASSWORD '{verifier.decode()}'")
    target = connection.scalar(text("SELECT current_schema()"))
    connection.exec_driver_sql(f"GRANT USAGE ON SCHEMA {target} TO {name}")
    for table in sorted(metadata.tables):
        connection.exec_driver_sql(f"GRANT {RUNTIME_GRANTS} ON {table} TO {name}")
    # Not the version table: the functions never read the history.
    connection.exec_driver_sql(f"REVOKE ALL ON {VERSION_TABLE} FROM {name}")


# One connection, one transaction per migration run: PostgreSQL's DDL is transactional.
engine = create_engine(sqlalchemy_url(url))
try:
    with engine.begin() as connection:
        if session is not None:
            session.attach(connection)
        # Two deployments migrating at once would race on the version table: one waits for the other.
        connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({ADVISORY_LOCK})")
        if lock_timeout_seconds is not None:
            # After the advisory lock: a second run waits for the first as long as its own time lasts.
            connection.exec_driver_sql(f"SET LOCAL lock_timeout = {round(lock_timeout_seconds * 1000)}")
        if schema:
            refuse_a_second_copy(connection, schema)
            connection.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {schema}")
            # The migrations' own SQL names no schema: for this transaction, theirs comes first.
            connection.exec_driver_sql(f"SET LOCAL search_path TO {schema}, public")
        else:
            take_over_legacy_history(connection)
        context.configure(
            connection=connection,
            transactional_ddl=True,
            version_table=VERSION_TABLE,
            version_table_schema=schema,
        )
        context.run_migrations()
        if runtime_role is not None:
            grant(connection, runtime_role)
finally:
    # Closed, not pooled: a run that failed or was stopped leaves no session behind.
    engine.dispose()
