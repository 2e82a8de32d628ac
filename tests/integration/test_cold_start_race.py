"""A cold container's first batch: its worker threads race for the clients and the engine."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import boto3
import pytest
from sqlalchemy import Engine

from devkit import handlers, samples, uploads
from devkit.poller import LambdaContext, sqs_event
from photo_publish import bootstrap
from tests.conftest import BUCKET, STAGE, Infra
from tests.rows import published

process = handlers.load("process")
RECORDS = 4


def test_the_first_batchs_threads_build_one_engine_and_one_client_each(
    infra: Infra, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a cold container (nothing built) whose records are worked on four at a time, and
    # builders slow enough for the threads to meet inside them
    infra.configure(record_concurrency=RECORDS)
    shots = [
        uploads.upload(db, infra.s3, BUCKET, STAGE, file_name=name, data=(samples.IMAGES / name).read_bytes())
        for name in ("Aqua.jpg", "Garden.jpg", "Storm.jpg", "Wood.jpg")
    ]
    messages: list[dict[str, Any]] = []
    while len(messages) < RECORDS:
        messages += infra.sqs.receive_message(
            QueueUrl=infra.queues.url, MaxNumberOfMessages=10, WaitTimeSeconds=1, AttributeNames=["All"]
        ).get("Messages", [])
    engines: list[Engine] = []
    clients: Counter[str] = Counter()
    lock = threading.Lock()
    real_engine, real_client = bootstrap.create_database_engine, boto3.session.Session.client

    def slow_engine(*args: Any, **kwargs: Any) -> Engine:
        time.sleep(0.2)
        engine = real_engine(*args, **kwargs)
        with lock:
            engines.append(engine)
        return engine

    def counted_client(self: boto3.session.Session, service: str, *args: Any, **kwargs: Any) -> Any:
        with lock:
            clients[service] += 1
        time.sleep(0.05)
        return real_client(self, service, *args, **kwargs)

    monkeypatch.setattr(bootstrap, "create_database_engine", slow_engine)
    monkeypatch.setattr(boto3.session.Session, "client", counted_client)
    bootstrap.reset()

    # WHEN the handler gets its first batch
    response = process.lambda_handler(sqs_event(messages, infra.queues.arn), LambdaContext())

    # THEN every record published, through one engine and one client per service
    assert response == {"batchItemFailures": []}
    assert all(published(db, shot.photo_id)() for shot in shots)
    assert len(engines) == 1
    assert clients == {"s3": 1, "sqs": 1}
    for engine in engines:
        engine.dispose()
