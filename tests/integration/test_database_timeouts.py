"""Every statement of the functions runs under a statement, lock and idle-transaction timeout,
whether the engine sends them as startup options (straight to PostgreSQL) or cannot (behind RDS
Proxy, `db_session_options=False`: then each transaction sets them with SET LOCAL)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as StillWaiting

import psycopg
import pytest
from sqlalchemy import Connection, Engine, insert, select, text
from sqlalchemy.exc import DBAPIError, OperationalError

from photo_publish.adapters.database import create_database_engine
from photo_publish.adapters.models import Photo, PhotoJob
from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.publish import repository
from photo_publish.publish.repository import Claimed
from photo_publish.retry import PERMANENT
from tests.conftest import settings_for
from tests.rows import committed, job

# Seconds: DB_STATEMENT_TIMEOUT_SECONDS. A lock is waited for half of it (a statement that waits
# as long as its whole timeout is cancelled as a statement, never named a lock wait), and a
# transaction may idle six times it.
TIMEOUT = 0.3
LOCK_TIMEOUT = TIMEOUT / 2
# What a loaded 2-core machine may add to a timeout before the error is back in Python.
SLACK = 2.0
TIMEOUT_NAMES = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
PATHS = [
    pytest.param(True, id="startup-options"),
    pytest.param(False, id="set-local-per-transaction"),
]


@pytest.fixture(params=PATHS)
def functions_engine(request: pytest.FixtureRequest, database_url: str) -> Iterator[Engine]:
    """The engine the functions build, with session options on (direct) or off (RDS Proxy)."""
    settings = settings_for(
        database_url,
        queue_url="",
        dead_letter_url="",
        db_session_options=request.param,
        db_statement_timeout_seconds=TIMEOUT,
    )
    engine = create_database_engine(settings)
    yield engine
    engine.dispose()


def new_photo(db: Engine) -> uuid.UUID:
    photo_id = uuid.uuid4()
    with db.begin() as connection:
        connection.execute(
            insert(Photo).values(id=photo_id, album_id=uuid.uuid4(), original_key=f"dev/originals/{photo_id}")
        )
        connection.execute(insert(PhotoJob).values(photo_id=photo_id))
    return photo_id


def within_bound(call: Callable[[], object], holder: Connection) -> tuple[BaseException | None, float]:
    """What `call` raised and how long it took; if it still waits after the timeout and the slack,
    the holder lets go (so a missing timeout fails the test instead of hanging it)."""
    with ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        future = pool.submit(call)
        try:
            error = future.exception(timeout=LOCK_TIMEOUT + SLACK)
        except StillWaiting:
            holder.rollback()
            future.result()
            pytest.fail(f"still waiting for the lock after {LOCK_TIMEOUT + SLACK} s: no lock timeout")
        return error, time.monotonic() - started


@pytest.mark.parametrize("begin", ["connect", "begin"])
def test_every_transaction_runs_under_the_timeouts(functions_engine: Engine, begin: str) -> None:
    # GIVEN the functions' engine, WHEN a transaction is opened either way (a read through
    # connect() autobegins one, as SQLAlchemy 2 does by default)
    with getattr(functions_engine, begin)() as connection:
        # THEN its statements run under the configured timeouts
        shown = [connection.scalar(text(f"SHOW {name}")) for name in TIMEOUT_NAMES]
    assert shown == ["300ms", "150ms", "1800ms"]


def test_a_claim_on_a_row_locked_by_another_session_gives_up_at_the_lock_timeout_as_a_transient_failure(
    db: Engine, functions_engine: Engine
) -> None:
    # GIVEN a job whose row another session holds locked in a transaction that does not end (a
    # frozen worker, a person at a psql prompt)
    photo_id = new_photo(db)
    with db.connect() as holder:
        holder.execute(select(PhotoJob).where(PhotoJob.photo_id == photo_id).with_for_update())

        # WHEN a function claims the job (the state machine's transition, in a unit of work)
        error, took = within_bound(
            lambda: committed(functions_engine, repository.claim, photo_id, stale_after=300, max_attempts=3),
            holder,
        )
        holder.rollback()

    # THEN it gave up after the lock timeout, not at once and not at the Lambda's timeout...
    assert LOCK_TIMEOUT <= took < LOCK_TIMEOUT + SLACK
    # ...with PostgreSQL's lock_not_available, which the unit of work calls DATABASE_UNAVAILABLE: a
    # transient failure, retried, never a permanent one
    assert isinstance(error, PhotoError), error
    assert error.code is ErrorCode.DATABASE_UNAVAILABLE and error.code not in PERMANENT
    assert isinstance(error.__cause__, DBAPIError)
    assert isinstance(error.__cause__.orig, psycopg.errors.LockNotAvailable)
    # AND the job is untouched, and claimed once the lock is gone
    assert job(db, photo_id) == ("pending", 0, None)
    claimed = committed(functions_engine, repository.claim, photo_id, stale_after=300, max_attempts=3)
    assert claimed == Claimed(1)


def test_a_long_statement_is_cancelled_at_the_statement_timeout(functions_engine: Engine) -> None:
    # GIVEN the functions' engine, WHEN a statement runs longer than the statement timeout
    started = time.monotonic()
    with pytest.raises(OperationalError) as caught, functions_engine.connect() as connection:
        connection.execute(text("SELECT pg_sleep(:seconds)"), {"seconds": TIMEOUT + SLACK + 1})

    # THEN PostgreSQL cancels it at the timeout (query_canceled, SQLSTATE class 57: transient to
    # the repository)
    assert TIMEOUT <= time.monotonic() - started < TIMEOUT + SLACK
    assert isinstance(caught.value.orig, psycopg.errors.QueryCanceled)


def test_a_transaction_left_idle_is_ended_by_the_server(functions_engine: Engine) -> None:
    # GIVEN a transaction of the functions' engine left idle past six times the timeout (a frozen
    # worker holding whatever it locked)
    with pytest.raises(DBAPIError) as caught, functions_engine.begin() as connection:
        connection.execute(text("SELECT 1"))
        time.sleep(6 * TIMEOUT + 0.5)

        # WHEN it goes on, THEN the server has ended it: its locks did not outlive the worker (and
        # the connection is invalidated, which the repository takes for a transient failure)
        connection.execute(text("SELECT 1"))
    assert isinstance(caught.value.orig, psycopg.errors.IdleInTransactionSessionTimeout)
    assert caught.value.connection_invalidated
