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

from sqlalchemy import Engine, Text, and_, case, false, func, literal, not_, or_, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker

from photo_publish.contracts import (
    PHOTO_PUBLISHED,
    PhotoPublishedPayload,
    Placeholder,
    PublishedVariants,
    VariantRef,
)
from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.keys import Upload
from photo_publish.models import OutboxEvent, Photo, PhotoJob, PhotoVariant

# A second's tolerance for the clocks of the queue and the database (SPEC 5).
CLOCK_TOLERANCE = timedelta(seconds=1)
# S3 orders the uploads of a key by their sequencers, hex strings of varying length compared after
# padding the shorter with zeros: stored padded, text order is upload order.
_SEQUENCER_WIDTH = 40


@dataclass(frozen=True, slots=True)
class PhotoRow:
    id: UUID
    album_id: UUID
    original_key: str
    processing_state: str
    # The job's last worker died holding it: its claim is stale, or the sweep took it back.
    worker_lost: bool = False


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
class OwedDeadLetter:
    """A final failure's dead letter that the queue has not accepted yet, now this caller's to send."""

    photo_id: UUID
    attempt: int
    code: ErrorCode


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
    outcome: Literal["published", "already", "skipped", "superseded"]
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

    def get_photo(self, photo_id: UUID, *, stale_after: int) -> PhotoRow | None:
        worker_lost = or_(
            and_(
                PhotoJob.status == "active", PhotoJob.claimed_at < func.now() - timedelta(seconds=stale_after)
            ),
            and_(PhotoJob.status == "pending", PhotoJob.last_error_code == ErrorCode.WORKER_LOST.value),
        )
        with self._transaction() as session:
            row = session.execute(
                select(
                    Photo.id,
                    Photo.album_id,
                    Photo.original_key,
                    Photo.processing_state,
                    func.coalesce(worker_lost, false()),
                )
                .outerjoin(PhotoJob, PhotoJob.photo_id == Photo.id)
                .where(Photo.id == photo_id)
            ).one_or_none()
        return None if row is None else PhotoRow(*row)

    def ensure_job(self, photo_id: UUID, *, upload: Upload | None = None) -> None:
        """Create the photo's job if the photo exists; a newer upload of its original reopens a failed job.

        The job keeps the newest upload that reached it: a duplicate of an event, or its redelivery
        after a crash, announces the same upload and reopens nothing (an input that crashes its
        worker would otherwise loop: worker lost, dead letter, reopened, ...). An upload older than
        the one seen (S3 delivers out of order) changes nothing either.
        """
        if upload is None:
            stmt = insert(PhotoJob).from_select(["photo_id"], select(Photo.id).where(Photo.id == photo_id))
            with self._transaction() as session:
                session.execute(stmt.on_conflict_do_nothing(index_elements=[PhotoJob.photo_id]))
            return

        padded = None if upload.sequencer is None else upload.sequencer.rjust(_SEQUENCER_WIDTH, "0")
        sequencer, etag = literal(padded, Text), literal(upload.etag, Text)
        stmt = insert(PhotoJob).from_select(
            ["photo_id", "upload_sequencer", "upload_etag"],
            select(Photo.id, sequencer, etag).where(Photo.id == photo_id),
        )
        older = func.coalesce(PhotoJob.upload_sequencer > sequencer, false())
        seen = and_(
            PhotoJob.upload_sequencer.is_not_distinct_from(sequencer),
            PhotoJob.upload_etag.is_not_distinct_from(etag),
        )
        reopen = PhotoJob.status == "failed"
        stmt = stmt.on_conflict_do_update(
            index_elements=[PhotoJob.photo_id],
            set_={
                "status": case((reopen, "pending"), else_=PhotoJob.status),
                "attempt": case((reopen, 0), else_=PhotoJob.attempt),
                "next_retry_at": case((reopen, None), else_=PhotoJob.next_retry_at),
                "upload_sequencer": sequencer,
                "upload_etag": etag,
                "updated_at": func.now(),
            },
            where=and_(not_(older), not_(seen)),
        )
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
        placeholder: Placeholder,
    ) -> PublishResult:
        """SPEC 4.1: variants, publication and outbox event in one transaction, all or nothing.

        Fenced first: only the worker that holds the job's claimed attempt may publish, so a worker
        whose job was taken over changes nothing (its job row is locked before the photo's, the
        order every transaction here takes them in).
        """
        with self._transaction() as session:
            if not self._finish_job(session, photo_id, attempt, "done"):
                exists = session.scalar(select(Photo.id).where(Photo.id == photo_id)) is not None
                return PublishResult("superseded" if exists else "skipped")
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
                    thumbhash=placeholder.thumbhash,
                    average_color=placeholder.average_color,
                    updated_at=func.now(),
                )
                .returning(Photo.album_id, Photo.entity_version, Photo.published_at)
                .execution_options(synchronize_session=False)
            ).one_or_none()

            if published is None:
                # Zero rows: published already (by a worker of an earlier claim), or deleted.
                exists = session.scalar(select(Photo.id).where(Photo.id == photo_id)) is not None
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
                placeholder=placeholder,
            )
            session.add(
                OutboxEvent(
                    aggregate_type="photo",
                    aggregate_id=photo_id,
                    event_type=PHOTO_PUBLISHED,
                    payload=payload.to_json(),
                )
            )
        return PublishResult("published", payload)

    def holds(self, photo_id: UUID, attempt: int) -> bool:
        """The worker's claim still stands and the photo is not published: its variants may be written.

        Asked before the variant objects are written, because they carry an immutable Cache-Control:
        a published photo's objects are never written again.
        """
        with self._transaction() as session:
            return (
                session.scalar(
                    select(PhotoJob.photo_id)
                    .join(Photo, Photo.id == PhotoJob.photo_id)
                    .where(
                        PhotoJob.photo_id == photo_id,
                        PhotoJob.status == "active",
                        PhotoJob.attempt == attempt,
                        Photo.processing_state != "ready",
                    )
                )
                is not None
            )

    def fail(self, photo_id: UUID, attempt: int, code: ErrorCode, *, final: bool = False) -> bool:
        """Job `failed`, photo `processing_failed` (never a published one); False if fenced out.

        A final failure also records that its dead letter is owed, in the same transaction: whoever
        sends it clears that, and if nobody does, a redelivery or the sweep finds it owed.
        """
        owed = {"dead_letter_owed_at": func.now()} if final else {}
        with self._transaction() as session:
            if not self._finish_job(session, photo_id, attempt, "failed", code, **owed):
                return False
            session.execute(
                update(Photo)
                .where(Photo.id == photo_id, Photo.processing_state != "ready")
                .values(processing_state="processing_failed", error_code=code.value, updated_at=func.now())
                .execution_options(synchronize_session=False)
            )
        return True

    def take_owed_dead_letter(self, photo_id: UUID, *, lease_seconds: int) -> OwedDeadLetter | float | None:
        """The job's owed dead letter, leased to the caller; else the seconds until it may be taken
        (its lease, or its first sender, still holds it), or None when no letter is owed."""
        leased = PhotoJob.dead_letter_owed_at < func.now() - timedelta(seconds=lease_seconds)
        with self._transaction() as session:
            row = session.execute(
                update(PhotoJob)
                .where(PhotoJob.photo_id == photo_id, leased)
                .values(dead_letter_owed_at=func.now())
                .returning(PhotoJob.attempt, PhotoJob.last_error_code)
            ).one_or_none()
            if row is not None:
                return OwedDeadLetter(photo_id, row.attempt, ErrorCode(row.last_error_code))
            wait = session.scalar(
                select(
                    func.extract(
                        "epoch",
                        PhotoJob.dead_letter_owed_at + timedelta(seconds=lease_seconds) - func.now(),
                    )
                ).where(PhotoJob.photo_id == photo_id, PhotoJob.dead_letter_owed_at.is_not(None))
            )
        return None if wait is None else max(float(wait), 0.0)

    def dead_letter_sent(self, photo_ids: Sequence[UUID]) -> None:
        """The queue accepted these jobs' dead letters: nothing is owed any more."""
        if photo_ids:
            with self._transaction() as session:
                session.execute(
                    update(PhotoJob).where(PhotoJob.photo_id.in_(photo_ids)).values(dead_letter_owed_at=None)
                )

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
# (serialization failure, deadlock), insufficient resources, operator intervention (shutdown, and
# statement_timeout's query_canceled).
_TRANSIENT_SQLSTATE_CLASSES = frozenset({"08", "40", "53", "57"})
# lock_timeout: a row held by a stuck transaction (idle_in_transaction_session_timeout ends it).
_LOCK_NOT_AVAILABLE = "55P03"


def _unavailable(error: DBAPIError | PoolTimeout) -> bool:
    if isinstance(error, PoolTimeout | OperationalError) or error.connection_invalidated:
        return True
    sqlstate = getattr(error.orig, "sqlstate", None) or ""
    return sqlstate[:2] in _TRANSIENT_SQLSTATE_CLASSES or sqlstate == _LOCK_NOT_AVAILABLE
