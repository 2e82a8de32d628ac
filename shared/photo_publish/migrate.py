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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import URL, Connection, create_engine, event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from photo_publish.adapters.database import configured_url, sqlalchemy_url
from photo_publish.budget import Remaining
from photo_publish.observability import logger
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
# The migrate function's run ends at a deadline (SPEC 19): kept back from its time to stop a run
# not finished by then (cancel its statement, wait for the rollback, else end its session) before
# the function answers. Stopping takes well under a second when the database answers; the rest
# bounds a second connection that does not (STOP_CONNECT_SECONDS) and the waits.
STOP_SECONDS = 6.0
STOP_CONNECT_SECONDS = 2
# The run's session ends itself when its client goes quiet inside the transaction: between two
# statements the migrations spend milliseconds of Python, so a session idle this long belongs to a
# process that was frozen or killed, and holds ACCESS EXCLUSIVE locks every function waits for.
IDLE_IN_TRANSACTION_SECONDS = 10.0
# The migrations' advisory lock (migrations/env.py): two runs at once take turns.
ADVISORY_LOCK = 7012943


@dataclass(frozen=True, slots=True)
class RuntimeRole:
    """The login the functions connect as; its password is set when given (from its secret)."""

    name: str
    password: str | None = None

    def __post_init__(self) -> None:
        if not ROLE_NAME.match(self.name):
            raise ValueError(f"a role name is letters, digits, _ and -: {self.name!r}")


class Stopped(RuntimeError):
    """A statement or the commit of a run the function has stopped (never sent to the server)."""


@dataclass
class Session:
    """A migration run's database session as the function that may have to stop it sees it: the
    server-side timeouts it runs under, its backend's pid once connected, and a stop that refuses
    every later statement and the commit (a run stopped between two statements, where a cancel
    finds nothing to cancel, never sends another)."""

    statement_timeout_seconds: float
    idle_in_transaction_seconds: float
    pid: int | None = None
    # With the pid, the backend itself: a pid the server gives again later is another session.
    backend_start: datetime | None = None
    stopped: threading.Event = field(default_factory=threading.Event)

    def attach(self, connection: Connection) -> None:
        """The run's transaction has begun on `connection` (migrations/env.py): guard it."""
        event.listen(connection, "before_cursor_execute", self._refuse_when_stopped)
        event.listen(connection, "commit", self._refuse_when_stopped)
        self.pid, self.backend_start = connection.execute(
            text("SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()")
        ).one()
        # SET LOCAL: for the run's transaction alone, the only one its session has.
        connection.exec_driver_sql(
            f"SET LOCAL statement_timeout = {max(round(self.statement_timeout_seconds * 1000), 1)}"
        )
        connection.exec_driver_sql(
            "SET LOCAL idle_in_transaction_session_timeout = "
            f"{max(round(self.idle_in_transaction_seconds * 1000), 1)}"
        )

    def _refuse_when_stopped(self, *_: Any) -> None:
        if self.stopped.is_set():
            raise Stopped("the migration run was stopped at its deadline")


def config(
    url: str,
    *,
    schema: str | None = None,
    runtime_role: RuntimeRole | None = None,
    lock_timeout_seconds: float | None = None,
    session: Session | None = None,
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
    alembic.attributes["session"] = session
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
    session: Session | None = None,
) -> str:
    """Apply every migration not applied yet (a second run changes nothing) and the runtime role's
    grants; the head revision the database is now at."""
    alembic = config(
        url,
        schema=schema,
        runtime_role=runtime_role,
        lock_timeout_seconds=lock_timeout_seconds,
        session=session,
    )
    command.upgrade(alembic, "head")
    return head()


def runtime_role(secret_string: str) -> RuntimeRole:
    """The runtime role of a secret in Secrets Manager's format (JSON with username and password)."""
    secret = json.loads(secret_string)
    return RuntimeRole(secret["username"], secret["password"])


def upgrade_as_configured(settings: Settings, read_secret: Callable[[str], str], remaining: Remaining) -> str:
    """The migrate function's run: the migrations on the configured database with the owner's
    login (DATABASE_URL, or DB_SECRET_ARN + DB_HOST as the engine builds it), in DB_SCHEMA, and the
    runtime role of DB_RUNTIME_SECRET_ARN created and granted when that is set; within `remaining`
    (the time the function has before it must answer), or stopped and rolled back (`within`)."""
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
    target = url.render_as_string(hide_password=False)
    seconds = remaining() - STOP_SECONDS
    if seconds <= 0:
        raise MigrationFailed(
            f"not started: {seconds + STOP_SECONDS:.0f} s left, {STOP_SECONDS:.0f} needed to stop a run"
        )
    # No statement of the run outlasts the function's answer, even if this process cannot stop it
    # (frozen or killed with its container): the server cancels it, and the transaction with it.
    # Later than the deadline, so that the function's own stop comes first and says why.
    session = Session(
        statement_timeout_seconds=seconds + STOP_SECONDS,
        idle_in_transaction_seconds=IDLE_IN_TRANSACTION_SECONDS,
    )
    return within(
        seconds,
        lambda: upgrade(
            target,
            schema=settings.db_schema or None,
            runtime_role=role,
            lock_timeout_seconds=LOCK_TIMEOUT_SECONDS,
            session=session,
        ),
        session,
        target,
    )


@dataclass
class _Outcome:
    revision: str | None = None
    error: BaseException | None = None


def within(seconds: float, run: Callable[[], str], session: Session, url: str) -> str:
    """`run` (a migration run on `session`) for at most `seconds`, then stopped: nothing of it
    runs or can commit once this returns or raises (it takes STOP_SECONDS at most to stop it).

    The run has a thread of its own, so that this one can stop it: it cancels the running
    statement with pg_cancel_backend from a second connection (a SQL function, which RDS Proxy
    passes on, unlike libpq's cancel request) until the run has rolled back, closed its session and
    with it released its locks and the advisory lock; a run that does not end so has its session
    ended by the server (pg_terminate_backend), seen gone from pg_stat_activity."""
    outcome = _Outcome()

    def work() -> None:
        try:
            outcome.revision = run()
        except BaseException as error:  # every failure is the run's answer
            outcome.error = error

    worker = threading.Thread(target=work, name="migration-run", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        how = _stop(worker, session, url)
        if outcome.revision is None:
            raise MigrationFailed(f"not finished within {seconds:.0f} s: {how}")
        # Committed as it was being stopped (its COMMIT had been sent): it did finish.
    if outcome.error is not None:
        raise outcome.error
    assert outcome.revision is not None
    return outcome.revision


def _stop(worker: threading.Thread, session: Session, url: str) -> str:
    """Stop the run at its deadline; how it ended, as the answer says it."""
    started = time.monotonic()
    session.stopped.set()
    cancel_until, give_up_at = started + STOP_SECONDS / 2, started + STOP_SECONDS - 1
    how = "stopped before it began"
    this_run = "FROM pg_stat_activity WHERE pid = :pid AND backend_start = :started"
    stopper = create_engine(
        sqlalchemy_url(url),
        poolclass=NullPool,
        isolation_level="AUTOCOMMIT",
        connect_args={"connect_timeout": STOP_CONNECT_SECONDS},
    )
    try:
        with stopper.connect() as connection:
            # A SET, not a startup option: RDS Proxy refuses those (DB_SESSION_OPTIONS).
            connection.exec_driver_sql("SET statement_timeout = 1000")
            while worker.is_alive() and time.monotonic() < cancel_until:
                # Again and again: a cancel between two statements finds nothing to cancel, and the
                # next statement is refused by the session's stop before it is sent.
                if session.pid is not None:
                    connection.execute(text(f"SELECT pg_cancel_backend(pid) {this_run}"), _of(session))
                worker.join(0.1)
            if session.pid is not None:
                how = "statement cancelled, transaction rolled back, locks released"
            if worker.is_alive() and session.pid is not None:
                connection.execute(text(f"SELECT pg_terminate_backend(pid) {this_run}"), _of(session))
                how = "session ended by the server (pg_terminate_backend): rolled back, locks released"
                gone = text(f"SELECT NOT EXISTS (SELECT {this_run})")
                while not connection.scalar(gone, _of(session)):
                    if time.monotonic() > give_up_at:
                        how = "its session could not be ended; the server's timeouts end it"
                        break
                    time.sleep(0.05)
            worker.join(max(give_up_at - time.monotonic(), 0))
    except DBAPIError as error:
        # The database does not answer this connection either: the run's session ends at its own
        # statement timeout, and nothing of it can commit (its stop refuses the COMMIT).
        how = f"could not be cancelled ({describe(error)}); its statement timeout ends it"
    finally:
        stopper.dispose()
    logger.warning(
        "migration run stopped at its deadline",
        pid=session.pid,
        how=how,
        seconds=round(time.monotonic() - started, 3),
        thread_ended=not worker.is_alive(),
    )
    return how


def _of(session: Session) -> dict[str, Any]:
    return {"pid": session.pid, "started": session.backend_start}


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
