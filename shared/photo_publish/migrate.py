"""The schema's migrations (Alembic), as `make migrate`, the tools and the migrate function apply them.

The project is a guest in a database it may share with its app (SPEC 17): its tables go in
`DB_SCHEMA` when one is named (created if missing; else the first schema of the search path), its
history in a version table of its own, so that the app's own Alembic never sees it; and a runtime
role, when named, is granted the statements the functions run and nothing else (no DDL, no
TRUNCATE), so that only the migrations hold the owner's credentials.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import URL
from sqlalchemy.exc import DBAPIError

from photo_publish.adapters.database import configured_url
from photo_publish.settings import Settings

SCRIPTS = Path(__file__).with_name("migrations")
VERSION_TABLE = "photo_publish_version"
# Where the history was kept before it had a table of its own: taken over when it holds ours.
LEGACY_VERSION_TABLE = "alembic_version"
IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# A login's name, always double-quoted in SQL: a stack's (photo_publish_{Stage}_runtime) may hold
# capitals and hyphens.
ROLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,62}$")
# The migrate function's bounds: a database that does not answer fails in seconds, and a migration
# waiting for a lock (a table a running function holds) gives up rather than queue every other
# statement on that table behind it for as long as the function runs.
CONNECT_TIMEOUT_SECONDS = 10
LOCK_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class RuntimeRole:
    """The login the functions connect as; its password is set when given (from its secret)."""

    name: str
    password: str | None = None

    def __post_init__(self) -> None:
        if not ROLE_NAME.match(self.name):
            raise ValueError(f"a role name is letters, digits, _ and -: {self.name!r}")


def config(
    url: str,
    *,
    schema: str | None = None,
    runtime_role: RuntimeRole | None = None,
    lock_timeout_seconds: float | None = None,
) -> Config:
    """Alembic's configuration for `url`, without an ini file (the Lambda package has none)."""
    if schema is not None and not IDENTIFIER.match(schema):
        raise ValueError(f"a schema name is lower-case letters, digits and _: {schema!r}")
    alembic = Config()
    alembic.set_main_option("script_location", str(SCRIPTS))
    alembic.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    alembic.attributes["schema"] = schema
    alembic.attributes["runtime_role"] = runtime_role
    alembic.attributes["lock_timeout_seconds"] = lock_timeout_seconds
    return alembic


def head() -> str:
    revision = ScriptDirectory.from_config(config("postgresql://unused")).get_current_head()
    assert revision is not None
    return revision


def upgrade(
    url: str,
    *,
    schema: str | None = None,
    runtime_role: RuntimeRole | None = None,
    lock_timeout_seconds: float | None = None,
) -> str:
    """Apply every migration not applied yet (a second run changes nothing) and the runtime role's
    grants; the head revision the database is now at."""
    alembic = config(url, schema=schema, runtime_role=runtime_role, lock_timeout_seconds=lock_timeout_seconds)
    command.upgrade(alembic, "head")
    return head()


def runtime_role(secret_string: str) -> RuntimeRole:
    """The runtime role of a secret in Secrets Manager's format (JSON with username and password)."""
    secret = json.loads(secret_string)
    return RuntimeRole(secret["username"], secret["password"])


def upgrade_as_configured(settings: Settings, read_secret: Callable[[str], str]) -> str:
    """The migrate function's run: the migrations on the configured database with the owner's
    login (DATABASE_URL, or DB_SECRET_ARN + DB_HOST as the engine builds it), in DB_SCHEMA, and the
    runtime role of DB_RUNTIME_SECRET_ARN created and granted when that is set."""
    url = configured_url(settings, read_secret)
    if "connect_timeout" not in url.query:
        url = url.update_query_dict({"connect_timeout": str(CONNECT_TIMEOUT_SECONDS)})
    if url.host and url.host.startswith("/"):
        # A socket directory as DB_HOST: in the query, where a URL's text can hold a path.
        url = URL.create(
            url.drivername,
            username=url.username,
            password=url.password,
            database=url.database,
            query={**url.query, "host": url.host, **({"port": str(url.port)} if url.port else {})},
        )
    role = (
        runtime_role(read_secret(settings.db_runtime_secret_arn)) if settings.db_runtime_secret_arn else None
    )
    return upgrade(
        url.render_as_string(hide_password=False),
        schema=settings.db_schema or None,
        runtime_role=role,
        lock_timeout_seconds=LOCK_TIMEOUT_SECONDS,
    )


class MigrationFailed(RuntimeError):
    """A migration run that failed, said as `describe` says it (nothing of its statements)."""


def describe(error: BaseException) -> str:
    """An error of a migration run as it may be shown anywhere (CloudFormation's events, the log):
    a database error by the server's message alone, never with its statement, which for the
    runtime role's ALTER ROLE holds the password."""
    if isinstance(error, DBAPIError) and error.orig is not None:
        primary = getattr(getattr(error.orig, "diag", None), "message_primary", None)
        return str(primary or error.orig).strip()
    return str(error)
