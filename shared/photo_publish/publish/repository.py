"""The process function's transactions, each method one short one.

The job's and the photo's state change only through `photo_publish.jobs.machine`'s transitions:
the photo's publication is its one conditional UPDATE (only one concurrent worker can win it), and
every transition of a job out of `active` is conditioned on the attempt its worker claimed (the
fencing token), so a worker whose job was taken over changes nothing. Here: the reads that decide
what to do, and the publish transaction around its transitions (variants, outbox event).
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
    Engine,
    and_,
    case,
    false,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from photo_publish.adapters.tables import (
    photo_jobs,
    photo_variants,
    photos,
    retired_variants,
    variant_recipes,
)
from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.image.recipes import Recipe, mismatch
from photo_publish.jobs import machine
from photo_publish.keys import Upload
from photo_publish.outbox import writer
from photo_publish.outbox.contracts import (
    PHOTO_PUBLISHED,
    PHOTO_VARIANTS_UPDATED,
    PhotoPublishedPayload,
    Placeholder,
    PublishedVariants,
    VariantRef,
)

# A final failure's dead letter that the queue has not accepted yet, now its holder's to send.
OwedDeadLetter = machine.OwedLetter


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
        """The photo's job, created if the photo exists; a newer upload of its original reopens a
        failed job, and the newest upload that reached the job is remembered.

        A duplicate of an event, or its redelivery after a crash, announces the same upload and
        reopens nothing (an input that crashes its worker would otherwise loop: worker lost, dead
        letter, reopened, ...); nor does an upload older than the one seen (S3 delivers out of order).
        """
        with self._transaction() as connection:
            machine.ensure(connection, photo_id)
            if upload is not None and not machine.reopen(connection, photo_id, upload):
                machine.note_upload(connection, photo_id, upload)

    def claim(self, photo_id: UUID, *, stale_after: int, max_attempts: int) -> ClaimResult:
        """A due pending job, or a stale active one with attempts left; else why not."""
        with self._transaction() as connection:
            attempt = machine.claim(connection, photo_id, stale_after=stale_after, max_attempts=max_attempts)
            if attempt is not None:
                return Claimed(attempt)
            # Not claimed: read why, only to answer the delivery (nothing is written on this read).
            now = func.now()
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
        """The photo is already published: its pending job has nothing left to do."""
        with self._transaction() as connection:
            machine.settle_published(connection, photo_id)

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
            if not machine.publish(connection, photo_id, attempt):
                return PublishResult(self._superseded_or_skipped(connection, photo_id))
            published = machine.publish_photo(
                connection, photo_id, _rendition(width, height, variant_version, placeholder)
            )
            if published is None:
                # Zero rows: published already (by a worker of an earlier claim), or deleted.
                exists = connection.scalar(select(photos.c.id).where(photos.c.id == photo_id)) is not None
                return PublishResult("already" if exists else "skipped")
            _store_variants(connection, photo_id, variants, variant_version)
            payload, _ = _append_event(
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
            if not machine.publish(connection, photo_id, attempt):
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
            old_keys = connection.scalars(
                select(photo_variants.c.storage_key).where(
                    photo_variants.c.photo_id == photo_id,
                    photo_variants.c.storage_key.not_in([v.key for v in variants]),
                )
            ).all()
            _store_variants(connection, photo_id, variants, variant_version)
            payload, event_id = _append_event(
                connection,
                PHOTO_VARIANTS_UPDATED,
                photo_id,
                replaced,
                width=width,
                height=height,
                variants=variants,
                placeholder=placeholder,
            )
            if old_keys:
                # Deleted once `retire_after` has passed and the event telling consumers of the new
                # keys has been out of the outbox as long (the sweep): the old ones may be cached.
                connection.execute(
                    insert(retired_variants)
                    .values(
                        [
                            {
                                "storage_key": key,
                                "photo_id": photo_id,
                                "delete_after": func.now() + retire_after,
                                "event_id": event_id,
                            }
                            for key in old_keys
                        ]
                    )
                    .on_conflict_do_nothing(index_elements=[retired_variants.c.storage_key])
                )
        return PublishResult("rerendered", payload)

    @staticmethod
    def _superseded_or_skipped(connection: Connection, photo_id: UUID) -> Literal["superseded", "skipped"]:
        """A fenced-out transition: another claim owns the job, or the photo (and its job) is gone."""
        exists = connection.scalar(select(photos.c.id).where(photos.c.id == photo_id)) is not None
        return "superseded" if exists else "skipped"

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

    def fail(self, photo_id: UUID, attempt: int, code: ErrorCode, *, final: bool = False) -> datetime | None:
        """Job `failed` (owing its dead letter if `final`), photo `processing_failed` (never a
        published one) with its `photo.failed` event, in one transaction. The failure's time (its
        letter's name), or None if fenced out."""
        with self._transaction() as connection:
            failed = machine.fail(connection, photo_id, attempt, code, final=final)
            if failed is None:
                return None
            # A published photo is not downgraded, and gets no event: only a photo marked failed does.
            writer.append_failed(connection, failed.marked)
        return failed.failed_at

    def take_owed_dead_letter(self, photo_id: UUID, *, lease_seconds: int) -> OwedDeadLetter | float | None:
        """The job's owed dead letter, leased to the caller; else the seconds until it may be taken
        (its lease, or its first sender, still holds it), or None when no letter is owed."""
        with self._transaction() as connection:
            leased = machine.lease_letters(
                connection, lease_seconds=lease_seconds, limit=1, photo_id=photo_id
            )
            if leased and isinstance(leased[0], OwedDeadLetter):
                return leased[0]
            return machine.letter_wait(connection, photo_id, lease_seconds=lease_seconds)

    def dead_letter_sent(self, letters: Sequence[OwedDeadLetter]) -> None:
        """The queue accepted these letters: nothing is owed for those failures any more."""
        if letters:
            with self._transaction() as connection:
                machine.settle_letters(connection, letters)

    def release(self, photo_id: UUID, attempt: int, code: ErrorCode, retry_in: int) -> bool:
        """Back to `pending`, not claimable for `retry_in` seconds; False if fenced out."""
        with self._transaction() as connection:
            return machine.release(connection, photo_id, attempt, code, retry_in)


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
) -> tuple[PhotoPublishedPayload, UUID]:
    """The outbox row of a publication or a re-render (the same payload, SPEC 14), and its id."""
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
    return payload, writer.append_published(connection, event_type, payload)


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
