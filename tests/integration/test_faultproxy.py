"""The soak's fault proxy speaks the services' own failures: botocore and the adapters take its faults
for S3's and SQS's (so what the soak finds is what AWS would cause, not an artefact of the proxy)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

from devkit import samples
from devkit.faultproxy import ProxyControl
from devkit.soak import fault_proxy
from photo_publish.adapters.queue import SqsQueue
from photo_publish.adapters.storage import S3Store
from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.image.pipeline import RenderOptions, render
from tests.conftest import BUCKET

# The functions' own client settings (bootstrap). In botocore's Config `max_attempts` counts the
# retries (`total_max_attempts` would count the first request too): 4 requests in all.
CLIENT = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=3, read_timeout=20)
REQUESTS = 4
PHOTO = bytes(samples.photograph("Aqua.jpg").thumbnail_image(256).jpegsave_buffer(Q=80))


@pytest.fixture
def proxy(aws_endpoint: None, tmp_path: Path) -> Iterator[ProxyControl]:
    """The proxy in front of the tests' moto server, without dice: each test opens its outage."""
    with fault_proxy(os.environ["AWS_ENDPOINT_URL"], 1, tmp_path, rates={}) as control:
        yield control


def through(proxy: ProxyControl, service: str) -> object:
    return boto3.client(service, endpoint_url=proxy.url, config=CLIENT)  # type: ignore[call-overload]


def test_an_s3_outage_outlasts_botocores_retries_and_becomes_storage_read_failed(proxy: ProxyControl) -> None:
    # GIVEN an original, and S3 answering every GetObject with 503 SlowDown
    key = f"dev/originals/albums/{uuid.uuid4()}/{uuid.uuid4()}/a.jpg"
    boto3.client("s3").put_object(Bucket=BUCKET, Key=key, Body=PHOTO)
    proxy.call("outage", service="s3", kind="error_503", seconds=30, operation="GetObject")

    # WHEN the store opens it through the proxy
    with pytest.raises(PhotoError) as raised:
        S3Store(through(proxy, "s3"), BUCKET).open_original(key, 10**6)  # type: ignore[arg-type]

    # THEN botocore retried until it gave up, and the adapter mapped S3's code to a transient failure
    assert raised.value.code is ErrorCode.STORAGE_READ_FAILED
    assert proxy.call("stats")["faults"]["s3:error_503"] == REQUESTS


def test_a_body_cut_short_is_a_storage_fault_not_a_broken_photo(proxy: ProxyControl) -> None:
    # GIVEN an original whose GetObject answers are cut in half (headers promise the whole length)
    key = f"dev/originals/albums/{uuid.uuid4()}/{uuid.uuid4()}/a.jpg"
    boto3.client("s3").put_object(Bucket=BUCKET, Key=key, Body=PHOTO)
    proxy.call("outage", service="s3", kind="truncate", seconds=30, operation="GetObject")

    # WHEN it is rendered from the stream
    stream = S3Store(through(proxy, "s3"), BUCKET).open_original(key, 10**6)  # type: ignore[arg-type]
    with pytest.raises(PhotoError) as raised:
        render(stream, RenderOptions())

    # THEN it is a storage fault (retried), never DECODE_FAILED (the user's bad file)
    assert raised.value.code is ErrorCode.STORAGE_READ_FAILED


def test_a_dead_letter_refused_through_an_sqs_outage_is_reported_not_sent(proxy: ProxyControl) -> None:
    # GIVEN a dead-letter queue that answers SendMessage with 500 InternalFailure
    sqs = boto3.client("sqs")
    url = sqs.create_queue(QueueName=f"proxy-{uuid.uuid4().hex[:8]}-dlq")["QueueUrl"]
    proxy.call("outage", service="sqs", kind="error_500", seconds=30, operation="SendMessage(dlq)")

    # WHEN a dead letter is sent through the proxy
    sent = SqsQueue(through(proxy, "sqs"), url, url).send_dead_letter(uuid.uuid4(), 3, ErrorCode.WORKER_LOST)  # type: ignore[arg-type]

    # THEN botocore retried until it gave up, the queue reports it unsent, and nothing arrived
    assert sent is False
    assert proxy.call("stats")["faults"]["sqs:error_500"] == REQUESTS
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)


def test_a_dropped_answer_hides_a_send_that_happened(proxy: ProxyControl) -> None:
    # GIVEN SQS forwarding every SendMessage, then dropping the connection before answering
    sqs = boto3.client("sqs")
    url = sqs.create_queue(QueueName=f"proxy-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    proxy.call("outage", service="sqs", kind="drop_response", seconds=30, operation="SendMessage")

    # WHEN a job message is sent through the proxy
    with pytest.raises(Exception, match="Connection"):
        SqsQueue(through(proxy, "sqs"), url, url).send_job(uuid.uuid4())  # type: ignore[arg-type]

    # THEN the caller saw a failure, yet every request landed: a copy of the message for each
    bodies = []
    while batch := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get(
        "Messages"
    ):
        bodies += [json.loads(m["Body"]) for m in batch]
        for message in batch:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert len(bodies) == REQUESTS


def test_a_quiet_proxy_ends_every_outage(proxy: ProxyControl) -> None:
    # GIVEN an S3 outage, then the drain's call for quiet
    proxy.call("outage", service="s3", kind="error_500", seconds=30)
    proxy.call("quiet")

    # WHEN an object goes through the proxy THEN it arrives whole, and no fault is counted
    key = f"dev/originals/albums/{uuid.uuid4()}/{uuid.uuid4()}/a.jpg"
    s3 = through(proxy, "s3")
    s3.put_object(Bucket=BUCKET, Key=key, Body=PHOTO)  # type: ignore[attr-defined]
    assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == PHOTO  # type: ignore[attr-defined]
    assert proxy.call("stats")["faults"] == {}
