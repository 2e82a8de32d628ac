"""The schema, its migrations and the job state machine, on a real PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import Engine, create_engine, func, insert, select, text, update
from sqlalchemy.exc import IntegrityError

from devkit import stack
from devkit.stack import ROOT
from photo_publish import migrate
from photo_publish.adapters.models import Base, OutboxEvent, Photo, PhotoJob, PhotoVariant
from photo_publish.adapters.storage import Pin
from photo_publish.contracts import Placeholder
from photo_publish.errors import ErrorCode
from photo_publish.jobs import machine
from photo_publish.jobs.machine import OwedLetter
from photo_publish.keys import Upload
from photo_publish.migrate import VERSION_TABLE
from photo_publish.publish import repository, transaction
from photo_publish.publish.repository import Claimed, ClaimResult, Exhausted, Holding, NotClaimable
from photo_publish.publish.transaction import Rendition, StoredVariant
from tests.letters import owed
from tests.rows import committed, in_state, job

STALE, ATTEMPTS = 300, 3
# The original a worker read, as S3 names it.
READ = Pin("9e107d9d372bb6826bd81d3542a419d6")


def new_photo(db: Engine, *, job: bool = True) -> uuid.UUID:
    photo_id = uuid.uuid4()
    with db.begin() as connection:
        connection.execute(
            insert(Photo).values(id=photo_id, album_id=uuid.uuid4(), original_key=f"dev/originals/{photo_id}")
        )
        if job:
            connection.execute(insert(PhotoJob).values(photo_id=photo_id))
    return photo_id


def set_job(db: Engine, photo_id: uuid.UUID, **values: object) -> None:
    with db.begin() as connection:
        connection.execute(update(PhotoJob).where(PhotoJob.photo_id == photo_id).values(**in_state(**values)))


PLACEHOLDER = Placeholder("1QcSHQRnh493V4dIh4eXh1h4kJUI", "#7d6a4f")
VARIANTS = [
    StoredVariant("thumb", "k/thumb.webp", 400, 250, 1000, "image/webp"),
    StoredVariant("browse", "k/browse.webp", 2048, 1280, 9000, "image/webp"),
]
RENDITION = Rendition(2560, 1600, VARIANTS, 1, PLACEHOLDER)


def claim(db: Engine, photo_id: uuid.UUID) -> ClaimResult:
    return committed(db, repository.claim, photo_id, stale_after=STALE, max_attempts=ATTEMPTS)


# --- schema and migrations -------------------------------------------------------------------


def test_migrations_are_at_head_and_a_second_run_is_a_no_op(db: Engine, database_url: str) -> None:
    # GIVEN the database the session migrated
    head = migrate.head()

    # WHEN the migrations run again
    stack.migrate(database_url)

    # THEN it is still at head, with its rows untouched
    with db.connect() as connection:
        history = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        assert history.get_current_revision() == head
        assert connection.scalar(text("SELECT count(*) FROM photo_publish_version")) == 1


def test_the_models_match_the_migrated_schema(db: Engine) -> None:
    # GIVEN the typed models and the schema the migrations built
    with db.connect() as connection:
        # WHEN alembic compares them
        diff = compare_metadata(
            MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}), Base.metadata
        )

    # THEN there is nothing a migration would still have to do
    assert diff == []


def test_the_albums_migration_gives_an_album_the_backend_used_to_no_user(engine: Engine) -> None:
    # GIVEN a database before albums had owners: an album the backend registered two photos into
    # and a user another (as any user could), and an album of one user's photos before another's
    name = f"pre0013_{uuid.uuid4().hex[:8]}"
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    url = engine.url.set(database=name)
    alembic = migrate.config(url.render_as_string(hide_password=False))
    command.upgrade(alembic, "0012")
    backends, users = uuid.uuid4(), uuid.uuid4()
    old = create_engine(url)
    with old.begin() as c:
        for album, owner, at in [
            (backends, None, 1),
            (backends, None, 2),
            (backends, "mallory", 3),
            (users, "alice", 1),
            (users, "bob", 2),
        ]:
            photo_id = uuid.uuid4()
            c.execute(
                text(
                    "INSERT INTO photos (id, album_id, original_key, owner, created_at)"
                    " VALUES (:id, :album, :key, :owner, now() - make_interval(secs => 10 - :at))"
                ),
                {"id": photo_id, "album": album, "key": f"k/{photo_id}", "owner": owner, "at": at},
            )

    # WHEN the migrations run on to the head
    command.upgrade(alembic, "head")

    # THEN the backend's album is no user's (mallory's photo there claims nothing); the other is
    # its earliest user's
    with old.connect() as c:
        owners = dict(c.execute(text("SELECT id, owner FROM albums")).all())
    old.dispose()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    assert owners == {backends: None, users: "alice"}


def test_migration_0008_upgrades_rows_in_the_states_the_code_before_it_left(engine: Engine) -> None:
    """SPEC 4: migrations run on an existing database. (Held: kept as evidence.)"""
    name = f"pre0008_{uuid.uuid4().hex[:8]}"
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    url = engine.url.set(database=name)
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("sqlalchemy.url", url.render_as_string(hide_password=False).replace("%", "%%"))
    command.upgrade(config, "0007")
    old = create_engine(url)
    ids = [uuid.uuid4() for _ in range(7)]
    with old.begin() as c:
        for i, (state, visibility, code) in enumerate(
            [
                ("ready", "published", None),
                ("uploaded", "unpublished", None),
                ("ready", "published", None),
                ("processing_failed", "unpublished", None),
                ("uploaded", "unpublished", "DECODE_FAILED"),
                ("processing_failed", "unpublished", "STORAGE_READ_FAILED"),
                ("processing_failed", "unpublished", "WORKER_LOST"),
            ]
        ):
            c.execute(
                text(
                    "INSERT INTO photos (id, album_id, original_key, processing_state, visibility, error_code,"
                    " published_at) VALUES (:id, :a, :k, :s, :v, :e, CASE WHEN :v = 'published' THEN now() END)"
                ),
                {
                    "id": ids[i],
                    "a": uuid.uuid4(),
                    "k": f"k/{ids[i]}",
                    "s": state,
                    "v": visibility,
                    "e": code,
                },
            )
        rows = [
            # a failed re-render's owed letter, its code nulled by a resumed backfill (finding 2)
            "(:p0, 'failed', 3, NULL, NULL, NULL, NULL, now(), now(), NULL, NULL)",
            # an active job the old code left without a claim time
            "(:p1, 'active', 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
            # a done job with every column of its earlier states left over
            "(:p2, 'done', 3, now(), now(), now(), 'WORKER_LOST', now(), now(), NULL, 2)",
            "(:p3, 'failed', 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
            "(:p4, 'pending', 0, now(), now(), now(), 'DECODE_FAILED', now(), now(), NULL, NULL)",
            "(:p5, 'failed', 3, NULL, now(), NULL, 'STORAGE_READ_FAILED', NULL, now(),"
            " '0000000000000000000000000062E99A88DC407460', NULL)",
            "(:p6, 'active', 3, NULL, NULL, now(), NULL, NULL, NULL, NULL, NULL)",
        ]
        for i, row in enumerate(rows):
            c.execute(
                text(
                    "INSERT INTO photo_jobs (photo_id, status, attempt, next_retry_at, claimed_at, enqueued_at,"
                    f" last_error_code, dead_letter_owed_at, failed_at, upload_sequencer, rerender_to) VALUES {row}"
                ),
                {f"p{i}": ids[i]},
            )
    old.dispose()
    try:
        command.upgrade(config, "head")
    finally:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))


def test_an_upload_api_needs_to_write_only_the_ids_and_the_key(db: Engine) -> None:
    # GIVEN the two inserts an upload API makes (SPEC 11)
    photo_id = new_photo(db)

    # THEN every other column has its default
    with db.connect() as connection:
        photo = connection.execute(select(Photo).where(Photo.id == photo_id)).one()
    assert (photo.processing_state, photo.visibility, photo.entity_version) == ("uploaded", "unpublished", 1)
    assert photo.created_at is not None and photo.updated_at is not None
    assert job(db, photo_id) == ("pending", 0, None)


def test_every_error_code_is_accepted_by_the_check_and_nothing_else_is(db: Engine) -> None:
    photo_id = new_photo(db)
    for code in ErrorCode:
        with db.begin() as connection:
            connection.execute(
                update(Photo)
                .where(Photo.id == photo_id)
                .values(processing_state="processing_failed", error_code=code.value)
            )
    with pytest.raises(IntegrityError), db.begin() as connection:
        connection.execute(update(Photo).where(Photo.id == photo_id).values(error_code="SOMETHING_ELSE"))


def test_transactions_run_at_read_committed_whatever_the_session_default(db: Engine) -> None:
    with db.connect() as connection:
        # GIVEN a connection whose session default was changed (as a server or role setting may)
        connection.execute(text("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE"))
        connection.commit()
        # WHEN the next transaction begins on it, THEN it is READ COMMITTED: pinned, not inherited
        assert connection.scalar(text("SHOW transaction_isolation")) == "read committed"


# --- the claim -----------------------------------------------------------------------------


def test_a_pending_job_is_claimed_once_with_its_attempt_as_the_token(db: Engine) -> None:
    photo_id = new_photo(db)

    first = claim(db, photo_id)
    second = claim(db, photo_id)

    assert first == Claimed(1)
    # The second delivery finds it active and fresh: it comes back when the claim would be stale.
    assert isinstance(second, NotClaimable) and second.status == "active"
    assert second.retry_in is not None and STALE - 5 < second.retry_in <= STALE


def test_a_job_in_backoff_is_not_claimable_until_due(db: Engine) -> None:
    photo_id = new_photo(db)
    set_job(db, photo_id, next_retry_at=func.now() + timedelta(seconds=60))

    result = claim(db, photo_id)

    assert isinstance(result, NotClaimable) and result.status == "pending"
    assert result.retry_in is not None and 55 < result.retry_in <= 60


def test_a_job_due_within_a_second_is_claimable_for_the_clocks_tolerance(db: Engine) -> None:
    photo_id = new_photo(db)
    set_job(db, photo_id, next_retry_at=func.now() + timedelta(milliseconds=500))

    assert claim(db, photo_id) == Claimed(1)


@pytest.mark.parametrize("status", ["done", "failed"])
def test_a_finished_job_makes_a_delivery_a_duplicate(db: Engine, status: str) -> None:
    photo_id = new_photo(db)
    set_job(db, photo_id, status=status, attempt=1)

    assert claim(db, photo_id) == NotClaimable(status, None)


def test_a_stale_active_job_is_taken_over_with_the_next_attempt(db: Engine) -> None:
    photo_id = new_photo(db)
    set_job(db, photo_id, status="active", attempt=1, claimed_at=func.now() - timedelta(seconds=STALE + 1))

    assert claim(db, photo_id) == Claimed(2)


def test_a_stale_active_job_with_no_attempts_left_is_exhausted(db: Engine) -> None:
    photo_id = new_photo(db)
    set_job(
        db, photo_id, status="active", attempt=ATTEMPTS, claimed_at=func.now() - timedelta(seconds=STALE + 1)
    )

    assert claim(db, photo_id) == Exhausted(ATTEMPTS)


def test_a_job_row_is_created_only_for_a_photo_that_exists(db: Engine) -> None:
    photo_id = new_photo(db, job=False)

    committed(db, repository.ensure_job, photo_id)
    committed(db, repository.ensure_job, uuid.uuid4(), upload=Upload("01", "e"))

    with db.connect() as connection:
        assert connection.scalars(select(PhotoJob.photo_id)).all() == [photo_id]


def test_an_upload_of_the_original_reopens_a_failed_job_and_nothing_else(db: Engine) -> None:
    failed, done = new_photo(db), new_photo(db)
    set_job(db, failed, status="failed", attempt=3, last_error_code="ORIGINAL_NOT_FOUND")
    set_job(db, done, status="done", attempt=1)

    committed(db, repository.ensure_job, failed, upload=Upload("0A", "e1"))
    committed(db, repository.ensure_job, done, upload=Upload("0A", "e1"))

    assert job(db, failed)[:2] == ("pending", 0)
    assert job(db, done) == ("done", 1, None)


FAILED_AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
BEFORE, AFTER = FAILED_AT - timedelta(seconds=30), FAILED_AT + timedelta(seconds=30)


@pytest.mark.parametrize(
    ("seen", "event", "reopens"),
    [
        pytest.param(Upload("0A", "e1"), Upload("0A", "e1"), False, id="the-same-upload-again"),
        pytest.param(Upload("0A", "e1"), Upload("0B", "e2"), True, id="a-newer-upload"),
        # S3's rule: the shorter sequencer right-padded with zeros (issue 21, finding 4; left padding
        # read "0B" as 000B, older than 0A01, and ignored the newer upload).
        pytest.param(Upload("0A", "e1"), Upload("0A01", "e2"), True, id="a-newer-longer-sequencer"),
        pytest.param(Upload("0A01", "e1"), Upload("0B", "e2"), True, id="a-newer-shorter-sequencer"),
        pytest.param(Upload("0B", "e1"), Upload("0A01", "e2"), False, id="an-older-longer-sequencer"),
        pytest.param(Upload("FF", "e1"), Upload("0100", "e2"), False, id="an-older-longer-sequencer-0100"),
        pytest.param(Upload("0B", "e2"), Upload("0A", "e1"), False, id="an-older-upload-late"),
        pytest.param(Upload(None, "e1"), Upload(None, "e1"), False, id="no-sequencer-same-etag"),
        pytest.param(Upload(None, "e1"), Upload(None, "e2"), True, id="no-sequencer-new-etag"),
        # The job saw no upload (it ran from job messages): the event's time against the failure's.
        pytest.param(None, Upload(None, "e1", BEFORE), False, id="unseen-uploaded-before-the-failure"),
        pytest.param(None, Upload(None, "e1", AFTER), True, id="unseen-uploaded-after-the-failure"),
        pytest.param(None, Upload(None, "e1"), True, id="unseen-no-time"),
    ],
)
def test_only_a_newer_upload_reopens_a_failed_job(
    db: Engine, seen: Upload | None, event: Upload, reopens: bool
) -> None:
    # GIVEN a job that saw an upload (or none), then failed for good (a crashing input: its worker
    # was lost) at FAILED_AT
    # (its last attempt worked from that upload, and started ten seconds before it failed)
    photo_id = new_photo(db)
    if seen is not None:
        committed(db, repository.ensure_job, photo_id, upload=seen)
    set_job(
        db,
        photo_id,
        status="failed",
        attempt=3,
        last_error_code="WORKER_LOST",
        failed_at=FAILED_AT,
        attempt_started_at=FAILED_AT - timedelta(seconds=10),
        attempt_sequencer=seen.sequencer if seen else None,
        attempt_etag=seen.etag if seen else None,
    )

    # WHEN an upload event arrives: a duplicate or redelivery of the one it saw, or another upload
    committed(db, repository.ensure_job, photo_id, upload=event)

    # THEN only a genuinely newer upload gives the job its attempts back
    assert job(db, photo_id)[:2] == (("pending", 0) if reopens else ("failed", 3))


def test_an_upload_that_arrived_while_a_job_messages_attempt_ran_reopens_the_job_when_it_fails(
    db: Engine,
) -> None:
    # GIVEN a job whose last attempt ran from a job message (no upload seen at its claim), during
    # which the original's event arrived and was noted; then the attempt failed for good
    photo_id = new_photo(db)
    set_job(db, photo_id, status="active", attempt=3, attempt_started_at=FAILED_AT - timedelta(seconds=10))
    during = Upload(None, "e1", FAILED_AT - timedelta(seconds=5))
    committed(db, repository.ensure_job, photo_id, upload=during)
    set_job(db, photo_id, status="failed", last_error_code="STORAGE_READ_FAILED", failed_at=FAILED_AT)

    # WHEN that event comes back (it was answered "busy" while the attempt ran)
    committed(db, repository.ensure_job, photo_id, upload=during)

    # THEN the job has its attempts again: the attempt may have read the original before that upload
    # (a second page, if it fails again, is better than an upload never processed)
    assert job(db, photo_id)[:2] == ("pending", 0)


def test_a_new_upload_that_reopens_a_failed_job_owes_no_letter_for_the_failure_it_replaced(
    db: Engine,
) -> None:
    # GIVEN a job failed for good whose dead letter the queue refused (still owed)
    photo_id = new_photo(db)
    committed(db, repository.ensure_job, photo_id, upload=Upload(sequencer="0A", etag="etag-a"))
    claim(db, photo_id)
    failure = committed(db, machine.fail, photo_id, 1, ErrorCode.STORAGE_READ_FAILED, final=True)
    assert failure is not None
    letter = OwedLetter(photo_id, 1, ErrorCode.STORAGE_READ_FAILED, failure.failed_at)
    committed(db, machine.release_letters, [letter], lease_seconds=STALE)  # what its sender does then
    assert owed(db, photo_id) is not None

    # WHEN a newer upload reopens it
    committed(
        db, repository.ensure_job, photo_id, upload=Upload(sequencer="0B", etag="etag-b"), lease_seconds=STALE
    )

    # THEN the letter is owed no more: the failure it spoke of was given its attempts again (else,
    # read with the job's new code, it would page for the next failure, even a permanent one: the
    # state machine found that)
    assert owed(db, photo_id) is None
    assert claim(db, photo_id) == Claimed(1)
    assert committed(db, machine.fail, photo_id, 1, ErrorCode.DECODE_FAILED, final=False)
    assert committed(db, repository.take_owed_letter, photo_id, lease_seconds=0) is None


def test_a_job_message_never_reopens_a_failed_job(db: Engine) -> None:
    photo_id = new_photo(db)
    set_job(db, photo_id, status="failed", attempt=3, last_error_code="DECODE_FAILED")

    committed(db, repository.ensure_job, photo_id)

    assert job(db, photo_id) == ("failed", 3, "DECODE_FAILED")


# --- fencing and failure marking -----------------------------------------------------------


def test_a_worker_whose_job_was_taken_over_changes_nothing_when_it_fails(db: Engine) -> None:
    # GIVEN a job claimed by a slow worker (attempt 1) and then taken over (attempt 2)
    photo_id = new_photo(db)
    assert claim(db, photo_id) == Claimed(1)
    set_job(db, photo_id, claimed_at=func.now() - timedelta(seconds=STALE + 1))
    assert claim(db, photo_id) == Claimed(2)

    # WHEN the slow worker reports a failure and a retry
    failed = committed(db, machine.fail, photo_id, 1, ErrorCode.DECODE_FAILED, final=False)
    released = committed(db, machine.release, photo_id, 1, ErrorCode.STORAGE_READ_FAILED, 30)

    # THEN neither is recorded: the job and the photo are as the new owner holds them
    assert (failed, released) == (None, False)
    assert job(db, photo_id) == ("active", 2, None)
    with db.connect() as connection:
        assert connection.scalar(select(Photo.processing_state).where(Photo.id == photo_id)) == "uploaded"


def test_a_worker_whose_job_was_taken_over_cannot_publish(db: Engine) -> None:
    # GIVEN a job claimed by a slow worker (attempt 1) and then taken over (attempt 2)
    photo_id = new_photo(db)
    claim(db, photo_id)
    set_job(db, photo_id, claimed_at=func.now() - timedelta(seconds=STALE + 1))
    claim(db, photo_id)

    # WHEN the slow worker finishes rendering: may it write its variants, may it publish?
    holds = committed(db, repository.holds, photo_id, 1, 1, READ)
    result = committed(db, transaction.publish, photo_id, 1, RENDITION)

    # THEN neither: it is fenced out, and the photo, its variants, events and job are untouched
    assert (holds, result.outcome) == (None, "superseded")
    assert job(db, photo_id) == ("active", 2, None)
    with db.connect() as connection:
        assert connection.scalar(select(Photo.entity_version).where(Photo.id == photo_id)) == 1
        assert connection.scalar(select(func.count()).select_from(PhotoVariant)) == 0
        assert connection.scalar(select(func.count()).select_from(OutboxEvent)) == 0

    # AND the owner publishes, once
    assert committed(db, repository.holds, photo_id, 2, 1, READ) == Holding("publish")
    assert committed(db, transaction.publish, photo_id, 2, RENDITION).outcome == "published"
    assert job(db, photo_id)[:2] == ("done", 2)
    assert committed(db, repository.holds, photo_id, 2, 1, READ) is None


def test_a_published_photos_variants_are_never_written_again(db: Engine) -> None:
    # GIVEN a published photo whose job is active again (an operator's retry raced the publish)
    photo_id = new_photo(db)
    claim(db, photo_id)
    committed(
        db, transaction.publish, photo_id, 1, Rendition(10, 10, VARIANTS, 1, PLACEHOLDER, original=READ)
    )
    set_job(db, photo_id, status="active", attempt=2)

    # WHEN its worker, having read the same original, asks whether it may write the variants
    # THEN it may not, though it holds the claim: there is nothing to commit
    assert committed(db, repository.holds, photo_id, 2, 1, READ) == Holding("nothing")


def test_a_failure_never_downgrades_a_published_photo(db: Engine) -> None:
    photo_id = new_photo(db)
    claim(db, photo_id)
    committed(db, transaction.publish, photo_id, 1, Rendition(10, 10, VARIANTS, 1, PLACEHOLDER))
    set_job(db, photo_id, status="active", attempt=3)

    assert committed(db, machine.fail, photo_id, 3, ErrorCode.DECODE_FAILED, final=False)

    with db.connect() as connection:
        photo = connection.execute(select(Photo).where(Photo.id == photo_id)).one()
    assert (photo.processing_state, photo.visibility, photo.error_code) == ("ready", "published", None)


def test_a_retry_puts_the_job_back_in_backoff_with_its_code(db: Engine) -> None:
    photo_id = new_photo(db)
    claim(db, photo_id)

    assert committed(db, machine.release, photo_id, 1, ErrorCode.STORAGE_READ_FAILED, 30)

    assert job(db, photo_id) == ("pending", 1, "STORAGE_READ_FAILED")
    again = claim(db, photo_id)
    assert isinstance(again, NotClaimable) and again.retry_in is not None and 25 < again.retry_in <= 30


def test_publishing_a_deleted_photo_is_skipped(db: Engine) -> None:
    photo_id = new_photo(db)
    claim(db, photo_id)
    with db.begin() as connection:
        connection.execute(text("DELETE FROM photos WHERE id = :id"), {"id": photo_id})

    result = committed(db, transaction.publish, photo_id, 1, Rendition(1, 1, VARIANTS, 1, PLACEHOLDER))

    assert result.outcome == "skipped"


# --- dead letters owed ------------------------------------------------------------------------


def test_a_final_failure_owes_its_dead_letter_until_it_is_sent(db: Engine) -> None:
    # GIVEN a job failed for good, and another failed permanently
    final, permanent = new_photo(db), new_photo(db)
    for photo_id in (final, permanent):
        claim(db, photo_id)
    failure = committed(db, machine.fail, final, 1, ErrorCode.STORAGE_READ_FAILED, final=True)
    assert failure is not None
    failed_at = failure.failed_at
    assert failed_at is not None
    assert committed(db, machine.fail, permanent, 1, ErrorCode.DECODE_FAILED, final=False) is not None

    # THEN only the final failure owes a dead letter, recorded with the failure itself
    assert owed(db, final) is not None
    assert owed(db, permanent) is None

    # AND it is not for a second sender while its first sender may still be sending
    wait = committed(db, repository.take_owed_letter, final, lease_seconds=STALE)
    assert isinstance(wait, float) and STALE - 5 < wait <= STALE
    assert committed(db, repository.take_owed_letter, permanent, lease_seconds=STALE) is None

    # WHEN its lease has passed, one taker gets it (a second gets the new lease's wait)
    set_job(db, final, dead_letter_owed_at=func.now() - timedelta(seconds=STALE + 1))
    taken = committed(db, repository.take_owed_letter, final, lease_seconds=STALE)
    assert taken == OwedLetter(final, 1, ErrorCode.STORAGE_READ_FAILED, failed_at)
    assert isinstance(committed(db, repository.take_owed_letter, final, lease_seconds=STALE), float)

    # AND once sent, nothing is owed
    committed(db, machine.settle_letters, [taken])
    assert owed(db, final) is None
    assert committed(db, repository.take_owed_letter, final, lease_seconds=STALE) is None


def test_an_upload_waits_while_the_letter_of_the_failure_it_would_take_back_is_being_sent(db: Engine) -> None:
    # GIVEN a final failure whose letter its sender holds (sent any moment now)
    photo_id = new_photo(db)
    committed(db, repository.ensure_job, photo_id, upload=Upload(sequencer="0A", etag="etag-a"))
    claim(db, photo_id)
    assert committed(db, machine.fail, photo_id, 1, ErrorCode.STORAGE_READ_FAILED, final=True)

    # WHEN a newer upload arrives, THEN it does not reopen the job yet (taken back now, the letter
    # would page for a photo no longer failed): its delivery waits for the letter's lease
    committed(
        db, repository.ensure_job, photo_id, upload=Upload(sequencer="0B", etag="etag-b"), lease_seconds=STALE
    )
    assert job(db, photo_id)[0] == "failed"
    wait = committed(db, repository.take_owed_letter, photo_id, lease_seconds=STALE)
    assert isinstance(wait, float) and wait > 0
