"""Every statement the process function runs, each method one short transaction.

The photo's publication is gated by one conditional UPDATE (only one concurrent worker can win it),
and every transition of a job out of `active` is conditioned on the attempt its worker claimed
(the fencing token), so a worker whose job was taken over changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any, Literal
from uuid import UUID

from sqlalchemy import (
    Connection,
    DateTime,
    Engine,
    Text,
    and_,
    case,
    false,
    func,
    literal,
    not_,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from photo_publish.adapters.tables import (
    outbox_events,
    photo_jobs,
    photo_variants,
    photos,
    retired_variants,
    variant_recipes,
)
from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.image.recipes import Recipe, mismatch
from photo_publish.keys import Upload
from photo_publish.outbox.contracts import (
    PHOTO_FAILED,
    PHOTO_PUBLISHED,
    PHOTO_VARIANTS_UPDATED,
    PhotoFailedPayload,
    PhotoPublishedPayload,
    Placeholder,
    PublishedVariants,
    VariantRef,
)

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
    # The recipe version of its published variants, and a backfill's mark on its job.
    variant_version: int | None = None
    rerender_to: int | None = None
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
    outcome: Literal["published", "rerendered", "already", "skipped", "superseded"]
    payload: PhotoPublishedPayload | None = None


class PhotoRepository:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        """One transaction; a database that cannot be reached, or loses the commit, is transient."""
        try:
            with self._engine.begin() as connection:
                yield connection
        except (DBAPIError, PoolTimeout) as error:
            if not _unavailable(error):
                raise
            raise PhotoError(
                ErrorCode.DATABASE_UNAVAILABLE, type(getattr(error, "orig", error)).__name__
            ) from error

    def ensure_recipe(self, version: int, recipe: Recipe) -> None:
        """Record `version` as `recipe` if it is new; raise RecipeMismatch if it is another's."""
        with self._transaction() as connection:
            connection.execute(
                insert(variant_recipes)
                .values(version=version, fingerprint=recipe.fingerprint, recipe=asdict(recipe))
                .on_conflict_do_nothing(index_elements=[variant_recipes.c.version])
            )
            recorded = connection.execute(
                select(variant_recipes.c.fingerprint, variant_recipes.c.recipe).where(
                    variant_recipes.c.version == version
                )
            ).one()
        if refusal := mismatch(version, recorded.fingerprint, recorded.recipe, recipe):
            raise refusal

    def get_photo(self, photo_id: UUID, *, stale_after: int) -> PhotoRow | None:
        worker_lost = or_(
            and_(
                photo_jobs.c.status == "active",
                photo_jobs.c.claimed_at < func.now() - timedelta(seconds=stale_after),
            ),
            and_(
                photo_jobs.c.status == "pending", photo_jobs.c.last_error_code == ErrorCode.WORKER_LOST.value
            ),
        )
        with self._transaction() as connection:
            row = connection.execute(
                select(
                    photos.c.id,
                    photos.c.album_id,
                    photos.c.original_key,
                    photos.c.processing_state,
                    photos.c.variant_version,
                    photo_jobs.c.rerender_to,
                    func.coalesce(worker_lost, false()),
                )
                .outerjoin(photo_jobs, photo_jobs.c.photo_id == photos.c.id)
                .where(photos.c.id == photo_id)
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
            stmt = insert(photo_jobs).from_select(
                ["photo_id"], select(photos.c.id).where(photos.c.id == photo_id)
            )
            with self._transaction() as connection:
                connection.execute(stmt.on_conflict_do_nothing(index_elements=[photo_jobs.c.photo_id]))
            return

        padded = None if upload.sequencer is None else upload.sequencer.rjust(_SEQUENCER_WIDTH, "0")
        sequencer, etag = literal(padded, Text), literal(upload.etag, Text)
        at = literal(upload.at, DateTime(timezone=True))
        stmt = insert(photo_jobs).from_select(
            ["photo_id", "upload_sequencer", "upload_etag"],
            select(photos.c.id, sequencer, etag).where(photos.c.id == photo_id),
        )
        older = func.coalesce(photo_jobs.c.upload_sequencer > sequencer, false())
        seen = and_(
            photo_jobs.c.upload_sequencer.is_not_distinct_from(sequencer),
            photo_jobs.c.upload_etag.is_not_distinct_from(etag),
        )
        # New against what failed: by S3's order where both uploads have a sequencer, else by eTag,
        # else (the job saw no upload: it ran from job messages) by time: only an upload after the
        # failure is new proof that the original exists.
        newer = case(
            (
                and_(sequencer.is_not(None), photo_jobs.c.upload_sequencer.is_not(None)),
                sequencer > photo_jobs.c.upload_sequencer,
            ),
            (
                and_(etag.is_not(None), photo_jobs.c.upload_etag.is_not(None)),
                etag != photo_jobs.c.upload_etag,
            ),
            (and_(at.is_not(None), photo_jobs.c.failed_at.is_not(None)), at > photo_jobs.c.failed_at),
            else_=true(),
        )
        reopen = and_(photo_jobs.c.status == "failed", newer)
        stmt = stmt.on_conflict_do_update(
            index_elements=[photo_jobs.c.photo_id],
            set_={
                "status": case((reopen, "pending"), else_=photo_jobs.c.status),
                "attempt": case((reopen, 0), else_=photo_jobs.c.attempt),
                "next_retry_at": case((reopen, None), else_=photo_jobs.c.next_retry_at),
                # A letter still owed for the failure this upload replaces is dropped with it: the
                # photo has its attempts again (and the letter, read with the job's next code, would
                # page for whatever happens next, even a permanent failure).
                "dead_letter_owed_at": case((reopen, None), else_=photo_jobs.c.dead_letter_owed_at),
                "upload_sequencer": sequencer,
                "upload_etag": etag,
                "updated_at": func.now(),
            },
            where=and_(not_(older), not_(seen)),
        )
        with self._transaction() as connection:
            connection.execute(stmt)

    def claim(self, photo_id: UUID, *, stale_after: int, max_attempts: int) -> ClaimResult:
        """One conditional UPDATE: a due pending job, or a stale active one with attempts left."""
        now = func.now()
        stale = photo_jobs.c.claimed_at < now - timedelta(seconds=stale_after)
        claimable = or_(
            and_(
                photo_jobs.c.status == "pending",
                or_(
                    photo_jobs.c.next_retry_at.is_(None), photo_jobs.c.next_retry_at <= now + CLOCK_TOLERANCE
                ),
            ),
            and_(photo_jobs.c.status == "active", stale, photo_jobs.c.attempt < max_attempts),
        )
        with self._transaction() as connection:
            attempt = connection.scalar(
                update(photo_jobs)
                .where(photo_jobs.c.photo_id == photo_id, claimable)
                .values(
                    status="active",
                    attempt=photo_jobs.c.attempt + 1,
                    claimed_at=now,
                    next_retry_at=None,
                    updated_at=now,
                )
                .returning(photo_jobs.c.attempt)
            )
            if attempt is not None:
                return Claimed(attempt)
            # Not claimed: read why, only to answer the delivery (nothing is written on this read).
            due_at = case(
                (photo_jobs.c.status == "pending", photo_jobs.c.next_retry_at),
                (photo_jobs.c.status == "active", photo_jobs.c.claimed_at + timedelta(seconds=stale_after)),
            )
            row = connection.execute(
                select(photo_jobs.c.status, photo_jobs.c.attempt, func.extract("epoch", due_at - now)).where(
                    photo_jobs.c.photo_id == photo_id
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
        with self._transaction() as connection:
            connection.execute(
                update(photo_jobs)
                .where(photo_jobs.c.photo_id == photo_id, photo_jobs.c.status != "done")
                .values(status="done", next_retry_at=None, rerender_to=None, updated_at=func.now())
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
        with self._transaction() as connection:
            # Done, and no re-render owed: the variants are at the version this worker renders.
            if not self._finish_job(connection, photo_id, attempt, "done", rerender_to=None):
                return PublishResult(self._superseded_or_skipped(connection, photo_id))
            published = connection.execute(
                update(photos)
                .where(
                    photos.c.id == photo_id, photos.c.processing_state.in_(("uploaded", "processing_failed"))
                )
                .values(
                    processing_state="ready",
                    visibility="published",
                    published_at=func.now(),
                    error_code=None,
                    **_rendition(width, height, variant_version, placeholder),
                )
                .returning(photos.c.album_id, photos.c.entity_version, photos.c.published_at)
            ).one_or_none()
            if published is None:
                # Zero rows: published already (by a worker of an earlier claim), or deleted.
                exists = connection.scalar(select(photos.c.id).where(photos.c.id == photo_id)) is not None
                return PublishResult("already" if exists else "skipped")
            self._store_variants(connection, photo_id, variants, variant_version)
            payload = self._append_event(
                connection,
                PHOTO_PUBLISHED,
                photo_id,
                published,
                width=width,
                height=height,
                variants=variants,
                placeholder=placeholder,
            )
        return PublishResult("published", payload)

    def replace_variants(
        self,
        photo_id: UUID,
        attempt: int,
        *,
        width: int,
        height: int,
        variants: Sequence[StoredVariant],
        variant_version: int,
        placeholder: Placeholder,
        retire_after: timedelta,
    ) -> PublishResult:
        """SPEC 14: a published photo's variants re-rendered at a newer recipe, in one transaction.

        The photo's new rows, its version bump and photo.variants_updated, or nothing. The objects
        of the version it replaces are retired, to be deleted after `retire_after`: clients and
        caches may still hold their keys.
        """
        with self._transaction() as connection:
            # Done, and no re-render owed: the variants are at the version this worker renders.
            if not self._finish_job(connection, photo_id, attempt, "done", rerender_to=None):
                return PublishResult(self._superseded_or_skipped(connection, photo_id))
            replaced = connection.execute(
                update(photos)
                .where(
                    photos.c.id == photo_id,
                    photos.c.processing_state == "ready",
                    # Published at this version meanwhile (a new upload's own render): nothing to do.
                    func.coalesce(photos.c.variant_version, 0) < variant_version,
                )
                .values(**_rendition(width, height, variant_version, placeholder))
                .returning(photos.c.album_id, photos.c.entity_version, photos.c.published_at)
            ).one_or_none()
            if replaced is None:
                exists = connection.scalar(select(photos.c.id).where(photos.c.id == photo_id)) is not None
                return PublishResult("already" if exists else "skipped")
            new_keys = [v.key for v in variants]
            old_keys = connection.scalars(
                select(photo_variants.c.storage_key).where(
                    photo_variants.c.photo_id == photo_id, photo_variants.c.storage_key.not_in(new_keys)
                )
            ).all()
            if old_keys:
                connection.execute(
                    insert(retired_variants)
                    .values(
                        [
                            {
                                "storage_key": key,
                                "photo_id": photo_id,
                                "delete_after": func.now() + retire_after,
                            }
                            for key in old_keys
                        ]
                    )
                    .on_conflict_do_nothing(index_elements=[retired_variants.c.storage_key])
                )
            self._store_variants(connection, photo_id, variants, variant_version)
            payload = self._append_event(
                connection,
                PHOTO_VARIANTS_UPDATED,
                photo_id,
                replaced,
                width=width,
                height=height,
                variants=variants,
                placeholder=placeholder,
            )
        return PublishResult("rerendered", payload)

    @staticmethod
    def _superseded_or_skipped(connection: Connection, photo_id: UUID) -> Literal["superseded", "skipped"]:
        """A fenced-out transition: another claim owns the job, or the photo (and its job) is gone."""
        exists = connection.scalar(select(photos.c.id).where(photos.c.id == photo_id)) is not None
        return "superseded" if exists else "skipped"

    @staticmethod
    def _store_variants(
        connection: Connection, photo_id: UUID, variants: Sequence[StoredVariant], variant_version: int
    ) -> None:
        stmt = insert(photo_variants).values(
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
        connection.execute(
            stmt.on_conflict_do_update(
                index_elements=[photo_variants.c.photo_id, photo_variants.c.kind],
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

    @staticmethod
    def _append_event(
        connection: Connection,
        event_type: str,
        photo_id: UUID,
        photo: Any,
        *,
        width: int,
        height: int,
        variants: Sequence[StoredVariant],
        placeholder: Placeholder,
    ) -> PhotoPublishedPayload:
        """The outbox row of a publication or a re-render: the same payload (SPEC 14)."""
        album_id, entity_version, published_at = photo
        assert published_at is not None  # set when the photo was published
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
        connection.execute(
            insert(outbox_events).values(
                aggregate_type="photo",
                aggregate_id=photo_id,
                event_type=event_type,
                payload=payload.to_json(),
            )
        )
        return payload

    def holds(self, photo_id: UUID, attempt: int, variant_version: int) -> bool:
        """The worker's claim still stands and the photo has no variants at this version yet: they
        may be written.

        Asked before the variant objects are written, because they carry an immutable Cache-Control:
        a published version's objects are never written again (a re-render writes a newer version's).
        """
        with self._transaction() as connection:
            return (
                connection.scalar(
                    select(photo_jobs.c.photo_id)
                    .join(photos, photos.c.id == photo_jobs.c.photo_id)
                    .where(
                        photo_jobs.c.photo_id == photo_id,
                        photo_jobs.c.status == "active",
                        photo_jobs.c.attempt == attempt,
                        or_(
                            photos.c.processing_state != "ready",
                            func.coalesce(photos.c.variant_version, 0) < variant_version,
                        ),
                    )
                )
                is not None
            )

    def fail(self, photo_id: UUID, attempt: int, code: ErrorCode, *, final: bool = False) -> bool:
        """Job `failed`, photo `processing_failed` (never a published one) with its `photo.failed`
        event; False if fenced out.

        A final failure also records that its dead letter is owed, in the same transaction: whoever
        sends it clears that, and if nobody does, a redelivery or the sweep finds it owed.
        """
        owed = {"dead_letter_owed_at": func.now()} if final else {}
        owed["failed_at"] = func.now()
        with self._transaction() as connection:
            if not self._finish_job(connection, photo_id, attempt, "failed", code, **owed):
                return False
            failed = connection.execute(
                update(photos)
                .where(photos.c.id == photo_id, photos.c.processing_state != "ready")
                .values(processing_state="processing_failed", error_code=code.value, updated_at=func.now())
                .returning(photos.c.album_id, photos.c.entity_version, photos.c.updated_at)
            ).one_or_none()
            # A published photo is not downgraded, and gets no event: only a photo marked failed does.
            if failed is not None:
                connection.execute(
                    insert(outbox_events).values(
                        failed_event(
                            photo_id,
                            album_id=failed.album_id,
                            entity_version=failed.entity_version,
                            code=code,
                            attempt=attempt,
                            failed_at=failed.updated_at,
                            final=final,
                        )
                    )
                )
        return True

    def take_owed_dead_letter(self, photo_id: UUID, *, lease_seconds: int) -> OwedDeadLetter | float | None:
        """The job's owed dead letter, leased to the caller; else the seconds until it may be taken
        (its lease, or its first sender, still holds it), or None when no letter is owed."""
        leased = photo_jobs.c.dead_letter_owed_at < func.now() - timedelta(seconds=lease_seconds)
        with self._transaction() as connection:
            row = connection.execute(
                update(photo_jobs)
                .where(photo_jobs.c.photo_id == photo_id, leased)
                .values(dead_letter_owed_at=func.now())
                .returning(photo_jobs.c.attempt, photo_jobs.c.last_error_code)
            ).one_or_none()
            if row is not None:
                return OwedDeadLetter(photo_id, row.attempt, ErrorCode(row.last_error_code))
            wait = connection.scalar(
                select(
                    func.extract(
                        "epoch",
                        photo_jobs.c.dead_letter_owed_at + timedelta(seconds=lease_seconds) - func.now(),
                    )
                ).where(photo_jobs.c.photo_id == photo_id, photo_jobs.c.dead_letter_owed_at.is_not(None))
            )
        return None if wait is None else max(float(wait), 0.0)

    def dead_letter_sent(self, photo_ids: Sequence[UUID]) -> None:
        """The queue accepted these jobs' dead letters: nothing is owed any more."""
        if photo_ids:
            with self._transaction() as connection:
                connection.execute(
                    update(photo_jobs)
                    .where(photo_jobs.c.photo_id.in_(photo_ids))
                    .values(dead_letter_owed_at=None)
                )

    def release(self, photo_id: UUID, attempt: int, code: ErrorCode, retry_in: int) -> bool:
        """Back to `pending`, not claimable for `retry_in` seconds; False if fenced out."""
        with self._transaction() as connection:
            return self._finish_job(
                connection,
                photo_id,
                attempt,
                "pending",
                code,
                next_retry_at=func.now() + timedelta(seconds=retry_in),
            )

    @staticmethod
    def _finish_job(
        connection: Connection,
        photo_id: UUID,
        attempt: int,
        status: str,
        code: ErrorCode | None = None,
        **values: object,
    ) -> bool:
        """A transition out of `active`, fenced by the attempt its worker claimed."""
        result = connection.execute(
            update(photo_jobs)
            .where(
                photo_jobs.c.photo_id == photo_id,
                photo_jobs.c.status == "active",
                photo_jobs.c.attempt == attempt,
            )
            .values(
                status=status,
                last_error_code=code.value if code else photo_jobs.c.last_error_code,
                updated_at=func.now(),
                **({"next_retry_at": None} | values),
            )
            .returning(photo_jobs.c.photo_id)
        )
        return result.first() is not None


def failed_event(
    photo_id: UUID,
    *,
    album_id: UUID,
    entity_version: int,
    code: ErrorCode,
    attempt: int,
    failed_at: datetime,
    final: bool,
) -> dict[str, Any]:
    """The outbox row of a photo marked `processing_failed` (SPEC 12), for that same transaction's insert."""
    payload = PhotoFailedPayload(
        photo_id=photo_id,
        album_id=album_id,
        entity_version=entity_version,
        error_code=code,
        kind="final" if final else "permanent",
        attempt=attempt,
        failed_at=failed_at,
    )
    return {
        "aggregate_type": "photo",
        "aggregate_id": photo_id,
        "event_type": PHOTO_FAILED,
        "payload": payload.to_json(),
    }


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


def _rendition(width: int, height: int, variant_version: int, placeholder: Placeholder) -> dict[str, Any]:
    """The photo's columns a render sets, publishing or re-rendering: its displayed size, its
    variants' version, its placeholder, and one version bump."""
    return {
        "width": width,
        "height": height,
        "variant_version": variant_version,
        "thumbhash": placeholder.thumbhash,
        "average_color": placeholder.average_color,
        "entity_version": photos.c.entity_version + 1,
        "updated_at": func.now(),
    }
