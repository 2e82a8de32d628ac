"""Events leave the database (SPEC 12) on a real LocalStack: its EventBridge, a rule on the bus to
an SQS queue, and the publish path's events arriving there, by the hand-off and by the relay.

LocalStack delivers a rule's targets asynchronously: the subscriber's queue is polled until the
events arrive (or a deadline passes).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from sqlalchemy import Engine, select

from devkit import handlers, samples, stack, uploads
from devkit.poller import LambdaContext
from photo_publish import bootstrap
from photo_publish.adapters.models import OutboxEvent
from photo_publish.contracts import PhotoFailedPayload, PhotoPublishedPayload
from photo_publish.errors import ErrorCode
from tests.conftest import BUCKET, STAGE, Infra
from tests.faults import aws_fails
from tests.localstack.flow import arrived
from tests.polling import poll_until
from tests.rows import job, photo

pytestmark = pytest.mark.localstack
relay = handlers.load("relay")


def rows(db: Engine) -> dict[str, Any]:
    with db.connect() as c:
        return {str(r.id): r for r in c.execute(select(OutboxEvent))}


def test_a_rule_on_the_bus_brings_the_publish_paths_events_to_a_queue(
    infra: Infra, db: Engine, bus: stack.Subscriber
) -> None:
    # GIVEN a photo and a corrupt upload, delivered by LocalStack's S3 notifications
    good = uploads.upload(
        db,
        infra.s3,
        BUCKET,
        STAGE,
        file_name="Lady Bird.jpg",
        data=(samples.IMAGES / "LadyBird.jpg").read_bytes(),
    )
    bad = uploads.upload(db, infra.s3, BUCKET, STAGE, file_name="bad.jpg", data=b"not a photo")

    # WHEN the process function handles them (and hands each event to LocalStack's bus)
    poll_until(infra, lambda: photo(db, good.photo_id)[0] == "ready" and job(db, bad.photo_id)[0] == "failed")

    # THEN the rule brought both events to the subscriber's queue, as SPEC 11 shapes them
    envelopes = arrived(infra, bus, 2)
    outbox = rows(db)
    assert Counter(e["detail"]["eventId"] for e in envelopes) == Counter(dict.fromkeys(outbox, 1))
    by_type = {e["detail-type"]: e for e in envelopes}
    assert set(by_type) == {"photo.published", "photo.failed"}
    assert {e["source"] for e in envelopes} == {"photo-publish"}
    published = PhotoPublishedPayload.from_json(by_type["photo.published"]["detail"]["data"])
    failed = PhotoFailedPayload.from_json(by_type["photo.failed"]["detail"]["data"])
    assert (published.photo_id, published.entity_version) == (good.photo_id, 2)
    assert (failed.photo_id, failed.error_code, failed.kind) == (
        bad.photo_id,
        ErrorCode.UNSUPPORTED_FORMAT,
        "permanent",
    )
    assert all(r.published_at is not None for r in outbox.values())


def test_events_the_hand_off_could_not_send_reach_the_queue_through_the_relay(
    infra: Infra, db: Engine, bus: stack.Subscriber
) -> None:
    # GIVEN a photo published while the hand-off could not reach the bus
    shot = uploads.upload(
        db, infra.s3, BUCKET, STAGE, file_name="Wood.jpg", data=(samples.IMAGES / "Wood.jpg").read_bytes()
    )
    with aws_fails(bootstrap.handoff_events_client(), "PutEvents"):
        poll_until(infra, lambda: photo(db, shot.photo_id)[0] == "ready")
    assert arrived(infra, bus, 1, timeout=2) == []

    # WHEN the relay runs on its schedule's event
    summary = relay.lambda_handler({"source": "aws.events"}, LambdaContext(60))

    # THEN the event reached the subscriber, once, and a second run sends nothing
    assert summary["published"] == 1
    (envelope,) = arrived(infra, bus, 1)
    assert envelope["detail"]["eventId"] in rows(db)
    assert relay.lambda_handler({"source": "aws.events"}, LambdaContext(60))["published"] == 0
