"""The app's side (SPEC 17): register an upload a browser makes, watch it, delete it.

For an app's own API and for the upload function's routes. Every call takes its caller: the app's
backend (`BACKEND`, AWS_IAM), which may do everything, or a user (`User(sub)`, a JWT's subject),
who may register into an album that is theirs (the first user to register into a new album owns
it; one the backend has filled is opened only by sharing) or that the backend shared with them,
and may read and delete the photos they registered or that are in their album. Registration writes the photo and its job in one transaction, with the album check,
and answers a presigned POST whose policy S3 itself enforces: the exact key, the size range, the
declared type and the bucket's encryption. A presigned PUT cannot bound the size; a POST policy can.
"""

from __future__ import annotations

import reprlib
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeGuard
from uuid import UUID

from sqlalchemy import Engine, select
from sqlalchemy.exc import SQLAlchemyError

from photo_publish.adapters.tables import photo_jobs, photo_variants, photos
from photo_publish.adapters.unit_of_work import unit_of_work
from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.jobs import invalidations, machine
from photo_publish.keys import (
    FIXED_KINDS,
    MalformedKey,
    clean_file_name,
    original_key,
    parse_uuid,
    photo_prefixes,
)
from photo_publish.observability import logger
from photo_publish.outbox import writer
from photo_publish.publish.transaction import capture_of
from photo_publish.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# What SPEC 3 decodes, by the Content-Type a browser declares for it.
ACCEPTED_TYPES = frozenset(
    {
        "image/jpeg",
        "image/png",
        "image/webp",
        "image/tiff",
        "image/gif",
        "image/avif",
        "image/heic",
        "image/heif",
    }
)
# The bucket's default encryption (template: SSE-S3), bound in the policy so that no upload asks
# for another.
ENCRYPTION = "AES256"


class Refused(ValueError):
    """A request the API answers with 400: `reason` is a stable code, the message says why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Forbidden(Refused):
    """A request its caller may not make (the API answers 403): `ALBUM_FORBIDDEN`, another user's
    album; `BACKEND_ONLY`, a call only the app's backend makes."""


@dataclass(frozen=True, slots=True)
class Backend:
    """The app's backend (the upload API's AWS_IAM routes, or an app's own server): it has checked
    its user's rights itself, and may do everything."""


@dataclass(frozen=True, slots=True)
class User:
    """An end user, by their token's subject (the upload API's JWT routes): never empty, and text
    PostgreSQL can hold (no NUL, no lone surrogate)."""

    sub: str

    def __post_init__(self) -> None:
        if not usable_subject(self.sub):
            raise ValueError("a user's subject is a non-empty string without NUL or lone surrogates")


BACKEND = Backend()
Caller = Backend | User


def user_of(caller: Caller) -> str | None:
    """The user a call is made for; None for the backend. Anything else is a programming error:
    no value stands for the backend but BACKEND (a None, say, is refused, not trusted)."""
    match caller:
        case User(sub=sub):
            return sub
        case Backend():
            return None
    raise TypeError(f"a caller is uploads.BACKEND or uploads.User(sub), not {_shown(caller)}")


def usable_subject(sub: object) -> TypeGuard[str]:
    """Whether `sub` can name a user: a non-empty string that PostgreSQL's text can hold."""
    if not isinstance(sub, str) or not sub or "\x00" in sub:
        return False
    try:
        sub.encode()
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Registration:
    photo_id: UUID
    album_id: UUID
    key: str
    url: str
    fields: dict[str, str]
    expires_at: datetime

    def as_json(self) -> dict[str, Any]:
        return {
            "photoId": str(self.photo_id),
            "albumId": str(self.album_id),
            "key": self.key,
            "upload": {"url": self.url, "fields": self.fields},
            "expiresAt": self.expires_at.isoformat().replace("+00:00", "Z"),
        }


def register(
    engine: Engine,
    s3: S3Client,
    settings: Settings,
    *,
    album_id: str | UUID,
    file_name: str,
    content_type: str,
    size: int | None = None,
    keep_location: bool = False,
    caller: Caller,
) -> Registration:
    """A new photo in `album_id` and the POST that uploads its original; Refused for a request that
    cannot be one (an album id that is not a UUID, a file name that cleans to nothing, a type SPEC 3
    does not decode, a size outside 1..MAX_ORIGINAL_BYTES, a keep_location that is not a bool);
    Forbidden (`ALBUM_FORBIDDEN`) for a user whose album it is not. A user registering into an
    album nobody owns becomes its owner, in the transaction that writes the photo.
    `keep_location`: the user agreed to keep the photo's GPS position on its record (never in a
    variant); without it, its GPS tags are never read. `s3` signs the POST: give it
    `Config(signature_version="s3v4")` (bootstrap.s3_client() has it), as botocore otherwise signs
    presigned requests with SigV2, which S3 refuses on buckets created since June 2020."""
    album = _album(album_id)
    name = clean_file_name(file_name) if isinstance(file_name, str) else ""
    if not name:
        raise Refused(
            "FILE_NAME_INVALID", "The file name is empty once cleaned of /, ${ and control characters."
        )
    if not isinstance(content_type, str) or content_type not in ACCEPTED_TYPES:
        raise Refused(
            "CONTENT_TYPE_UNSUPPORTED",
            f"The content type {_shown(content_type)} is not one of {', '.join(sorted(ACCEPTED_TYPES))}.",
        )
    limit = settings.max_original_bytes
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= limit):
        raise Refused("SIZE_INVALID", f"The size must be between 1 and {limit} bytes, not {_shown(size)}.")
    if not isinstance(keep_location, bool):
        raise Refused(
            "KEEP_LOCATION_INVALID", f"keepLocation must be true or false, not {_shown(keep_location)}."
        )

    photo_id = uuid.uuid4()
    key = original_key(settings.stage, album, photo_id, name)
    with unit_of_work(engine) as connection:
        # The backend's photos belong to no user; a user's need the album to be theirs or shared.
        owner = user_of(caller)
        if owner is None:
            machine.backend_album(connection, album)
        elif not machine.admit_to_album(connection, album, owner):
            raise Forbidden("ALBUM_FORBIDDEN", "This album is another user's, and was not shared with you.")
        machine.register(connection, photo_id, album, key, keep_location=keep_location, owner=owner)
    # Signed, not sent: the browser's POST carries the policy, and S3 refuses what it does not allow.
    post = s3.generate_presigned_post(
        Bucket=settings.photo_bucket,
        Key=key,
        Fields={"Content-Type": content_type, "x-amz-server-side-encryption": ENCRYPTION},
        Conditions=[
            {"bucket": settings.photo_bucket},
            ["eq", "$key", key],
            ["content-length-range", 1, size or limit],
            {"Content-Type": content_type},
            {"x-amz-server-side-encryption": ENCRYPTION},
        ],
        ExpiresIn=settings.upload_expiry_seconds,
    )
    expires = datetime.now(UTC) + timedelta(seconds=settings.upload_expiry_seconds)
    return Registration(photo_id, album, key, post["url"], dict(post["fields"]), expires)


def _album(album_id: str | UUID) -> UUID:
    if isinstance(album_id, UUID):
        return album_id
    try:
        return parse_uuid(album_id)
    except MalformedKey:
        raise Refused("ALBUM_ID_INVALID", f"The album id must be a UUID, not {_shown(album_id)}.") from None


def _shown(value: object) -> str:
    """A value as a message quotes it: short (a 5,000-digit int has no repr at all, by Python's
    integer-string limit)."""
    try:
        return reprlib.repr(value)
    except ValueError:
        return "a number too long to show"


def share_album(engine: Engine, album_id: str | UUID, member: str, *, caller: Caller) -> None:
    """`member` may register into `album_id` (the backend's call), and read and delete what they put
    there; an album nobody owns yet stays the backend's (sharing gives no ownership)."""
    album, user = _album(album_id), _member(member, caller)
    with unit_of_work(engine) as connection:
        machine.share_album(connection, album, user)


def unshare_album(engine: Engine, album_id: str | UUID, member: str, *, caller: Caller) -> bool:
    """`member` may no longer register into `album_id` (the backend's call); the photos they put there
    stay theirs. False if they were not a member (an album's owner is not one: an owner stays)."""
    album, user = _album(album_id), _member(member, caller)
    with unit_of_work(engine) as connection:
        return machine.unshare_album(connection, album, user)


def _member(member: str, caller: Caller) -> str:
    if user_of(caller) is not None:
        raise Forbidden("BACKEND_ONLY", "Only the app's backend shares albums.")
    if not usable_subject(member):
        raise Refused("USER_ID_INVALID", f"A user id is a token's subject, not {_shown(member)}.")
    return member


# What a client shows its user for a failed photo, by code.
IN_WORDS = {
    ErrorCode.ORIGINAL_NOT_FOUND: "The upload never arrived.",
    ErrorCode.ORIGINAL_TOO_LARGE: "The file is larger than this service accepts.",
    ErrorCode.UNSUPPORTED_FORMAT: "The file is not a picture format this service reads.",
    ErrorCode.DECODE_FAILED: "The file is damaged or incomplete.",
    ErrorCode.DIMENSIONS_EXCEEDED: "The picture is larger (in pixels) than this service accepts.",
    ErrorCode.ENCODE_FAILED: "The picture could not be converted.",
    ErrorCode.RENDER_TIME_EXCEEDED: "The picture took too long to convert.",
    ErrorCode.STORAGE_READ_FAILED: "Storage could not be read; it will be tried again by an operator.",
    ErrorCode.STORAGE_WRITE_FAILED: "Storage could not be written; it will be tried again by an operator.",
    ErrorCode.DATABASE_UNAVAILABLE: "The service was unavailable; it will be tried again by an operator.",
    ErrorCode.TIME_BUDGET_EXCEEDED: "The service ran out of time; it will be tried again by an operator.",
    ErrorCode.PHOTO_NOT_FOUND: "The photo was not registered before its upload.",
    ErrorCode.UNEXPECTED_ERROR: "Something went wrong on our side; an operator has been told.",
    ErrorCode.WORKER_LOST: "Converting it failed repeatedly; an operator has been told.",
}


def status(
    engine: Engine, photo_id: str | UUID, *, caller: Caller, base_url: str = ""
) -> dict[str, Any] | None:
    """What a polling client needs: the state, the error in words, the variants (with URLs under
    `base_url` when one is set), the placeholder and, once published, the capture metadata (as the
    payload carries it); None for an unknown photo, or one a user caller may not see (neither
    theirs nor in their album)."""
    user = user_of(caller)
    try:
        photo_uuid = photo_id if isinstance(photo_id, UUID) else parse_uuid(photo_id)
    except MalformedKey:
        return None
    with unit_of_work(engine) as connection:
        photo = connection.execute(
            select(photos, photo_jobs.c.status.label("job_status"))
            .outerjoin(photo_jobs, photo_jobs.c.photo_id == photos.c.id)
            .where(photos.c.id == photo_uuid)
        ).one_or_none()
        if photo is None or (user is not None and not machine.may_touch(connection, photo_uuid, user)):
            return None
        variants = connection.execute(
            select(photo_variants)
            .where(photo_variants.c.photo_id == photo_uuid)
            .order_by(photo_variants.c.width, photo_variants.c.content_type.desc())
        ).all()
    # A failed photo given its attempts again (a new upload, the operator's retry) is processing
    # until it publishes or fails anew; its old code says nothing more until then.
    again = photo.processing_state == "processing_failed" and photo.job_status in ("pending", "active")
    code = ErrorCode(photo.error_code) if photo.error_code and not again else None
    state = {"ready": "published", "processing_failed": "failed"}.get(photo.processing_state, "processing")
    if again:
        state = "processing"
    base = base_url.rstrip("/")
    return {
        "photoId": str(photo.id),
        "albumId": str(photo.album_id),
        "state": state,
        "errorCode": code.value if code else None,
        "error": IN_WORDS.get(code) if code else None,
        "entityVersion": photo.entity_version,
        "width": photo.width,
        "height": photo.height,
        "variants": {v.kind: _variant(v, base) for v in variants if v.kind in FIXED_KINDS},
        # The responsive ladder (SPEC 18), by width, WebP before AVIF: a srcset's entries.
        "ladder": [_variant(v, base) for v in variants if v.kind not in FIXED_KINDS],
        "placeholder": (
            {"thumbhash": photo.thumbhash, "averageColor": photo.average_color} if photo.thumbhash else None
        ),
        "capture": capture_of(photo).to_json() if photo.processing_state == "ready" else None,
    }


def _variant(row: Any, base: str) -> dict[str, Any]:
    return {
        "key": row.storage_key,
        "width": row.width,
        "height": row.height,
        "bytes": row.bytes,
        "contentType": row.content_type,
    } | ({"url": f"{base}/{row.storage_key}"} if base else {})


def delete(
    engine: Engine,
    s3_store: Any,
    settings: Settings,
    photo_id: str | UUID,
    *,
    caller: Caller,
    cdn: invalidations.Invalidator | None = None,
) -> bool:
    """The photo leaves the product everywhere the product put it: its rows and waiting events at
    once (with a `photo.deleted` event), then its original and every variant of every version, then
    the CDN's copies (its variants path, recorded with the deletion, sent through `cdn` at once
    where given, else or if refused by the sweep). A render that raced it commits nothing; objects it may have put
    meanwhile are purged by the sweep once no worker can still hold the photo (STALE_AFTER_SECONDS).
    False for an unknown photo, or one a user caller may not delete (neither theirs nor in their
    album: an album's owner may delete what a member put in it)."""
    user = user_of(caller)
    try:
        photo_uuid = photo_id if isinstance(photo_id, UUID) else parse_uuid(photo_id)
    except MalformedKey:
        return False
    with unit_of_work(engine) as connection:
        if user is not None and not machine.may_touch(connection, photo_uuid, user):
            return False
        deleted = machine.delete(connection, photo_uuid, purge_after=settings.purge_delay)
        if deleted is None:
            return False
        writer.append_deleted(connection, deleted.event)
        # Recorded whether or not this process knows the distribution (an app's own API calling the
        # library may not): the sweep, which the template tells it, sends what is left.
        path = invalidations.photo_path(settings.stage, deleted.album_id, photo_uuid)
        invalidations.request_invalidations(connection, [path])
    # Best effort now; the sweep's purge deletes whatever this could not.
    removed = s3_store.delete_under(photo_prefixes(settings.stage, deleted.album_id, photo_uuid))
    _invalidate(engine, settings, cdn, path, removed=removed)
    return True


def _invalidate(
    engine: Engine, settings: Settings, cdn: invalidations.Invalidator | None, path: str, *, removed: bool
) -> None:
    """Best effort after the commit: the sweep sends the path if this could not."""
    try:
        if not removed:
            # Invalidated while S3 still holds the objects, an edge could fetch them again: the
            # path waits for the sweep's purge instead.
            invalidations.defer_invalidations(engine, [path], settings.purge_delay.total_seconds())
        elif cdn is not None:
            invalidations.send_invalidations(engine, cdn, paths=[path])
    except (SQLAlchemyError, PhotoError) as error:
        # A PhotoError is the unit of work's DATABASE_UNAVAILABLE, naming the driver's error.
        reason = str(error) if isinstance(error, PhotoError) else type(error).__name__
        logger.warning("cdn path left to the sweep", path=path, reason=reason)
