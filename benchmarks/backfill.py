"""Issue 16: new uploads' latency while a backfill runs, against the same with no backfill.

BACKFILL_PHOTOS (2000) photos are published at recipe version 1 (their rows as the publish
transaction leaves them, their small originals in S3), then the functions are deployed at version 2.
Three phases, each with the real process handler fed by devkit's poller (one Lambda, two records
at a time) and the real sweep on a schedule, every SWEEP_PERIOD seconds here instead of a minute:
- baseline: UPLOADS new photos uploaded one every UPLOAD_INTERVAL seconds, no backfill;
- default rate: `rerender --all` marks the 2000, and the same uploads arrive while the sweep sends
  the backfill at the template's rate scaled to this period (50 a minute: 3 a run), spread over
  the period, only while the queue is short. One local Lambda has about a tenth of the capacity of
  the template's ten, and this rate the template's share of it;
- heavy: the uploads again while the sweep sends 40 a run (13 a second, a quarter or more of this
  Lambda's capacity), until all 2000 have moved: the backfill's throughput.
Reported: upload-to-published latency (the photo row's created_at to its published_at, both the
database's clock) p50 and p95 in each phase, their ratios to the baseline (target: at most 1.5 at
the default rate), and the backfill's throughput. Uploads and the backfill's originals are small JPEGs (320 x 200): the question is
queueing, not rendering. Results go to .local/bench-results/backfill.json.
"""

from __future__ import annotations

import io
import json
import logging
import os
import statistics
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, insert, select

from benchmarks.delivery import moto_process
from devkit import handlers, samples, stack, uploads
from devkit.demo import BUCKET, STAGE, Stack, start_stack
from devkit.poller import LambdaContext, Poller
from photo_publish.adapters.models import Photo, PhotoJob, PhotoVariant
from photo_publish.keys import original_key, variant_key

BACKFILL_PHOTOS = int(os.environ.get("BENCH_BACKFILL_PHOTOS", "2000"))
UPLOADS = int(os.environ.get("BENCH_BACKFILL_UPLOADS", "60"))
UPLOAD_INTERVAL = 0.5
SWEEP_PERIOD = 3.0
DEFAULT_BATCH = 3  # the template's 50 a minute, at a 3-second period
HEAVY_BATCH = 40
PHASES = {"baseline": None, "default": DEFAULT_BATCH, "heavy": HEAVY_BATCH}
RESULTS = stack.ROOT / ".local" / "bench-results"


def seed(local: Stack, count: int, original: bytes) -> None:
    """`count` photos published at version 1, as the publish transaction leaves them."""
    rows = []
    for _ in range(count):
        album, photo = uuid.uuid4(), uuid.uuid4()
        rows.append((album, photo, original_key(STAGE, album, photo, "p.jpg")))
    with local.engine.begin() as connection:
        connection.execute(
            insert(Photo),
            [
                {
                    "id": p,
                    "album_id": a,
                    "original_key": k,
                    "processing_state": "ready",
                    "visibility": "published",
                    "published_at": datetime.now(UTC),
                    "width": 320,
                    "height": 200,
                    "entity_version": 2,
                    "variant_version": 1,
                }
                for a, p, k in rows
            ],
        )
        connection.execute(
            insert(PhotoJob), [{"photo_id": p, "status": "done", "attempt": 1} for _, p, _ in rows]
        )
        connection.execute(
            insert(PhotoVariant),
            [
                {
                    "photo_id": p,
                    "kind": kind,
                    "storage_key": variant_key(STAGE, a, p, version=1, kind=kind, ext="webp"),
                    "width": 320,
                    "height": 200,
                    "bytes": 1000,
                    "content_type": "image/webp",
                    "variant_version": 1,
                }
                for a, p, _ in rows
                for kind in ("thumb", "browse")
            ],
        )
    for _, _, key in rows:
        local.s3.put_object(Bucket=BUCKET, Key=key, Body=original)
    # These are old uploads: their notifications were handled long ago.
    while messages := local.sqs.receive_message(
        QueueUrl=local.queues.url, MaxNumberOfMessages=10, WaitTimeSeconds=1
    ).get("Messages", []):
        local.sqs.delete_message_batch(
            QueueUrl=local.queues.url,
            Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)],
        )


def phase(local: Stack, original: bytes, *, batch: int | None) -> dict[str, Any]:
    """Uploads (and, with a batch, a backfill of the seeded photos at that rate) until the uploads are
    published, or, for the heavy phase, until the backfill is done too."""
    # Imported after start_stack: the functions' Logger and Metrics read its environment.
    from photo_publish import bootstrap
    from photo_publish.jobs import backfill

    if batch is not None:
        os.environ["BACKFILL_BATCH_SIZE"] = str(batch)
        bootstrap.reset()
        backfill.mark(local.engine, 2, backfill.Selection())
    process, sweep = handlers.load("process"), handlers.load("sweep")
    poller = Poller(local.sqs, local.queues.url, local.queues.arn, process.lambda_handler, wait_seconds=1)
    sweeps: list[dict[str, Any]] = []
    poller.schedule.append(
        (
            SWEEP_PERIOD,
            lambda: sweeps.append(sweep.lambda_handler({"source": "aws.events"}, LambdaContext(60))),
        )
    )
    uploaded: list[uuid.UUID] = []

    def upload_all() -> None:
        for _ in range(UPLOADS):
            uploaded.append(
                uploads.upload(
                    local.engine, local.s3, BUCKET, STAGE, file_name="new.jpg", data=original
                ).photo_id
            )
            time.sleep(UPLOAD_INTERVAL)

    def moved() -> int:
        with local.engine.connect() as connection:
            return int(
                connection.scalar(
                    select(func.count()).where(Photo.variant_version == 2, Photo.entity_version == 3)
                )
                or 0
            )

    def finished() -> bool:
        if uploader.is_alive() or len(uploaded) < UPLOADS:
            return False
        with local.engine.connect() as connection:
            ready = connection.scalar(
                select(func.count()).where(Photo.id.in_(uploaded), Photo.processing_state == "ready")
            )
        return ready == UPLOADS and (batch != HEAVY_BATCH or moved() >= BACKFILL_PHOTOS)

    before, started = moved(), time.monotonic()
    uploader = threading.Thread(target=upload_all)
    uploader.start()
    assert poller.run_until(finished, deadline_seconds=900), "the phase did not finish in 15 minutes"
    uploader.join()
    seconds = time.monotonic() - started
    with local.engine.connect() as connection:
        latencies = sorted(
            float(s)
            for s in connection.scalars(
                select(func.extract("epoch", Photo.published_at - Photo.created_at)).where(
                    Photo.id.in_(uploaded)
                )
            )
        )
    backfill.stop(local.engine)  # what this phase did not send waits for the next one's marking
    return {
        "seconds": seconds,
        "p50": statistics.median(latencies),
        "p95": latencies[int(0.95 * (len(latencies) - 1))],
        "moved": moved() - before,
        "backfill_sent": sum(s["backfillSent"] for s in sweeps),
    }


def main() -> None:
    original = bytes(samples.photograph("Garden.jpg").thumbnail_image(320).jpegsave_buffer(Q=85))
    with (
        stack.database(stack.ROOT / ".local" / "postgres", name="photo_publish_bench_backfill") as url,
        moto_process(),
        stack.aws_endpoint(),
    ):
        local = start_stack(url)
        stack.drop_test_events(local.sqs, local.queues.url)
        for name, value in {
            "VARIANT_VERSION": "2",
            "THUMB_SIZE": "320",
            "BACKFILL_SPREAD_SECONDS": str(int(SWEEP_PERIOD)),
            "POWERTOOLS_LOG_LEVEL": "WARNING",
        }.items():
            os.environ[name] = value
        for handler in logging.getLogger(os.environ["POWERTOOLS_SERVICE_NAME"]).handlers:
            if isinstance(handler, logging.StreamHandler):
                handler.setStream(io.StringIO())
        print(f"seeding {BACKFILL_PHOTOS} photos published at version 1 ...", flush=True)
        seed(local, BACKFILL_PHOTOS, original)
        phases = {name: phase(local, original, batch=batch) for name, batch in PHASES.items()}
        local.engine.dispose()

    baseline = phases["baseline"]
    ratios = {name: (p["p50"] / baseline["p50"], p["p95"] / baseline["p95"]) for name, p in phases.items()}
    heavy = phases["heavy"]
    throughput = heavy["moved"] / heavy["seconds"]
    print(
        f"upload to published: {UPLOADS} uploads one every {UPLOAD_INTERVAL} s, one Lambda (2 records at a time), "
        f"the sweep every {SWEEP_PERIOD:.0f} s spreading its batch over its period; {BACKFILL_PHOTOS} photos marked"
    )
    labels = {
        "baseline": "no backfill",
        "default": f"backfill at the default rate ({DEFAULT_BATCH} a run)",
        "heavy": f"backfill at {HEAVY_BATCH} a run",
    }
    for name, label in labels.items():
        p, (r50, r95) = phases[name], ratios[name]
        print(
            f"  {label:42} p50 {p['p50']:.3f} s  p95 {p['p95']:.3f} s  (x{r50:.2f}, x{r95:.2f}); moved {p['moved']}"
        )
    print(f"  backfill throughput at {HEAVY_BATCH} a run: {throughput:.1f} photos/s")
    ratio = ratios["default"][0]
    print("targets (verdicts, not assertions)")
    print(
        f"  upload latency during a backfill at the default rate <= x1.5 (p50): x{ratio:.2f}  {'MET' if ratio <= 1.5 else 'MISSED'}"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    summary = {"phases": phases, "ratios": ratios, "throughput": throughput, "photos": BACKFILL_PHOTOS}
    (RESULTS / "backfill.json").write_text(json.dumps(summary, indent=1))
    print(f"written {(RESULTS / 'backfill.json').relative_to(stack.ROOT)}")


if __name__ == "__main__":
    main()
