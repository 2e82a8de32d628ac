"""Dead letters and re-uploads under faults (SPEC 5, 7, 14 and 16): outages, retries, redrives and
backfills that must never drop or falsely page a photo; each test failed first.

Real parts throughout: PostgreSQL, moto's server over HTTP (S3 notifications into SQS, the
dead-letter queue), libvips rendering small photographs, and the real process and sweep handlers,
operator and backfill. Faults are injected into the real clients (tests/faults.py); time is moved
only where test_sweep.py moves it, by ageing a dead letter's lease in the database.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import Engine, delete, func, insert, select, update

from devkit import handlers, samples, uploads
from devkit.poller import LambdaContext, Poller
from photo_publish import bootstrap, operator
from photo_publish.adapters.models import Photo, PhotoJob
from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.events import from_sqs_body
from photo_publish.jobs import machine
from tests.conftest import BUCKET, STAGE, Infra
from tests.faults import aws_fails
from tests.polling import poll_until, process
from tests.rows import in_state, job, photo, published

MINUTE = timedelta(minutes=1)


# --- helpers -------------------------------------------------------------------------------------


def small(name: str) -> bytes:
    """One of the project's photographs as a small JPEG (fast to render)."""
    return bytes(samples.photograph(name).thumbnail_image(160).jpegsave_buffer(Q=85))


def upload(infra: Infra, db: Engine, name: str, data: bytes | None = None) -> uploads.Upload:
    return uploads.upload(
        db, infra.s3, BUCKET, STAGE, file_name=name, data=small(name) if data is None else data
    )


def sweep() -> dict[str, Any]:
    """The scheduled sweep function, as EventBridge invokes it."""
    result: dict[str, Any] = handlers.load("sweep").lambda_handler(
        {"source": "aws.events"}, LambdaContext(timeout_seconds=60)
    )
    return result


def rerender(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    """`python -m photo_publish.operator rerender ...`, as a person runs it."""
    operator.main(["rerender", *argv])
    answer: dict[str, Any] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return answer


def versions(db: Engine, photo_ids: list[UUID]) -> list[tuple[int, int | None]]:
    """(entity_version, variant_version) per photo, in the order given."""
    with db.connect() as c:
        rows = {
            r.id: (r.entity_version, r.variant_version)
            for r in c.execute(
                select(Photo.id, Photo.entity_version, Photo.variant_version).where(Photo.id.in_(photo_ids))
            )
        }
    return [rows[p] for p in photo_ids]


def owed(db: Engine, photo_id: UUID) -> Any:
    with db.connect() as c:
        return c.scalar(select(PhotoJob.dead_letter_owed_at).where(PhotoJob.photo_id == photo_id))


def lease_passes(db: Engine) -> None:
    """Letters still owed were taken longer than STALE_AFTER_SECONDS ago (as test_sweep ages them);
    a letter no longer owed stays so."""
    with db.begin() as c:
        c.execute(
            update(PhotoJob)
            .where(PhotoJob.dead_letter_owed_at.is_not(None))
            .values(dead_letter_owed_at=func.now() - 6 * MINUTE)
        )


def dead_letters(infra: Infra) -> list[tuple[UUID | None, str | None]]:
    """(photoId, errorCode) of every message in the dead-letter queue, left there (visible again)."""
    messages: list[dict[str, Any]] = []
    while batch := infra.sqs.receive_message(
        QueueUrl=infra.queues.dead_letter_url,
        MaxNumberOfMessages=10,
        VisibilityTimeout=30,
        MessageAttributeNames=["All"],
    ).get("Messages", []):
        messages.extend(batch)
    for m in messages:
        infra.sqs.change_message_visibility(
            QueueUrl=infra.queues.dead_letter_url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
        )
    letters = []
    for m in messages:
        attributes = {k: v.get("StringValue") for k, v in m.get("MessageAttributes", {}).items()}
        photo_id = attributes.get("photoId")
        letters.append((UUID(photo_id) if photo_id else None, attributes.get("errorCode")))
    return letters


def queued(infra: Infra) -> list[str]:
    """The bodies of the messages visible in the process queue (received and deleted)."""
    bodies = []
    while batch := infra.sqs.receive_message(QueueUrl=infra.queues.url, MaxNumberOfMessages=10).get(
        "Messages", []
    ):
        for m in batch:
            bodies.append(m["Body"])
            infra.sqs.delete_message(QueueUrl=infra.queues.url, ReceiptHandle=m["ReceiptHandle"])
    return bodies


def peek(infra: Infra) -> list[str]:
    """The bodies of the messages now in the process queue, left there (visible again at once)."""
    messages = infra.sqs.receive_message(
        QueueUrl=infra.queues.url, MaxNumberOfMessages=10, WaitTimeSeconds=2
    ).get("Messages", [])
    for m in messages:
        infra.sqs.change_message_visibility(
            QueueUrl=infra.queues.url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
        )
    return [m["Body"] for m in messages]


def queue_empty(infra: Infra) -> bool:
    attributes = infra.sqs.get_queue_attributes(
        QueueUrl=infra.queues.url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return attributes == {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}


def drain(infra: Infra, done: Callable[[], bool], *, timeout: float = 30) -> None:
    """The real process handler on the queue's messages until `done()`, or until the queue holds
    nothing (visible or in flight), or the time is up; asserts nothing itself."""
    poller = Poller(infra.sqs, infra.queues.url, infra.queues.arn, process.lambda_handler, wait_seconds=0)
    deadline = time.monotonic() + timeout
    while not done() and not queue_empty(infra) and time.monotonic() < deadline:
        if not poller.poll_once():
            time.sleep(0.05)


def carried(body: str) -> list[tuple[UUID, str | None, str | None, str | None]]:
    """What a process-queue message proves, as the process function reads it: (photo, original
    key, S3 sequencer, eTag) per photo."""
    return [
        (
            r.photo_id,
            None if r.original is None else r.original.key,
            None if r.upload is None else r.upload.sequencer,
            None if r.upload is None else r.upload.etag,
        )
        for r in from_sqs_body(body, bucket=BUCKET, stage=STAGE)
    ]


def lost_work(db: Engine, **values: Any) -> UUID:
    """A photo and its job, the job's columns set as given (as test_sweep.py makes its rows)."""
    photo_id = uuid.uuid4()
    with db.begin() as c:
        c.execute(
            insert(Photo).values(
                id=photo_id,
                album_id=uuid.uuid4(),
                original_key=f"{STAGE}/originals/albums/x/{photo_id}/p.jpg",
            )
        )
        c.execute(insert(PhotoJob).values(photo_id=photo_id, **values))
    return photo_id


def stamp(db: Engine, photo_id: UUID) -> Any:
    with db.connect() as c:
        return c.scalar(select(PhotoJob.enqueued_at).where(PhotoJob.photo_id == photo_id))


# --- finding 1: a re-upload handed back at the receive limit -------------------------------------


def test_a_reupload_of_a_failed_photo_through_a_database_outage_at_the_receive_limit_is_published(
    infra: Infra, db: Engine
) -> None:
    """Finding 1: at MAX_RECEIVE_COUNT the re-upload's record is replaced by a bare job message and dropped."""
    # GIVEN a photo that failed permanently: its first original could not be decoded
    infra.configure(retry_base_seconds=0)  # each receive's backoff: the shortest visibility, 1 s
    database_url = infra.settings.database_url
    fixed = small("Garden.jpg")
    shot = upload(infra, db, "Garden.jpg", fixed[: len(fixed) // 2])
    poll_until(infra, lambda: job(db, shot.photo_id)[0] == "failed")
    assert photo(db, shot.photo_id)[:2] == ("processing_failed", "DECODE_FAILED")

    # WHEN the user uploads the fixed file while the database is down through every receive of its
    # notification, up to the one it is handed on from (two short of the redrive's MAX_RECEIVE_COUNT)
    infra.configure(retry_base_seconds=0, database_url="postgresql://postgres@127.0.0.1:9/none")
    uploads.put_original(infra.s3, BUCKET, shot.key, fixed)
    records: list[dict[str, Any]] = []

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        records.extend(event["Records"])
        response: dict[str, Any] = process.lambda_handler(event, context)
        return response

    outage = Poller(infra.sqs, infra.queues.url, infra.queues.arn, handler, wait_seconds=1)
    deadline = time.monotonic() + 30
    while outage.received - outage.failed < 1:  # until the notification is acknowledged
        assert time.monotonic() < deadline, "the notification was never acknowledged"
        outage.poll_once()
    assert [int(r["attributes"]["ApproximateReceiveCount"]) for r in records] == [1, 2, 3]
    handed_back = peek(infra)

    # ... and the database comes back, and the queue's messages reach the process function
    infra.configure(retry_base_seconds=0, database_url=database_url)
    drain(infra, published(db, shot.photo_id))

    # THEN the new upload was processed: the photo is published
    assert photo(db, shot.photo_id)[0] == "ready", (
        f"the re-upload was dropped: photo {photo(db, shot.photo_id)}, job {job(db, shot.photo_id)},"
        f" handed back as {handed_back}"
    )
    # AND the message that carried the record on carried what the record proved: key, sequencer, eTag
    assert [carried(body) for body in handed_back] == [carried(records[0]["body"])]


# --- finding 2: an owed letter of a failed re-render, and the backfill resumed -------------------


@pytest.mark.usefixtures("recipe_before_the_ladder")
def test_a_resumed_backfill_never_breaks_the_sweep_on_a_failed_rerenders_owed_letter(
    infra: Infra, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    """Finding 2: re-marking keeps the owed letter and nulls its code; the sweep then raises on ErrorCode(None)."""
    # GIVEN a photo published at version 1, and a backfill to version 2 sent by the sweep
    infra.configure(retry_base_seconds=1)
    rerendered = upload(infra, db, "Aqua.jpg")
    poll_until(infra, published(db, rerendered.photo_id))
    infra.configure(retry_base_seconds=1, thumb_size=320, variant_version=2, backfill_spread_seconds=0)
    assert rerender(capsys, "--all") == {"version": 2, "marked": 1}
    assert sweep()["backfillSent"] == 1

    # ... whose re-render fails for good (S3 unreadable through its attempts), as does an unrelated
    # photo's first render, while the dead-letter queue refuses both letters
    with aws_fails(bootstrap.s3_client(), "GetObject"), aws_fails(bootstrap.sqs_client(), "SendMessage"):
        unrelated = upload(infra, db, "Wood.jpg")
        poll_until(
            infra,
            lambda: (
                job(db, rerendered.photo_id)[0] == "failed" and job(db, unrelated.photo_id)[0] == "failed"
            ),
        )
    assert job(db, rerendered.photo_id) == ("failed", 3, "STORAGE_READ_FAILED")
    assert photo(db, rerendered.photo_id)[0] == "ready" and versions(db, [rerendered.photo_id]) == [(2, 1)]
    assert job(db, unrelated.photo_id) == ("failed", 3, "STORAGE_READ_FAILED")
    assert owed(db, rerendered.photo_id) is not None and owed(db, unrelated.photo_id) is not None
    assert dead_letters(infra) == []

    # WHEN the operator resumes the backfill (`rerender --all` marks the photo again), the sweep sends
    # it and it is re-rendered
    assert rerender(capsys, "--all") == {"version": 2, "marked": 1}
    assert sweep()["backfillSent"] == 1
    poll_until(infra, lambda: versions(db, [rerendered.photo_id]) == [(3, 2)])

    # ... while lost work waits for the sweep: a pending row past its due time, a stale active one
    due = lost_work(db, created_at=func.now() - 20 * MINUTE)
    stale = lost_work(db, status="active", attempt=1, claimed_at=func.now() - 10 * MINUTE)

    # ... and the sweep runs once the owed letters' lease has passed
    lease_passes(db)
    summary = sweep()

    # THEN the run finished: the unrelated photo's letter was sent with its own code (by this run or,
    # refused letters being in nobody's hands, an earlier one), and none for the photo whose job is
    # no longer failed
    assert dead_letters(infra) == [(unrelated.photo_id, "STORAGE_READ_FAILED")]
    assert summary["errors"] == 0
    assert owed(db, rerendered.photo_id) is None
    # AND the rows it stamped were sent (or unstamped, for a later run)
    sent = {p for body in queued(infra) for p, *_ in carried(body)}
    for photo_id in (due, stale):
        assert photo_id in sent or stamp(db, photo_id) is None


# --- finding 3: retry and redrive leave the owed letter of the failure they take back -------------


def test_an_operator_retry_takes_back_an_owed_dead_letter_so_the_published_photo_never_pages(
    infra: Infra, db: Engine
) -> None:
    """Finding 3 (retry): the owed letter survives the retry; after publication the sweep dead-letters it."""
    # GIVEN a final failure (S3 unreadable through the attempts) whose dead letter the queue refused
    infra.configure(retry_base_seconds=1)
    with aws_fails(bootstrap.s3_client(), "GetObject"), aws_fails(bootstrap.sqs_client(), "SendMessage"):
        shot = upload(infra, db, "LadyBird.jpg")
        poll_until(infra, lambda: job(db, shot.photo_id)[0] == "failed")
    assert job(db, shot.photo_id) == ("failed", 3, "STORAGE_READ_FAILED")
    assert owed(db, shot.photo_id) is not None and dead_letters(infra) == []

    # WHEN the operator retries it, it publishes, and the sweep runs after the letter's lease
    assert operator.retry(bootstrap.engine(), bootstrap.queue(), [shot.photo_id]) == [shot.photo_id]
    poll_until(infra, published(db, shot.photo_id))
    lease_passes(db)
    summary = sweep()

    # THEN no dead letter was sent for the published photo
    assert dead_letters(infra) == [], f"a published photo paged (sweep {summary})"
    assert summary["deadLettersSent"] == 0


def test_an_operator_redrive_takes_back_an_owed_dead_letter_so_the_published_photo_never_pages(
    infra: Infra, db: Engine
) -> None:
    """Finding 3 (redrive): the owed letter survives the redrive; after publication the sweep dead-letters it."""
    # GIVEN a photo that failed for good and was dead-lettered, then was retried while S3 was still
    # down and failed for good again while the dead-letter queue refused the second letter
    infra.configure(retry_base_seconds=1)
    with aws_fails(bootstrap.s3_client(), "GetObject"):
        shot = upload(infra, db, "LadyBird.jpg")
        poll_until(infra, lambda: job(db, shot.photo_id)[0] == "failed")
        assert dead_letters(infra) == [(shot.photo_id, "STORAGE_READ_FAILED")]
        assert operator.retry(bootstrap.engine(), bootstrap.queue(), [shot.photo_id]) == [shot.photo_id]
        with aws_fails(bootstrap.sqs_client(), "SendMessage"):
            poll_until(
                infra, lambda: job(db, shot.photo_id)[0] == "failed" and owed(db, shot.photo_id) is not None
            )
    assert job(db, shot.photo_id) == ("failed", 3, "STORAGE_READ_FAILED")

    # WHEN S3 is back and the operator redrives the dead-letter queue, the photo publishes, and the
    # sweep runs after the owed letter's lease
    redriven = operator.redrive(bootstrap.engine(), infra.sqs, infra.settings)
    poll_until(infra, published(db, shot.photo_id))
    lease_passes(db)
    summary = sweep()

    # THEN the redrive took the photo up and removed its letter, and no dead letter was sent for the
    # published photo afterwards
    assert redriven.photos == [shot.photo_id] and redriven.messages_removed == 1
    assert dead_letters(infra) == [], f"a published photo paged (sweep {summary})"
    assert summary["deadLettersSent"] == 0


# --- finding 6: a redrive of a failed re-render's letter -----------------------------------------


@pytest.mark.usefixtures("recipe_before_the_ladder")
def test_a_redrive_of_a_failed_rerenders_letter_takes_the_rerender_up_again(
    infra: Infra, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    """Finding 6: redrive deletes a ready photo's re-render letter and retries nothing."""
    # GIVEN a photo published at version 1 whose backfill re-render to version 2 failed for good (S3
    # unreadable through its attempts): its dead letter is in the queue, the photo still published
    infra.configure(retry_base_seconds=1)
    shot = upload(infra, db, "Storm.jpg")
    poll_until(infra, published(db, shot.photo_id))
    infra.configure(retry_base_seconds=1, thumb_size=320, variant_version=2, backfill_spread_seconds=0)
    assert rerender(capsys, "--all") == {"version": 2, "marked": 1}
    assert sweep()["backfillSent"] == 1
    with aws_fails(bootstrap.s3_client(), "GetObject"):
        poll_until(infra, lambda: job(db, shot.photo_id)[0] == "failed")
    assert dead_letters(infra) == [(shot.photo_id, "STORAGE_READ_FAILED")]
    assert versions(db, [shot.photo_id]) == [(2, 1)] and photo(db, shot.photo_id)[0] == "ready"

    # WHEN S3 is back and the operator redrives the dead-letter queue; the sweep runs on its
    # schedule and the queue's messages reach the process function
    redriven = operator.redrive(bootstrap.engine(), infra.sqs, infra.settings)
    left = []
    for _ in range(3):
        left.append(sweep()["backfillLeft"])
        drain(infra, lambda: versions(db, [shot.photo_id]) == [(3, 2)])

    # THEN the re-render was taken up again (the photo is on version 2), or its letter was kept
    rerendered = versions(db, [shot.photo_id]) == [(3, 2)]
    kept = dead_letters(infra) == [(shot.photo_id, "STORAGE_READ_FAILED")]
    assert rerendered or kept, (
        f"the redrive ({redriven}) dropped the letter and retried nothing: the photo stays at"
        f" {versions(db, [shot.photo_id])}, job {job(db, shot.photo_id)}, backfillLeft {left}"
    )


# --- finding (c): the dry run counts what the backfill marks -------------------------------------


@pytest.mark.usefixtures("recipe_before_the_ladder")
def test_the_backfill_dry_run_counts_what_it_marks_and_every_counted_photo_is_rerendered(
    infra: Infra, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    """Finding (c): estimate counts ready photos without a job row, which mark never marks."""
    # GIVEN two photos published at version 1, one of them without a job row (published before the
    # pipeline kept jobs: an import)
    shots = [upload(infra, db, "Aqua.jpg"), upload(infra, db, "Wood.jpg")]
    photo_ids = [s.photo_id for s in shots]
    poll_until(infra, lambda: versions(db, photo_ids) == [(2, 1)] * 2)
    with db.begin() as c:
        c.execute(delete(PhotoJob).where(PhotoJob.photo_id == photo_ids[1]))
    infra.configure(thumb_size=320, variant_version=2, backfill_spread_seconds=0)

    # WHEN the operator dry-runs the backfill, then starts it
    dry = rerender(capsys, "--all", "--dry-run")
    started = rerender(capsys, "--all")

    # THEN the dry run counted what the backfill marked
    assert dry["photos"] == started["marked"], f"dry run {dry}, started {started}"

    # WHEN the sweep sends the backfill and the queue's messages reach the process function
    for _ in range(3):
        sweep()
        drain(infra, lambda: versions(db, photo_ids).count((3, 2)) == dry["photos"])

    # THEN every photo the dry run counted was re-rendered
    assert versions(db, photo_ids).count((3, 2)) == dry["photos"]


# --- found by the state machine: a new upload meets its job's last attempt lost with its worker ----


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
    assert (shot.photo_id, "WORKER_LOST") in dead_letters(infra)
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
