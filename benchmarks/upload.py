"""Issue 22 (performance): upload-to-visible and registration, with AWS's latencies.

An app's view of one photo, BENCH_UPLOADS times (default 50), one after the other: the upload
function registers it (POST /albums/{albumId}/photos, its handler called with the HTTP API's event),
the "browser" POSTs the file to S3 with the returned fields, then polls GET /photos/{photoId}
every 50 ms, as the gallery does, until the photo is published, and loads its browse image from the
variant's key (a GET signed for moto's private bucket). Upload-to-visible runs from the POST's answer to the browse image's last byte: S3's
notification through SQS, the process function (warm, polled by a stand-in of Lambda's event source
mapping in this process), the poll, the image. Everything goes through devkit.faultproxy's latency
proxies (`--latency aws`: S3 GetObject's first byte 30 ms and 100 MB/s, PutObject 50 ms, SQS 10 ms,
1 ms a database round trip), as in `benchmarks.delivery`.

The peer, measured in the same run on the same photos: the render alone (photo_publish's pipeline,
in this process, with the function's options), the part of the wait no network can remove. The
photos: the corpus' 8 to 24 MP JPEGs and its 1 to 2 MP ones, taken in turn.

Registration's own latency: the handler's call for every upload plus BENCH_REGISTRATIONS (200)
registrations alone, against the database's round trip measured alone (SELECT 1 through the same
proxy) times the round trips a registration makes (counted from the engine's own events): the
target is p99 under 50 ms beside those round trips.

Results go to .local/bench-results/upload.json.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from sqlalchemy import event, text

from benchmarks.corpus import photos, small_photos
from benchmarks.delivery import RESULTS, moto_process
from devkit import gallery, handlers, stack
from devkit.demo import BUCKET, start_stack
from devkit.faultproxy import database_through, database_upstream, latency_proxy
from devkit.poller import LambdaContext, Poller
from photo_publish.image.pipeline import render

UPLOADS = int(os.environ.get("BENCH_UPLOADS", "50"))
REGISTRATIONS = int(os.environ.get("BENCH_REGISTRATIONS", "200"))
POLL_EVERY = 0.05
TARGET_P99_MS = 50.0
TYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg"}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def http_api(method: str, path: str, route: str, body: Any = None, **parameters: str) -> dict[str, Any]:
    """The request as API Gateway's HTTP API hands it to the function (the gallery's stand-in)."""
    return gallery.json_request(
        method, route, path, parameters, b"" if body is None else json.dumps(body).encode()
    )


@dataclass
class App:
    """The upload function's handler, warm, and a browser's HTTP session."""

    function: Any
    browser: requests.Session
    s3: Any  # to sign the image's GET: moto's bucket is private, as a CDN's origin is

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        with redirect_stdout(io.StringIO()):  # the metrics' EMF lines
            answer: dict[str, Any] = self.function.lambda_handler(request, LambdaContext(30))
        return answer

    def register(self, album_id: str, path: Path, size: int) -> tuple[dict[str, Any], float]:
        request = http_api(
            "POST",
            f"/albums/{album_id}/photos",
            "/albums/{albumId}/photos",
            {"fileName": path.name, "contentType": TYPES[path.suffix.lower()], "size": size},
            albumId=album_id,
        )
        started = time.perf_counter()
        answer = self.call(request)
        seconds = time.perf_counter() - started
        if answer["statusCode"] != 201:
            raise RuntimeError(f"registration refused: {answer}")
        return json.loads(answer["body"]), seconds

    def status(self, photo_id: str) -> dict[str, Any]:
        answer = self.call(http_api("GET", f"/photos/{photo_id}", "/photos/{photoId}", photoId=photo_id))
        body: dict[str, Any] = json.loads(answer["body"])
        return body

    def upload_to_visible(self, album_id: str, path: Path) -> tuple[float, float]:
        """Registration's seconds, and from the POST's answer to the browse image loaded."""
        data = path.read_bytes()
        registered, registration = self.register(album_id, path, len(data))
        form = registered["upload"]
        posted = self.browser.post(
            form["url"], data=form["fields"], files={"file": (path.name, data)}, timeout=60
        )
        posted.raise_for_status()
        answered = time.perf_counter()
        deadline = answered + 60
        while True:
            status = self.status(registered["photoId"])
            if status["state"] == "published":
                break
            if status["state"] == "failed" or time.perf_counter() > deadline:
                raise RuntimeError(f"{path.name} did not publish: {status}")
            time.sleep(POLL_EVERY)
        key = status["variants"]["browse"]["key"]
        url = self.s3.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": key})
        image = self.browser.get(url, timeout=30)
        image.raise_for_status()
        return registration, time.perf_counter() - answered


@contextmanager
def running() -> Iterator[tuple[App, Any]]:
    """PostgreSQL, moto's server, the latency proxies, the upload and process functions warm, and
    the event source mapping's stand-in polling the queue in a thread. Yields the app and the
    functions' engine (for the round trips)."""
    with ExitStack() as exits:
        url = exits.enter_context(
            stack.database(stack.ROOT / ".local" / "postgres", name="photo_publish_bench_upload")
        )
        exits.enter_context(moto_process())
        exits.enter_context(stack.aws_endpoint())
        local = start_stack(url)
        stack.drop_test_events(local.sqs, local.queues.url)
        http_proxy = exits.enter_context(latency_proxy(os.environ["AWS_ENDPOINT_URL"]))
        database_proxy = exits.enter_context(latency_proxy(database_upstream(url)))
        os.environ["AWS_ENDPOINT_URL"] = http_proxy.url
        os.environ["DATABASE_URL"] = database_through(url, database_proxy.url)
        from photo_publish import bootstrap

        bootstrap.reset()
        function, process = handlers.load("upload"), handlers.load("process")
        s3, sqs = stack.clients()  # through the proxy now: SQS's 10 ms, as the poller sees it
        poller = Poller(sqs, local.queues.url, local.queues.arn, process.lambda_handler, batch_size=10)
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                with redirect_stdout(io.StringIO()):
                    poller.poll_once()

        worker = threading.Thread(target=poll, daemon=True)
        worker.start()
        try:
            yield App(function, requests.Session(), s3), bootstrap.engine()
        finally:
            stop.set()
            worker.join(10)
            bootstrap.reset()
            local.engine.dispose()


def round_trips(engine: Any, app: App) -> tuple[int, list[float]]:
    """The round trips of one registration (statements, and the transaction's BEGIN and COMMIT), and
    a database round trip's seconds, measured alone."""
    statements = 0

    def count(*_: Any) -> None:
        nonlocal statements
        statements += 1

    event.listen(engine, "before_cursor_execute", count)
    try:
        app.register(str(uuid.uuid4()), photos()[0], 1000)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    alone = []
    with engine.connect() as connection:
        for _ in range(100):
            started = time.perf_counter()
            connection.execute(text("SELECT 1"))
            alone.append(time.perf_counter() - started)
    return statements + 2, alone


def main() -> None:
    corpus = [p for pair in zip(photos(), small_photos(), strict=False) for p in pair]
    with running() as (app, engine):
        from photo_publish import bootstrap
        from photo_publish.publish.service import render_options

        options = render_options(bootstrap.settings())
        album_id = str(uuid.uuid4())
        app.upload_to_visible(album_id, corpus[0])  # warm: the first S3 connections, the JIT of libvips
        registrations, visible, renders = [], [], []
        for index in range(UPLOADS):
            path = corpus[index % len(corpus)]
            registration, seconds = app.upload_to_visible(album_id, path)
            registrations.append(registration)
            visible.append(seconds)
            started = time.perf_counter()
            render(io.BytesIO(path.read_bytes()), options)
            renders.append(time.perf_counter() - started)
            if (index + 1) % 10 == 0:
                print(f"  {index + 1} of {UPLOADS} uploads visible", file=sys.stderr, flush=True)
        for _ in range(REGISTRATIONS):
            registrations.append(app.register(str(uuid.uuid4()), corpus[0], 1000)[1])
        trips, alone = round_trips(engine, app)
    summary = report(visible, renders, registrations, trips, alone)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "upload.json").write_text(json.dumps(summary, indent=1))
    print(f"written {(RESULTS / 'upload.json').relative_to(stack.ROOT)}")


def report(
    visible: list[float], renders: list[float], registrations: list[float], trips: int, alone: list[float]
) -> dict[str, Any]:
    ms = {
        "visible_p50": 1000 * percentile(visible, 0.5),
        "visible_p95": 1000 * percentile(visible, 0.95),
        "render_p50": 1000 * percentile(renders, 0.5),
        "render_p95": 1000 * percentile(renders, 0.95),
        "registration_p50": 1000 * percentile(registrations, 0.5),
        "registration_p99": 1000 * percentile(registrations, 0.99),
        "round_trip_p50": 1000 * statistics.median(alone),
    }
    beside = ms["registration_p99"] - trips * ms["round_trip_p50"]
    print(f"upload-to-visible over {len(visible)} photos (AWS-like latencies):")
    print(
        f"  p50 {ms['visible_p50']:.0f} ms, p95 {ms['visible_p95']:.0f} ms;"
        f" the render alone p50 {ms['render_p50']:.0f} ms, p95 {ms['render_p95']:.0f} ms"
    )
    print(
        f"  x{ms['visible_p50'] / ms['render_p50']:.2f} the render alone at p50,"
        f" x{ms['visible_p95'] / ms['render_p95']:.2f} at p95"
    )
    print(f"registration over {len(registrations)} calls:")
    print(
        f"  p50 {ms['registration_p50']:.1f} ms, p99 {ms['registration_p99']:.1f} ms;"
        f" {trips} database round trips of {ms['round_trip_p50']:.1f} ms (p50, measured alone)"
    )
    verdict = "met" if beside < TARGET_P99_MS else "NOT met"
    print(f"  p99 beside those round trips {beside:.1f} ms (target < {TARGET_P99_MS:.0f} ms): {verdict}")
    return {"ms": ms, "round_trips": trips, "uploads": len(visible), "registrations": len(registrations)}


if __name__ == "__main__":
    main()
