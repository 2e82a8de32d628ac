"""`make demo`: real photos from an S3 upload to published variants, rows and outbox events, and
the events a subscriber of the bus receives.

Everything runs on this machine: an embedded PostgreSQL (or DATABASE_URL), moto's S3 + SQS +
EventBridge server on loopback (or AWS_ENDPOINT_URL), the bucket's notification to the queue, the
local poller feeding the real process handler, the sweep and the relay on their schedules, and a
subscriber's rule on the bus to a queue the demo reads. DEMO_PHOTOS=<folder> runs it on your own
photos.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from sqlalchemy import Engine, func, select

from devkit import handlers, report, samples, stack, uploads
from devkit.poller import LambdaContext, Poller
from photo_publish.adapters.database import create_database_engine
from photo_publish.adapters.models import OutboxEvent, Photo
from photo_publish.settings import Settings

ROOT = stack.ROOT
OUTPUT = Path(os.environ.get("DEMO_OUTPUT", ROOT / "demo-output"))
BUCKET = "photo-publish-demo"
STAGE = "dev"
SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".tif", ".tiff", ".gif", ".heic", ".heif", ".avif"}


def demo_photos() -> Iterator[tuple[str, bytes]]:
    """DEMO_PHOTOS' files, or the project's photographs and a few hard cases made from them."""
    folder = os.environ.get("DEMO_PHOTOS")
    if folder:
        for path in sorted(Path(folder).iterdir()):
            if path.suffix.lower() in SUFFIXES:
                yield path.name, path.read_bytes()
        return
    for path in samples.photographs():
        yield path.name, path.read_bytes()
    storm = samples.photograph("Storm.jpg")
    yield "Storm, stored sideways (EXIF 6).jpg", samples.oriented_jpeg(storm, 6)
    yield "Lady bird in Display P3.jpg", samples.profiled_jpeg(samples.photograph("LadyBird.jpg"), "p3")
    yield (
        "Garden, printed (CMYK).jpg",
        samples.cmyk_jpeg(samples.photograph("Garden.jpg").thumbnail_image(1600)),
    )
    yield (
        "Yellow flower, half transparent.png",
        samples.alpha_png(samples.photograph("YellowFlower.jpg").thumbnail_image(1200)),
    )
    yield "Aqua, animated.gif", samples.animated_gif(samples.photograph("Aqua.jpg"))
    yield "IMG_0001.HEIC", samples.heic(samples.photograph("Wood.jpg"), 6, profile="p3")
    yield "Broken upload.jpg", samples.truncated((samples.IMAGES / "Wood.jpg").read_bytes())


# Powertools reads these as its Logger and Metrics are made, at the first import of the project's
# observability module (which the migrations import too): set before anything runs, as Lambda does.
POWERTOOLS = {
    "POWERTOOLS_SERVICE_NAME": "photo-publish",
    "POWERTOOLS_METRICS_NAMESPACE": "PhotoPublishDemo",
    "POWERTOOLS_LOG_LEVEL": "INFO",
}
for _name, _value in POWERTOOLS.items():
    os.environ.setdefault(_name, _value)


def function_environment(settings: Settings) -> None:
    """What the template sets on the functions, set here for the handler running in-process."""
    os.environ.update(settings.environment())


def counts(engine: Engine) -> collections.Counter[str]:
    with engine.connect() as connection:
        rows = connection.execute(
            select(Photo.processing_state, func.count()).group_by(Photo.processing_state)
        )
        return collections.Counter({state: n for state, n in rows})


def outcomes(log_path: Path) -> tuple[collections.Counter[str], int]:
    """Deliveries by outcome, and the events handed off to the bus right after their commits, read
    from the function's own structured logs (as Logs Insights would)."""
    tally: collections.Counter[str] = collections.Counter()
    handed_off = 0
    for line in log_path.read_text().splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            if entry.get("message") == "photo processed":
                tally[entry["outcome"]] += 1
                handed_off += (entry.get("handoff") or {}).get("sent", 0)
    return tally, handed_off


def bus_events(
    received: list[dict[str, Any]], engine: Engine, handed_off: int, relays: list[dict[str, Any]]
) -> dict[str, Any]:
    """What the subscriber received, against the outbox: every row once, by the hand-off or the relay."""
    with engine.connect() as connection:
        rows = set(map(str, connection.scalars(select(OutboxEvent.id))))
    ids = collections.Counter(e["detail"]["eventId"] for e in received)
    return {
        "received": len(received),
        "byType": dict(collections.Counter(e["detail-type"] for e in received)),
        "everyOutboxRowOnce": set(ids) == rows and all(n == 1 for n in ids.values()),
        "handedOff": handed_off,
        "relayed": sum(r["published"] for r in relays),
        "relayRuns": len(relays),
    }


@dataclass
class Stack:
    settings: Settings
    engine: Engine
    s3: Any
    sqs: Any
    queues: stack.Queues
    subscriber: stack.Subscriber


def start_stack(url: str, **settings: Any) -> Stack:
    """Migrations, the queue pair and the bucket's notification, and the functions' environment
    (`settings`: more of the functions' settings, e.g. variant_base_url)."""
    stack.migrate(url)
    s3, sqs = stack.clients()
    queues = stack.create_queues(
        sqs, f"photo-publish-demo-{uuid.uuid4().hex[:6]}", max_receive_count=5, visibility_timeout=60
    )
    stack.create_bucket(s3, BUCKET, queue_arn=queues.arn, originals_prefix=f"{STAGE}/originals/")
    # The bus, as the template makes it, and a consuming service's rule to its own queue.
    subscriber = stack.subscribe(stack.events_client(), sqs, f"photo-publish-demo-{uuid.uuid4().hex[:6]}")
    configured = Settings(
        database_url=url,
        photo_bucket=BUCKET,
        stage=STAGE,
        process_queue_url=queues.url,
        dead_letter_queue_url=queues.dead_letter_url,
        event_bus_name=subscriber.bus_name,
        **settings,
    )
    function_environment(configured)
    return Stack(configured, create_database_engine(configured), s3, sqs, queues, subscriber)


@dataclass
class Delivered:
    render_seconds: float
    sweeps: int
    # The relay's runs (its summaries): what the process function's hand-off left behind.
    relays: list[dict[str, Any]]


def deliver(local: Stack, count: int, log: TextIO, started: float) -> Delivered:
    """The local event source and the sweep's and relay's schedules, until every photo has settled."""
    process, sweep, relay = handlers.load("process"), handlers.load("sweep"), handlers.load("relay")
    # The function logs JSON to stdout, as in Lambda; here it goes to a file beside the report.
    for handler in logging.getLogger(os.environ["POWERTOOLS_SERVICE_NAME"]).handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(log)
    poller = Poller(local.sqs, local.queues.url, local.queues.arn, process.lambda_handler, wait_seconds=1)
    sweeps: list[dict[str, Any]] = []
    # The sweep on its schedule (rate(1 minute) in the template), as EventBridge would run it.
    poller.schedule.append(
        (60.0, lambda: sweeps.append(sweep.lambda_handler({"source": "aws.events"}, LambdaContext(60))))
    )
    # The relay on its own: it sends what the hand-offs after the commits could not.
    relays: list[dict[str, Any]] = []
    poller.schedule.append(
        (60.0, lambda: relays.append(relay.lambda_handler({"source": "aws.events"}, LambdaContext(60))))
    )

    def progress() -> None:
        state = counts(local.engine)
        print(
            f"  [{time.perf_counter() - started:5.1f}s] published {state['ready']}/{count}"
            f", failed {state['processing_failed']}",
            file=sys.__stdout__,
            flush=True,
        )

    def settled() -> bool:
        state = counts(local.engine)
        return state["ready"] + state["processing_failed"] == count

    render_started = time.perf_counter()
    with redirect_stdout(log):
        poller.run_until(settled, deadline_seconds=600, on_batch=progress)
        render_seconds = time.perf_counter() - render_started
        # A second delivery of every photo, as S3 or the sweep may send: each must answer
        # `already` (or stay failed) without a new event.
        with local.engine.connect() as connection:
            for photo_id in connection.scalars(select(Photo.id)):
                local.sqs.send_message(
                    QueueUrl=local.queues.url, MessageBody=json.dumps({"photoId": str(photo_id)})
                )
        poller.run_until(lambda: False, deadline_seconds=3)
        # One more relay run, as the next minute's would: nothing may be left behind.
        relays.append(relay.lambda_handler({"source": "aws.events"}, LambdaContext(60)))
    return Delivered(render_seconds, len(sweeps), relays)


def run() -> dict[str, Any]:
    OUTPUT.mkdir(exist_ok=True)
    log_path = OUTPUT / "functions.log"
    photos = list(demo_photos())
    print(f"photo-publish demo: {len(photos)} photos", flush=True)
    with stack.database(ROOT / ".local" / "postgres", name="photo_publish_demo") as url, stack.aws_endpoint():
        started = time.perf_counter()
        local = start_stack(url)
        print(
            f"  stack ready in {time.perf_counter() - started:.1f}s (PostgreSQL, S3, SQS, EventBridge)",
            flush=True,
        )

        album_id = uuid.uuid4()
        names = {}
        for file_name, data in photos:
            shot = uploads.upload(
                local.engine, local.s3, BUCKET, STAGE, file_name=file_name, data=data, album_id=album_id
            )
            names[shot.photo_id] = file_name
        print(f"  uploaded {len(photos)} originals to s3://{BUCKET}/{STAGE}/originals/", flush=True)

        with log_path.open("w") as log:
            delivered = deliver(local, len(photos), log, started)
        wall = time.perf_counter() - started

        with local.engine.connect() as connection:
            events = connection.scalar(select(func.count()).select_from(OutboxEvent)) or 0
        # What a consuming service got: the bus's events, through its rule, in its queue.
        received = stack.received(local.sqs, local.subscriber.queue_url)
        (OUTPUT / "events.json").write_text(json.dumps(received, indent=2) + "\n")
        page = report.write(OUTPUT, local.engine, local.s3, BUCKET, names, received=received)
        tally, handed_off = outcomes(log_path)
        summary = {
            "photos": len(photos),
            "published": counts(local.engine)["ready"],
            "already": tally["already"],
            "failed": report.failures(local.engine),
            "outboxEvents": events,
            "busEvents": bus_events(received, local.engine, handed_off, delivered.relays),
            "deliveries": dict(tally),
            "sweeps": delivered.sweeps,
            "wallSeconds": round(wall, 2),
            "renderSeconds": round(delivered.render_seconds, 2),
            "photosPerSecond": round(len(photos) / delivered.render_seconds, 2),
        }
        (OUTPUT / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        local.engine.dispose()
    bus = summary["busEvents"]
    print(
        f"  done in {wall:.1f}s: {summary['published']} published, failed {summary['failed']}, "
        f"{summary['already']} duplicate deliveries answered 'already', {events} outbox events"
    )
    print(
        f"  the bus's subscriber received {bus['received']} events {bus['byType']} "
        f"({bus['handedOff']} handed off after their commits, {bus['relayed']} by the relay)"
    )
    print(
        f"  report:  {page}\n  summary: {OUTPUT / 'summary.json'}\n  events:  {OUTPUT / 'events.json'}"
        f"\n  logs:    {log_path}"
    )
    return summary


if __name__ == "__main__":
    run()
