"""The schema's migrations (Alembic), as `make migrate`, the tools and the migrate function apply them.

The project is a guest in a database it may share with its app (SPEC 17): its tables go in
`DB_SCHEMA` when one is named (created if missing; else the first schema of the search path), its
history in a version table of its own, so that the app's own Alembic never sees it; and a runtime
role, when named, is granted the statements the functions run and nothing else (no DDL, no
TRUNCATE), so that only the migrations hold the owner's credentials.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

SCRIPTS = Path(__file__).with_name("migrations")
VERSION_TABLE = "photo_publish_version"
# Where the history was kept before it had a table of its own: taken over when it holds ours.
LEGACY_VERSION_TABLE = "alembic_version"
IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True, slots=True)
class RuntimeRole:
    """The login the functions connect as; its password is set when given (from its secret)."""

    name: str
    password: str | None = None

    def __post_init__(self) -> None:
        if not IDENTIFIER.match(self.name):
            raise ValueError(f"a role name is lower-case letters, digits and _: {self.name!r}")


def config(url: str, *, schema: str | None = None, runtime_role: RuntimeRole | None = None) -> Config:
    """Alembic's configuration for `url`, without an ini file (the Lambda package has none)."""
    if schema is not None and not IDENTIFIER.match(schema):
        raise ValueError(f"a schema name is lower-case letters, digits and _: {schema!r}")
    alembic = Config()
    alembic.set_main_option("script_location", str(SCRIPTS))
    alembic.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    alembic.attributes["schema"] = schema
    alembic.attributes["runtime_role"] = runtime_role
    return alembic


def head() -> str:
    revision = ScriptDirectory.from_config(config("postgresql://unused")).get_current_head()
    assert revision is not None
    return revision


def upgrade(url: str, *, schema: str | None = None, runtime_role: RuntimeRole | None = None) -> str:
    """Apply every migration not applied yet (a second run changes nothing) and the runtime role's
    grants; the head revision the database is now at."""
    command.upgrade(config(url, schema=schema, runtime_role=runtime_role), "head")
    return head()
