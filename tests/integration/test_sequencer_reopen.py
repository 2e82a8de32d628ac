"""Newer uploads of an original, on a real PostgreSQL.

S3 sequencers of different lengths order uploads after RIGHT-padding the shorter with zeros (SPEC 5,
AWS's event message structure): a failed job is reopened by a newer upload whatever the two
sequencers' lengths, and never by an older one. A published photo's original written again (a form
posted twice, SPEC 19) is the newest upload: published as a new picture, whatever order the events
arrive in, its read pinned to the upload its event names.

Through the real process handler, on moto's S3 and SQS (SPEC 5, 16): the newest upload of a photo
is processed whatever became of the attempts before it (one failing as the upload lands, a failure
for good, the same file uploaded again onto a row as migration 0008 left it, a last attempt lost
with its worker, that loss's letter held), and a late duplicate of an older upload's event reopens
nothing.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import quote_plus

import pytest
import pyvips
from sqlalchemy import Engine, func, insert, literal_column, select, text, update

from devkit import handlers, samples, uploads
from devkit.poller import LambdaContext, Poller, sqs_event
from photo_publish import bootstrap
from photo_publish.adapters.models import OutboxEvent, Photo, PhotoJob, PhotoVariant
from photo_publish.adapters.storage import OriginalReplaced, Pin, S3Store
from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.jobs import machine
from photo_publish.keys import Upload, sequencer_order
from photo_publish.publish import repository
from tests.conftest import BUCKET, STAGE, Infra
from tests.faults import aws_fails
from tests.integration.test_database import new_photo
from tests.letters import letter_codes
from tests.originals import small, upload
from tests.polling import drain, poll_until, queued
from tests.rows import committed, in_state, job, photo, published

process = handlers.load("process")

# AWS's own sample sequencer (its event message structure page), and uploads of the same key whose
# sequencers are one digit shorter: right-padded, "...F" is "...F0", after "...E5"; "...E" is
# "...E0", before it. Left-padded to 40, the shorter of two gains a leading zero where the longer
# has its first significant digit ("0" against "5" here), so it reads as the older whatever its
# digits: a newer upload is ignored, and an older but longer one reopens.
STORED = "0055AED6DCD90281E5"
NEWER_SHORTER = "0055AED6DCD90281F"
OLDER_SHORTER = "0055AED6DCD90281E"
# And the other way round: a longer sequencer that is older than the shorter one stored.
STORED_SHORT = "0055AED6DCD90281F"
OLDER_LONGER = "0055AED6DCD90281E5"


def photo_with_a_failed_job(db: Engine, seen: Upload) -> uuid.UUID:
    """A photo whose job saw `seen`, then failed for good (its worker was lost)."""
    photo_id = uuid.uuid4()
    with db.begin() as connection:
        connection.execute(
            insert(Photo).values(id=photo_id, album_id=uuid.uuid4(), original_key=f"dev/originals/{photo_id}")
        )
    committed(db, repository.ensure_job, photo_id, upload=seen)
    # its attempt worked from that upload, and failed
    assert committed(db, repository.claim, photo_id, stale_after=300, max_attempts=3)
    assert committed(db, machine.fail, photo_id, 1, ErrorCode.WORKER_LOST, final=False)
    return photo_id


def recorded_etag(db: Engine, photo_id: uuid.UUID) -> str | None:
    with db.connect() as connection:
        return connection.scalar(select(PhotoJob.upload_etag).where(PhotoJob.photo_id == photo_id))


def test_a_newer_upload_with_a_shorter_sequencer_reopens_a_failed_job_and_is_recorded(db: Engine) -> None:
    # GIVEN a photo failed for good after an upload with AWS's sample sequencer
    photo_id = photo_with_a_failed_job(db, Upload(STORED, "etag-first"))

    # WHEN a later upload of the original arrives, its sequencer one digit shorter
    committed(db, repository.ensure_job, photo_id, upload=Upload(NEWER_SHORTER, "etag-second"))

    # THEN the upload is new proof that the original exists: the job has its attempts again, and
    # the job records the new upload (its eTag) as the newest it has seen
    assert (job(db, photo_id), recorded_etag(db, photo_id)) == (("pending", 0, None), "etag-second")


@pytest.mark.parametrize(
    ("stored", "late"),
    [
        pytest.param(STORED, OLDER_SHORTER, id="older-and-shorter"),
        pytest.param(STORED_SHORT, OLDER_LONGER, id="older-and-longer"),
    ],
)
def test_an_older_upload_arriving_late_never_reopens_a_failed_job(db: Engine, stored: str, late: str) -> None:
    # GIVEN a photo failed for good after an upload
    photo_id = photo_with_a_failed_job(db, Upload(stored, "etag-newest"))

    # WHEN the event of an earlier upload of the original arrives late (S3 delivers out of order)
    committed(db, repository.ensure_job, photo_id, upload=Upload(late, "etag-earlier"))

    # THEN nothing is reopened and the newest upload stays the one recorded
    assert (job(db, photo_id), recorded_etag(db, photo_id)) == (("failed", 1, "WORKER_LOST"), "etag-newest")


# The comparison ensure_job should make (SPEC 5), on the sequencers as S3 sent them (unpadded):
# both right-padded to the longer one's length, in upper case, compared byte by byte.
def test_postgresqls_rpad_orders_sequencers_as_sequencer_order_does(db: Engine) -> None:
    # GIVEN the finding's pairs, and a thousand random pairs of hex sequencers of 1 to 24 digits
    # in either case
    draw = random.Random(4)
    pairs = [(NEWER_SHORTER, STORED), (OLDER_SHORTER, STORED), (OLDER_LONGER, STORED_SHORT), ("FF", "0100")]
    for _ in range(1000):
        digits = [
            "".join(draw.choice("0123456789ABCDEFabcdef") for _ in range(draw.randint(1, 24))) for _ in "ab"
        ]
        pairs.append((digits[0], digits[1]))

    # WHEN PostgreSQL orders each pair as the job machine's statements do
    pair = text("unnest(CAST(:a AS text[]), CAST(:b AS text[])) WITH ORDINALITY AS pair(a, b, n)")
    later_than = machine._sequencer_after(literal_column("a"), literal_column("b"))
    with db.connect() as connection:
        later = connection.scalars(
            select(later_than).select_from(pair).order_by(literal_column("n")),
            {"a": [a for a, _ in pairs], "b": [b for _, b in pairs]},
        ).all()

    # THEN it agrees with S3's rule everywhere
    assert later == [sequencer_order(a, b) > 0 for a, b in pairs]


# --- A published photo's original written again (SPEC 19): the newest upload is the shown picture ---
#
# Through the real process handler, on moto's S3 and PostgreSQL. A form posted again before it
# expires writes the original's key a second time: in a versioned bucket (the template's) a second
# version, in an unversioned one (MinIO, moto without versioning) the same key over. The events are
# S3's notifications as S3 writes them: the object's eTag, its sequencer and, where the bucket keeps
# versions, its versionId (moto's own notifications carry neither).
FIRST, SECOND = "GreenMeadow.jpg", "Storm.jpg"  # 1280 x 1024, then 1920 x 1280
EARLIER, LATER = "0055AED6DCD90281E5", "0055AED6DCD9028200"


@dataclass(frozen=True)
class Put:
    """One write of the original, and the S3 notification announcing it."""

    etag: str
    version: str | None
    event: dict[str, Any]


@pytest.fixture(params=["versioned", "unversioned"])
def bucket(request: pytest.FixtureRequest, infra: Infra) -> str:
    """A bucket of the test's own (versions kept, or not), the process function reading it."""
    name = f"reposted-{uuid.uuid4().hex[:12]}"
    infra.s3.create_bucket(Bucket=name)
    if request.param == "versioned":
        infra.s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    infra.configure(photo_bucket=name)
    return name


def put(infra: Infra, bucket: str, key: str, image: str, *, sequencer: str, at: str) -> Put:
    data = (samples.IMAGES / image).read_bytes()
    answer = infra.s3.put_object(Bucket=bucket, Key=key, Body=data, ContentType="image/jpeg")
    etag, version = answer["ETag"].strip('"'), answer.get("VersionId")
    s3_object: dict[str, Any] = {
        "key": quote_plus(key),
        "size": len(data),
        "eTag": etag,
        "sequencer": sequencer,
    }
    if version is not None:
        s3_object["versionId"] = version
    record = {
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "awsRegion": "us-east-1",
        "eventTime": at,
        "eventName": "ObjectCreated:Post",
        "s3": {
            "s3SchemaVersion": "1.0",
            "bucket": {"name": bucket, "arn": f"arn:aws:s3:::{bucket}"},
            "object": s3_object,
        },
    }
    return Put(etag, version, {"Records": [record]})


def deliver(put: Put) -> dict[str, Any]:
    """The notification as the queue's Lambda event source hands it to the process function."""
    record = {
        "messageId": str(uuid.uuid4()),
        "receiptHandle": "not-returned",
        "body": json.dumps(put.event),
        "attributes": {"ApproximateReceiveCount": "1"},
        "messageAttributes": {},
        "eventSource": "aws:sqs",
    }
    response: dict[str, Any] = process.lambda_handler({"Records": [record]}, LambdaContext())
    return response


def shown(db: Engine, photo_id: uuid.UUID) -> Any:
    with db.connect() as connection:
        return connection.execute(
            select(
                Photo.processing_state,
                Photo.entity_version,
                Photo.width,
                Photo.height,
                Photo.thumbhash,
                Photo.original_etag,
                Photo.original_version,
            ).where(Photo.id == photo_id)
        ).one()


def events(db: Engine, photo_id: uuid.UUID) -> list[tuple[str, int]]:
    with db.connect() as connection:
        rows = connection.execute(
            select(OutboxEvent.event_type, OutboxEvent.payload)
            .where(OutboxEvent.aggregate_id == photo_id)
            .order_by(OutboxEvent.created_at)
        ).all()
    return [(event_type, payload["entityVersion"]) for event_type, payload in rows]


def browse_size(infra: Infra, bucket: str, db: Engine, photo_id: uuid.UUID) -> tuple[str, int, int]:
    """The browse variant's key, and the size of the picture its object holds."""
    with db.connect() as connection:
        key = connection.scalar(
            select(PhotoVariant.storage_key).where(
                PhotoVariant.photo_id == photo_id, PhotoVariant.kind == "browse"
            )
        )
    body = infra.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    image = pyvips.Image.new_from_buffer(body, "")
    return key, image.width, image.height


def test_a_published_photos_original_written_again_is_published_as_a_new_picture(
    infra: Infra, db: Engine, bucket: str
) -> None:
    # GIVEN a photo published from its first upload (picture A)
    registered = uploads.register(db, STAGE, "holiday.jpg")
    first = put(infra, bucket, registered.key, FIRST, sequencer=EARLIER, at="2026-12-07T21:00:00.000Z")
    assert deliver(first) == {"batchItemFailures": []}
    before = shown(db, registered.photo_id)
    key_a, *size_a = browse_size(infra, bucket, db, registered.photo_id)
    assert (before.entity_version, before.width, before.height, size_a) == (2, 1280, 1024, [1280, 1024])

    # WHEN the same form is posted again with another file (a second object version, a newer
    # sequencer), and its event is delivered
    second = put(infra, bucket, registered.key, SECOND, sequencer=LATER, at="2026-12-07T21:01:00.000Z")
    response = deliver(second)

    # THEN picture B is published as a new picture: a new entity version, photo.published, its own
    # variant keys (A's objects are immutable) holding B, and the original it was read from recorded
    after = shown(db, registered.photo_id)
    key_b, *size_b = browse_size(infra, bucket, db, registered.photo_id)
    assert response == {"batchItemFailures": []}
    assert (after.processing_state, after.entity_version, after.width, after.height) == (
        "ready",
        3,
        1920,
        1280,
    )
    assert size_b == [1920, 1280] and key_b != key_a and after.thumbhash != before.thumbhash
    assert (after.original_etag, after.original_version) == (second.etag, second.version)
    assert events(db, registered.photo_id) == [("photo.published", 2), ("photo.published", 3)]

    # WHEN the first upload's event, then the second's, are delivered again (S3 delivers at least once)
    assert deliver(first) == deliver(second) == {"batchItemFailures": []}

    # THEN nothing changes: no event, no version bump, B still shown
    assert shown(db, registered.photo_id) == after
    assert len(events(db, registered.photo_id)) == 2


def test_an_event_whose_upload_was_written_over_loses_nothing(infra: Infra, db: Engine, bucket: str) -> None:
    # GIVEN a registered photo whose form was posted twice before either event was delivered
    registered = uploads.register(db, STAGE, "holiday.jpg")
    first = put(infra, bucket, registered.key, FIRST, sequencer=EARLIER, at="2026-12-07T21:00:00.000Z")
    second = put(infra, bucket, registered.key, SECOND, sequencer=LATER, at="2026-12-07T21:00:05.000Z")

    # WHEN the first upload's event is delivered, after its object was written over
    assert deliver(first) == {"batchItemFailures": []}

    # THEN the read pinned to it says what it read: in a versioned bucket the first version, still
    # there, is published; in an unversioned one its eTag's bytes are gone (412), and the job waits,
    # pending, for the newer write: nothing failed, nothing pages, nothing shows a picture not read
    state = shown(db, registered.photo_id)
    if second.version is not None:
        assert (state.processing_state, state.width, state.original_version) == ("ready", 1280, first.version)
    else:
        assert (state.processing_state, state.entity_version) == ("uploaded", 1)
        assert job(db, registered.photo_id)[0] == "pending"
    assert infra.sqs.receive_message(QueueUrl=infra.queues.dead_letter_url).get("Messages") is None

    # WHEN the second upload's own event arrives
    assert deliver(second) == {"batchItemFailures": []}

    # THEN it publishes B: the shown picture is the original's current version
    state = shown(db, registered.photo_id)
    assert (state.processing_state, state.width, state.height) == ("ready", 1920, 1280)
    assert (state.original_etag, state.original_version) == (second.etag, second.version)
    assert browse_size(infra, bucket, db, registered.photo_id)[1:] == (1920, 1280)
    assert events(db, registered.photo_id)[-1] == ("photo.published", state.entity_version)


def test_a_form_posted_again_and_again_spends_no_retries_of_the_upload_finally_read(db: Engine) -> None:
    # GIVEN a photo whose original is written over under each attempt, more times than it has attempts
    max_attempts = 3
    photo_id = new_photo(db)
    for _ in range(max_attempts + 1):
        with db.begin() as connection:
            claimed = machine.claim(connection, photo_id, stale_after=300, max_attempts=max_attempts)
            assert claimed is not None
            assert machine.step_aside(connection, photo_id, claimed.attempt)

    # WHEN the upload that is finally read is claimed, and its run fails for a while
    with db.begin() as connection:
        claimed = machine.claim(connection, photo_id, stale_after=300, max_attempts=max_attempts)

    # THEN it is its first attempt: a replaced read spent none of the retries a transient failure
    # gets, and the stepped-aside attempts' numbers no longer hold the job
    assert claimed is not None and claimed.attempt == 1
    with db.begin() as connection:
        assert not machine.step_aside(connection, photo_id, max_attempts)
        assert machine.release(connection, photo_id, 1, ErrorCode.STORAGE_READ_FAILED, 0)
    assert job(db, photo_id)[:2] == ("pending", 1)


def test_the_newer_uploads_event_arriving_first_is_published_and_the_older_one_changes_nothing(
    infra: Infra, db: Engine, bucket: str
) -> None:
    # GIVEN a registered photo whose form was posted twice
    registered = uploads.register(db, STAGE, "holiday.jpg")
    first = put(infra, bucket, registered.key, FIRST, sequencer=EARLIER, at="2026-12-07T21:00:00.000Z")
    second = put(infra, bucket, registered.key, SECOND, sequencer=LATER, at="2026-12-07T21:00:05.000Z")

    # WHEN the second upload's event arrives first, then the first's (S3 delivers out of order)
    assert deliver(second) == {"batchItemFailures": []}
    published = shown(db, registered.photo_id)
    assert deliver(first) == {"batchItemFailures": []}

    # THEN B was published once, and the older event changed nothing
    assert (published.processing_state, published.entity_version, published.width) == ("ready", 2, 1920)
    assert shown(db, registered.photo_id) == published
    assert events(db, registered.photo_id) == [("photo.published", 2)]


def test_a_pinned_read_returns_the_upload_named_or_says_it_was_written_over(
    infra: Infra, bucket: str
) -> None:
    # GIVEN an original written twice
    key = f"{STAGE}/originals/albums/{uuid.uuid4()}/{uuid.uuid4()}/holiday.jpg"
    first = put(infra, bucket, key, FIRST, sequencer=EARLIER, at="2026-12-07T21:00:00.000Z")
    second = put(infra, bucket, key, SECOND, sequencer=LATER, at="2026-12-07T21:00:05.000Z")
    store = S3Store(infra.s3, bucket)

    # WHEN each upload is read pinned (by version where the bucket keeps them, else by eTag)
    # THEN the newest is read and named as S3 names it
    stream = store.open_original(key, 10**8, Pin(second.etag, second.version))
    assert (stream.etag, stream.version) == (second.etag, second.version)
    assert stream.read(10**8) == (samples.IMAGES / SECOND).read_bytes()
    stream.close()
    # AND the first is its own version's bytes, or, unversioned, written over
    if first.version is None:
        with pytest.raises(OriginalReplaced):
            store.open_original(key, 10**8, Pin(first.etag))
    else:
        stream = store.open_original(key, 10**8, Pin(first.etag, first.version))
        assert stream.read(10**8) == (samples.IMAGES / FIRST).read_bytes()
        stream.close()
        # ... until that version is removed (NoSuchVersion): written over too
        infra.s3.delete_object(Bucket=bucket, Key=key, VersionId=first.version)
        with pytest.raises(OriginalReplaced):
            store.open_original(key, 10**8, Pin(first.etag, first.version))


def test_a_new_picture_waits_for_the_letter_of_a_failed_rerender_then_is_published(
    infra: Infra, db: Engine, bucket: str
) -> None:
    # GIVEN a published photo whose re-render failed for good, its dead letter being sent right now
    registered = uploads.register(db, STAGE, "holiday.jpg")
    first = put(infra, bucket, registered.key, FIRST, sequencer=EARLIER, at="2026-12-07T21:00:00.000Z")
    assert deliver(first) == {"batchItemFailures": []}
    with db.begin() as connection:
        connection.execute(
            update(PhotoJob)
            .where(PhotoJob.photo_id == registered.photo_id)
            .values(**in_state(status="failed", dead_letter_owed_at=func.now()))
        )

    # WHEN the form is posted again and its event arrives, through the queue
    second = put(infra, bucket, registered.key, SECOND, sequencer=LATER, at="2026-12-07T21:01:00.000Z")
    infra.sqs.send_message(QueueUrl=infra.queues.url, MessageBody=json.dumps(second.event))
    (message,) = infra.sqs.receive_message(QueueUrl=infra.queues.url, AttributeNames=["All"])["Messages"]
    answer = process.lambda_handler(sqs_event([message], infra.queues.arn), LambdaContext())

    # THEN it comes back later (a reopening takes the failure's letter back: not while it is sent)
    assert answer == {"batchItemFailures": [{"itemIdentifier": message["MessageId"]}]}
    assert shown(db, registered.photo_id).width == 1280

    # WHEN the letter was sent, and the event comes back
    with db.begin() as connection:
        connection.execute(
            update(PhotoJob).where(PhotoJob.photo_id == registered.photo_id).values(dead_letter_owed_at=None)
        )
    assert deliver(second) == {"batchItemFailures": []}

    # THEN the new picture is published
    state = shown(db, registered.photo_id)
    assert (state.processing_state, state.entity_version, state.width) == ("ready", 3, 1920)


# --- The newest upload is processed, whatever became of the attempts before it (SPEC 5, 16) ------
#
# Through the real process handler on moto's S3 and SQS. Interleavings are forced by hooking the
# real clients at the moment two actors overlap (never by writing the tables behind the code's
# back, except where a test says so).


def test_a_reupload_landing_during_a_failing_attempt_on_the_old_file_is_published(
    infra: Infra, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC 16 (3), SPEC 5 re-uploads: the newest upload of a photo is always processed."""
    infra.configure(retry_base_seconds=0, stale_after_seconds=5)
    fixed = small("Garden.jpg")
    # GIVEN an upload of a broken file, whose attempt has opened the (broken) original ...
    opened: list[str] = []
    real_open = S3Store.open_original

    def open_then_reupload(self: S3Store, key: str, max_bytes: int, pin: Any = None) -> Any:
        stream = real_open(self, key, max_bytes, pin)
        if not opened:
            opened.append(key)
            # ... when the user uploads the fixed file, and its notification is delivered while the
            # first attempt still renders the broken bytes it read
            uploads.put_original(infra.s3, BUCKET, key, fixed)
            other = Poller(
                infra.sqs, infra.queues.url, infra.queues.arn, process.lambda_handler, wait_seconds=2
            )
            deadline = time.monotonic() + 20
            while other.received < 1 and time.monotonic() < deadline:
                other.poll_once()
        return stream

    monkeypatch.setattr(S3Store, "open_original", open_then_reupload)
    shot = upload(infra, db, "Garden.jpg", fixed[: len(fixed) // 2])
    poll_until(infra, lambda: job(db, shot.photo_id)[0] == "failed")
    assert photo(db, shot.photo_id)[:2] == ("processing_failed", "DECODE_FAILED")
    monkeypatch.setattr(S3Store, "open_original", real_open)

    # WHEN the queue's messages reach the process function (the fixed upload's came back)
    drain(infra, published(db, shot.photo_id), timeout=30)

    # THEN the fixed upload was processed
    assert photo(db, shot.photo_id)[0] == "ready", (
        f"the fixed upload was dropped: photo {photo(db, shot.photo_id)}, job {job(db, shot.photo_id)}"
    )


def test_a_reupload_of_the_same_file_after_a_final_failure_is_published(infra: Infra, db: Engine) -> None:
    """SPEC 5 (re-uploads, as amended): a newer upload of a failed photo is processed. The user's
    fix for a photo that failed because S3 was down is to upload the same file again."""
    # GIVEN a photo that failed for good because S3 could not be read through its attempts
    infra.configure(retry_base_seconds=1)
    data = small("LadyBird.jpg")
    with aws_fails(bootstrap.s3_client(), "GetObject"):
        shot = upload(infra, db, "LadyBird.jpg", data)
        poll_until(infra, lambda: job(db, shot.photo_id)[0] == "failed")
    assert job(db, shot.photo_id) == ("failed", 3, "STORAGE_READ_FAILED")
    assert letter_codes(infra) == [(shot.photo_id, "STORAGE_READ_FAILED")]

    # WHEN S3 is back and the user uploads the same file again (a new upload: a new event, later
    # than the failure)
    time.sleep(1.1)
    uploads.put_original(infra.s3, BUCKET, shot.key, data)
    drain(infra, published(db, shot.photo_id), timeout=20)

    # THEN the new upload was processed
    assert photo(db, shot.photo_id)[0] == "ready", (
        f"the re-upload was answered as a duplicate: photo {photo(db, shot.photo_id)},"
        f" job {job(db, shot.photo_id)}"
    )


def test_a_reupload_of_the_same_file_with_s3s_sequencer_after_0008_cleared_the_stored_one_is_published(
    infra: Infra, db: Engine
) -> None:
    """SPEC 5 (re-uploads): as AWS sends it (with a sequencer) onto a job row as migration 0008
    leaves it (its stored sequencer cleared): the eTag alone decides, and the same file's eTag is
    the same, so the new upload is taken for the old one."""
    infra.configure(retry_base_seconds=1)
    data = small("LadyBird.jpg")
    with aws_fails(bootstrap.s3_client(), "GetObject"):
        shot = upload(infra, db, "LadyBird.jpg", data)
        poll_until(infra, lambda: job(db, shot.photo_id)[0] == "failed")
    assert job(db, shot.photo_id) == ("failed", 3, "STORAGE_READ_FAILED")
    with db.connect() as c:
        stored = c.execute(
            select(PhotoJob.upload_sequencer, PhotoJob.upload_etag).where(PhotoJob.photo_id == shot.photo_id)
        ).one()
    assert stored.upload_sequencer is None and stored.upload_etag  # what 0008 leaves on every row

    # WHEN the user uploads the same file again, and S3's notification (with its sequencer, as AWS
    # writes one on every record) reaches the queue
    time.sleep(1.1)
    uploads.put_original(infra.s3, BUCKET, shot.key, data)
    messages: list[dict[str, Any]] = []
    deadline = time.monotonic() + 10
    while not messages and time.monotonic() < deadline:
        messages = infra.sqs.receive_message(QueueUrl=infra.queues.url, WaitTimeSeconds=1).get("Messages", [])
    body = json.loads(messages[0]["Body"])
    body["Records"][0]["s3"]["object"]["sequencer"] = "0066B1A2C3D4E5F600"
    infra.sqs.delete_message(QueueUrl=infra.queues.url, ReceiptHandle=messages[0]["ReceiptHandle"])
    infra.sqs.send_message(QueueUrl=infra.queues.url, MessageBody=json.dumps(body))
    drain(infra, published(db, shot.photo_id), timeout=20)

    # THEN the new upload was processed
    assert photo(db, shot.photo_id)[0] == "ready", (
        f"the re-upload was answered as a duplicate: photo {photo(db, shot.photo_id)},"
        f" job {job(db, shot.photo_id)}"
    )


def test_a_late_duplicate_of_an_older_uploads_event_never_reopens_the_failed_job(
    infra: Infra, db: Engine
) -> None:
    """SPEC 16 (3): an older or repeated event never reopens anything. S3 delivers at least once,
    and out of order; where no sequencer is stored (moto, or every row after 0008) the eTag decides
    alone, and a different eTag is taken for a newer upload."""
    infra.configure(retry_base_seconds=0)
    whole = small("Garden.jpg")
    bodies: list[str] = []

    def keeping(event: dict[str, Any], context: Any) -> dict[str, Any]:
        bodies.extend(r["body"] for r in event["Records"])
        response: dict[str, Any] = process.lambda_handler(event, context)
        return response

    # GIVEN a first upload of a broken file that failed, and a second broken one that failed too
    shot = upload(infra, db, "Garden.jpg", whole[: len(whole) // 2])
    poll_until(infra, lambda: job(db, shot.photo_id)[0] == "failed", handler=keeping)
    first = bodies[0]
    uploads.put_original(infra.s3, BUCKET, shot.key, whole[: len(whole) // 3])
    poll_until(infra, lambda: len(bodies) >= 2 and job(db, shot.photo_id)[0] == "failed", handler=keeping)
    time.sleep(0.5)

    def failures() -> int:
        with db.connect() as c:
            return int(
                c.scalar(
                    select(func.count())
                    .select_from(OutboxEvent)
                    .where(
                        OutboxEvent.aggregate_id == shot.photo_id, OutboxEvent.event_type == "photo.failed"
                    )
                )
                or 0
            )

    assert failures() == 2

    # WHEN S3 delivers the first upload's notification once more, late (at least once, any order)
    infra.sqs.send_message(QueueUrl=infra.queues.url, MessageBody=first)
    drain(infra, lambda: False, timeout=10)

    # THEN nothing was reopened: no third attempt at the photo, no third photo.failed event
    assert failures() == 2, f"an older upload's event reopened the failed job: job {job(db, shot.photo_id)}"


def last_attempt_lost(db: Engine) -> uploads.Upload:
    """A registered photo whose three attempts died with their workers, the last one's claim stale."""
    shot = uploads.register(db, STAGE, "Garden.jpg")
    an_hour_ago = func.now() - timedelta(hours=1)
    with db.begin() as c:
        c.execute(
            update(PhotoJob)
            .where(PhotoJob.photo_id == shot.photo_id)
            .values(
                in_state(status="active", attempt=3, claimed_at=an_hour_ago, attempt_started_at=an_hour_ago)
            )
        )
    return shot


def test_a_new_upload_that_finds_the_last_attempt_lost_with_its_worker_is_processed(
    infra: Infra, db: Engine
) -> None:
    """The state machine (issue 21's find runs): a new upload's record reached a job whose third
    attempt lay with a dead worker; the lost attempts were paged as WORKER_LOST and the photo failed
    for good, the user's new file never processed (the attempts lost were not this upload's)."""
    # GIVEN a photo whose three attempts died with their workers, the last one's claim stale
    shot = last_attempt_lost(db)

    # WHEN the user uploads a new file, and its notification reaches the process function
    uploads.put_original(infra.s3, BUCKET, shot.key, small("Garden.jpg"))
    drain(infra, published(db, shot.photo_id))

    # THEN the loss was paged, and the new upload was processed: the photo is published
    assert (shot.photo_id, "WORKER_LOST") in letter_codes(infra)
    assert photo(db, shot.photo_id)[0] == "ready", f"job {job(db, shot.photo_id)}"


def test_a_new_upload_that_finds_the_last_attempt_lost_comes_back_while_the_losss_letter_is_held(
    infra: Infra, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same, when the reopen is refused because the loss's letter is held (sent, but the write
    that settles it failed): the record was acknowledged and the new file never processed."""
    # GIVEN a photo whose three attempts died with their workers, the last one's claim stale
    infra.configure(stale_after_seconds=2)  # a held letter's lease: the record comes back after it
    shot = last_attempt_lost(db)
    # ... and the database refuses the write that settles the loss's letter, once
    settle = machine.settle_letters
    calls: list[int] = []

    def refused_once(connection: Any, letters: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise PhotoError(ErrorCode.DATABASE_UNAVAILABLE, "injected")
        settle(connection, letters)

    monkeypatch.setattr(machine, "settle_letters", refused_once)

    # WHEN the user uploads a new file; its notification comes back until the letter's lease passed
    uploads.put_original(infra.s3, BUCKET, shot.key, small("Garden.jpg"))
    drain(infra, published(db, shot.photo_id))

    # THEN the new upload was processed
    assert photo(db, shot.photo_id)[0] == "ready", f"job {job(db, shot.photo_id)}, queued {queued(infra)}"
