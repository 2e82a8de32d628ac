"""The job's life (SPEC 16): every write to `photo_jobs`, and to a photo's processing columns.

Each transition is one conditional statement: its WHERE clause is the precondition (the job's
status, and for a worker's transitions the attempt it claimed: its fencing token), and a transition
that moves a job to another status sets every column of STATE, so that no column outlives the state
that set it. `TRANSITIONS` declares each one (docs/operating.md's table is tested against it), and each
statement is checked against its declaration when it is built. The tables' CHECK constraints
(migration 0008) refuse the combinations no state allows. The caller owns the transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from sqlalchemy import (
    ColumnElement,
    Connection,
    DateTime,
    Text,
    Uuid,
    and_,
    case,
    false,
    func,
    literal,
    literal_column,
    not_,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import insert

from photo_publish.adapters.tables import (
    album_members,
    albums,
    deleted_photos,
    outbox_events,
    photo_jobs,
    photos,
    retired_variants,
)
from photo_publish.contracts import PhotoDeletedPayload, PhotoFailedPayload
from photo_publish.errors import ErrorCode
from photo_publish.keys import Upload

PENDING, ACTIVE, DONE, FAILED = "pending", "active", "done", "failed"
# The columns a job's status decides: a transition to another status sets each of them.
STATE = frozenset(
    {
        "status",
        "attempt",
        "next_retry_at",
        "claimed_at",
        "enqueued_at",
        "last_error_code",
        "dead_letter_owed_at",
        "failed_at",
        "rerender_to",
    }
)
# A second's tolerance for the clocks of the queue and the database (SPEC 5).
CLOCK_TOLERANCE = timedelta(seconds=1)


@dataclass(frozen=True, slots=True)
class Transition:
    """One named change of a job: the statuses it leaves and reaches, the rest of its precondition
    in words, and the job's columns it sets."""

    name: str
    source: tuple[str, ...]
    target: tuple[str, ...]
    when: str
    sets: frozenset[str]


TRANSITIONS: dict[str, Transition] = {}


def _declare(name: str, source: str, target: str, when: str, sets: str = "") -> Transition:
    """`source`/`target`: statuses separated by `|` ("-" for a job that does not exist yet);
    `sets`: the columns it writes besides STATE (which a change of status writes whole)."""
    columns = frozenset(sets.split())
    if "-" in (source, target):
        columns = frozenset()  # a new row, every column its default; or the row is gone
    elif set(target.split("|")) != set(source.split("|")):
        columns |= STATE
    transition = Transition(name, tuple(source.split("|")), tuple(target.split("|")), when, columns)
    TRANSITIONS[name] = transition
    return transition


REGISTER = _declare("register", "-", PENDING, "the API registers a new photo: both rows at once")
ENSURE = _declare("ensure", "-", PENDING, "an event for a photo that exists, whose job row is missing")
REOPEN = _declare(
    "reopen",
    f"{FAILED}|{DONE}",
    PENDING,
    "an upload newer than the one its last attempt worked from: failed, no letter in flight; or done,"
    " its photo published from another original (the upload is a new picture)",
    "upload_sequencer upload_etag upload_at upload_version",
)
NOTE_UPLOAD = _declare(
    "note_upload",
    f"{PENDING}|{ACTIVE}|{DONE}|{FAILED}",
    f"{PENDING}|{ACTIVE}|{DONE}|{FAILED}",
    "an upload not older than, and not the same as, the newest one seen",
    "upload_sequencer upload_etag upload_at upload_version",
)
CLAIM = _declare(
    "claim",
    f"{PENDING}|{ACTIVE}",
    ACTIVE,
    "pending and due; or active, stale, with attempts left (attempt + 1 is the fencing token)",
    "attempt_sequencer attempt_etag attempt_upload_at attempt_started_at attempt_version",
)
STEP_ASIDE = _declare(
    "step_aside",
    ACTIVE,
    PENDING,
    "the claimed attempt found the upload it pinned written over: the newer write is processed",
)
RELEASE = _declare("release", ACTIVE, PENDING, "the claimed attempt failed transiently, attempts left")
FAIL = _declare("fail", ACTIVE, FAILED, "the claimed attempt failed permanently")
FAIL_FINALLY = _declare(
    "fail_finally", ACTIVE, FAILED, "the claimed attempt failed transiently, none left: a letter is owed"
)
REQUEUE_LOST = _declare("requeue_lost", ACTIVE, PENDING, "stale (its worker died), attempts left")
FAIL_LOST = _declare("fail_lost", ACTIVE, FAILED, "stale, no attempts left (WORKER_LOST): a letter is owed")
PUBLISH = _declare(
    "publish",
    ACTIVE,
    DONE,
    "the claimed attempt published or re-rendered the photo (or found that done already)",
)
SETTLE_PUBLISHED = _declare(
    "settle_published",
    PENDING,
    DONE,
    "the photo is published at (or past) any version it is marked for, and no new picture is owed",
)
STAMP = _declare(
    "stamp",
    PENDING,
    PENDING,
    "due for SWEEP_AFTER_SECONDS and not sent as long: the sweep sends it",
    "enqueued_at",
)
UNSTAMP = _declare("unstamp", PENDING, PENDING, "its job message could not be sent", "enqueued_at")
LEASE_LETTER = _declare(
    "lease_letter", FAILED, FAILED, "a letter is owed and no sender holds it", "dead_letter_owed_at"
)
RELEASE_LETTER = _declare(
    "release_letter",
    FAILED,
    FAILED,
    "the queue refused this failure's letter: any sender may take it",
    "dead_letter_owed_at",
)
SETTLE_LETTER = _declare(
    "settle_letter",
    FAILED,
    FAILED,
    "the queue accepted the letter of this same failure",
    "dead_letter_owed_at",
)
RETRY = _declare(
    "retry",
    f"{FAILED}|{PENDING}",
    PENDING,
    "the operator's retry or redrive; an owed letter is taken back unless a sender holds it",
)
MARK_RERENDER = _declare(
    "mark_rerender",
    f"{DONE}|{FAILED}",
    DONE,
    "a published photo below the recipe version (backfill); as for retry, its letter",
)
STOP_RERENDER = _declare("stop_rerender", DONE, DONE, "marked and not sent yet", "rerender_to")
START_RERENDER = _declare(
    "start_rerender", DONE, PENDING, "marked: the sweep sends it while the queue is short"
)
DELETE = _declare(
    "delete",
    f"{PENDING}|{ACTIVE}|{DONE}|{FAILED}",
    "-",
    "the photo is deleted: with its job, variant rows and waiting events; a tombstone stays",
)


def _values(transition: Transition, **values: Any) -> dict[str, Any]:
    """The SET of `transition`'s statement, refused unless it is exactly the declared columns."""
    if set(values) != transition.sets:
        missing, extra = transition.sets - set(values), set(values) - transition.sets
        raise AssertionError(f"{transition.name}: missing {sorted(missing)}, undeclared {sorted(extra)}")
    return values | {"updated_at": func.now()}


def _status_in(transition: Transition) -> ColumnElement[bool]:
    return photo_jobs.c.status.in_([literal_column(f"'{s}'") for s in transition.source])


def _no_letter_in_flight(lease_seconds: int) -> ColumnElement[bool]:
    """No sender holds the job's letter: none is owed, or its lease has passed (its sender finished
    or died). A transition that takes a failure back takes back its letter too, and a letter a
    sender holds may reach the queue any moment: taken back then, it would page for a photo that is
    no longer failed."""
    return or_(
        photo_jobs.c.dead_letter_owed_at.is_(None),
        photo_jobs.c.dead_letter_owed_at < func.now() - timedelta(seconds=lease_seconds),
    )


def _keep(*columns: str) -> dict[str, Any]:
    """Columns a transition decides to leave as they are (said, so that no column is forgotten)."""
    return {name: photo_jobs.c[name] for name in columns}


# -- created --------------------------------------------------------------------------------------


def register(
    connection: Connection,
    photo_id: UUID,
    album_id: UUID,
    original_key: str,
    *,
    keep_location: bool = False,
    owner: str | None = None,
) -> None:
    """What an upload API writes (SPEC 11): the photo and its job; every other column its default."""
    connection.execute(
        photos.insert().values(
            id=photo_id,
            album_id=album_id,
            original_key=original_key,
            keep_location=keep_location,
            owner=owner,
        )
    )
    connection.execute(photo_jobs.insert().values(photo_id=photo_id))


def ensure(connection: Connection, photo_id: UUID) -> None:
    """The photo's job, created pending if the photo exists and it has none."""
    connection.execute(
        insert(photo_jobs)
        .from_select(["photo_id"], select(photos.c.id).where(photos.c.id == photo_id))
        .on_conflict_do_nothing(index_elements=[photo_jobs.c.photo_id])
    )


# -- albums under a JWT authorizer (SPEC 19) ------------------------------------------------------


def admit_to_album(connection: Connection, album_id: UUID, user: str) -> bool:
    """Whether `user` may register into `album_id`: its owner, or a member the backend shared it
    with. A new album (no row, no photo) becomes `user`'s: of two users racing to create it, the
    second's insert waits for the first's commit and then reads the first as the owner. An album
    the backend has used (its row's owner null, or photos an upload API wrote without one) is no
    user's to claim (its photos would become theirs to read and delete): only sharing opens it.
    The rows read are locked against an unshare until the caller's transaction (the photo's
    insert) commits."""
    used = select(photos.c.id).where(photos.c.album_id == album_id).exists()
    connection.execute(
        insert(albums)
        .from_select(["id", "owner"], select(literal(album_id, Uuid), literal(user, Text)).where(~used))
        .on_conflict_do_nothing(index_elements=[albums.c.id])
    )
    owner = connection.scalar(
        select(albums.c.owner).where(albums.c.id == album_id).with_for_update(read=True)
    )
    if owner is not None and owner == user:
        return True
    member = connection.scalar(
        select(album_members.c.member)
        .where(album_members.c.album_id == album_id, album_members.c.member == user)
        .with_for_update(read=True)
    )
    return member is not None


def backend_album(connection: Connection, album_id: UUID) -> None:
    """The backend registers into `album_id`: an album no user owns yet stays the backend's (owner
    null), so that no user claims it later, even once its photos are gone."""
    connection.execute(
        insert(albums).values(id=album_id).on_conflict_do_nothing(index_elements=[albums.c.id])
    )


def share_album(connection: Connection, album_id: UUID, member: str) -> None:
    """`member` may register into `album_id`, and may read and delete what they put there (never
    its other photos, unless they own it). An album nobody owns yet is the backend's from now on:
    sharing gives no ownership, so an unshare takes back everything it gave."""
    backend_album(connection, album_id)
    connection.execute(
        insert(album_members)
        .from_select(
            ["album_id", "member"],
            select(albums.c.id, literal(member, Text)).where(
                albums.c.id == album_id, albums.c.owner.is_distinct_from(member)
            ),
        )
        .on_conflict_do_nothing(index_elements=[album_members.c.album_id, album_members.c.member])
    )


def unshare_album(connection: Connection, album_id: UUID, member: str) -> bool:
    """`member` no longer may register into `album_id`; False if they were not a member."""
    gone = connection.execute(
        album_members.delete().where(album_members.c.album_id == album_id, album_members.c.member == member)
    )
    return gone.rowcount > 0


def may_touch(connection: Connection, photo_id: UUID, user: str) -> bool:
    """Whether `user` may read or delete the photo: they registered it, or it is in their album
    (an album's owner answers for what members put in it)."""
    found = connection.scalar(
        select(photos.c.id)
        .outerjoin(albums, albums.c.id == photos.c.album_id)
        .where(photos.c.id == photo_id, or_(photos.c.owner == user, albums.c.owner == user))
    )
    return found is not None


# -- an upload announced --------------------------------------------------------------------------


def _sequencer_after(a: ColumnElement[Any], b: ColumnElement[Any]) -> ColumnElement[bool]:
    """S3's order of two uploads of a key: the shorter sequencer right-padded with zeros, then
    compared as text (AWS's rule), byte by byte whatever the database's collation."""
    width = func.greatest(func.length(a), func.length(b))
    return func.rpad(func.upper(a), width, "0").collate("C") > func.rpad(func.upper(b), width, "0").collate(
        "C"
    )


def _upload_terms(
    upload: Upload,
) -> tuple[ColumnElement[Any], ColumnElement[Any], ColumnElement[Any], ColumnElement[Any]]:
    return (
        literal(upload.sequencer, Text),
        literal(upload.etag, Text),
        literal(upload.at, DateTime(timezone=True)),
        literal(upload.version, Text),
    )


def picture_owed() -> ColumnElement[bool]:
    """The job's newest upload is another original than its published photo's picture (as
    `_another_picture` tells): a new picture is owed. True from a reopen until the new picture is
    published (SPEC 19); read with the job joined to its photo."""
    return case(
        (
            and_(photo_jobs.c.upload_version.is_not(None), photos.c.original_version.is_not(None)),
            photo_jobs.c.upload_version != photos.c.original_version,
        ),
        (
            and_(photo_jobs.c.upload_etag.is_not(None), photos.c.original_etag.is_not(None)),
            photo_jobs.c.upload_etag != photos.c.original_etag,
        ),
        else_=false(),
    )


def _another_picture(etag: ColumnElement[Any], version: ColumnElement[Any]) -> ColumnElement[bool]:
    """The job's photo is published from an original other than this upload (SPEC 19): by version id
    where both name one, else by eTag. Where neither can tell (a photo published before migration
    0014 recorded nothing), it is not: a late duplicate must not publish its picture again."""
    another = case(
        (
            and_(version.is_not(None), photos.c.original_version.is_not(None)),
            photos.c.original_version != version,
        ),
        (and_(etag.is_not(None), photos.c.original_etag.is_not(None)), photos.c.original_etag != etag),
        else_=false(),
    )
    return (
        select(photos.c.id)
        .where(photos.c.id == photo_jobs.c.photo_id, photos.c.processing_state == "ready", another)
        .exists()
    )


def _seen(sequencer: ColumnElement[Any], etag: ColumnElement[Any]) -> ColumnElement[bool]:
    return and_(
        photo_jobs.c.upload_sequencer.is_not_distinct_from(sequencer),
        photo_jobs.c.upload_etag.is_not_distinct_from(etag),
    )


def reopen(connection: Connection, photo_id: UUID, upload: Upload, *, lease_seconds: int) -> bool:
    """A failed job back to pending, attempt 0, for an upload newer than the one its failed attempt
    worked from (recorded at its claim): by S3's order where both have a sequencer; else by the
    events' times (an eTag orders nothing: the same bytes uploaded again are a new upload, and an
    older upload's late event is not), or, where the attempt saw no upload, the upload's time against
    the attempt's start; else by eTag. The upload is new proof that the original exists; the
    failure's letter is taken back with it, so none may be in flight (the caller comes back once
    its lease has passed).

    A done job of a published photo, the same way, for an upload newer than the one its publishing
    attempt worked from that is not the original its picture was read from (SPEC 19: a form posted
    again writes the key again): the newest upload is processed as one, a new picture. A duplicate
    of the event that published it, or an older upload's late event, reopens nothing."""
    sequencer, etag, at, version = _upload_terms(upload)
    started = func.coalesce(photo_jobs.c.attempt_started_at, photo_jobs.c.failed_at)
    newer = case(
        (
            and_(sequencer.is_not(None), photo_jobs.c.attempt_sequencer.is_not(None)),
            _sequencer_after(sequencer, photo_jobs.c.attempt_sequencer),
        ),
        (
            and_(at.is_not(None), photo_jobs.c.attempt_upload_at.is_not(None)),
            at > photo_jobs.c.attempt_upload_at,
        ),
        # The attempt saw no upload (it ran from a job message): one after its start is new, even
        # the one that arrived while it ran. The attempt may have read it or not; a second page
        # after a publish is the price of never dropping an upload it did not read.
        (and_(at.is_not(None), started.is_not(None)), at > started),
        (and_(etag.is_not(None), photo_jobs.c.attempt_etag.is_not(None)), etag != photo_jobs.c.attempt_etag),
        else_=true(),
    )
    reopened = connection.execute(
        update(photo_jobs)
        .where(
            photo_jobs.c.photo_id == photo_id,
            _status_in(REOPEN),
            newer,
            _no_letter_in_flight(lease_seconds),
            or_(photo_jobs.c.status == literal_column(f"'{FAILED}'"), _another_picture(etag, version)),
        )
        .values(
            _values(
                REOPEN,
                status=PENDING,
                attempt=0,
                next_retry_at=None,
                claimed_at=None,
                enqueued_at=None,
                last_error_code=None,
                dead_letter_owed_at=None,
                failed_at=None,
                upload_sequencer=func.coalesce(sequencer, photo_jobs.c.upload_sequencer),
                upload_etag=func.coalesce(etag, photo_jobs.c.upload_etag),
                upload_at=func.coalesce(at, photo_jobs.c.upload_at),
                upload_version=func.coalesce(version, photo_jobs.c.upload_version),
                **_keep("rerender_to"),
            )
        )
        .returning(photo_jobs.c.photo_id)
    )
    return reopened.first() is not None


def note_upload(connection: Connection, photo_id: UUID, upload: Upload) -> None:
    """Remember the newest upload that reached the job; an older one (S3 delivers out of order) or a
    repeated one changes nothing."""
    sequencer, etag, at, version = _upload_terms(upload)
    by_sequencer = and_(sequencer.is_not(None), photo_jobs.c.upload_sequencer.is_not(None))
    older = case(
        (by_sequencer, _sequencer_after(photo_jobs.c.upload_sequencer, sequencer)),
        (and_(at.is_not(None), photo_jobs.c.upload_at.is_not(None)), photo_jobs.c.upload_at > at),
        else_=false(),
    )
    repeated = and_(_seen(sequencer, etag), photo_jobs.c.upload_at.is_not_distinct_from(at))
    connection.execute(
        update(photo_jobs)
        .where(photo_jobs.c.photo_id == photo_id, _status_in(NOTE_UPLOAD), not_(older), not_(repeated))
        .values(
            _values(
                NOTE_UPLOAD,
                upload_sequencer=sequencer,
                upload_etag=etag,
                upload_at=at,
                upload_version=version,
            )
        )
    )


# -- a worker's attempt ---------------------------------------------------------------------------


def _stale(stale_after: int) -> ColumnElement[bool]:
    return photo_jobs.c.claimed_at < func.now() - timedelta(seconds=stale_after)


@dataclass(frozen=True, slots=True)
class Claim:
    """The attempt now claimed (the worker's fencing token) and the upload it works from: the newest
    the job had seen, which a delivery of an upload reads pinned (SPEC 19)."""

    attempt: int
    etag: str | None = None
    version: str | None = None


def claim(connection: Connection, photo_id: UUID, *, stale_after: int, max_attempts: int) -> Claim | None:
    """The attempt now claimed, or None."""
    now = func.now()
    claimable = or_(
        and_(
            photo_jobs.c.status == PENDING,
            or_(photo_jobs.c.next_retry_at.is_(None), photo_jobs.c.next_retry_at <= now + CLOCK_TOLERANCE),
        ),
        and_(photo_jobs.c.status == ACTIVE, _stale(stale_after), photo_jobs.c.attempt < max_attempts),
    )
    claimed = connection.execute(
        update(photo_jobs)
        .where(photo_jobs.c.photo_id == photo_id, _status_in(CLAIM), claimable)
        .values(
            _values(
                CLAIM,
                status=ACTIVE,
                attempt=photo_jobs.c.attempt + 1,
                claimed_at=now,
                next_retry_at=None,
                enqueued_at=None,
                dead_letter_owed_at=None,
                failed_at=None,
                # The upload this attempt works from (the newest seen), and when it started: what a
                # later upload is compared with if the attempt fails.
                attempt_sequencer=photo_jobs.c.upload_sequencer,
                attempt_etag=photo_jobs.c.upload_etag,
                attempt_upload_at=photo_jobs.c.upload_at,
                attempt_version=photo_jobs.c.upload_version,
                attempt_started_at=now,
                **_keep("last_error_code", "rerender_to"),
            )
        )
        .returning(photo_jobs.c.attempt, photo_jobs.c.attempt_etag, photo_jobs.c.attempt_version)
    ).one_or_none()
    return None if claimed is None else Claim(*claimed)


def step_aside(connection: Connection, photo_id: UUID, attempt: int) -> bool:
    """The claimed attempt gives the job back, due at once: the upload it pinned was written over
    (SPEC 19), so it is no attempt's to render. The newer write's event claims it, or the sweep's
    message (which reads the current object). The attempt is given back, so a form posted again and
    again never spends the retries of the upload that is finally read: fencing still holds, since a
    fenced write needs the job active and the next claim takes the number up again. False if fenced
    out."""
    stepped = connection.execute(
        update(photo_jobs)
        .where(_fenced(photo_id, attempt))
        .values(
            _values(
                STEP_ASIDE,
                status=PENDING,
                next_retry_at=None,
                claimed_at=None,
                enqueued_at=None,
                dead_letter_owed_at=None,
                failed_at=None,
                attempt=photo_jobs.c.attempt - 1,
                **_keep("last_error_code", "rerender_to"),
            )
        )
        .returning(photo_jobs.c.photo_id)
    )
    return stepped.first() is not None


def _fenced(photo_id: UUID, attempt: int) -> ColumnElement[bool]:
    """The worker that claimed `attempt` still holds the job."""
    return and_(
        photo_jobs.c.photo_id == photo_id, photo_jobs.c.status == ACTIVE, photo_jobs.c.attempt == attempt
    )


def release(connection: Connection, photo_id: UUID, attempt: int, code: ErrorCode, retry_in: int) -> bool:
    """Back to pending, not claimable for `retry_in` seconds; False if fenced out."""
    released = connection.execute(
        update(photo_jobs)
        .where(_fenced(photo_id, attempt))
        .values(
            _values(
                RELEASE,
                status=PENDING,
                next_retry_at=func.now() + timedelta(seconds=retry_in),
                claimed_at=None,
                enqueued_at=None,
                last_error_code=code.value,
                dead_letter_owed_at=None,
                failed_at=None,
                **_keep("attempt", "rerender_to"),
            )
        )
        .returning(photo_jobs.c.photo_id)
    )
    return released.first() is not None


def _failed_values(transition: Transition, code: ErrorCode, *, final: bool) -> dict[str, Any]:
    now = func.now()
    return _values(
        transition,
        status=FAILED,
        next_retry_at=None,
        claimed_at=None,
        enqueued_at=None,
        last_error_code=code.value,
        # Owed until the queue accepts it: whoever sends it settles it, and if nobody does, a
        # redelivery or the sweep finds it owed (SPEC 5).
        dead_letter_owed_at=now if final else None,
        failed_at=now,
        **_keep("attempt", "rerender_to"),
    )


@dataclass(frozen=True, slots=True)
class Failed:
    """A claimed attempt's failure recorded: its time (which names it) and the `photo.failed` event
    of the photo it marked failed (none for a published photo)."""

    failed_at: datetime
    marked: list[PhotoFailedPayload]


def fail(
    connection: Connection, photo_id: UUID, attempt: int, code: ErrorCode, *, final: bool
) -> Failed | None:
    """The claimed attempt failed for good: job `failed` (owing its letter if `final`), the photo
    `processing_failed` unless it is published (a re-render's failure never downgrades it). None
    if fenced out."""
    failed_at = connection.scalar(
        update(photo_jobs)
        .where(_fenced(photo_id, attempt))
        .values(_failed_values(FAIL_FINALLY if final else FAIL, code, final=final))
        .returning(photo_jobs.c.failed_at)
    )
    if failed_at is None:
        return None
    return Failed(failed_at, _mark_photos_failed(connection, {photo_id: attempt}, code, final=final))


def _mark_photos_failed(
    connection: Connection, attempts: dict[UUID, int], code: ErrorCode, *, final: bool
) -> list[PhotoFailedPayload]:
    """The photos' processing columns after their jobs failed: only those not published. Each
    photo marked, its `photo.failed` event (its entity version unchanged: only a publication bumps
    it)."""
    rows = connection.execute(
        update(photos)
        .where(photos.c.id.in_(attempts), photos.c.processing_state != "ready")
        .values(processing_state="processing_failed", error_code=code.value, updated_at=func.now())
        .returning(photos.c.id, photos.c.album_id, photos.c.entity_version, photos.c.updated_at)
    ).all()
    return [
        PhotoFailedPayload(
            photo_id=r.id,
            album_id=r.album_id,
            entity_version=r.entity_version,
            error_code=code,
            kind="final" if final else "permanent",
            attempt=attempts[r.id],
            failed_at=r.updated_at,
        )
        for r in rows
    ]


def publish(connection: Connection, photo_id: UUID, attempt: int) -> bool:
    """The claimed attempt's variants are committed with this transaction: job done, no re-render
    owed (the variants are at the version its worker renders); False if fenced out."""
    done = connection.execute(
        update(photo_jobs)
        .where(_fenced(photo_id, attempt))
        .values(_done_values(PUBLISH))
        .returning(photo_jobs.c.photo_id)
    )
    return done.first() is not None


def _done_values(transition: Transition) -> dict[str, Any]:
    return _values(
        transition,
        status=DONE,
        next_retry_at=None,
        claimed_at=None,
        enqueued_at=None,
        dead_letter_owed_at=None,
        failed_at=None,
        rerender_to=None,
        **_keep("attempt", "last_error_code"),
    )


def publish_photo(connection: Connection, photo_id: UUID, rendition: dict[str, Any]) -> Any:
    """SPEC 4.1's conditional UPDATE: only one worker publishes a photo. Its row, or None (already
    published, or deleted)."""
    return connection.execute(
        update(photos)
        .where(photos.c.id == photo_id, photos.c.processing_state.in_(("uploaded", "processing_failed")))
        .values(
            processing_state="ready",
            visibility="published",
            published_at=func.now(),
            error_code=None,
            **rendition,
        )
        .returning(photos.c.album_id, photos.c.entity_version, photos.c.published_at)
    ).one_or_none()


def settle_published(connection: Connection, photo_id: UUID) -> None:
    """A delivery for a published photo that nothing is owed for: its pending job is done. Not one
    a backfill marked meanwhile for a version its variants are below, nor one a newer upload
    reopened meanwhile for a new picture (the decision to settle was read before: the mark, and the
    upload, win)."""
    owed_nothing = (
        select(photos.c.id)
        .where(
            photos.c.id == photo_jobs.c.photo_id,
            photos.c.processing_state == "ready",
            or_(
                photo_jobs.c.rerender_to.is_(None),
                func.coalesce(photos.c.variant_version, 0) >= photo_jobs.c.rerender_to,
            ),
            not_(picture_owed()),
        )
        .exists()
    )
    connection.execute(
        update(photo_jobs)
        .where(photo_jobs.c.photo_id == photo_id, _status_in(SETTLE_PUBLISHED), owed_nothing)
        .values(_done_values(SETTLE_PUBLISHED))
    )


# -- lost work (the sweep) ------------------------------------------------------------------------


def stamp_due(connection: Connection, *, wait: timedelta, limit: int) -> list[UUID]:
    """Pending rows that waited `wait` past their due time and were not sent as long, stamped as
    sent now; taken with SKIP LOCKED, so two sweeps never send the same row."""
    now = func.now()
    due_at = func.coalesce(photo_jobs.c.next_retry_at, photo_jobs.c.created_at)
    due = (
        select(photo_jobs.c.photo_id)
        .where(
            # Literal, not a bound parameter: a generic plan must still see the partial index.
            _status_in(STAMP),
            due_at < now - wait,
            or_(photo_jobs.c.enqueued_at.is_(None), photo_jobs.c.enqueued_at < now - wait),
        )
        .order_by(due_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("due")
    )
    return list(
        connection.scalars(
            update(photo_jobs)
            .where(photo_jobs.c.photo_id == due.c.photo_id)
            .values(_values(STAMP, enqueued_at=now))
            .returning(photo_jobs.c.photo_id)
        )
    )


def unstamp(connection: Connection, photo_ids: Sequence[UUID]) -> None:
    """Their job messages were not sent: a later sweep sends them."""
    connection.execute(
        update(photo_jobs)
        .where(photo_jobs.c.photo_id.in_(photo_ids), _status_in(UNSTAMP))
        .values(_values(UNSTAMP, enqueued_at=None))
    )


def _stale_rows(*, stale_after: int, limit: int, exhausted: ColumnElement[bool]) -> Any:
    return (
        select(photo_jobs.c.photo_id)
        .where(photo_jobs.c.status == literal_column(f"'{ACTIVE}'"), _stale(stale_after), exhausted)
        .order_by(photo_jobs.c.claimed_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("stale")
    )


def requeue_lost(connection: Connection, *, stale_after: int, max_attempts: int, limit: int) -> list[UUID]:
    """Stale active jobs with attempts left back to pending, stamped as sent now (WORKER_LOST)."""
    stale = _stale_rows(stale_after=stale_after, limit=limit, exhausted=photo_jobs.c.attempt < max_attempts)
    return list(
        connection.scalars(
            update(photo_jobs)
            .where(photo_jobs.c.photo_id == stale.c.photo_id)
            .values(
                _values(
                    REQUEUE_LOST,
                    status=PENDING,
                    next_retry_at=None,
                    claimed_at=None,
                    enqueued_at=func.now(),
                    last_error_code=ErrorCode.WORKER_LOST.value,
                    dead_letter_owed_at=None,
                    failed_at=None,
                    **_keep("attempt", "rerender_to"),
                )
            )
            .returning(photo_jobs.c.photo_id)
        )
    )


@dataclass(frozen=True, slots=True)
class OwedLetter:
    """A final failure's dead letter, now this caller's to send; `failed_at` names the failure, and
    `rerender` says it is a published photo's re-render that failed (it pages as what it is)."""

    photo_id: UUID
    attempt: int
    code: ErrorCode
    failed_at: datetime
    rerender: bool = False

    @property
    def kind(self) -> str:
        return "rerender" if self.rerender else "photo"


def fail_lost(
    connection: Connection,
    *,
    stale_after: int,
    max_attempts: int,
    limit: int,
    photo_id: UUID | None = None,
) -> tuple[list[OwedLetter], list[PhotoFailedPayload]]:
    """Stale active jobs with no attempts left failed finally with WORKER_LOST (one photo's, or a
    batch): their letters (leased to the caller) and the `photo.failed` events of the photos marked
    failed."""
    exhausted = photo_jobs.c.attempt >= max_attempts
    if photo_id is not None:
        exhausted = and_(exhausted, photo_jobs.c.photo_id == photo_id)
    stale = _stale_rows(stale_after=stale_after, limit=limit, exhausted=exhausted)
    rows = connection.execute(
        update(photo_jobs)
        .where(photo_jobs.c.photo_id == stale.c.photo_id)
        .values(_failed_values(FAIL_LOST, ErrorCode.WORKER_LOST, final=True))
        .returning(photo_jobs.c.photo_id, photo_jobs.c.attempt, photo_jobs.c.failed_at)
    ).all()
    lost = {r.photo_id: r.attempt for r in rows}
    marked = _mark_photos_failed(connection, lost, ErrorCode.WORKER_LOST, final=True)
    failed = {m.photo_id for m in marked}
    letters = [
        OwedLetter(
            r.photo_id, r.attempt, ErrorCode.WORKER_LOST, r.failed_at, rerender=r.photo_id not in failed
        )
        for r in rows
    ]
    return letters, marked


# -- dead letters owed ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UnknownCode:
    """A row whose code this version does not know (a newer deploy wrote it): left, and counted."""

    photo_id: UUID
    code: str | None


def lease_letters(
    connection: Connection, *, lease_seconds: int, limit: int, photo_id: UUID | None = None
) -> list[OwedLetter | UnknownCode]:
    """Owed letters whose lease has passed (their first sender finished or died), leased anew."""
    leased = photo_jobs.c.dead_letter_owed_at < func.now() - timedelta(seconds=lease_seconds)
    owed = (
        select(photo_jobs.c.photo_id)
        .where(leased, _status_in(LEASE_LETTER), photo_jobs.c.photo_id == photo_id if photo_id else true())
        .order_by(photo_jobs.c.dead_letter_owed_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("owed")
    )
    rows = connection.execute(
        update(photo_jobs)
        .where(photo_jobs.c.photo_id == owed.c.photo_id)
        .values(_values(LEASE_LETTER, dead_letter_owed_at=func.now()))
        .returning(
            photo_jobs.c.photo_id,
            photo_jobs.c.attempt,
            photo_jobs.c.last_error_code,
            photo_jobs.c.failed_at,
            _published(photo_jobs.c.photo_id).label("rerender"),
        )
    ).all()
    return [_letter(row) for row in rows]


def _published(photo_id: ColumnElement[Any]) -> ColumnElement[bool]:
    """The photo is published: a failed job of it is its re-render's."""
    return select(photos.c.id).where(photos.c.id == photo_id, photos.c.processing_state == "ready").exists()


def _letter(row: Any) -> OwedLetter | UnknownCode:
    try:
        return OwedLetter(
            row.photo_id, row.attempt, ErrorCode(row.last_error_code), row.failed_at, row.rerender
        )
    except ValueError:
        return UnknownCode(row.photo_id, row.last_error_code)


def letter_wait(connection: Connection, photo_id: UUID, *, lease_seconds: int) -> float | None:
    """Seconds until the job's owed letter may be leased; None when none is owed."""
    wait = connection.scalar(
        select(
            func.extract(
                "epoch", photo_jobs.c.dead_letter_owed_at + timedelta(seconds=lease_seconds) - func.now()
            )
        ).where(photo_jobs.c.photo_id == photo_id, photo_jobs.c.dead_letter_owed_at.is_not(None))
    )
    return None if wait is None else max(float(wait), 0.0)


def still_owed(connection: Connection, letters: Sequence[OwedLetter]) -> list[OwedLetter]:
    """The letters whose failure still stands, read just before they are sent: a photo deleted (or
    a failure taken back) since its letter was leased pages nobody. A read, not a lock: a deletion
    that commits while the letter is on its way leaves it in the queue, for the sweep to remove."""
    if not letters:
        return []
    rows = connection.execute(
        select(photo_jobs.c.photo_id, photo_jobs.c.failed_at).where(
            photo_jobs.c.photo_id.in_([letter.photo_id for letter in letters]),
            photo_jobs.c.status == literal_column(f"'{FAILED}'"),
            photo_jobs.c.dead_letter_owed_at.is_not(None),
        )
    )
    standing = {(row.photo_id, row.failed_at) for row in rows}
    return [letter for letter in letters if (letter.photo_id, letter.failed_at) in standing]


def release_letters(connection: Connection, letters: Sequence[OwedLetter], *, lease_seconds: int) -> None:
    """The queue refused these letters: no sender holds them now (the sweep's next run takes them,
    and a retry may take them back)."""
    for letter in letters:
        connection.execute(
            update(photo_jobs)
            .where(
                photo_jobs.c.photo_id == letter.photo_id,
                _status_in(RELEASE_LETTER),
                photo_jobs.c.failed_at == letter.failed_at,
                photo_jobs.c.dead_letter_owed_at.is_not(None),
            )
            .values(
                _values(RELEASE_LETTER, dead_letter_owed_at=func.now() - timedelta(seconds=lease_seconds + 1))
            )
        )


def settle_letters(connection: Connection, letters: Sequence[OwedLetter]) -> None:
    """The queue accepted these letters: owed no more, unless the job has failed again since (its
    new failure owes its own)."""
    for letter in letters:
        connection.execute(
            update(photo_jobs)
            .where(
                photo_jobs.c.photo_id == letter.photo_id,
                _status_in(SETTLE_LETTER),
                photo_jobs.c.failed_at == letter.failed_at,
            )
            .values(_values(SETTLE_LETTER, dead_letter_owed_at=None))
        )


# -- the operator ---------------------------------------------------------------------------------


def retry(connection: Connection, photo_ids: Sequence[UUID] | None, *, lease_seconds: int) -> list[UUID]:
    """The operator's retry (and redrive): the jobs of the given photos, or of every failed one,
    back to pending, attempt 0, stamped as sent now (the caller sends one message each), an owed
    letter taken back (not while a sender holds it: the job is retried once it was sent). A failed job of a published photo is its re-render's (its mark is kept: the
    process function re-renders it). A job at work is left to its worker; a photo marked failed
    with no job row gets one."""
    failed = select(photos.c.id).where(photos.c.processing_state == "processing_failed")
    if photo_ids is not None:
        failed = failed.where(photos.c.id.in_(photo_ids))
    connection.execute(
        insert(photo_jobs)
        .from_select(["photo_id"], failed)
        .on_conflict_do_nothing(index_elements=[photo_jobs.c.photo_id])
    )
    chosen = (
        photo_jobs.c.photo_id.in_(photo_ids)
        if photo_ids is not None
        else or_(photo_jobs.c.status == literal_column(f"'{FAILED}'"), photo_jobs.c.photo_id.in_(failed))
    )
    return list(
        connection.scalars(
            update(photo_jobs)
            .where(chosen, _status_in(RETRY), _no_letter_in_flight(lease_seconds))
            .values(
                _values(
                    RETRY,
                    status=PENDING,
                    attempt=0,
                    next_retry_at=None,
                    claimed_at=None,
                    enqueued_at=func.now(),
                    last_error_code=None,
                    dead_letter_owed_at=None,
                    failed_at=None,
                    **_keep("rerender_to"),
                )
            )
            .returning(photo_jobs.c.photo_id)
        )
    )


def mark_rerender(
    connection: Connection, photo_ids: Sequence[UUID], version: int, *, lease_seconds: int
) -> int:
    """Mark published photos' finished jobs for a re-render at `version` (a job at work keeps its
    course); a photo with no job row gets one. Any letter still owed for an earlier re-render's
    failure is taken back: the photo has its attempts again."""
    connection.execute(
        insert(photo_jobs)
        .from_select(
            ["photo_id", "status"], select(photos.c.id, literal(DONE)).where(photos.c.id.in_(photo_ids))
        )
        .on_conflict_do_nothing(index_elements=[photo_jobs.c.photo_id])
    )
    marked = connection.execute(
        update(photo_jobs)
        .where(
            photo_jobs.c.photo_id.in_(photo_ids),
            _status_in(MARK_RERENDER),
            _no_letter_in_flight(lease_seconds),
        )
        .values(
            _values(
                MARK_RERENDER,
                status=DONE,
                next_retry_at=None,
                claimed_at=None,
                enqueued_at=None,
                dead_letter_owed_at=None,
                failed_at=None,
                rerender_to=version,
                **_keep("attempt", "last_error_code"),
            )
        )
        .returning(photo_jobs.c.photo_id)
    )
    return len(marked.all())


def stop_rerender(connection: Connection) -> int:
    """Clear the marks not sent yet (the photos in flight finish); marking again resumes."""
    stopped = connection.execute(
        update(photo_jobs)
        .where(photo_jobs.c.rerender_to.is_not(None), _status_in(STOP_RERENDER))
        .values(_values(STOP_RERENDER, rerender_to=None))
        .returning(photo_jobs.c.photo_id)
    )
    return len(stopped.all())


MARKED = and_(photo_jobs.c.rerender_to.is_not(None), photo_jobs.c.status == literal_column(f"'{DONE}'"))


def start_rerender(connection: Connection, *, limit: int) -> list[UUID]:
    """Marked jobs become ordinary pending jobs, stamped as sent now (the caller sends them): from
    then on retries, lost messages and lost workers are handled as for any upload."""
    marked = (
        select(photo_jobs.c.photo_id)
        .where(MARKED)
        .order_by(photo_jobs.c.photo_id)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .cte("marked")
    )
    return list(
        connection.scalars(
            update(photo_jobs)
            .where(photo_jobs.c.photo_id == marked.c.photo_id, _status_in(START_RERENDER))
            .values(
                _values(
                    START_RERENDER,
                    status=PENDING,
                    attempt=0,
                    next_retry_at=None,
                    claimed_at=None,
                    enqueued_at=func.now(),
                    last_error_code=None,
                    dead_letter_owed_at=None,
                    failed_at=None,
                    **_keep("rerender_to"),
                )
            )
            .returning(photo_jobs.c.photo_id)
        )
    )


# -- deletion -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Deleted:
    """A deleted photo: where its objects were, and its last entity version (for its event)."""

    photo_id: UUID
    album_id: UUID
    original_key: str
    entity_version: int
    deleted_at: datetime

    @property
    def event(self) -> PhotoDeletedPayload:
        """Its `photo.deleted` event: one version past the photo's last, so that it orders last."""
        return PhotoDeletedPayload(
            photo_id=self.photo_id,
            album_id=self.album_id,
            entity_version=self.entity_version + 1,
            deleted_at=self.deleted_at,
        )


def delete(
    connection: Connection, photo_id: UUID, *, purge_after: timedelta, owner: str | None = None
) -> Deleted | None:
    """The photo leaves the product's tables: its row (its job and variant rows with it), its events
    still waiting in the outbox; a tombstone stays, so that a later event for it is acknowledged and
    the sweep purges its objects once more after `purge_after` (a worker that raced the deletion
    finds its claim gone and commits nothing, but may have put variants meanwhile). None if there
    was no such photo (given an `owner`, none that user registered). Whatever state the job was in: a worker holding it is fenced out.
    An owed letter goes with the job's row; one a sender holds is not sent (its sender's last look,
    `still_owed`, finds no failure), or, already on its way, is removed from the queue by the sweep."""
    # The job's row first, the order every transaction takes them in (a publish locks its job,
    # then its photo): a deletion racing a commit waits for it instead of deadlocking with it.
    connection.execute(
        select(photo_jobs.c.photo_id).where(photo_jobs.c.photo_id == photo_id).with_for_update()
    )
    mine = true() if owner is None else photos.c.owner == owner
    gone = connection.execute(
        photos.delete()
        .where(photos.c.id == photo_id, mine)
        .returning(photos.c.album_id, photos.c.original_key, photos.c.entity_version, func.now())
    ).one_or_none()
    if gone is None:
        return None
    # Not a row a relay is sending (leased): accepted, it reaches the bus before the photo.deleted
    # written below, which waits behind it; refused, the relay drops it, the photo being gone.
    connection.execute(
        outbox_events.delete().where(
            outbox_events.c.aggregate_id == photo_id,
            outbox_events.c.published_at.is_(None),
            or_(outbox_events.c.leased_until.is_(None), outbox_events.c.leased_until < func.now()),
        )
    )
    # Its replaced versions' keys, waiting out their grace: the deletion takes every version's
    # objects now, and the tombstone's purge any that come after.
    connection.execute(retired_variants.delete().where(retired_variants.c.photo_id == photo_id))
    connection.execute(
        insert(deleted_photos)
        .values(
            photo_id=photo_id,
            album_id=gone.album_id,
            original_key=gone.original_key,
            purge_after=func.now() + purge_after,
        )
        .on_conflict_do_nothing(index_elements=[deleted_photos.c.photo_id])
    )
    return Deleted(photo_id, gone.album_id, gone.original_key, gone.entity_version, gone[3])
