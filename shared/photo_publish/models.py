"""The tables of SPEC 4 as SQLAlchemy 2 typed models. The migrations create them; these read them."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import CheckConstraint, DateTime, ForeignKey, Index, Integer, Text, func, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from photo_publish.errors import ErrorCode

PROCESSING_STATES = ("uploaded", "ready", "processing_failed")
VISIBILITIES = ("unpublished", "published")
JOB_STATUSES = ("pending", "active", "done", "failed")
VARIANT_KINDS = ("thumb", "browse")


def one_of(column: str, values: tuple[str, ...] | list[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


ERROR_CODES = [code.value for code in ErrorCode]


class Base(DeclarativeBase):
    type_annotation_map = {datetime: DateTime(timezone=True), str: Text, dict[str, Any]: JSONB}  # noqa: RUF012 - SQLAlchemy reads it as is


class Photo(Base):
    __tablename__ = "photos"
    __table_args__ = (
        CheckConstraint(one_of("processing_state", PROCESSING_STATES), name="photos_processing_state_check"),
        CheckConstraint(one_of("visibility", VISIBILITIES), name="photos_visibility_check"),
        CheckConstraint(one_of("error_code", ERROR_CODES), name="photos_error_code_check"),
        CheckConstraint("average_color ~ '^#[0-9a-f]{6}$'", name="photos_average_color_check"),
    )

    id: Mapped[UUID] = mapped_column(primary_key=True)
    album_id: Mapped[UUID] = mapped_column(index=True)
    original_key: Mapped[str] = mapped_column(unique=True)
    processing_state: Mapped[str] = mapped_column(server_default=text("'uploaded'"))
    visibility: Mapped[str] = mapped_column(server_default=text("'unpublished'"))
    published_at: Mapped[datetime | None]
    width: Mapped[int | None]
    height: Mapped[int | None]
    error_code: Mapped[str | None]
    entity_version: Mapped[int] = mapped_column(server_default=text("1"))
    # The published picture's placeholder (migration 0006): base64 ThumbHash and "#rrggbb".
    thumbhash: Mapped[str | None]
    average_color: Mapped[str | None]
    # The recipe version of its published variants (migration 0007).
    variant_version: Mapped[int | None]
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())


class PhotoVariant(Base):
    __tablename__ = "photo_variants"
    __table_args__ = (CheckConstraint(one_of("kind", VARIANT_KINDS), name="photo_variants_kind_check"),)

    photo_id: Mapped[UUID] = mapped_column(ForeignKey("photos.id", ondelete="CASCADE"), primary_key=True)
    kind: Mapped[str] = mapped_column(primary_key=True)
    storage_key: Mapped[str]
    width: Mapped[int]
    height: Mapped[int]
    bytes: Mapped[int] = mapped_column(Integer)
    content_type: Mapped[str]
    variant_version: Mapped[int]
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())


class PhotoJob(Base):
    __tablename__ = "photo_jobs"
    __table_args__ = (
        CheckConstraint(one_of("status", JOB_STATUSES), name="photo_jobs_status_check"),
        CheckConstraint(one_of("last_error_code", ERROR_CODES), name="photo_jobs_last_error_code_check"),
        CheckConstraint("attempt >= 0", name="photo_jobs_attempt_check"),
        # The sweep's two scans (migration 0002): oldest due pending first, oldest active claim first.
        Index(
            "photo_jobs_pending_due_idx",
            text("coalesce(next_retry_at, created_at)"),
            postgresql_where=text("status = 'pending'"),
        ),
        Index("photo_jobs_active_claimed_idx", "claimed_at", postgresql_where=text("status = 'active'")),
        # Published photos marked for a re-render that the sweep has not sent yet (migration 0007).
        Index(
            "photo_jobs_rerender_idx",
            "photo_id",
            postgresql_where=text("rerender_to IS NOT NULL AND status = 'done'"),
        ),
        # Dead letters owed (migration 0003): the sweep finds them without reading finished jobs.
        Index(
            "photo_jobs_dead_letter_owed_idx",
            "dead_letter_owed_at",
            postgresql_where=text("dead_letter_owed_at IS NOT NULL"),
        ),
    )

    photo_id: Mapped[UUID] = mapped_column(ForeignKey("photos.id", ondelete="CASCADE"), primary_key=True)
    status: Mapped[str] = mapped_column(server_default=text("'pending'"))
    attempt: Mapped[int] = mapped_column(server_default=text("0"))
    next_retry_at: Mapped[datetime | None]
    claimed_at: Mapped[datetime | None]
    enqueued_at: Mapped[datetime | None]
    last_error_code: Mapped[str | None]
    # Set while a final failure's dead letter has not been accepted by the queue (SPEC 5).
    dead_letter_owed_at: Mapped[datetime | None]
    # The newest upload of the original that reached this job (S3's sequencer, zero-padded so that
    # text order is upload order, and its eTag).
    upload_sequencer: Mapped[str | None]
    upload_etag: Mapped[str | None]
    failed_at: Mapped[datetime | None]
    # A backfill's mark: re-render the published photo at this recipe version (SPEC 14).
    rerender_to: Mapped[int | None]
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())


class VariantRecipe(Base):
    """What VARIANT_VERSION `version` means: the fingerprint of everything that decides the bytes."""

    __tablename__ = "variant_recipes"
    __table_args__ = (CheckConstraint("version >= 1", name="variant_recipes_version_check"),)

    version: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    fingerprint: Mapped[str]
    recipe: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())


class RetiredVariant(Base):
    """A replaced version's object, deleted by the sweep once `delete_after` has passed."""

    __tablename__ = "retired_variants"
    __table_args__ = (Index("retired_variants_due_idx", "delete_after"),)

    storage_key: Mapped[str] = mapped_column(primary_key=True)
    photo_id: Mapped[UUID]
    delete_after: Mapped[datetime]


class OutboxEvent(Base):
    __tablename__ = "outbox_events"
    __table_args__ = (
        # A relay reads the unpublished events in order; published ones leave the index.
        Index("outbox_events_unpublished_idx", "created_at", postgresql_where=text("published_at IS NULL")),
        # Migration 0005: a photo's waiting events (the relay's per-photo order, the hand-off), and
        # the published rows past their retention.
        Index(
            "outbox_events_unpublished_photo_idx",
            "aggregate_id",
            "created_at",
            postgresql_where=text("published_at IS NULL"),
        ),
        Index(
            "outbox_events_published_idx", "published_at", postgresql_where=text("published_at IS NOT NULL")
        ),
    )

    id: Mapped[UUID] = mapped_column(primary_key=True, server_default=func.gen_random_uuid())
    aggregate_type: Mapped[str]
    aggregate_id: Mapped[UUID] = mapped_column(index=True)
    event_type: Mapped[str]
    payload: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    published_at: Mapped[datetime | None]
