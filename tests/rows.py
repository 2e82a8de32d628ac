"""What the database says of a photo, for assertions: its state, its job, its published flag."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar
from uuid import UUID

from sqlalchemy import Connection, Engine, create_engine, func, select, text

from photo_publish.adapters.models import Photo, PhotoJob
from photo_publish.adapters.unit_of_work import unit_of_work

P = ParamSpec("P")
T = TypeVar("T")


def committed(
    db: Engine, statements: Callable[Concatenate[Connection, P], T], *args: P.args, **kwargs: P.kwargs
) -> T:
    """`statements` (a transition, a query) run in a unit of work of their own, and committed."""
    with unit_of_work(db) as connection:
        return statements(connection, *args, **kwargs)


def photo(db: Engine, photo_id: UUID) -> tuple[str, str | None, int]:
    """(processing_state, error_code, entity_version)"""
    with db.connect() as c:
        row = c.execute(
            select(Photo.processing_state, Photo.error_code, Photo.entity_version).where(Photo.id == photo_id)
        ).one()
    return row.processing_state, row.error_code, row.entity_version


def job(db: Engine, photo_id: UUID) -> tuple[str, int, str | None]:
    """(status, attempt, last_error_code)"""
    with db.connect() as c:
        row = c.execute(
            select(PhotoJob.status, PhotoJob.attempt, PhotoJob.last_error_code).where(
                PhotoJob.photo_id == photo_id
            )
        ).one()
    return row.status, row.attempt, row.last_error_code


def published(db: Engine, photo_id: UUID) -> Callable[[], bool]:
    return lambda: photo(db, photo_id)[0] == "ready"


def in_state(**values: object) -> dict[str, object]:
    """A test's direct write of a job's status, completed with what the table requires of that
    status (SPEC 16's CHECKs): a claim time on an active job, a failure's time and code on a failed
    one, nothing left over from another state. Given columns win."""
    status = values.get("status")
    if status is None:
        return values
    shape: dict[str, object] = {
        "claimed_at": func.now() if status == "active" else None,
        "failed_at": func.now() if status == "failed" else None,
    }
    if status == "failed":
        shape["last_error_code"] = "UNEXPECTED_ERROR"
    else:
        shape["dead_letter_owed_at"] = None
    if status != "pending":
        shape |= {"next_retry_at": None, "enqueued_at": None}
    return shape | values


def scalar_at(url: str, sql: str, **parameters: Any) -> Any:
    """One value from the database at `url` (another than the tests' own), on a connection of its own."""
    from photo_publish.adapters.database import sqlalchemy_url

    engine = create_engine(sqlalchemy_url(url))
    try:
        with engine.connect() as connection:
            return connection.scalar(text(sql), parameters)
    finally:
        engine.dispose()
