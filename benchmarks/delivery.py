"""Issue #7, part 4: the whole warm delivery of a batch, against the original worker's core alone.

A batch is the corpus' five photographs (benchmarks/corpus.py, 8 to 24 MP JPEGs), as many records
as the template's BatchSize (5). Three peers, run as A B C A B C ... for ROUNDS rounds after one
warm-up batch of the first:
- delivery: the process handler (functions/process/app.py), warm, in this process, on a real SQS
  event: each photo registered (rows as the upload API writes them) and uploaded to S3, S3's
  notifications received from SQS and turned into the event Lambda would build. Timed: the
  handler's call, which streams each original from S3, renders, writes both variants to S3, claims
  and commits against PostgreSQL, RECORD_CONCURRENCY (2) records at a time. Every record must
  publish, or the benchmark stops.
- render: the same photos' bytes rendered in this process by photo_publish.pipeline.render, two
  at a time (a thread pool of 2), with the handler's options: the delivery's rendering alone.
- sharp: the original worker's core, sharp on Node.js rendering the same photos with two
  pipelines each, two jobs at a time (BullMQ's concurrency 2), one warm process per round
  (benchmarks/sharp_queue.mjs; it times its second batch, the photos already in memory).
Reported: medians of batch seconds and photos per second, delivery / sharp (target: at most 1.0),
the share of the delivery outside rendering, 1 - render / delivery (target: under 15%), and from
each record's log line the median milliseconds of its steps (claim, render with the S3 read it
streams, store, commit).

S3 and SQS are moto's server, in a process of its own on loopback (so that its Python does not
share this process' interpreter lock), PostgreSQL the embedded one (or DATABASE_URL). On this
2-core machine both servers take CPU from the render that AWS would not: moto's CPU seconds per
batch are reported beside the figures.
Results go to .local/bench-results/delivery.json. BENCH_ROUNDS sets the rounds (default 5).
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Any

from benchmarks.corpus import photos
from devkit import handlers, stack, uploads
from devkit.demo import BUCKET, STAGE, Stack, start_stack
from devkit.poller import LambdaContext, sqs_event
from photo_publish.pipeline import RenderOptions, render

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
CONCURRENCY = 2
RESULTS = stack.ROOT / ".local" / "bench-results"
SHARP = stack.ROOT / ".local" / "bench-node" / "node_modules" / "sharp"
SHARP_SCRIPT = Path(__file__).with_name("sharp_queue.mjs")
TICKS = os.sysconf("SC_CLK_TCK")


@contextmanager
def moto_process() -> Iterator[int]:
    """moto's server in its own process on a free loopback port; yields its pid."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("moto's server did not start") from None
                time.sleep(0.1)
        os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{port}"
        yield server.pid
    finally:
        os.environ.pop("AWS_ENDPOINT_URL", None)
        server.terminate()
        server.wait()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


class Steps(logging.Handler):
    """Collects the steps_ms of each published record's "photo processed" line."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[dict[str, int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "photo processed" and getattr(record, "steps_ms", None):
            self.records.append(record.steps_ms)  # type: ignore[attr-defined]


def receive(local: Stack, count: int) -> list[dict[str, Any]]:
    """The S3 notifications of `count` uploads, as Lambda's poller would receive them."""
    messages: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    while len(messages) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(messages)} of {count} notifications arrived")
        messages += local.sqs.receive_message(
            QueueUrl=local.queues.url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        ).get("Messages", [])
    return messages


def deliver(local: Stack, process: Any, corpus: list[Path]) -> float:
    album_id = uuid.uuid4()
    for path in corpus:
        uploads.upload(
            local.engine,
            local.s3,
            BUCKET,
            STAGE,
            file_name=path.name,
            data=path.read_bytes(),
            album_id=album_id,
        )
    messages = receive(local, len(corpus))
    event = sqs_event(messages, local.queues.arn)
    started = time.perf_counter()
    with redirect_stdout(io.StringIO()):  # the metrics' EMF lines
        response = process.lambda_handler(event, LambdaContext(120))
    seconds = time.perf_counter() - started
    if response != {"batchItemFailures": []}:
        raise RuntimeError(f"the batch did not publish: {response}")
    for message in messages:  # what the event source mapping does with a batch that succeeded
        local.sqs.delete_message(QueueUrl=local.queues.url, ReceiptHandle=message["ReceiptHandle"])
    return seconds


def render_alone(datas: list[bytes], options: RenderOptions) -> float:
    started = time.perf_counter()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(lambda data: render(io.BytesIO(data), options), datas))
    return time.perf_counter() - started


def sharp(corpus: list[Path]) -> float:
    out = subprocess.run(
        ["node", str(SHARP_SCRIPT), str(CONCURRENCY), *map(str, corpus)],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SHARP_PATH": str(SHARP)},
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])


def sharp_skipped() -> str | None:
    if shutil.which("node") is None:
        return "node is not on PATH"
    if not SHARP.exists():
        return (
            f"sharp is not installed (npm install --prefix {SHARP.parents[1].relative_to(stack.ROOT)} sharp)"
        )
    return None


def main() -> None:
    corpus = photos()
    datas = [path.read_bytes() for path in corpus]
    skipped = sharp_skipped()
    if skipped:
        print(f"SKIPPED peer sharp: {skipped}")
    runs: dict[str, list[float]] = {"delivery": [], "render": [], "sharp": [], "moto_cpu": []}
    steps = Steps()
    with (
        stack.database(stack.ROOT / ".local" / "postgres", name="photo_publish_bench_delivery") as url,
        moto_process() as moto_pid,
        stack.aws_endpoint(),
    ):
        local = start_stack(url)
        stack.drop_test_events(local.sqs, local.queues.url)
        # After start_stack: the functions' Logger and Metrics read its environment when imported.
        process = handlers.load("process")
        from photo_publish.service import render_options

        function_logger = logging.getLogger(os.environ["POWERTOOLS_SERVICE_NAME"])
        for handler in function_logger.handlers:
            if isinstance(handler, logging.StreamHandler):
                handler.setStream(io.StringIO())
        function_logger.addHandler(steps)
        options = render_options(local.settings)
        deliver(local, process, corpus)  # warm: clients, connections, libvips
        render_alone(datas, options)
        steps.records.clear()
        for _ in range(ROUNDS):
            moto_before = cpu_seconds(moto_pid)
            runs["delivery"].append(deliver(local, process, corpus))
            runs["moto_cpu"].append(cpu_seconds(moto_pid) - moto_before)
            runs["render"].append(render_alone(datas, options))
            if not skipped:
                runs["sharp"].append(sharp(corpus))
        local.engine.dispose()

    medians = {name: statistics.median(values) for name, values in runs.items() if values}
    count = len(corpus)
    print(
        f"whole delivery of a batch of {count} photos (8-24 MP JPEGs), {CONCURRENCY} at a time, "
        f"median of {ROUNDS} interleaved rounds, {os.cpu_count()} CPUs"
    )
    labels = {
        "delivery": "photo-publish handler, warm (S3 get, render, S3 puts, claim, commit)",
        "render": "photo-publish render alone (same photos, from memory)",
        "sharp": "original worker's core: sharp, two pipelines per photo",
    }
    for name, label in labels.items():
        if name in medians:
            print(f"  {label:72} {medians[name]:6.2f} s  {count / medians[name]:5.2f} photos/s")
    by_step = {
        step: statistics.median(r[step] for r in steps.records)
        for step in ("claim", "render", "store", "commit")
    }
    print(
        "  per record, median ms: "
        + ", ".join(f"{step} {ms:.0f}" for step, ms in by_step.items())
        + f"; moto's server used {medians['moto_cpu']:.2f} CPU s per batch"
    )
    outside = 1 - medians["render"] / medians["delivery"]
    print("targets (verdicts, not assertions)")
    if "sharp" in medians:
        ratio = medians["delivery"] / medians["sharp"]
        print(f"  delivery <= x1.00 sharp's render alone: x{ratio:.2f}  {'MET' if ratio <= 1 else 'MISSED'}")
    else:
        print(f"  delivery <= x1.00 sharp's render alone: NOT MEASURED ({skipped})")
    print(f"  time outside rendering < 15%: {outside:.0%}  {'MET' if outside < 0.15 else 'MISSED'}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    summary = {"photos": [p.name for p in corpus], "rounds": ROUNDS, "runs": runs, "medians": medians}
    summary |= {"steps_ms": by_step, "outside_rendering": outside, "skipped": skipped}
    (RESULTS / "delivery.json").write_text(json.dumps(summary, indent=1))
    print(f"written {(RESULTS / 'delivery.json').relative_to(stack.ROOT)}")


if __name__ == "__main__":
    main()
