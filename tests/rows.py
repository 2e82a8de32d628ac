"""What the database says of a photo, for assertions: its state, its job, its published flag."""

from __future__ import annotations

from collections.abc import Callable
from uuid import UUID

from sqlalchemy import Engine, select

from photo_publish.adapters.models import Photo, PhotoJob


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
