"""The unit of work: one transaction on the engine, begun, committed or rolled back in one place.

The code inside is handed the connection and calls the job's transitions (`jobs.machine`) and the
other statements on it; the block's end commits them all, an exception rolls them all back. A
database that cannot be reached, or that loses the commit, is `DATABASE_UNAVAILABLE` (transient:
the work is tried again), told from any other database error by its type and SQLSTATE, never by its
message. No network call is made inside (SPEC 19): the block holds row locks until it ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from photo_publish.errors import ErrorCode, PhotoError

# SQLSTATE classes a later attempt can outlive: connection exception, transaction rollback
# (serialization failure, deadlock), insufficient resources, operator intervention (shutdown, and
# statement_timeout's query_canceled).
_TRANSIENT_SQLSTATE_CLASSES = frozenset({"08", "40", "53", "57"})
# lock_timeout: a row held by a stuck transaction (idle_in_transaction_session_timeout ends it).
_LOCK_NOT_AVAILABLE = "55P03"


@contextmanager
def unit_of_work(engine: Engine) -> Iterator[Connection]:
    """One transaction; a database that cannot be reached, or loses the commit, is transient."""
    try:
        with engine.begin() as connection:
            yield connection
    except (DBAPIError, PoolTimeout) as error:
        if not _unavailable(error):
            raise
        raise PhotoError(
            ErrorCode.DATABASE_UNAVAILABLE, type(getattr(error, "orig", error)).__name__
        ) from error


def _unavailable(error: DBAPIError | PoolTimeout) -> bool:
    if isinstance(error, PoolTimeout | OperationalError) or error.connection_invalidated:
        return True
    sqlstate = getattr(error.orig, "sqlstate", None) or ""
    return sqlstate[:2] in _TRANSIENT_SQLSTATE_CLASSES or sqlstate == _LOCK_NOT_AVAILABLE
