"""Eight deliveries of one photo at once: exactly one event, entity_version + 1 exactly once."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, update

from devkit import samples, uploads
from photo_publish.adapters.database import create_database_engine
from photo_publish.adapters.models import OutboxEvent, Photo, PhotoJob, PhotoVariant
from photo_publish.adapters.queue import SqsQueue
from photo_publish.adapters.storage import OriginalStream, S3Store
from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.events import PhotoRequest
from photo_publish.publish.outcomes import Outcome, Result
from photo_publish.publish.service import PhotoService
from photo_publish.retry import HAND_ON_SLACK
from photo_publish.settings import Settings
from tests.conftest import BUCKET, STAGE, Infra

WORKERS = 8


class BarrierStore(S3Store):
    """The real S3 store, holding each worker at the original until all of them got there."""

    def __init__(self, inner: S3Store, barrier: threading.Barrier) -> None:
        self.__dict__.update(inner.__dict__)
        self._barrier = barrier

    def open_original(self, key: str, max_bytes: int) -> OriginalStream:
        self._barrier.wait()
        return super().open_original(key, max_bytes)


@pytest.fixture
def engines(infra: Infra) -> Iterator[list[Engine]]:
    """One engine per worker: each delivery has its own connections, as separate Lambdas do."""
    engines = [create_database_engine(infra.settings) for _ in range(WORKERS)]
    yield engines
    for engine in engines:
        engine.dispose()


def deliver_all(
    make_service: Callable[[int], PhotoService], request: PhotoRequest, *, until_claimed: bool = False
) -> list[Result]:
    start = threading.Barrier(WORKERS)

    def deliver(index: int) -> Result:
        service = make_service(index)
        start.wait()
        result = service.process(request)
        # A claim can lose to one whose transaction started later; the queue would bring it back.
        while until_claimed and result.outcome is Outcome.RETRY:
            result = service.process(request)
        return result

    with ThreadPoolExecutor(WORKERS) as pool:
        return list(pool.map(deliver, range(WORKERS)))


def published_state(db: Engine, photo_id: Any) -> tuple[int, int, str, int]:
    with db.connect() as connection:
        version = connection.scalar(select(Photo.entity_version).where(Photo.id == photo_id))
        events = connection.scalar(
            select(func.count()).select_from(OutboxEvent).where(OutboxEvent.aggregate_id == photo_id)
        )
        job = connection.execute(
            select(PhotoJob.status, PhotoJob.attempt).where(PhotoJob.photo_id == photo_id)
        ).one()
    return version, events, job.status, job.attempt


def services(infra: Infra, engines: list[Engine], settings: Settings, **barriers: threading.Barrier) -> Any:
    queue = SqsQueue(infra.sqs, settings.process_queue_url, settings.dead_letter_queue_url)
    store = S3Store(infra.s3, BUCKET)

    def make(index: int) -> PhotoService:
        worker_store = BarrierStore(store, barriers["render"]) if "render" in barriers else store
        return PhotoService(engines[index], worker_store, queue, settings)

    return make


def test_concurrent_deliveries_let_one_through_the_claim(
    infra: Infra, db: Engine, engines: list[Engine]
) -> None:
    # GIVEN an uploaded photo and eight deliveries of it arriving together
    data = (samples.IMAGES / "Aqua.jpg").read_bytes()
    upload = uploads.upload(db, infra.s3, BUCKET, STAGE, file_name="Aqua.jpg", data=data)

    # WHEN they run at once, each with its own connections
    results = deliver_all(services(infra, engines, infra.settings), PhotoRequest(upload.photo_id))

    # THEN one published; the others were turned away by the claim (or found it published)
    outcomes = Counter(r.outcome for r in results)
    assert outcomes[Outcome.PUBLISHED] == 1
    assert set(outcomes) <= {Outcome.PUBLISHED, Outcome.RETRY, Outcome.ALREADY, Outcome.DUPLICATE}
    # AND the photo went up one version with exactly one event; its job ran once
    assert published_state(db, upload.photo_id) == (2, 1, "done", 1)


def test_concurrent_renders_of_taken_over_claims_let_only_the_last_claim_write_and_publish(
    infra: Infra, db: Engine, engines: list[Engine]
) -> None:
    # GIVEN a claim that any delivery can take over at once (stale after 0 s, attempts to spare)
    data = (samples.IMAGES / "YellowFlower.jpg").read_bytes()
    upload = uploads.upload(db, infra.s3, BUCKET, STAGE, file_name="YellowFlower.jpg", data=data)
    settings = infra.configure(stale_after_seconds=0, max_attempts=100, max_receive_count=100 + HAND_ON_SLACK)
    render = threading.Barrier(WORKERS, timeout=60)
    puts: list[str] = []

    def count_put(params: dict[str, Any], **_: Any) -> None:
        puts.append(params["Key"])

    # WHEN eight deliveries each claim in turn (taking the job over), then all render together
    infra.s3.meta.events.register("before-parameter-build.s3.PutObject", count_put)
    make = services(infra, engines, settings, render=render)
    results = deliver_all(make, PhotoRequest(upload.photo_id), until_claimed=True)
    infra.s3.meta.events.unregister("before-parameter-build.s3.PutObject", count_put)

    # THEN the fencing token let exactly one write the variants and publish; the seven others,
    # superseded, wrote nothing
    outcomes = Counter(r.outcome for r in results)
    assert outcomes == {Outcome.PUBLISHED: 1, Outcome.SUPERSEDED: 7}
    # (one put a variant object: thumb, browse and the ladder's steps below the browse's size)
    with db.connect() as connection:
        keys = connection.scalars(
            select(PhotoVariant.storage_key).where(PhotoVariant.photo_id == upload.photo_id)
        )
        assert sorted(puts) == sorted(set(keys)) and len(puts) >= 2
    # AND entity_version went up once, with one event; the last claim finished the job
    version, events, status, attempt = published_state(db, upload.photo_id)
    assert (version, events, status) == (2, 1, "done")
    assert attempt >= WORKERS


@pytest.mark.parametrize("ending", ["finishes", "fails"])
def test_a_slow_worker_whose_job_was_taken_over_changes_nothing_of_the_job(
    infra: Infra, db: Engine, engines: list[Engine], ending: str
) -> None:
    # GIVEN a worker that claimed the job and is stuck reading the original
    data = (samples.IMAGES / "Storm.jpg").read_bytes()
    upload = uploads.upload(db, infra.s3, BUCKET, STAGE, file_name="Storm.jpg", data=data)
    reached, release = threading.Event(), threading.Event()

    slow_puts: list[str] = []

    class SlowStore(S3Store):
        def open_original(self, key: str, max_bytes: int) -> OriginalStream:
            reached.set()
            release.wait(30)
            if ending == "fails":
                raise PhotoError(ErrorCode.STORAGE_READ_FAILED, "the slow worker's read finally fails")
            return super().open_original(key, max_bytes)

        def put_variant(self, key: str, data: bytes, content_type: str) -> None:
            slow_puts.append(key)
            super().put_variant(key, data, content_type)

    queue = SqsQueue(infra.sqs, infra.settings.process_queue_url, infra.settings.dead_letter_queue_url)
    slow = PhotoService(engines[0], SlowStore(infra.s3, BUCKET), queue, infra.settings)
    with ThreadPoolExecutor(1) as pool:
        slow_result = pool.submit(slow.process, PhotoRequest(upload.photo_id))
        assert reached.wait(30)

        # WHEN its claim goes stale, another delivery takes the job over and publishes
        with db.begin() as connection:
            connection.execute(
                update(PhotoJob)
                .where(PhotoJob.photo_id == upload.photo_id)
                .values(claimed_at=func.now() - timedelta(seconds=infra.settings.stale_after_seconds + 1))
            )
        fresh = PhotoService(engines[1], S3Store(infra.s3, BUCKET), queue, infra.settings)
        assert fresh.process(PhotoRequest(upload.photo_id)).outcome is Outcome.PUBLISHED
        # AND the slow worker finally finishes, or fails
        release.set()
        late = slow_result.result(30)

    # THEN nothing it did changed the job: done by attempt 2, no error recorded, one event
    assert late.outcome is Outcome.SUPERSEDED
    # AND it never wrote over the published variants (immutable, cached for a year)
    assert slow_puts == []
    assert published_state(db, upload.photo_id) == (2, 1, "done", 2)
    with db.connect() as connection:
        assert (
            connection.scalar(select(PhotoJob.last_error_code).where(PhotoJob.photo_id == upload.photo_id))
            is None
        )
