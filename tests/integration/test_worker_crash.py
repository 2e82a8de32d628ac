"""A crash inside the decoder kills the container: every record of its batch still ends recorded.

The fuzzer found a HEIC that crashes the interpreter inside pi-heif (libheif's metadata, see
tests/images/fuzz); the pipeline now refuses it from its boxes. A crash nobody has found yet is
refused by nothing: here the worker renders without that check (tests/crashworker.py lifts it), so
the same file really kills it, with SIGSEGV, in the middle of a batch, as often as it is rendered.
The worker is the real process handler in its own process, fed as devkit/poller.py feeds it, over
moto's server and PostgreSQL, with short stale and visibility settings; a dead worker is replaced,
as Lambda starts a new container.

The promise: the photo that crashes ends `processing_failed` with WORKER_LOST (its attempts spent
by its own crashes) and one dead letter; every neighbour of its batches ends published, once, and
none is dead-lettered for its neighbour's crash.
"""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select

from devkit import samples, uploads
from photo_publish.adapters.models import OutboxEvent, PhotoJob
from tests import crashworker
from tests.conftest import BUCKET, STAGE, Infra
from tests.rows import photo

ROOT = Path(__file__).resolve().parent.parent.parent
CRASHER = ROOT / "tests" / "images" / "fuzz" / "heic-exif-item-type-not-utf8.heic"
NEIGHBOURS = 7
# Lambda's timeout < STALE_AFTER_SECONDS < the queue's visibility (SPEC 5), in seconds.
FUNCTION_TIMEOUT, STALE_AFTER, VISIBILITY = 5, 6, 8


def dead_letters(sqs: Any, url: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    while batch := sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60, MessageAttributeNames=["All"]
    ).get("Messages", []):
        messages.extend(batch)
    return messages


def jobs(db: Engine) -> Counter[str]:
    with db.connect() as c:
        return Counter(dict(c.execute(select(PhotoJob.status, func.count()).group_by(PhotoJob.status)).all()))


def published_events(db: Engine) -> Counter[Any]:
    with db.connect() as c:
        rows = c.execute(
            select(OutboxEvent.aggregate_id, func.count())
            .where(OutboxEvent.event_type == "photo.published")
            .group_by(OutboxEvent.aggregate_id)
        ).all()
    return Counter(dict(rows))


@pytest.fixture
def crash_infra(infra: Infra) -> Infra:
    """The test bucket notifying a queue whose visibility is seconds, and the functions set to match."""
    infra.use_queues(
        f"crash-{uuid.uuid4().hex[:12]}",
        visibility_timeout=VISIBILITY,
        stale_after_seconds=STALE_AFTER,
        retry_base_seconds=1,
        record_budget_seconds=1,
        commit_budget_seconds=0.5,
        record_concurrency=2,
    )
    return infra


def start_worker(log: Any) -> subprocess.Popen[bytes]:
    return crashworker.start(log, WORKER_FUNCTION_TIMEOUT=str(FUNCTION_TIMEOUT), WORKER_LIFT_HEIF_GUARD="1")


@pytest.mark.slow
def test_a_decoder_crash_kills_its_worker_and_every_record_of_its_batch_still_ends_recorded(
    crash_infra: Infra, db: Engine, tmp_path: Path
) -> None:
    infra = crash_infra
    # GIVEN seven small photographs and, in their midst, the HEIC that crashes pi-heif, all uploaded
    # before any worker runs, so that they arrive in one batch
    small = [
        bytes(samples.photograph(path.name).thumbnail_image(320).jpegsave_buffer(Q=80))
        for path in samples.photographs()
    ]
    shots = []
    for index in range(NEIGHBOURS):
        if index == NEIGHBOURS // 2:
            crasher = uploads.upload(
                db, infra.s3, BUCKET, STAGE, file_name="crash.heic", data=CRASHER.read_bytes()
            )
        shots.append(
            uploads.upload(
                db, infra.s3, BUCKET, STAGE, file_name=f"n{index}.jpg", data=small[index % len(small)]
            )
        )
    neighbours = {shot.photo_id for shot in shots}
    deadline = time.monotonic() + 30
    while (
        int(
            infra.sqs.get_queue_attributes(
                QueueUrl=infra.queues.url, AttributeNames=["ApproximateNumberOfMessages"]
            )["Attributes"]["ApproximateNumberOfMessages"]
        )
        < NEIGHBOURS + 1
    ):
        assert time.monotonic() < deadline, "the notifications did not arrive"
        time.sleep(0.1)

    def settled() -> bool:
        finished = jobs(db)
        return set(finished) <= {"done", "failed"} and finished.total() == NEIGHBOURS + 1

    # WHEN workers run the queue, each replaced when it dies, until every photo is settled
    deaths: list[int] = []
    with (tmp_path / "workers.log").open("wb") as log:
        worker = start_worker(log)
        deadline = time.monotonic() + 120
        try:
            while not settled():
                assert time.monotonic() < deadline, (tmp_path / "workers.log").read_text()[-4000:]
                if worker.poll() is not None:
                    deaths.append(worker.returncode)
                    worker = start_worker(log)
                time.sleep(0.2)
        finally:
            worker.terminate()
            worker.wait(10)

    # THEN the HEIC killed its worker, with SIGSEGV, once for each of its attempts, and was then
    # failed with WORKER_LOST: its dead letter, and only its, is in the dead-letter queue
    assert deaths == [-signal.SIGSEGV] * 3, (tmp_path / "workers.log").read_text()[-4000:]
    assert photo(db, crasher.photo_id) == ("processing_failed", "WORKER_LOST", 1)
    letters = dead_letters(infra.sqs, infra.queues.dead_letter_url)
    assert [m["MessageAttributes"]["photoId"]["StringValue"] for m in letters] == [str(crasher.photo_id)]
    # AND every neighbour of its batches is published once, none failed for its neighbour's crash
    assert all(photo(db, photo_id) == ("ready", None, 2) for photo_id in neighbours)
    events = published_events(db)
    assert {photo_id: events[photo_id] for photo_id in neighbours} == dict.fromkeys(neighbours, 1)
    assert jobs(db) == Counter({"done": NEIGHBOURS, "failed": 1})
