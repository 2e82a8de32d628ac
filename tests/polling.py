"""Driving the functions in a test: the real process handler fed by devkit's Poller until a condition
holds, the scheduled sweep as EventBridge invokes it, and the process queue's messages as read."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from uuid import UUID

from devkit import handlers
from devkit.poller import Handler, LambdaContext, Poller
from photo_publish.events import from_sqs_body
from tests.conftest import BUCKET, STAGE, Infra

process = handlers.load("process")


def poll_until(
    infra: Infra,
    done: Callable[[], bool],
    *,
    handler: Handler = process.lambda_handler,
    queue_url: str | None = None,
    queue_arn: str | None = None,
    timeout: float = 30,
) -> Poller:
    poller = Poller(
        infra.sqs,
        queue_url or infra.queues.url,
        queue_arn or infra.queues.arn,
        handler,
        wait_seconds=0,
    )
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out waiting for the queue"
        if not poller.poll_once():
            time.sleep(0.05)
    return poller


def queue_empty(infra: Infra) -> bool:
    """The process queue holds nothing, visible or in flight."""
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


def sweep() -> dict[str, Any]:
    """The scheduled sweep function, as EventBridge invokes it."""
    result: dict[str, Any] = handlers.load("sweep").lambda_handler(
        {"source": "aws.events"}, LambdaContext(timeout_seconds=60)
    )
    return result


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
