"""Typed ORM classes over the Core tables of `photo_publish.adapters.tables`, for the tools and the tests.

The functions do not import this module (their statements are Core, on a Connection): the ORM
stays out of their cold start. The columns are the tables'; the annotations only type them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy.orm import DeclarativeBase, Mapped

from photo_publish.adapters import tables


class Base(DeclarativeBase):
    metadata = tables.metadata


class Photo(Base):
    __table__ = tables.photos

    id: Mapped[UUID]
    album_id: Mapped[UUID]
    original_key: Mapped[str]
    processing_state: Mapped[str]
    visibility: Mapped[str]
    published_at: Mapped[datetime | None]
    width: Mapped[int | None]
    height: Mapped[int | None]
    error_code: Mapped[str | None]
    entity_version: Mapped[int]
    thumbhash: Mapped[str | None]
    average_color: Mapped[str | None]
    variant_version: Mapped[int | None]
    keep_location: Mapped[bool]
    owner: Mapped[str | None]
    taken_at: Mapped[datetime | None]
    taken_at_local: Mapped[datetime | None]
    camera_make: Mapped[str | None]
    camera_model: Mapped[str | None]
    lens_model: Mapped[str | None]
    f_number: Mapped[float | None]
    exposure_time: Mapped[float | None]
    iso: Mapped[int | None]
    focal_length: Mapped[float | None]
    latitude: Mapped[float | None]
    longitude: Mapped[float | None]
    altitude: Mapped[float | None]
    original_etag: Mapped[str | None]
    original_version: Mapped[str | None]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class PhotoVariant(Base):
    __table__ = tables.photo_variants

    photo_id: Mapped[UUID]
    kind: Mapped[str]
    storage_key: Mapped[str]
    width: Mapped[int]
    height: Mapped[int]
    bytes: Mapped[int]
    content_type: Mapped[str]
    variant_version: Mapped[int]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class PhotoJob(Base):
    __table__ = tables.photo_jobs

    photo_id: Mapped[UUID]
    status: Mapped[str]
    attempt: Mapped[int]
    next_retry_at: Mapped[datetime | None]
    claimed_at: Mapped[datetime | None]
    enqueued_at: Mapped[datetime | None]
    last_error_code: Mapped[str | None]
    dead_letter_owed_at: Mapped[datetime | None]
    upload_sequencer: Mapped[str | None]
    upload_etag: Mapped[str | None]
    upload_version: Mapped[str | None]
    attempt_version: Mapped[str | None]
    failed_at: Mapped[datetime | None]
    rerender_to: Mapped[int | None]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class VariantRecipe(Base):
    __table__ = tables.variant_recipes

    version: Mapped[int]
    fingerprint: Mapped[str]
    recipe: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]


class RetiredVariant(Base):
    __table__ = tables.retired_variants

    storage_key: Mapped[str]
    photo_id: Mapped[UUID]
    delete_after: Mapped[datetime]


class OutboxEvent(Base):
    __table__ = tables.outbox_events

    id: Mapped[UUID]
    aggregate_type: Mapped[str]
    aggregate_id: Mapped[UUID]
    event_type: Mapped[str]
    payload: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    published_at: Mapped[datetime | None]
    leased_until: Mapped[datetime | None]
