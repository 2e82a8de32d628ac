"""The publish path, its retries and the dead-letter queue, against a real LocalStack (S3 + SQS).

What moto's server cannot show: S3 notifications in LocalStack's encoding, its visibility timeouts
and redrive policy, and StartMessageMoveTask. The process handler is the real one, fed by devkit's
Poller; it talks to LocalStack through AWS_ENDPOINT_URL with plain boto3, as in Lambda.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import uuid
from typing import Any
from urllib.parse import unquote_plus

import pytest
from sqlalchemy import Engine

from devkit import stack, uploads
from devkit.poller import Poller
from photo_publish import bootstrap, operator
from photo_publish.adapters.models import OutboxEvent
from photo_publish.adapters.queue import SqsQueue, job_body
from photo_publish.errors import ErrorCode
from tests.conftest import BUCKET, STAGE, Infra
from tests.faults import aws_fails
from tests.localstack.flow import (
    Recorder,
    count,
    counts,
    last_move_task,
    messages,
    outbox,
    upload,
)
from tests.polling import poll_until
from tests.rows import job, photo, published

pytestmark = pytest.mark.localstack


@pytest.fixture
def fast(infra: Infra) -> Infra:
    """Backoffs of 1 s and 2 s instead of 30 s and 60 s."""
    infra.configure(retry_base_seconds=1)
    return infra


def given_up(fast: Infra, db: Engine) -> uploads.Upload:
    """A photo whose three attempts failed on S3 reads: final failure, one dead letter."""
    with aws_fails(bootstrap.s3_client(), "GetObject") as calls:
        shot = upload(fast, db)
        poll_until(fast, lambda: job(db, shot.photo_id)[0] == "failed")
    assert len(calls) == 3
    return shot


def test_an_upload_is_delivered_by_localstacks_notification_and_published_once(
    infra: Infra, db: Engine
) -> None:
    # GIVEN a photo whose file name S3 must encode in its notification (a space and a plus)
    name = "Lady Bird+1.jpg"
    shot = upload(infra, db, name, image="LadyBird.jpg")

    # WHEN LocalStack's notification reaches the real process handler through the Poller
    recorder = Recorder()
    poller = poll_until(infra, published(db, shot.photo_id), handler=recorder)

    # THEN the notification was LocalStack's own, in the full AWS shape, with the key encoded
    assert len(recorder.bodies) == 1 and poller.failed == 0
    record = recorder.bodies[0]["Records"][0]
    assert (record["eventSource"], record["eventName"]) == ("aws:s3", "ObjectCreated:Put")
    assert record["s3"]["bucket"]["name"] == BUCKET
    raw_key = record["s3"]["object"]["key"]
    assert raw_key != shot.key and unquote_plus(raw_key) == shot.key
    assert raw_key.endswith("Lady%20Bird%2B1.jpg")
    # AND the photo is published at version 2 with its variants in S3
    assert photo(db, shot.photo_id) == ("ready", None, 2)
    assert job(db, shot.photo_id) == ("done", 1, None)
    for kind in ("thumb", "browse"):
        version = infra.settings.variant_version
        key = f"{STAGE}/albums/{shot.album_id}/variants/{shot.photo_id}/{version}/{kind}.webp"
        head = infra.s3.head_object(Bucket=BUCKET, Key=key)
        assert head["ContentType"] == "image/webp"
        assert head["CacheControl"] == "public, max-age=31536000, immutable"
    # AND exactly one photo.published event, and nothing left in either queue
    events = outbox(db, shot.photo_id)
    assert [(e.event_type, e.payload["entityVersion"]) for e in events] == [("photo.published", 2)]
    assert counts(infra, infra.queues.url) == (0, 0, 0)
    assert counts(infra, infra.queues.dead_letter_url) == (0, 0, 0)


def test_three_s3_read_failures_are_retried_by_localstacks_visibility_then_dead_lettered_once(
    fast: Infra, db: Engine
) -> None:
    # GIVEN S3 unreachable for the function's reads
    with aws_fails(bootstrap.s3_client(), "GetObject") as calls:
        shot = upload(fast, db)

        # WHEN the photo is delivered until it is given up
        recorder = Recorder()
        poller = poll_until(fast, lambda: job(db, shot.photo_id)[0] == "failed", handler=recorder)

    # THEN LocalStack brought the record back after each backoff (1 s, then 2 s), not after 60 s
    assert len(calls) == 3 and poller.failed == 2
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert 0.9 < gaps[0] < 4 and 1.9 < gaps[1] < 5, gaps
    assert recorder.receive_counts == [1, 2, 3]
    # AND it is a final failure: on the job and the photo, one dead letter with its attributes
    assert job(db, shot.photo_id) == ("failed", 3, "STORAGE_READ_FAILED")
    assert photo(db, shot.photo_id) == ("processing_failed", "STORAGE_READ_FAILED", 1)
    letters = messages(fast, fast.queues.dead_letter_url)
    assert len(letters) == 1
    attributes = {k: v["StringValue"] for k, v in letters[0]["MessageAttributes"].items()}
    assert attributes == {
        "photoId": str(shot.photo_id),
        "attempt": "3",
        "errorCode": "STORAGE_READ_FAILED",
        "kind": "photo",
    }
    # AND the original message was acknowledged, and nothing was published: one photo.failed
    assert counts(fast, fast.queues.url) == (0, 0, 0)
    assert outbox(db, shot.photo_id) == []
    (failed,) = outbox(db, shot.photo_id, "photo.failed")
    assert (failed.payload["kind"], failed.payload["attempt"]) == ("final", 3)


def test_the_operators_redrive_moves_the_dead_letter_back_with_a_message_move_task(
    fast: Infra, db: Engine
) -> None:
    # GIVEN a photo given up after its attempts, its dead letter waiting
    shot = given_up(fast, db)

    # WHEN S3 is back and the operator redrives with StartMessageMoveTask (LocalStack has it)
    summary = operator.redrive(bootstrap.engine(), fast.sqs, fast.settings, move_task=True)

    # THEN the task moved it: completed, the dead-letter queue empty
    assert summary.moved_by_task and summary.photos == [shot.photo_id]
    task = last_move_task(fast, fast.queues.dead_letter_arn)
    assert (task["Status"], task.get("FailureReason")) == ("COMPLETED", None)
    assert task["ApproximateNumberOfMessagesMoved"] == 1
    assert counts(fast, fast.queues.dead_letter_url) == (0, 0, 0)
    # AND the moved message publishes the photo, once
    poll_until(fast, published(db, shot.photo_id))
    assert photo(db, shot.photo_id) == ("ready", None, 2)
    assert job(db, shot.photo_id)[:2] == ("done", 1)
    assert len(outbox(db, shot.photo_id)) == 1
    assert counts(fast, fast.queues.dead_letter_url) == (0, 0, 0)


def test_the_operators_redrive_without_the_move_task_publishes_and_empties_the_queue(
    fast: Infra, db: Engine
) -> None:
    # GIVEN a photo given up after its attempts, its dead letter waiting
    shot = given_up(fast, db)

    # WHEN S3 is back and the operator redrives the default way (one fresh job message per photo)
    summary = operator.redrive(bootstrap.engine(), fast.sqs, fast.settings)
    poll_until(fast, published(db, shot.photo_id))

    # THEN the photo is published once and the dead letter is gone
    assert not summary.moved_by_task
    assert summary.photos == [shot.photo_id] and summary.messages_removed == 1
    assert counts(fast, fast.queues.dead_letter_url) == (0, 0, 0)
    assert photo(db, shot.photo_id) == ("ready", None, 2)
    assert len(outbox(db, shot.photo_id)) == 1


def crash(event: dict[str, Any], context: Any) -> dict[str, Any]:
    raise RuntimeError("Runtime exited with error: signal: killed")


def dead_lettered_by_policy(infra: Infra, db: Engine) -> tuple[stack.Queues, uploads.Upload, Recorder]:
    """A registered photo's job message on a queue wired as the template wires it (maxReceiveCount =
    MAX_RECEIVE_COUNT; visibility 0 instead of 720 s), received by a function that dies on every run
    before it answers (as a timeout or an out-of-memory kill would), until the queue gives it up."""
    name = f"{infra.queues.url.rsplit('/', 1)[1]}-crash"
    queues = stack.create_queues(
        infra.sqs, name, max_receive_count=infra.settings.max_receive_count, visibility_timeout=0
    )
    shot = upload(infra, db, "Aqua.jpg")  # its notification goes to the test's own queue, unread
    infra.sqs.send_message(QueueUrl=queues.url, MessageBody=job_body(shot.photo_id))
    recorder = Recorder(crash)
    poller = Poller(infra.sqs, queues.url, queues.arn, recorder, wait_seconds=0)
    deadline = time.monotonic() + 30
    while counts(infra, queues.dead_letter_url)[0] == 0:
        assert time.monotonic() < deadline, "the redrive policy never moved the message"
        with contextlib.suppress(RuntimeError):
            poller.poll_once()
    return queues, shot, recorder


def test_a_message_whose_runs_never_finish_is_dead_lettered_by_localstacks_redrive_policy(
    infra: Infra, db: Engine
) -> None:
    # GIVEN / WHEN a job message whose every run dies, until the queue gives it up
    queues, shot, recorder = dead_lettered_by_policy(infra, db)

    # THEN the function saw it exactly maxReceiveCount times, and LocalStack moved it to the DLQ
    assert recorder.receive_counts == list(range(1, infra.settings.max_receive_count + 1))
    assert counts(infra, queues.url) == (0, 0, 0)
    letters = messages(infra, queues.dead_letter_url)
    assert len(letters) == 1
    assert letters[0]["Body"] == job_body(shot.photo_id)
    assert letters[0]["Attributes"]["DeadLetterQueueSourceArn"] == queues.arn
    # AND the database never saw an attempt (no run got that far)
    assert job(db, shot.photo_id) == ("pending", 0, None)
    assert count(db, OutboxEvent) == 0


def test_a_dead_letter_from_the_redrive_policy_is_moved_back_by_the_operators_move_task(
    infra: Infra, db: Engine
) -> None:
    # GIVEN a message the redrive policy dead-lettered (it carries DeadLetterQueueSourceArn)
    queues, shot, _ = dead_lettered_by_policy(infra, db)
    infra.queues = queues
    infra.configure(process_queue_url=queues.url, dead_letter_queue_url=queues.dead_letter_url)

    # WHEN the function is fixed and the operator redrives with the move task
    summary = operator.redrive(bootstrap.engine(), infra.sqs, infra.settings, move_task=True)

    # THEN the task moved it back to its source, and it publishes the photo, once
    assert summary.moved_by_task and summary.photos == [shot.photo_id]
    task = last_move_task(infra, queues.dead_letter_arn)
    assert (task["Status"], task["ApproximateNumberOfMessagesMoved"]) == ("COMPLETED", 1)
    poll_until(infra, published(db, shot.photo_id))
    assert job(db, shot.photo_id) == ("done", 1, None)
    assert len(outbox(db, shot.photo_id)) == 1
    assert counts(infra, queues.dead_letter_url) == (0, 0, 0)


def test_a_redrive_with_the_move_task_leaves_an_unregistered_uploads_dead_letter_for_a_person(
    infra: Infra, db: Engine
) -> None:
    # GIVEN a photo's message the redrive policy dead-lettered (the move task can send it back), and
    # the function's dead letter for an upload the API never registered (no photo row)
    queues, shot, _ = dead_lettered_by_policy(infra, db)
    infra.queues = queues
    settings = infra.configure(process_queue_url=queues.url, dead_letter_queue_url=queues.dead_letter_url)
    SqsQueue(infra.sqs, queues.url, queues.dead_letter_url).send_dead_letter(
        uuid.uuid4(), 3, ErrorCode.PHOTO_NOT_FOUND
    )

    # WHEN the operator redrives with the move task
    summary = operator.redrive(bootstrap.engine(), infra.sqs, settings, move_task=True)

    # THEN the photo's message was moved back, and the orphan's is left for a person (in flight for
    # now, visible again after the redrive's timeout), as the summary says
    assert summary.moved_by_task and summary.photos == [shot.photo_id] and summary.left_in_queue == 1
    assert last_move_task(infra, queues.dead_letter_arn)["Status"] == "COMPLETED"
    assert counts(infra, queues.dead_letter_url) == (0, 1, 0)
