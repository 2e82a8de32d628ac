"""Real photos at the pixel limit publish through the process handler within the function's memory.

Issue 24's own case first: an 8000 x 6000 progressive JPEG (a 48 MP camera's size, as mozjpeg
writes it), refused before with DIMENSIONS_EXCEEDED ("its decoder would hold 288000000 bytes, over
240000000"). Beside it in one batch, a 100 MP progressive 4:4:4 JPEG (renders in a shared slot), a
100 MP interlaced 16-bit RGBA PNG (more than a slot: renders alone) and small photographs. The worker
is the real process handler in its own process (tests/crashworker.py, fed as devkit/poller.py feeds
it), told the template's memory (AWS_LAMBDA_FUNCTION_MEMORY_SIZE=1769) as Lambda tells it; its peak
resident memory is read from the kernel before it is stopped.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine

from devkit import samples, uploads
from tests import crashworker
from tests.conftest import BUCKET, STAGE, Infra
from tests.rows import photo

LARGE = {
    "jpeg-progressive-8000x6000.jpg": "shared",
    "jpeg-progressive-444-10000x10000.jpg": "shared",
    "png-interlaced-10000x10000-16bit-alpha.png": "alone",
}
SMALL = ("Aqua.jpg", "Storm.jpg", "GreenMeadow.jpg")
MEMORY_MB = 1769


def peak_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:  # noqa: PTH123
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024


def queued(infra: Infra) -> int:
    attributes = infra.sqs.get_queue_attributes(
        QueueUrl=infra.queues.url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"])


@pytest.mark.slow
def test_photos_at_the_pixel_limit_publish_through_the_handler_within_the_functions_memory(
    infra: Infra, db: Engine, fullsize_corpus: Path, tmp_path: Path
) -> None:
    # GIVEN a queue whose visibility outlasts a batch of 100 MP renders, and the function's settings
    infra.use_queues(
        f"large-{uuid.uuid4().hex[:12]}", visibility_timeout=600, aws_lambda_function_memory_size=MEMORY_MB
    )
    # AND the photos uploaded before the worker starts, so that they arrive in one batch
    large = {
        uploads.upload(
            db, infra.s3, BUCKET, STAGE, file_name=name, data=(fullsize_corpus / name).read_bytes()
        ).photo_id: route
        for name, route in LARGE.items()
    }
    small = [
        uploads.upload(
            db, infra.s3, BUCKET, STAGE, file_name=name, data=(samples.IMAGES / name).read_bytes()
        ).photo_id
        for name in SMALL
    ]
    deadline = time.monotonic() + 30
    while queued(infra) < len(large) + len(small):
        assert time.monotonic() < deadline, "the notifications did not arrive"
        time.sleep(0.1)

    # WHEN the real process handler works the queue, in its own process
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        worker = crashworker.start(log, WORKER_FUNCTION_TIMEOUT="120", POWERTOOLS_LOG_LEVEL="INFO")
        try:
            deadline = time.monotonic() + 600
            while not all(photo(db, photo_id)[0] != "uploaded" for photo_id in [*large, *small]):
                assert worker.poll() is None, log_path.read_text()[-4000:]
                assert time.monotonic() < deadline, log_path.read_text()[-4000:]
                time.sleep(0.5)
            peak = peak_mb(worker.pid)
        finally:
            worker.terminate()
            worker.wait(10)

    # THEN every photo is published, the 48 MP progressive JPEG first of all
    assert all(photo(db, photo_id) == ("ready", None, 2) for photo_id in [*large, *small]), (
        log_path.read_text()[-4000:]
    )
    # AND the one whose decoder needs more than a shared slot rendered alone, the others beside others
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    alone = {line["photo_id"] for line in lines if line.get("message") == "rendering alone"}
    assert alone == {str(photo_id) for photo_id, route in large.items() if route == "alone"}
    # AND the worker, a whole container's process, never held more than the function's memory
    assert peak <= MEMORY_MB, peak
    budget = next(line for line in lines if line.get("message") == "decode budget")
    assert budget["source"].startswith(f"{MEMORY_MB} MB of function memory")
