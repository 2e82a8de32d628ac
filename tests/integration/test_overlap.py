"""What a record waits on overlaps with the renders: its two puts at once, more records in flight
than renders (RECORD_CONCURRENCY > RENDER_CONCURRENCY), every guarantee as before (issue 17)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import boto3
import pytest
from sqlalchemy import Engine, select

from devkit import samples, uploads
from devkit.faultproxy import AWS_LATENCY, latency_proxy
from photo_publish.adapters.models import Photo, PhotoJob
from photo_publish.adapters.queue import SqsQueue
from photo_publish.adapters.storage import S3Store
from photo_publish.errors import ErrorCode
from photo_publish.events import PhotoRequest
from photo_publish.image import pipeline
from photo_publish.publish import repository, transaction
from photo_publish.publish import service as service_module
from photo_publish.publish.outcomes import Outcome
from photo_publish.publish.service import PhotoService
from tests.conftest import BUCKET, STAGE, Infra

PHOTOS = ("Aqua.jpg", "Garden.jpg", "Storm.jpg", "Wood.jpg", "LadyBird.jpg", "GreenMeadow.jpg")


class RecordingStore(S3Store):
    """The real store, noting when each put starts and ends (and, told to, failing one kind's)."""

    def __init__(self, client: Any, *, fail: str | None = None, slow: float = 0.0) -> None:
        super().__init__(client, BUCKET)
        self.fail, self.slow = fail, slow
        self.events: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def put_variant(self, key: str, data: bytes, content_type: str) -> None:
        kind = key.rsplit("/", 1)[1].split(".", maxsplit=1)[0]
        with self._lock:
            self.events.append(("start", kind))
        try:
            if kind == self.fail:
                # A bucket that does not exist: S3's own NoSuchBucket, mapped as every S3 error is.
                S3Store(self._client, "no-such-bucket-here").put_variant(key, data, content_type)
            time.sleep(self.slow)
            super().put_variant(key, data, content_type)
        finally:
            with self._lock:
                self.events.append(("end", kind))


class CommitWatch:
    """The real publish transaction, noting the store's puts as they stood when it began."""

    def __init__(self, store: RecordingStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.at_commit: list[tuple[str, str]] | None = None
        publish = transaction.publish

        def watched(*args: Any, **kwargs: Any) -> Any:
            self.at_commit = list(store.events)
            return publish(*args, **kwargs)

        monkeypatch.setattr(transaction, "publish", watched)


def a_service(
    infra: Infra, db: Engine, store: RecordingStore, monkeypatch: pytest.MonkeyPatch
) -> tuple[PhotoService, CommitWatch]:
    queue = SqsQueue(infra.sqs, infra.settings.process_queue_url, infra.settings.dead_letter_queue_url)
    return PhotoService(db, store, queue, infra.settings), CommitWatch(store, monkeypatch)


def upload(infra: Infra, db: Engine, name: str = "Aqua.jpg") -> Any:
    return uploads.upload(
        db, infra.s3, BUCKET, STAGE, file_name=name, data=(samples.IMAGES / name).read_bytes()
    )


def test_every_variant_is_put_at_once_and_all_finish_before_the_commit(
    infra: Infra, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN puts that each take 0.3 s, and a photo whose thumb, browse and ladder (640 and 1280; its
    # 2048 step is the browse's object) are as many puts as a record has threads for
    store = RecordingStore(infra.s3, slow=0.3)
    service, commits = a_service(infra, db, store, monkeypatch)
    photo = upload(infra, db)

    # WHEN the photo is processed
    result = service.process(PhotoRequest(photo.photo_id))

    # THEN it is published; every put started before any ended, and all ended before the commit
    assert result.outcome is Outcome.PUBLISHED
    kinds = {kind for _, kind in store.events}
    assert kinds == {"thumb", "browse", "w640-webp", "w1280-webp"}
    assert [event for event, _ in store.events] == ["start"] * len(kinds) + ["end"] * len(kinds)
    assert commits.at_commit is not None and len(commits.at_commit) == 2 * len(kinds)
    # (and the store step took less than the puts one after another would: a loaded machine's
    # threads start late, so no tighter bound than that)
    assert result.steps is not None and result.steps.store < len(kinds) * 0.3


@pytest.mark.parametrize("failing", ["thumb", "browse"])
def test_a_failed_put_of_either_variant_is_storage_write_failed_once_both_have_finished(
    infra: Infra, db: Engine, failing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN S3 refusing one variant's put, the other's slow
    store = RecordingStore(infra.s3, fail=failing, slow=0.3)
    service, commits = a_service(infra, db, store, monkeypatch)
    photo = upload(infra, db)

    # WHEN the photo is processed
    result = service.process(PhotoRequest(photo.photo_id))

    # THEN it is a transient STORAGE_WRITE_FAILED, as when the puts ran one after the other, returned
    # only once the other put had finished; nothing was committed
    assert (result.outcome, result.code) == (Outcome.RETRY, ErrorCode.STORAGE_WRITE_FAILED)
    kinds = {kind for _, kind in store.events}
    assert {"thumb", "browse"} < kinds
    assert sorted(store.events) == sorted([(event, kind) for event in ("start", "end") for kind in kinds])
    assert commits.at_commit is None
    with db.connect() as connection:
        assert (
            connection.scalar(select(Photo.processing_state).where(Photo.id == photo.photo_id)) == "uploaded"
        )
        job = connection.execute(select(PhotoJob).where(PhotoJob.photo_id == photo.photo_id)).one()
    assert (job.status, job.last_error_code) == ("pending", "STORAGE_WRITE_FAILED")


@pytest.fixture
def s3_with_latency(aws_endpoint: None) -> Iterator[Any]:
    with latency_proxy(os.environ["AWS_ENDPOINT_URL"]) as proxy:
        yield boto3.client("s3", endpoint_url=proxy.url)


def test_through_aws_latencies_the_two_puts_take_one_puts_time(
    infra: Infra, db: Engine, s3_with_latency: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN S3 behind AWS's latencies: 50 ms a PutObject
    put = AWS_LATENCY.seconds("s3", "PutObject")
    service, _ = a_service(infra, db, RecordingStore(s3_with_latency), monkeypatch)
    s3_with_latency.put_object(Bucket=BUCKET, Key="warm", Body=b"")  # the connection

    # WHEN photos are processed
    stores = []
    for name in PHOTOS[:3]:
        result = service.process(PhotoRequest(upload(infra, db, name).photo_id))
        assert result.outcome is Outcome.PUBLISHED and result.steps is not None
        stores.append(result.steps.store)

    # THEN storing both variants took about one put's latency: one after the other takes two at least
    assert put <= min(stores) < 2 * put


def test_renders_stay_bounded_while_more_records_are_in_flight(
    infra: Infra, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN four records in flight and two renders at once, each render held for 0.3 s
    settings = replace(infra.settings, record_concurrency=4, render_concurrency=2)
    lock, rendering, most, claimed_meanwhile = threading.Lock(), [0], [0], []
    real_render = pipeline.render

    def counted(*args: Any, **kwargs: Any) -> Any:
        with lock:
            rendering[0] += 1
            most[0] = max(most[0], rendering[0])
        try:
            time.sleep(0.3)
            return real_render(*args, **kwargs)
        finally:
            with lock:
                rendering[0] -= 1

    monkeypatch.setattr(service_module, "render", counted)
    store = RecordingStore(infra.s3)
    queue = SqsQueue(infra.sqs, settings.process_queue_url, settings.dead_letter_queue_url)
    service = PhotoService(db, store, queue, settings)
    real_claim = repository.claim

    def claim(*args: Any, **kwargs: Any) -> Any:
        with lock:
            claimed_meanwhile.append(rendering[0])
        return real_claim(*args, **kwargs)

    monkeypatch.setattr(repository, "claim", claim)
    photos = [upload(infra, db, name) for name in PHOTOS]

    # WHEN six records are worked on, four at a time (as the batch processor does)
    with ThreadPoolExecutor(settings.record_concurrency) as pool:
        results = list(pool.map(lambda p: service.process(PhotoRequest(p.photo_id)), photos))

    # THEN every photo is published, never more than two rendered at once, and records were
    # claimed while two others rendered
    assert {r.outcome for r in results} == {Outcome.PUBLISHED}
    assert most[0] == settings.render_concurrency
    assert max(claimed_meanwhile) == settings.render_concurrency
    # AND the wait for a slot is told apart from the render
    assert max(r.steps.wait for r in results if r.steps) > 0.1
