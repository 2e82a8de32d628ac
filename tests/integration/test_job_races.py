"""The job's life under races (SPEC 5, 16): re-uploads during and after failures, retries and
re-renders racing letters and backfills, late duplicates; each test failed first.

Real parts throughout, as in test_letters_and_reuploads_under_faults.py: PostgreSQL, moto's server over HTTP (S3
notifications into SQS, the dead-letter queue), libvips, the real process and sweep handlers and
the operator's commands. Interleavings are forced by hooking the real clients at the moment two
actors overlap (never by writing the tables behind the code's back, except where a test says so).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from sqlalchemy import Engine, select

from devkit import uploads
from devkit.poller import Poller
from photo_publish import bootstrap, operator
from photo_publish.adapters.models import PhotoJob
from photo_publish.adapters.queue import SqsQueue
from photo_publish.adapters.storage import S3Store
from photo_publish.jobs import machine
from tests.conftest import BUCKET, Infra
from tests.faults import aws_fails
from tests.integration.test_letters_and_reuploads_under_faults import (
    dead_letters,
    drain,
    lease_passes,
    owed,
    rerender,
    small,
    sweep,
    upload,
    versions,
)
from tests.polling import poll_until, process
from tests.rows import job, photo, published

# --- 1: a re-upload that lands while an attempt on the old file is at work -----------------------


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


# --- 2: a re-upload of the same file after a final failure ---------------------------------------


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
    assert dead_letters(infra) == [(shot.photo_id, "STORAGE_READ_FAILED")]

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


# --- 3: the operator's retry while the sweep sends the letter it leased --------------------------


def test_a_retry_while_the_sweep_sends_an_owed_letter_never_pages_for_the_published_photo(
    infra: Infra, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC 5 (paging, as amended) and SPEC 16 (2): a retry takes back any letter still owed; the
    dead-letter queue holds a letter only for a photo that is failed."""
    # GIVEN a final failure whose dead letter the queue refused: owed, and past its lease
    infra.configure(retry_base_seconds=1)
    with aws_fails(bootstrap.s3_client(), "GetObject"), aws_fails(bootstrap.sqs_client(), "SendMessage"):
        shot = upload(infra, db, "LadyBird.jpg")
        poll_until(infra, lambda: job(db, shot.photo_id)[0] == "failed")
    assert owed(db, shot.photo_id) is not None and dead_letters(infra) == []
    lease_passes(db)

    # WHEN the sweep leases the owed letter, and the operator retries the photo before the sweep's
    # SendMessage reaches the dead-letter queue (the operator's command and the scheduled sweep run
    # independently)
    real_send = SqsQueue.send_dead_letter
    retried: list[Any] = []

    def operator_first(self: SqsQueue, *args: Any, **kwargs: Any) -> bool:
        if not retried:
            retried.append(operator.retry(bootstrap.engine(), bootstrap.queue(), [shot.photo_id]))
        return real_send(self, *args, **kwargs)

    monkeypatch.setattr(SqsQueue, "send_dead_letter", operator_first)
    sweep()
    monkeypatch.setattr(SqsQueue, "send_dead_letter", real_send)

    # THEN the retry left the photo whose letter was in flight (a letter taken back then would page
    # for a photo no longer failed): the letter was sent while the photo was failed, and settled
    assert retried == [[]]
    assert [code for _, code in dead_letters(infra)] == ["STORAGE_READ_FAILED"]
    assert owed(db, shot.photo_id) is None and photo(db, shot.photo_id)[0] == "processing_failed"

    # WHEN the operator retries again, the letter sent, THEN the photo publishes and pages no more
    assert operator.retry(bootstrap.engine(), bootstrap.queue(), [shot.photo_id]) == [shot.photo_id]
    drain(infra, published(db, shot.photo_id), timeout=20)
    assert photo(db, shot.photo_id)[0] == "ready"
    summary = sweep()
    assert len(dead_letters(infra)) == 1, f"a published photo paged again (sweep {summary})"


# --- 4: a failed re-render pages as a failed photo ------------------------------------------------


def letters_in_full(infra: Infra) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """photoId -> (message attributes, body) of each dead letter, left in the queue."""
    found: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    messages: list[dict[str, Any]] = []
    while batch := infra.sqs.receive_message(
        QueueUrl=infra.queues.dead_letter_url,
        MaxNumberOfMessages=10,
        VisibilityTimeout=30,
        MessageAttributeNames=["All"],
    ).get("Messages", []):
        messages.extend(batch)
    for m in messages:
        attributes = {k: v.get("StringValue") for k, v in m.get("MessageAttributes", {}).items()}
        found[attributes["photoId"]] = (attributes, json.loads(m["Body"]))
        infra.sqs.change_message_visibility(
            QueueUrl=infra.queues.dead_letter_url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
        )
    return found


@pytest.mark.usefixtures("recipe_before_the_ladder")
def test_a_rerender_that_fails_for_good_pages_as_a_rerender_not_as_a_failed_photo(
    infra: Infra, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    """SPEC 16 (4): a re-render that fails for good pages as what it is (the photo stays published
    on its old version), never as a failed photo."""
    # GIVEN a photo published at version 1, marked for a backfill to version 2 and sent
    infra.configure(retry_base_seconds=1)
    rerendered = upload(infra, db, "Aqua.jpg")
    poll_until(infra, published(db, rerendered.photo_id))
    infra.configure(retry_base_seconds=1, thumb_size=320, variant_version=2, backfill_spread_seconds=0)
    assert rerender(capsys, "--all") == {"version": 2, "marked": 1}
    assert sweep()["backfillSent"] == 1

    # WHEN S3 cannot be read through the attempts: the re-render fails for good, and so does a new
    # upload's first render
    with aws_fails(bootstrap.s3_client(), "GetObject"):
        failed = upload(infra, db, "Wood.jpg")
        poll_until(
            infra,
            lambda: job(db, rerendered.photo_id)[0] == "failed" and job(db, failed.photo_id)[0] == "failed",
        )
    assert (
        photo(db, rerendered.photo_id)[0] == "ready" and photo(db, failed.photo_id)[0] == "processing_failed"
    )

    # THEN the page for the re-render tells it from the page for the failed photo
    letters = letters_in_full(infra)
    assert set(letters) == {str(rerendered.photo_id), str(failed.photo_id)}

    def what(letter: tuple[dict[str, Any], dict[str, Any]]) -> Any:
        attributes, body = letter
        same = {"photoId", "attempt", "detail"}
        return (
            {k: v for k, v in attributes.items() if k not in same},
            {k: v for k, v in body.items() if k not in same},
        )

    assert what(letters[str(rerendered.photo_id)]) != what(letters[str(failed.photo_id)]), (
        f"the published photo's failed re-render pages exactly as a failed photo: {letters}"
    )


# --- 5: a duplicate delivery for a published photo settles a backfill's mark --------------------


@pytest.mark.usefixtures("recipe_before_the_ladder")
def test_a_duplicate_delivery_racing_the_backfills_start_never_drops_the_rerender(
    infra: Infra, db: Engine, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC 14: a backfill re-renders every ready photo below the version; SPEC 16: a transition's
    condition is its precondition (settle_published: "the photo is published and not marked")."""
    # GIVEN a photo published at version 1, and the functions at version 2
    infra.configure(retry_base_seconds=1)
    shot = upload(infra, db, "Aqua.jpg")
    poll_until(infra, published(db, shot.photo_id))
    infra.configure(retry_base_seconds=1, thumb_size=320, variant_version=2, backfill_spread_seconds=0)

    # WHEN a duplicate message for the photo (a job message, as a sweep or an API sends) is being
    # answered "already published" while the operator starts the backfill and the sweep sends it
    real_settle = machine.settle_published
    raced: list[Any] = []

    def backfill_meanwhile(connection: Any, photo_id: Any) -> None:
        if not raced:
            # Another process's work (its calls to SQS are no waits inside this transaction).
            operator = threading.Thread(
                target=lambda: raced.extend([rerender(capsys, "--all"), sweep()["backfillSent"]])
            )
            operator.start()
            operator.join()
        real_settle(connection, photo_id)

    monkeypatch.setattr(machine, "settle_published", backfill_meanwhile)
    bootstrap.queue().send_job(shot.photo_id)
    drain(infra, lambda: versions(db, [shot.photo_id]) == [(3, 2)], timeout=20)
    assert raced == [{"version": 2, "marked": 1}, 1]
    left = sweep()["backfillLeft"]

    # THEN the photo was re-rendered at version 2 (or is still marked for it)
    assert versions(db, [shot.photo_id]) == [(3, 2)] or left == 1, (
        f"the backfill's re-render was dropped: versions {versions(db, [shot.photo_id])},"
        f" job {job(db, shot.photo_id)}, backfillLeft {left}"
    )


# --- held: migration 0008 on rows as the code before it could leave them -------------------------


def test_migration_0008_upgrades_rows_in_the_states_the_code_before_it_left(engine: Engine) -> None:
    """SPEC 4: migrations run on an existing database. (Held: kept as evidence.)"""
    import uuid as _uuid

    from alembic import command
    from alembic.config import Config
    from sqlalchemy import create_engine, text

    from devkit.stack import ROOT

    name = f"pre0008_{_uuid.uuid4().hex[:8]}"
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    url = engine.url.set(database=name)
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("sqlalchemy.url", url.render_as_string(hide_password=False).replace("%", "%%"))
    command.upgrade(config, "0007")
    old = create_engine(url)
    ids = [_uuid.uuid4() for _ in range(7)]
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
                    "a": _uuid.uuid4(),
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


# --- 6: a late duplicate of an older upload's event reopens a failed job -------------------------


def test_a_late_duplicate_of_an_older_uploads_event_never_reopens_the_failed_job(
    infra: Infra, db: Engine
) -> None:
    """SPEC 16 (3): an older or repeated event never reopens anything. S3 delivers at least once,
    and out of order; where no sequencer is stored (moto, or every row after 0008) the eTag decides
    alone, and a different eTag is taken for a newer upload."""
    from sqlalchemy import func

    from photo_publish.adapters.models import OutboxEvent

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
