"""Every statement the process function runs, each method one short transaction.

The photo's publication is gated by one conditional UPDATE (only one concurrent worker can win it),
and every transition of a job out of `active` is conditioned on the attempt its worker claimed
(the fencing token), so a worker whose job was taken over changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal
from uuid import UUID

from sqlalchemy import Engine, and_, case, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker

from photo_publish.contracts import PHOTO_PUBLISHED, PhotoPublishedPayload, PublishedVariants, VariantRef
from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.models import OutboxEvent, Photo, PhotoJob, PhotoVariant

# A second's tolerance for the clocks of the queue and the database (SPEC 5).
CLOCK_TOLERANCE = timedelta(seconds=1)


@dataclass(frozen=True, slots=True)
class PhotoRow:
    id: UUID
    album_id: UUID
    original_key: str
    processing_state: str


@dataclass(frozen=True, slots=True)
class Claimed:
    attempt: int


@dataclass(frozen=True, slots=True)
class NotClaimable:
    """The job is finished (retry_in None) or belongs to another delivery for retry_in seconds."""

    status: str
    retry_in: float | None


@dataclass(frozen=True, slots=True)
class Exhausted:
    """A stale active job with no attempts left: its worker died holding the last one."""

    attempt: int


ClaimResult = Claimed | NotClaimable | Exhausted | None


@dataclass(frozen=True, slots=True)
class StoredVariant:
    kind: Literal["thumb", "browse"]
    key: str
    width: int
    height: int
    size: int
    content_type: str


@dataclass(frozen=True, slots=True)
class PublishResult:
    outcome: Literal["published", "already", "skipped"]
    payload: PhotoPublishedPayload | None = None


class PhotoRepository:
    def __init__(self, engine: Engine) -> None:
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @contextmanager
    def _transaction(self) -> Iterator[Session]:
        """One transaction; a database that cannot be reached, or loses the commit, is transient."""
        try:
            with self._sessions.begin() as session:
                yield session
        except (DBAPIError, PoolTimeout) as error:
            if not _unavailable(error):
                raise
            raise PhotoError(
                ErrorCode.DATABASE_UNAVAILABLE, type(getattr(error, "orig", error)).__name__
            ) from error

    def get_photo(self, photo_id: UUID) -> PhotoRow | None:
        with self._transaction() as session:
            row = session.execute(
                select(Photo.id, Photo.album_id, Photo.original_key, Photo.processing_state).where(
                    Photo.id == photo_id
                )
            ).one_or_none()
        return None if row is None else PhotoRow(*row)

    def ensure_job(self, photo_id: UUID, *, reopen_failed: bool) -> None:
        """Create the photo's job if the photo exists; an upload of its original reopens a failed job."""
        stmt = insert(PhotoJob).from_select(["photo_id"], select(Photo.id).where(Photo.id == photo_id))
        if reopen_failed:
            stmt = stmt.on_conflict_do_update(
                index_elements=[PhotoJob.photo_id],
                set_={"status": "pending", "attempt": 0, "next_retry_at": None, "updated_at": func.now()},
                where=PhotoJob.status == "failed",
            )
        else:
            stmt = stmt.on_conflict_do_nothing(index_elements=[PhotoJob.photo_id])
        with self._transaction() as session:
            session.execute(stmt)

    def claim(self, photo_id: UUID, *, stale_after: int, max_attempts: int) -> ClaimResult:
        """One conditional UPDATE: a due pending job, or a stale active one with attempts left."""
        now = func.now()
        stale = PhotoJob.claimed_at < now - timedelta(seconds=stale_after)
        claimable = or_(
            and_(
                PhotoJob.status == "pending",
                or_(PhotoJob.next_retry_at.is_(None), PhotoJob.next_retry_at <= now + CLOCK_TOLERANCE),
            ),
            and_(PhotoJob.status == "active", stale, PhotoJob.attempt < max_attempts),
        )
        with self._transaction() as session:
            attempt = session.scalar(
                update(PhotoJob)
                .where(PhotoJob.photo_id == photo_id, claimable)
                .values(
                    status="active",
                    attempt=PhotoJob.attempt + 1,
                    claimed_at=now,
                    next_retry_at=None,
                    updated_at=now,
                )
                .returning(PhotoJob.attempt)
            )
            if attempt is not None:
                return Claimed(attempt)
            # Not claimed: read why, only to answer the delivery (nothing is written on this read).
            due_at = case(
                (PhotoJob.status == "pending", PhotoJob.next_retry_at),
                (PhotoJob.status == "active", PhotoJob.claimed_at + timedelta(seconds=stale_after)),
            )
            row = session.execute(
                select(PhotoJob.status, PhotoJob.attempt, func.extract("epoch", due_at - now)).where(
                    PhotoJob.photo_id == photo_id
                )
            ).one_or_none()
        if row is None:
            return None
        status, attempt, retry_in = row
        if status == "active" and attempt >= max_attempts and retry_in is not None and retry_in <= 0:
            return Exhausted(attempt)
        if status in ("done", "failed"):
            return NotClaimable(status, None)
        return NotClaimable(status, max(float(retry_in or 0), 0.0))

    def mark_done(self, photo_id: UUID) -> None:
        """The photo is already published: nothing is left for its job to do."""
        with self._transaction() as session:
            session.execute(
                update(PhotoJob)
                .where(PhotoJob.photo_id == photo_id, PhotoJob.status != "done")
                .values(status="done", next_retry_at=None, updated_at=func.now())
            )

    def publish(
        self,
        photo_id: UUID,
        attempt: int,
        *,
        width: int,
        height: int,
        variants: Sequence[StoredVariant],
        variant_version: int,
    ) -> PublishResult:
        """SPEC 4.1: variants, publication and outbox event in one transaction, all or nothing."""
        with self._transaction() as session:
            published = session.execute(
                update(Photo)
                .where(Photo.id == photo_id, Photo.processing_state.in_(("uploaded", "processing_failed")))
                .values(
                    processing_state="ready",
                    visibility="published",
                    published_at=func.now(),
                    width=width,
                    height=height,
                    error_code=None,
                    entity_version=Photo.entity_version + 1,
                    updated_at=func.now(),
                )
                .returning(Photo.album_id, Photo.entity_version, Photo.published_at)
                .execution_options(synchronize_session=False)
            ).one_or_none()

            if published is None:
                # Zero rows: a concurrent winner published it (ready), or the photo was deleted.
                exists = session.scalar(select(Photo.id).where(Photo.id == photo_id)) is not None
                self._finish_job(session, photo_id, attempt, "done")
                return PublishResult("already" if exists else "skipped")

            album_id, entity_version, published_at = published
            assert published_at is not None  # set by the UPDATE above
            stmt = insert(PhotoVariant).values(
                [
                    {
                        "photo_id": photo_id,
                        "kind": v.kind,
                        "storage_key": v.key,
                        "width": v.width,
                        "height": v.height,
                        "bytes": v.size,
                        "content_type": v.content_type,
                        "variant_version": variant_version,
                    }
                    for v in variants
                ]
            )
            session.execute(
                stmt.on_conflict_do_update(
                    index_elements=[PhotoVariant.photo_id, PhotoVariant.kind],
                    set_={
                        "storage_key": stmt.excluded.storage_key,
                        "width": stmt.excluded.width,
                        "height": stmt.excluded.height,
                        "bytes": stmt.excluded.bytes,
                        "content_type": stmt.excluded.content_type,
                        "variant_version": stmt.excluded.variant_version,
                        "updated_at": func.now(),
                    },
                )
            )
            refs = {
                v.kind: VariantRef(
                    key=v.key, width=v.width, height=v.height, size=v.size, content_type=v.content_type
                )
                for v in variants
            }
            payload = PhotoPublishedPayload(
                photo_id=photo_id,
                album_id=album_id,
                entity_version=entity_version,
                published_at=published_at,
                width=width,
                height=height,
                variants=PublishedVariants(**refs),
            )
            session.add(
                OutboxEvent(
                    aggregate_type="photo",
                    aggregate_id=photo_id,
                    event_type=PHOTO_PUBLISHED,
                    payload=payload.to_json(),
                )
            )
            self._finish_job(session, photo_id, attempt, "done")
        return PublishResult("published", payload)

    def fail(self, photo_id: UUID, attempt: int, code: ErrorCode) -> bool:
        """Job `failed`, photo `processing_failed` (never a published one); False if fenced out."""
        with self._transaction() as session:
            if not self._finish_job(session, photo_id, attempt, "failed", code):
                return False
            session.execute(
                update(Photo)
                .where(Photo.id == photo_id, Photo.processing_state != "ready")
                .values(processing_state="processing_failed", error_code=code.value, updated_at=func.now())
                .execution_options(synchronize_session=False)
            )
        return True

    def release(self, photo_id: UUID, attempt: int, code: ErrorCode, retry_in: int) -> bool:
        """Back to `pending`, not claimable for `retry_in` seconds; False if fenced out."""
        with self._transaction() as session:
            return self._finish_job(
                session,
                photo_id,
                attempt,
                "pending",
                code,
                next_retry_at=func.now() + timedelta(seconds=retry_in),
            )

    @staticmethod
    def _finish_job(
        session: Session,
        photo_id: UUID,
        attempt: int,
        status: str,
        code: ErrorCode | None = None,
        **values: object,
    ) -> bool:
        """A transition out of `active`, fenced by the attempt its worker claimed."""
        result = session.execute(
            update(PhotoJob)
            .where(PhotoJob.photo_id == photo_id, PhotoJob.status == "active", PhotoJob.attempt == attempt)
            .values(
                status=status,
                last_error_code=code.value if code else PhotoJob.last_error_code,
                updated_at=func.now(),
                **({"next_retry_at": None} | values),
            )
            .returning(PhotoJob.photo_id)
        )
        return result.first() is not None


# SQLSTATE classes a later attempt can outlive: connection exception, transaction rollback
# (serialization failure, deadlock), insufficient resources, operator intervention (shutdown).
_TRANSIENT_SQLSTATE_CLASSES = frozenset({"08", "40", "53", "57"})


def _unavailable(error: DBAPIError | PoolTimeout) -> bool:
    if isinstance(error, PoolTimeout | OperationalError) or error.connection_invalidated:
        return True
    sqlstate = getattr(error.orig, "sqlstate", None) or ""
    return sqlstate[:2] in _TRANSIENT_SQLSTATE_CLASSES
