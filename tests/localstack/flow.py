"""What the LocalStack tests read and drive: the real process handler fed by devkit's Poller."""

from __future__ import annotations

import json
import time
from typing import Any
from uuid import UUID

from sqlalchemy import Engine, func, select

from devkit import handlers, samples, stack, uploads
from devkit.poller import Handler
from photo_publish.adapters.models import OutboxEvent
from tests.conftest import BUCKET, STAGE, Infra

process = handlers.load("process")


class Recorder:
    """The process handler, keeping the bodies of the records it was given."""

    def __init__(self, handler: Handler = process.lambda_handler) -> None:
        self.handler = handler
        self.bodies: list[dict[str, Any]] = []
        self.receive_counts: list[int] = []

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        for record in event["Records"]:
            self.bodies.append(json.loads(record["body"]))
            self.receive_counts.append(int(record["attributes"]["ApproximateReceiveCount"]))
        return self.handler(event, context)


def upload(infra: Infra, db: Engine, name: str = "LadyBird.jpg", image: str | None = None) -> uploads.Upload:
    data = (samples.IMAGES / (image or name)).read_bytes()
    return uploads.upload(db, infra.s3, BUCKET, STAGE, file_name=name, data=data)


def outbox(db: Engine, photo_id: UUID, event_type: str = "photo.published") -> list[Any]:
    """The photo's outbox rows of one type (photo.published unless told)."""
    with db.connect() as c:
        return list(
            c.execute(
                select(OutboxEvent).where(
                    OutboxEvent.aggregate_id == photo_id, OutboxEvent.event_type == event_type
                )
            ).all()
        )


def messages(infra: Infra, queue_url: str) -> list[dict[str, Any]]:
    """Every message of a queue, left visible again afterwards (so the operator can read them)."""
    found: list[dict[str, Any]] = []
    while batch := infra.sqs.receive_message(
        QueueUrl=queue_url,
        MaxNumberOfMessages=10,
        VisibilityTimeout=30,
        WaitTimeSeconds=0,
        AttributeNames=["All"],
        MessageAttributeNames=["All"],
    ).get("Messages", []):
        found.extend(batch)
    for m in found:
        infra.sqs.change_message_visibility(
            QueueUrl=queue_url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
        )
    return found


def counts(infra: Infra, queue_url: str) -> tuple[int, int, int]:
    """(visible, in flight, delayed), as the queue reports them."""
    names = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    ]
    attributes = infra.sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=names)["Attributes"]
    visible, in_flight, delayed = (int(attributes[n]) for n in names)
    return visible, in_flight, delayed


def count(db: Engine, model: Any) -> int:
    with db.connect() as c:
        return c.scalar(select(func.count()).select_from(model)) or 0


def last_move_task(infra: Infra, source_arn: str, *, timeout: float = 15) -> dict[str, Any]:
    """The newest message move task of `source_arn`, once it is no longer running."""
    deadline = time.monotonic() + timeout
    while True:
        tasks = infra.sqs.list_message_move_tasks(SourceArn=source_arn, MaxResults=1)["Results"]
        assert tasks, f"no message move task for {source_arn}"
        if tasks[0]["Status"] not in ("RUNNING", "CANCELLING"):
            return dict(tasks[0])
        assert time.monotonic() < deadline, f"the move task is still {tasks[0]['Status']}"
        time.sleep(0.1)


def arrived(infra: Infra, bus: stack.Subscriber, count: int, timeout: float = 20) -> list[dict[str, Any]]:
    """The subscriber's events once `count` have arrived; then one more look for any extra."""
    found: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(found) < count and time.monotonic() < deadline:
        found += stack.received(infra.sqs, bus.queue_url)
        time.sleep(0.2)
    time.sleep(1)
    return found + stack.received(infra.sqs, bus.queue_url)
