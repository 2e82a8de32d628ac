"""The whole flow through real parts: S3 put -> notification -> SQS -> handler -> PostgreSQL."""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

from sqlalchemy import Engine, func, insert, select

from devkit import handlers, samples, uploads
from devkit.poller import LambdaContext, Poller
from photo_publish import bootstrap
from photo_publish.adapters.models import OutboxEvent, Photo, PhotoJob, PhotoVariant
from photo_publish.contracts import PHOTO_FAILED, PhotoFailedPayload
from photo_publish.errors import ErrorCode
from photo_publish.keys import original_key
from tests.conftest import BUCKET, STAGE, Infra

process = handlers.load("process")


def drain(infra: Infra, *, rounds: int = 20) -> Poller:
    poller = Poller(infra.sqs, infra.queues.url, infra.queues.arn, process.lambda_handler, wait_seconds=0)
    for _ in range(rounds):
        if not poller.poll_once() and not poller.poll_once():
            break
    return poller


def row(db: Engine, model: Any, photo_id: Any) -> Any:
    with db.connect() as connection:
        key = model.id if model is Photo else model.photo_id
        return connection.execute(select(model).where(key == photo_id)).one()


def test_an_uploaded_photo_is_published_with_variants_rows_and_one_outbox_event(
    infra: Infra, db: Engine
) -> None:
    # GIVEN a photo registered by the API and its original uploaded to S3
    data = (samples.IMAGES / "LadyBird.jpg").read_bytes()
    upload = uploads.upload(db, infra.s3, BUCKET, STAGE, file_name="LadyBird.jpg", data=data)

    # WHEN the queue's messages reach the process function
    poller = drain(infra)

    # THEN the photo is published at version 2 with its displayed size
    photo = row(db, Photo, upload.photo_id)
    assert (photo.processing_state, photo.visibility, photo.entity_version) == ("ready", "published", 2)
    assert (photo.width, photo.height) == (2560, 1600)
    assert photo.published_at is not None and photo.error_code is None
    assert row(db, PhotoJob, upload.photo_id).status == "done"
    # AND thumb, browse and the default ladder are stored under the versioned prefix, immutable, as WebP
    with db.connect() as connection:
        variants = {v.kind: v for v in connection.execute(select(PhotoVariant)).all()}
        events = connection.execute(select(OutboxEvent)).all()
    ladder = [f"w{width}-webp" for width in sorted(infra.settings.variant_widths)]
    assert set(variants) == {"thumb", "browse", *ladder}
    version = infra.settings.variant_version
    for kind, variant in variants.items():
        # (the ladder's step at the browse's size is the browse object, stored once)
        own = "browse" if kind == "w2048-webp" else kind
        assert (
            variant.storage_key
            == f"{STAGE}/albums/{upload.album_id}/variants/{upload.photo_id}/{version}/{own}.webp"
        )
        head = infra.s3.head_object(Bucket=BUCKET, Key=variant.storage_key)
        assert head["ContentType"] == "image/webp"
        assert head["CacheControl"] == "public, max-age=31536000, immutable"
        assert head["ContentLength"] == variant.bytes
    assert (variants["browse"].width, variants["browse"].height) == (2048, 1280)
    assert (variants["thumb"].width, variants["thumb"].height) == (400, 250)
    # AND exactly one photo.published event carries the post-increment version
    assert len(events) == 1
    event = events[0]
    assert (event.event_type, event.aggregate_type, event.aggregate_id) == (
        "photo.published",
        "photo",
        upload.photo_id,
    )
    assert event.payload["entityVersion"] == 2
    assert event.payload["photoId"] == str(upload.photo_id)
    assert event.payload["variants"]["browse"]["key"] == variants["browse"].storage_key
    assert event.payload["variants"]["thumb"]["bytes"] == variants["thumb"].bytes
    # AND the placeholder and the ladder (schema version 3) are the ones stored; the capture (3 on)
    # is there, empty for a photograph whose EXIF is
    assert event.payload["schemaVersion"] == 3
    assert set(event.payload["capture"].values()) == {None}
    assert event.payload["placeholder"] == {"thumbhash": photo.thumbhash, "averageColor": photo.average_color}
    assert photo.thumbhash and photo.average_color.startswith("#")
    assert [step["key"] for step in event.payload["ladder"]] == [
        variants[kind].storage_key for kind in ladder
    ]
    assert poller.failed == 0


def test_a_second_delivery_answers_already_without_rendering_or_writing(infra: Infra, db: Engine) -> None:
    # GIVEN a published photo whose variant objects are then removed from S3
    data = (samples.IMAGES / "Garden.jpg").read_bytes()
    upload = uploads.upload(db, infra.s3, BUCKET, STAGE, file_name="Garden.jpg", data=data)
    drain(infra)
    prefix = f"{STAGE}/albums/{upload.album_id}/variants/{upload.photo_id}/"
    for obj in infra.s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]:
        infra.s3.delete_object(Bucket=BUCKET, Key=obj["Key"])

    # WHEN the same photo is delivered again (a job message, as a duplicate would be)
    infra.sqs.send_message(
        QueueUrl=infra.queues.url, MessageBody=json.dumps({"photoId": str(upload.photo_id)})
    )
    poller = drain(infra)

    # THEN nothing was written to S3, no event was added and the version did not move
    assert poller.received == 1 and poller.failed == 0
    assert infra.s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("KeyCount") == 0
    assert row(db, Photo, upload.photo_id).entity_version == 2
    with db.connect() as connection:
        assert connection.scalar(select(func.count()).select_from(OutboxEvent)) == 1


def test_a_batch_with_no_records_answers_no_failures(infra: Infra) -> None:
    assert process.lambda_handler({"Records": []}, LambdaContext()) == {"batchItemFailures": []}


def test_keys_with_spaces_plus_percent_brackets_and_accents_survive_s3s_encoding(
    infra: Infra, db: Engine
) -> None:
    # GIVEN a file name S3 must escape in its notification (moto escapes the slashes too)
    name = "Été à la plage + 100% [final] (2).jpg"
    data = (samples.IMAGES / "GreenMeadow.jpg").read_bytes()
    upload = uploads.upload(db, infra.s3, BUCKET, STAGE, file_name=name, data=data)

    # WHEN the notification is delivered
    poller = drain(infra)

    # THEN the decoded key found the photo and its original
    assert poller.failed == 0
    assert row(db, Photo, upload.photo_id).processing_state == "ready"


def test_a_corrupt_upload_fails_permanently_on_its_first_attempt(infra: Infra, db: Engine) -> None:
    # GIVEN a truncated JPEG uploaded as a photo
    data = samples.truncated((samples.IMAGES / "Wood.jpg").read_bytes())
    upload = uploads.upload(db, infra.s3, BUCKET, STAGE, file_name="Wood.jpg", data=data)

    # WHEN it is delivered
    poller = drain(infra)

    # THEN the photo is marked with the code and stays unpublished; the job failed at attempt 1
    photo = row(db, Photo, upload.photo_id)
    assert (photo.processing_state, photo.visibility, photo.error_code) == (
        "processing_failed",
        "unpublished",
        "DECODE_FAILED",
    )
    assert (row(db, PhotoJob, upload.photo_id).status, row(db, PhotoJob, upload.photo_id).attempt) == (
        "failed",
        1,
    )
    # AND one photo.failed event tells the app, the version unchanged (only a publication bumps it)
    with db.connect() as connection:
        (event,) = connection.execute(select(OutboxEvent)).all()
    assert (event.event_type, event.aggregate_id) == (PHOTO_FAILED, upload.photo_id)
    failed = PhotoFailedPayload.from_json(event.payload)
    assert (failed.error_code, failed.kind, failed.attempt, failed.entity_version, failed.album_id) == (
        ErrorCode.DECODE_FAILED,
        "permanent",
        1,
        1,
        upload.album_id,
    )
    # AND the message was acknowledged: no retry, nothing in the dead-letter queue
    assert poller.failed == 0
    assert (
        infra.sqs.receive_message(QueueUrl=infra.queues.dead_letter_url, WaitTimeSeconds=0).get("Messages")
        is None
    )


def test_an_upload_that_races_the_apis_insert_is_retried_until_the_row_exists(
    infra: Infra, db: Engine
) -> None:
    # GIVEN a short backoff, and an original uploaded before the API wrote its photo row
    infra.configure(retry_base_seconds=1)
    data = (samples.IMAGES / "Storm.jpg").read_bytes()
    registered = uploads.Upload(uuid.uuid4(), uuid.uuid4(), "")
    key = original_key(STAGE, registered.album_id, registered.photo_id, "Storm.jpg")
    uploads.put_original(infra.s3, BUCKET, key, data)

    # WHEN the notification is delivered
    poller = drain(infra, rounds=1)

    # THEN it is a transient failure: back to the queue, and no job row for a photo that does not exist
    assert poller.failed == 1
    with db.connect() as connection:
        assert connection.scalar(select(func.count()).select_from(PhotoJob)) == 0

    # WHEN the row arrives and the message comes back after its backoff
    with db.begin() as connection:
        connection.execute(
            insert(Photo).values(id=registered.photo_id, album_id=registered.album_id, original_key=key)
        )
    time.sleep(1.2)
    drain(infra)

    # THEN the photo is published
    assert row(db, Photo, registered.photo_id).processing_state == "ready"


def test_the_records_of_a_batch_are_worked_on_side_by_side(infra: Infra, db: Engine) -> None:
    # GIVEN four uploads waiting in the queue, and four records at a time allowed (two rendering)
    threads: set[int] = set()
    bootstrap.s3_client().meta.events.register(
        "before-call.s3.GetObject", lambda **_: threads.add(threading.get_ident())
    )
    shots = [
        uploads.upload(db, infra.s3, BUCKET, STAGE, file_name=n, data=(samples.IMAGES / n).read_bytes())
        for n in ("Aqua.jpg", "Garden.jpg", "Storm.jpg", "Wood.jpg")
    ]
    time.sleep(0.5)  # let every notification reach the queue, so that one receive takes them all

    # WHEN one batch carries them to the handler
    poller = drain(infra)

    # THEN all are published, and four workers read the originals
    assert poller.failed == 0
    assert {row(db, Photo, s.photo_id).processing_state for s in shots} == {"ready"}
    assert len(threads) == infra.settings.record_concurrency == 4
