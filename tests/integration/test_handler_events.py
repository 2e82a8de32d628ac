"""The real handler on real AWS event JSON of every shape SPEC 6 names (tests/events/)."""

from __future__ import annotations

import copy
import json
from typing import Any
from urllib.parse import unquote_plus
from uuid import UUID

import pytest
from sqlalchemy import Engine, func, insert, select

from devkit import handlers, samples, uploads
from devkit.poller import LambdaContext
from photo_publish.adapters.models import OutboxEvent, Photo, PhotoJob
from photo_publish.observability import logger
from tests.conftest import BUCKET, Infra, load_event
from tests.template.test_template import ROOT, local_env

process = handlers.load("process")

# The ids and the decoded key the files in tests/events/ carry.
ALBUM = UUID("7d3c6a52-1f0e-4b59-9a57-2a1f1c0f4e11")
PHOTO = UUID("0b9f2d4e-8c61-4f6a-b2a3-6d5e4c3b2a10")
KEY = f"dev/originals/albums/{ALBUM}/{PHOTO}/My photo (2) + [final] 100% été.jpg"


@pytest.fixture
def uploaded(infra: Infra, db: Engine) -> None:
    """The photo the event files name: its rows as the API writes them, its original in S3."""
    with db.begin() as connection:
        connection.execute(insert(Photo).values(id=PHOTO, album_id=ALBUM, original_key=KEY))
        connection.execute(insert(PhotoJob).values(photo_id=PHOTO))
    uploads.put_original(infra.s3, BUCKET, KEY, (samples.IMAGES / "LadyBird.jpg").read_bytes())


def state(db: Engine) -> tuple[Any, ...]:
    with db.connect() as connection:
        photo = connection.execute(
            select(Photo.processing_state, Photo.entity_version).where(Photo.id == PHOTO)
        ).one()
        events = connection.scalar(select(func.count()).select_from(OutboxEvent))
    return (*photo, events)


@pytest.mark.parametrize("name", ["sqs_s3_notification", "sqs_eventbridge_object_created", "sqs_job_message"])
def test_each_sqs_event_shape_publishes_the_photo(name: str, uploaded: None, db: Engine) -> None:
    # GIVEN an SQS event as Lambda delivers it, naming a photo whose key S3 URL-encoded
    event = load_event(name)

    # WHEN the handler runs
    response = process.lambda_handler(event, LambdaContext())

    # THEN the record succeeded and the photo is published once
    assert response == {"batchItemFailures": []}
    assert state(db) == ("ready", 2, 1)


def test_a_published_records_log_line_carries_its_step_timings(
    uploaded: None, db: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN an SQS event for an uploaded photo, logged at INFO (the template's level)
    event = load_event("sqs_job_message")
    level = logger.log_level
    logger.setLevel("INFO")

    # WHEN the handler publishes it
    try:
        process.lambda_handler(event, LambdaContext())
    finally:
        logger.setLevel(level)

    # THEN its "photo processed" line says how long each step took, and the wait for a render slot
    [line] = [r for r in caplog.records if r.getMessage() == "photo processed"]
    assert line.outcome == "published"  # type: ignore[attr-defined]
    steps = line.steps_ms  # type: ignore[attr-defined]
    assert set(steps) == {"claim", "render", "store", "commit", "wait"}
    assert all(isinstance(ms, int) and ms >= 0 for ms in steps.values())
    assert steps["render"] > 0


def test_a_direct_s3_event_publishes_the_photo(uploaded: None, db: Engine) -> None:
    # GIVEN S3 invoking the function itself (as `sam local invoke` with a generated event does)
    event = load_event("s3_object_created")

    # WHEN the handler runs
    response = process.lambda_handler(event, LambdaContext())

    # THEN it answers with each record's outcome and the photo is published
    assert response == {"results": [{"photoId": str(PHOTO), "outcome": "published"}]}
    assert state(db) == ("ready", 2, 1)


def test_irrelevant_records_are_acknowledged_without_touching_anything(uploaded: None, db: Engine) -> None:
    # GIVEN S3's test event, a variant key, a deletion and another stage's upload
    event = load_event("sqs_irrelevant")

    # WHEN the handler runs
    response = process.lambda_handler(event, LambdaContext())

    # THEN every record is acknowledged and the photo was not worked on
    assert response == {"batchItemFailures": []}
    assert state(db) == ("uploaded", 1, 0)
    with db.connect() as connection:
        assert connection.scalar(select(PhotoJob.attempt).where(PhotoJob.photo_id == PHOTO)) == 0


def test_malformed_records_are_acknowledged_logged_and_counted(
    uploaded: None, db: Engine, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN records no producer of ours would send: not JSON, no known shape, non-UUID ids
    event = load_event("sqs_malformed")

    # WHEN the handler runs
    response = process.lambda_handler(event, LambdaContext())

    # THEN none is retried (none reaches the dead-letter queue through the redrive)
    assert response == {"batchItemFailures": []}
    assert state(db) == ("uploaded", 1, 0)
    # AND each is logged with its message id and counted by a metric
    logged = [r for r in caplog.records if r.getMessage() == "malformed message"]
    assert sorted(r.message_id for r in logged) == sorted(r["messageId"] for r in event["Records"])  # type: ignore[attr-defined]
    assert {r.body for r in logged} == {r["body"] for r in event["Records"]}  # type: ignore[attr-defined]
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    metrics = [line for line in lines if "_aws" in line and "MalformedMessages" in line]
    assert sum(metrics[0]["MalformedMessages"]) == len(event["Records"])


def test_an_event_for_another_key_than_the_photos_original_is_not_processed(
    uploaded: None, db: Engine
) -> None:
    # GIVEN an upload under the photo's ids but with another file name than the one recorded
    event = copy.deepcopy(load_event("s3_object_created"))
    event["Records"][0]["s3"]["object"]["key"] = f"dev/originals/albums/{ALBUM}/{PHOTO}/other.jpg"

    # WHEN the handler runs
    response = process.lambda_handler(event, LambdaContext())

    # THEN it is ignored: the recorded original is the source of truth
    assert response == {"results": [{"photoId": str(PHOTO), "outcome": "ignored"}]}
    assert state(db) == ("uploaded", 1, 0)


def test_a_job_message_for_a_deleted_photo_is_skipped(infra: Infra, db: Engine) -> None:
    # GIVEN a job message for a photo that no longer exists
    event = load_event("sqs_job_message")

    # WHEN the handler runs
    response = process.lambda_handler(event, LambdaContext())

    # THEN the record is acknowledged and no job row appears for a photo that does not exist
    assert response == {"batchItemFailures": []}
    with db.connect() as connection:
        assert connection.scalar(select(func.count()).select_from(PhotoJob)) == 0


def test_a_body_nested_deeper_than_the_json_parser_is_acknowledged_as_malformed(
    uploaded: None, db: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a 200 KB body of nested arrays (json.loads raises RecursionError on it)
    event = copy.deepcopy(load_event("sqs_job_message"))
    event["Records"][0]["body"] = "[" * 100_000 + "]" * 100_000

    # WHEN the handler runs
    response = process.lambda_handler(event, LambdaContext())

    # THEN it is acknowledged as malformed, never retried into the dead-letter queue
    assert response == {"batchItemFailures": []}
    assert [r.getMessage() for r in caplog.records].count("malformed message") == 1


def test_a_direct_s3_event_that_must_be_retried_is_handed_to_the_queue(infra: Infra, db: Engine) -> None:
    # GIVEN S3 invoking the function directly for an upload whose photo row does not exist yet
    infra.configure(retry_base_seconds=1)
    event = load_event("s3_object_created")

    # WHEN the handler runs
    response = process.lambda_handler(event, LambdaContext())

    # THEN it does not fail (Lambda's own async retries would drop it after two): the record went
    # to the process queue, delayed by its backoff, where receive counts and the dead-letter queue
    # take over
    assert response == {"results": [{"photoId": str(PHOTO), "outcome": "retry"}]}
    (message,) = infra.sqs.receive_message(QueueUrl=infra.queues.url, WaitTimeSeconds=3)["Messages"]
    assert json.loads(message["Body"]) == {"Records": event["Records"]}


def test_the_heap_is_trimmed_once_per_invocation_after_its_batch(
    uploaded: None, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN an SQS batch for an uploaded photo, and glibc's malloc_trim recorded with what the
    # database said when it was called
    from photo_publish.image import memory

    trims: list[tuple[int, tuple[Any, ...]]] = []
    monkeypatch.setattr(memory, "_malloc_trim", lambda: lambda pad: trims.append((pad, state(db))) or 1)

    # WHEN the handler runs it
    response = process.lambda_handler(load_event("sqs_job_message"), LambdaContext())

    # THEN malloc_trim(0) ran once, after the photo was published (the batch's work done)
    assert response == {"batchItemFailures": []}
    assert trims == [(0, ("ready", 2, 1))]


# The sample events of `sam local invoke -e events/...` (the repository's events/ folder).
SAMPLE_EVENTS = ROOT / "events"


def test_the_sample_events_run_the_handlers(infra: Infra, db: Engine) -> None:
    # GIVEN the local bucket and stage, and the photo the sample events name, as the API writes it
    env = local_env()
    infra.s3.create_bucket(Bucket=env["PHOTO_BUCKET"])
    infra.configure(photo_bucket=env["PHOTO_BUCKET"], stage=env["STAGE"])
    event = json.loads((SAMPLE_EVENTS / "process-s3-notification.json").read_text())
    s3_record = json.loads(event["Records"][0]["body"])["Records"][0]["s3"]
    key = unquote_plus(s3_record["object"]["key"])
    photo_id, album_id = key.split("/")[4], key.split("/")[3]
    with db.begin() as connection:
        connection.execute(insert(Photo).values(id=photo_id, album_id=album_id, original_key=key))
        connection.execute(insert(PhotoJob).values(photo_id=photo_id))
    infra.s3.put_object(Bucket=env["PHOTO_BUCKET"], Key=key, Body=(samples.IMAGES / "Wood.jpg").read_bytes())
    process, sweep = handlers.load("process"), handlers.load("sweep")

    # WHEN each sample event is handled, as `sam local invoke -e events/...` would
    published = process.lambda_handler(event, LambdaContext())
    again = process.lambda_handler(
        json.loads((SAMPLE_EVENTS / "process-job-message.json").read_text()), LambdaContext()
    )
    swept = sweep.lambda_handler(
        json.loads((SAMPLE_EVENTS / "sweep-scheduled.json").read_text()), LambdaContext()
    )

    # THEN the photo is published, the job message finds it done, and the sweep finds nothing due
    assert published == again == {"batchItemFailures": []}
    with db.connect() as connection:
        assert connection.scalar(select(Photo.processing_state).where(Photo.id == photo_id)) == "ready"
    assert swept["resentPending"] == 0
