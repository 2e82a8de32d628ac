"""The tables of SPEC 4 as SQLAlchemy Core `Table`s. The migrations create them; the functions
read and write them with Core statements on a Connection.

Core, not the ORM: the functions never load an object graph, and `sqlalchemy.orm` adds about
40 ms to SQLAlchemy Core's import under python3.12, paid by every cold start before its first
record (issue 17).
`photo_publish.adapters.models` maps typed ORM classes onto these same tables for the tools and tests.
"""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    Uuid,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from photo_publish.errors import ErrorCode
from photo_publish.keys import FIXED_KINDS, LADDER_KIND

PROCESSING_STATES = ("uploaded", "ready", "processing_failed")
VISIBILITIES = ("unpublished", "published")
JOB_STATUSES = ("pending", "active", "done", "failed")
ERROR_CODES = [code.value for code in ErrorCode]


def one_of(column: str, values: tuple[str, ...] | list[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _timestamp(name: str, *, nullable: bool = True) -> Column[object]:
    return Column(name, DateTime(timezone=True), nullable=nullable)


def _created_updated() -> list[Column[object]]:
    return [
        Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    ]


metadata = MetaData()

photos = Table(
    "photos",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("album_id", Uuid, nullable=False, index=True),
    Column("original_key", Text, nullable=False, unique=True),
    Column("processing_state", Text, nullable=False, server_default=text("'uploaded'")),
    Column("visibility", Text, nullable=False, server_default=text("'unpublished'")),
    _timestamp("published_at"),
    Column("width", Integer),
    Column("height", Integer),
    Column("error_code", Text),
    Column("entity_version", Integer, nullable=False, server_default=text("1")),
    # The published picture's placeholder (migration 0006): base64 ThumbHash and "#rrggbb".
    Column("thumbhash", Text),
    Column("average_color", Text),
    # The recipe version of its published variants (migration 0007).
    Column("variant_version", Integer),
    # The upload said its user agreed to keep the photo's location (migration 0009, SPEC 18).
    Column("keep_location", Boolean, nullable=False, server_default=text("false")),
    # The JWT subject that registered it behind a JWT authorizer (migration 0010); null otherwise.
    Column("owner", Text),
    # What its EXIF says of its taking (migration 0012, SPEC 18), set with its rendition: the instant
    # where the camera recorded its UTC offset, and the camera's clock; the location only with
    # keep_location.
    Column("taken_at", DateTime(timezone=True)),
    Column("taken_at_local", DateTime(timezone=False)),
    Column("camera_make", Text),
    Column("camera_model", Text),
    Column("lens_model", Text),
    Column("f_number", Double),
    Column("exposure_time", Double),  # seconds
    Column("iso", Integer),
    Column("focal_length", Double),  # millimetres
    Column("latitude", Double),
    Column("longitude", Double),
    Column("altitude", Double),  # metres
    # The original its published rendition was read from (migration 0014, SPEC 19): the ETag
    # (unquoted) and, in a versioned bucket, the version id. A later write to the key is a new picture.
    Column("original_etag", Text),
    Column("original_version", Text),
    *_created_updated(),
    CheckConstraint(one_of("processing_state", PROCESSING_STATES), name="photos_processing_state_check"),
    CheckConstraint(one_of("visibility", VISIBILITIES), name="photos_visibility_check"),
    CheckConstraint(one_of("error_code", ERROR_CODES), name="photos_error_code_check"),
    CheckConstraint("average_color ~ '^#[0-9a-f]{6}$'", name="photos_average_color_check"),
    # What no state allows is unrepresentable (migration 0008, SPEC 16).
    CheckConstraint(
        "(processing_state = 'processing_failed') = (error_code IS NOT NULL)",
        name="photos_error_code_state_check",
    ),
    CheckConstraint(
        "(processing_state = 'ready') = (visibility = 'published')"
        " AND (processing_state <> 'ready' OR published_at IS NOT NULL)",
        name="photos_published_check",
    ),
    CheckConstraint("taken_at IS NULL OR taken_at_local IS NOT NULL", name="photos_taken_at_check"),
    CheckConstraint(
        "f_number > 0 AND exposure_time > 0 AND iso > 0 AND focal_length > 0", name="photos_exposure_check"
    ),
    # GPS only where the upload said its user agreed (SPEC 18).
    CheckConstraint(
        "(latitude IS NULL) = (longitude IS NULL) AND (altitude IS NULL OR latitude IS NOT NULL)"
        " AND (latitude IS NULL OR (keep_location AND abs(latitude) <= 90 AND abs(longitude) <= 180))",
        name="photos_location_check",
    ),
)

photo_variants = Table(
    "photo_variants",
    metadata,
    Column("photo_id", Uuid, ForeignKey("photos.id", ondelete="CASCADE"), primary_key=True),
    Column("kind", Text, primary_key=True),
    Column("storage_key", Text, nullable=False),
    Column("width", Integer, nullable=False),
    Column("height", Integer, nullable=False),
    Column("bytes", Integer, nullable=False),
    Column("content_type", Text, nullable=False),
    Column("variant_version", Integer, nullable=False),
    *_created_updated(),
    CheckConstraint(
        # thumb, browse, or a ladder step (migration 0011)
        f"{one_of('kind', FIXED_KINDS)} OR kind ~ '^{LADDER_KIND.pattern}$'",
        name="photo_variants_kind_check",
    ),
)

photo_jobs = Table(
    "photo_jobs",
    metadata,
    Column("photo_id", Uuid, ForeignKey("photos.id", ondelete="CASCADE"), primary_key=True),
    Column("status", Text, nullable=False, server_default=text("'pending'")),
    Column("attempt", Integer, nullable=False, server_default=text("0")),
    _timestamp("next_retry_at"),
    _timestamp("claimed_at"),
    _timestamp("enqueued_at"),
    Column("last_error_code", Text),
    # Set while a final failure's dead letter has not been accepted by the queue (SPEC 5).
    _timestamp("dead_letter_owed_at"),
    # The newest upload of the original that reached this job: S3's sequencer as sent (compared
    # right-padded, AWS's rule) and its eTag.
    Column("upload_sequencer", Text),
    Column("upload_etag", Text),
    # ... and its event's time (migration 0008).
    _timestamp("upload_at"),
    # The upload the job's last claimed attempt worked from, and when that attempt started
    # (migration 0008): what a later upload is compared with when the attempt failed.
    Column("attempt_sequencer", Text),
    Column("attempt_etag", Text),
    _timestamp("attempt_upload_at"),
    _timestamp("attempt_started_at"),
    _timestamp("failed_at"),
    # A backfill's mark: re-render the published photo at this recipe version (SPEC 14).
    Column("rerender_to", Integer),
    # The version ids of the newest upload seen and of the upload the last attempt worked from, in
    # a versioned bucket (migration 0014): what the attempt reads, pinned.
    Column("upload_version", Text),
    Column("attempt_version", Text),
    *_created_updated(),
    CheckConstraint(one_of("status", JOB_STATUSES), name="photo_jobs_status_check"),
    CheckConstraint(one_of("last_error_code", ERROR_CODES), name="photo_jobs_last_error_code_check"),
    CheckConstraint("attempt >= 0", name="photo_jobs_attempt_check"),
    # What no state allows is unrepresentable (migration 0008, SPEC 16): photo_publish.jobs.machine
    # writes every row, and a transition that forgets a column fails here, loudly.
    CheckConstraint(
        "(status = 'active') = (claimed_at IS NOT NULL) AND (status <> 'active' OR attempt >= 1)",
        name="photo_jobs_claimed_check",
    ),
    CheckConstraint(
        "status = 'pending' OR (next_retry_at IS NULL AND enqueued_at IS NULL)",
        name="photo_jobs_pending_check",
    ),
    CheckConstraint(
        "(status = 'failed') = (failed_at IS NOT NULL) AND (status <> 'failed' OR last_error_code IS NOT NULL)",
        name="photo_jobs_failed_check",
    ),
    CheckConstraint("dead_letter_owed_at IS NULL OR status = 'failed'", name="photo_jobs_dead_letter_check"),
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

# What VARIANT_VERSION `version` means: the fingerprint of everything that decides the bytes.
variant_recipes = Table(
    "variant_recipes",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("fingerprint", Text, nullable=False),
    Column("recipe", JSONB, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("version >= 1", name="variant_recipes_version_check"),
)

# A replaced version's object, deleted by the sweep once `delete_after` has passed.
retired_variants = Table(
    "retired_variants",
    metadata,
    Column("storage_key", Text, primary_key=True),
    Column("photo_id", Uuid, nullable=False),
    _timestamp("delete_after", nullable=False),
    # The photo.variants_updated event that told consumers of the new keys (migration 0008): the
    # old objects go only once it has left the outbox, a grace period ago.
    Column("event_id", Uuid),
    Index("retired_variants_due_idx", "delete_after"),
)

# A deleted photo's tombstone (migration 0009): later events for it are acknowledged, and the sweep
# purges its objects once more after `purge_after` (a render that raced the deletion).
deleted_photos = Table(
    "deleted_photos",
    metadata,
    Column("photo_id", Uuid, primary_key=True),
    Column("album_id", Uuid, nullable=False),
    Column("original_key", Text, nullable=False),
    Column("deleted_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    _timestamp("purge_after", nullable=False),
    _timestamp("purged_at"),
    Index("deleted_photos_purge_idx", "purge_after", postgresql_where=text("purged_at IS NULL")),
    Index("deleted_photos_purged_idx", "purged_at", postgresql_where=text("purged_at IS NOT NULL")),
)

# Albums under a JWT authorizer (migration 0013, SPEC 19): the user who first registered into one
# owns it, or the backend (owner null) where it registered first; the backend shares an album with
# members, who may register into it too.
albums = Table(
    "albums",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("owner", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("owner <> ''", name="albums_owner_check"),
)

album_members = Table(
    "album_members",
    metadata,
    Column("album_id", Uuid, ForeignKey("albums.id", ondelete="CASCADE"), primary_key=True),
    Column("member", Text, primary_key=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("member <> ''", name="album_members_member_check"),
)

# CDN paths still to invalidate (migration 0013, SPEC 19): a deleted, hidden or rejected photo's
# variants, one wildcard path a photo; the sweep sends them in batches and retries refusals.
cdn_invalidations = Table(
    "cdn_invalidations",
    metadata,
    Column("path", Text, primary_key=True),
    Column("requested_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("next_try_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("attempts >= 0", name="cdn_invalidations_attempts_check"),
    Index("cdn_invalidations_due_idx", "next_try_at"),
)

outbox_events = Table(
    "outbox_events",
    metadata,
    Column("id", Uuid, primary_key=True, server_default=func.gen_random_uuid()),
    Column("aggregate_type", Text, nullable=False),
    Column("aggregate_id", Uuid, nullable=False, index=True),
    Column("event_type", Text, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    _timestamp("published_at"),
    # Until when a relay that is sending the row holds it (migration 0015): the call is made with
    # no transaction open, and a relay that died leaves it to the next once this has passed.
    _timestamp("leased_until"),
    CheckConstraint("leased_until IS NULL OR published_at IS NULL", name="outbox_events_lease_check"),
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
    Index("outbox_events_published_idx", "published_at", postgresql_where=text("published_at IS NOT NULL")),
)
