"""The process function's statements that are not one transition, each run inside the caller's
unit of work (`adapters.unit_of_work`): the reads that decide what to do (the photo; whether a claim
still stands), the claim with the reason it was refused, the job ensured and told of an upload, an
owed letter taken, the recipe recorded, a deleted photo's late upload.

The job's and the photo's state change only through `photo_publish.jobs.machine`'s transitions:
the photo's publication is its one conditional UPDATE (only one concurrent worker can win it), and
every transition of a job out of `active` is conditioned on the attempt its worker claimed (the
fencing token), so a worker whose job was taken over changes nothing. The service calls a single
transition, and `publish.transaction`'s, itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal
from uuid import UUID

from sqlalchemy import (
    Connection,
    and_,
    case,
    false,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert

from photo_publish.adapters.storage import UNNAMED, Pin
from photo_publish.adapters.tables import (
    deleted_photos,
    photo_jobs,
    photos,
    variant_recipes,
)
from photo_publish.errors import ErrorCode
from photo_publish.image.recipes import Recipe, mismatch
from photo_publish.jobs import machine
from photo_publish.jobs.machine import OwedLetter
from photo_publish.keys import Upload
from photo_publish.settings import STALE_AFTER_SECONDS


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
    # Its upload said the user agreed to keep its location (SPEC 18): only then is GPS read.
    keep_location: bool = False
    # Published, and a newer upload of its original reopened its job: a new picture is owed (SPEC 19).
    picture_owed: bool = False
    # Its job's status (None without a job row).
    job_status: str | None = None


@dataclass(frozen=True, slots=True)
class Claimed:
    attempt: int
    # The upload the attempt works from (the newest the job has seen), which an upload's delivery
    # reads pinned; not part of what a claim is equal to.
    pin: Pin | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Holding:
    """The claim stands: how its render is committed. `publish` a photo's first picture; `rerender` a
    published picture at a newer recipe; `picture` a published photo's new picture (its original
    written again, SPEC 19), whose variants go under keys of their own (`tag`, the entity version it
    publishes); `nothing` when the published picture is this one, at this recipe already."""

    commit: Literal["publish", "rerender", "picture", "nothing"]
    tag: int | None = None


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


def ensure_recipe(connection: Connection, version: int, recipe: Recipe) -> None:
    """Record `version` as `recipe` if it is new; raise RecipeMismatch if it is another's."""
    connection.execute(
        insert(variant_recipes)
        .values(version=version, fingerprint=recipe.fingerprint, recipe=recipe.as_record())
        .on_conflict_do_nothing(index_elements=[variant_recipes.c.version])
    )
    recorded = connection.execute(
        select(variant_recipes.c.fingerprint, variant_recipes.c.recipe).where(
            variant_recipes.c.version == version
        )
    ).one()
    if refusal := mismatch(version, recorded.fingerprint, recorded.recipe, recipe):
        raise refusal


def get_photo(connection: Connection, photo_id: UUID, *, stale_after: int) -> PhotoRow | None:
    worker_lost = or_(
        and_(
            photo_jobs.c.status == "active",
            photo_jobs.c.claimed_at < func.now() - timedelta(seconds=stale_after),
        ),
        and_(photo_jobs.c.status == "pending", photo_jobs.c.last_error_code == ErrorCode.WORKER_LOST.value),
    )
    row = connection.execute(
        select(
            photos.c.id,
            photos.c.album_id,
            photos.c.original_key,
            photos.c.processing_state,
            photos.c.variant_version,
            photo_jobs.c.rerender_to,
            func.coalesce(worker_lost, false()),
            photos.c.keep_location,
            func.coalesce(
                and_(
                    photos.c.processing_state == "ready",
                    photo_jobs.c.status == "pending",
                    machine.picture_owed(),
                ),
                false(),
            ),
            photo_jobs.c.status,
        )
        .outerjoin(photo_jobs, photo_jobs.c.photo_id == photos.c.id)
        .where(photos.c.id == photo_id)
    ).one_or_none()
    return None if row is None else PhotoRow(*row)


def uploaded_after_deletion(connection: Connection, photo_id: UUID, purge_in: timedelta) -> bool:
    """An upload of a deleted photo (a browser's POST that raced the deletion, or finished after
    it): its tombstone is purged once more after `purge_in`, the sweep deleting what came after
    the deletion's own purge. False if the photo was never deleted."""
    found = connection.scalar(
        update(deleted_photos)
        .where(deleted_photos.c.photo_id == photo_id)
        .values(
            purged_at=None,
            purge_after=func.greatest(deleted_photos.c.purge_after, func.now() + purge_in),
        )
        .returning(deleted_photos.c.photo_id)
    )
    return found is not None


def ensure_job(
    connection: Connection,
    photo_id: UUID,
    *,
    upload: Upload | None = None,
    lease_seconds: int = STALE_AFTER_SECONDS,
    exists: bool = False,
) -> bool:
    """The photo's job, created if the photo exists (unless the caller read it: `exists`, for a job
    row goes only with its photo); a newer upload of its original reopens a failed job, and the
    newest upload that reached the job is remembered.

    A duplicate of an event, or its redelivery after a crash, announces the same upload and
    reopens nothing (an input that crashes its worker would otherwise loop: worker lost, dead
    letter, reopened, ...); nor does an upload older than the one seen (S3 delivers out of order).
    A published photo's done job is reopened by a newer upload that is another original than
    its picture's (SPEC 19). True if the upload reopened the job.
    """
    if not exists:
        machine.ensure(connection, photo_id)
    if upload is None:
        return False
    if machine.reopen(connection, photo_id, upload, lease_seconds=lease_seconds):
        return True
    machine.note_upload(connection, photo_id, upload)
    return False


def claim(connection: Connection, photo_id: UUID, *, stale_after: int, max_attempts: int) -> ClaimResult:
    """A due pending job, or a stale active one with attempts left; else why not."""
    claimed = machine.claim(connection, photo_id, stale_after=stale_after, max_attempts=max_attempts)
    if claimed is not None:
        return Claimed(claimed.attempt, Pin(claimed.etag, claimed.version))
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


def take_owed_letter(
    connection: Connection, photo_id: UUID, *, lease_seconds: int
) -> OwedLetter | float | None:
    """The job's owed dead letter, leased to the caller; else the seconds until it may be taken
    (its lease, or its first sender, still holds it), or None when no letter is owed."""
    leased = machine.lease_letters(connection, lease_seconds=lease_seconds, limit=1, photo_id=photo_id)
    if leased and isinstance(leased[0], OwedLetter):
        return leased[0]
    return machine.letter_wait(connection, photo_id, lease_seconds=lease_seconds)


def holds(
    connection: Connection, photo_id: UUID, attempt: int, variant_version: int, read: Pin
) -> Holding | None:
    """Whether the worker's claim still stands (None if not), and how its render of the original
    `read` is committed.

    Asked before the variant objects are written, because they carry an immutable Cache-Control:
    a published version's objects are never written again (a re-render writes a newer version's,
    a new picture its own).
    """
    photo = connection.execute(
        select(
            photos.c.processing_state,
            photos.c.variant_version,
            photos.c.original_etag,
            photos.c.original_version,
            photos.c.entity_version,
        )
        .join(photo_jobs, photos.c.id == photo_jobs.c.photo_id)
        .where(
            photo_jobs.c.photo_id == photo_id,
            photo_jobs.c.status == "active",
            photo_jobs.c.attempt == attempt,
        )
    ).one_or_none()
    if photo is None:
        return None
    if photo.processing_state != "ready":
        return Holding("publish")
    below = (photo.variant_version or 0) < variant_version
    same = _same_original(photo.original_etag, photo.original_version, read)
    # Published before the original was recorded: with nothing to re-render, only a new
    # upload claims the job.
    if same is False or (same is None and not below):
        return Holding("picture", photo.entity_version + 1)
    return Holding("rerender" if below else "nothing")


def _same_original(etag: str | None, version: str | None, read: Pin) -> bool | None:
    """Whether the original `read` is the one recorded (by version id where both name one, else by
    ETag); None where nothing was recorded (published before migration 0014). A read that names
    nothing (a store that does not say: S3 always does) is taken for the same."""
    if read == UNNAMED:
        return True
    if version is not None and read.version is not None:
        return version == read.version
    if etag is not None and read.etag is not None:
        return etag == read.etag
    return None
