"""The engine: one small pool per container, READ COMMITTED pinned, RDS Proxy friendly.

Every wait has an end: connecting, a silent peer after a failover (TCP keepalives and a user
timeout), a statement or a lock (server-side timeouts), a transaction left idle by a dead worker.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from sqlalchemy import URL, Connection, Engine, create_engine, event, make_url

from photo_publish.settings import Settings

# Seconds between two reads of the secret after failed connections: a database that is down
# costs a Secrets Manager call a minute, not one per connection attempt.
SECRET_REREAD_SECONDS = 60.0


def sqlalchemy_url(url: str | URL) -> URL:
    """A plain `postgresql://` URL (as pgserver, psql and most tools print it) driven by psycopg 3."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def url_from_secret(secret_string: str, settings: Settings) -> URL:
    """The URL for an RDS-style secret (username, password, and optionally host, port, dbname)."""
    secret = json.loads(secret_string)
    tls = {"sslmode": settings.db_sslmode}
    if settings.db_sslrootcert:
        tls["sslrootcert"] = settings.db_sslrootcert
    return URL.create(
        "postgresql+psycopg",
        username=secret["username"],
        password=secret["password"],
        host=settings.db_host or secret.get("host"),
        port=int(secret.get("port") or 5432),
        database=secret.get("dbname") or settings.db_name,
        query=tls,
    )


def configured_url(settings: Settings, read_secret: Callable[[str], str] | None = None) -> URL:
    """The URL the configuration names: DATABASE_URL, or DB_SECRET_ARN's secret with DB_HOST (as the
    engine's first connection uses them; the migrate function connects with this)."""
    if settings.database_url:
        return sqlalchemy_url(settings.database_url)
    if read_secret is not None and settings.db_secret_arn:
        return url_from_secret(read_secret(settings.db_secret_arn), settings)
    raise ValueError("no database configured")


class RotatingSecret:
    """The database's credentials from Secrets Manager, read again when a connection fails.

    A rotation changes the password under warm containers; their pooled connections live on, but
    the next new one would fail authentication until the container recycled. libpq reports a
    refused login with no SQLSTATE, so the failure is not classified: the secret is read again
    (at most once a SECRET_REREAD_SECONDS) and the connection retried only if it changed.
    """

    def __init__(self, read: Callable[[], str]) -> None:
        self._read = read
        self._lock = threading.Lock()
        self.value = read()
        self._reread_at = -SECRET_REREAD_SECONDS

    def reread(self) -> bool:
        """True if the secret changed since it was last read."""
        with self._lock:
            if time.monotonic() - self._reread_at < SECRET_REREAD_SECONDS:
                return False
            value, self._reread_at = self._read(), time.monotonic()
            changed, self.value = value != self.value, value
        return changed


def server_timeouts(settings: Settings) -> dict[str, int]:
    """The server-side timeouts every statement of the functions runs under, in milliseconds."""
    timeout = round(settings.db_statement_timeout_seconds * 1000)
    return {
        "statement_timeout": timeout,
        # Below the statement's: a lock waited for as long as the statement may run would always be
        # cancelled as a slow statement (PostgreSQL: "setting lock_timeout to a value larger than
        # or equal to statement_timeout is pointless"); this way a lock wait is named
        # lock_not_available and leaves the statement time to run once it has the row.
        "lock_timeout": timeout // 2,
        # A transaction of ours never waits on Python for long: one left open by a frozen or dead
        # worker must not hold its row locks.
        "idle_in_transaction_session_timeout": 6 * timeout,
    }


def _connect_args(settings: Settings) -> dict[str, Any]:
    args: dict[str, Any] = {
        "connect_timeout": 5,
        "application_name": "photo-publish",
        # A peer that stops answering (a failover, a dropped NAT entry) is dropped after about
        # 10 s of unacknowledged data or 25 s of silence, not at the Lambda's timeout.
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": 10_000,
    }
    if not settings.db_prepare_statements:
        args["prepare_threshold"] = None
    if settings.db_session_options:
        # Set once per connection, for its whole life: no statement of any transaction is sent.
        args["options"] = " ".join(f"-c {name}={value}" for name, value in server_timeouts(settings).items())
    return args


def _timeouts_per_transaction(engine: Engine, settings: Settings) -> None:
    """Each transaction sets the timeouts for itself, where startup options cannot set them for the
    session: RDS Proxy refuses a connection that sends any ("Feature not supported: RDS Proxy
    currently doesn't support command-line options"; psycopg/psycopg2#1577).

    SET LOCAL ends with its transaction, so nothing of it is left on the database connection the
    proxy lends to another client next. AWS pins a client for a change of *session* state (a SET,
    "Avoiding pinning an RDS Proxy", RDS and Aurora User Guides); a transaction is never
    multiplexed anyway, and AWS's PostgreSQL pinning notes (aws/agent-toolkit-for-aws,
    rds-oss/references/proxy-pinning-postgresql.md) say SET LOCAL pins only for the transaction.

    SQLAlchemy 2 runs every statement in a transaction (a read through `connect()` autobegins one)
    and fires `begin` before the first: run on that connection, the SETs are the transaction's
    first statement (SET LOCAL outside a transaction would only warn). The three go as one
    simple-protocol query, never prepared: one round trip a transaction more (three statements
    would be three, and psycopg would prepare them after five runs). psycopg sends its BEGIN as
    a query of its own; folding the SETs into it would mean driving libpq underneath psycopg.
    """
    statement = "; ".join(f"SET LOCAL {name} = {value}" for name, value in server_timeouts(settings).items())

    @event.listens_for(engine, "begin")
    def set_timeouts(connection: Connection) -> None:
        connection.exec_driver_sql(statement)


def create_database_engine(settings: Settings, read_secret: Callable[[str], str] | None = None) -> Engine:
    secret = None
    if settings.database_url:
        url = sqlalchemy_url(settings.database_url)
    elif read_secret is not None and settings.db_secret_arn:
        arn = settings.db_secret_arn
        secret = RotatingSecret(lambda: read_secret(arn))
        url = url_from_secret(secret.value, settings)
    else:
        raise ValueError("no database configured")
    engine = create_engine(
        url,
        # Pinned, not inherited: the conditional updates rely on READ COMMITTED's re-check of the
        # WHERE clause after a concurrent commit.
        isolation_level="READ COMMITTED",
        pool_size=settings.record_concurrency,
        max_overflow=0,
        pool_pre_ping=True,
        # A frozen Lambda container wakes with connections the proxy or server may have closed.
        pool_recycle=240,
        connect_args=_connect_args(settings),
        # Each statement names the project's schema when one is set: no search_path in the session,
        # which RDS Proxy would pin.
        execution_options={"schema_translate_map": {None: settings.db_schema}} if settings.db_schema else {},
    )
    if not settings.db_session_options:
        _timeouts_per_transaction(engine, settings)
    if secret is not None:
        _connect_with(engine, secret, settings)
    return engine


def _connect_with(engine: Engine, secret: RotatingSecret, settings: Settings) -> None:
    """Each new connection logs in with the secret's current credentials (SQLAlchemy's documented
    hook for rotating credentials), reading it again once when a login fails."""

    @event.listens_for(engine, "do_connect")
    def connect(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
        current = url_from_secret(secret.value, settings)
        cparams.update(user=current.username, password=current.password)
        try:
            return dialect.connect(*cargs, **cparams)
        except psycopg.OperationalError:
            if not secret.reread():
                raise
        current = url_from_secret(secret.value, settings)
        cparams.update(user=current.username, password=current.password)
        return dialect.connect(*cargs, **cparams)
