"""A worker process for the crash and memory tests: the real process handler, fed as devkit/poller.py
feeds it.

    python -m tests.crashworker

It polls the queue named by PROCESS_QUEUE_URL (every setting from the environment, as in Lambda)
with the poller's Lambda-shaped batches and a Lambda context of WORKER_FUNCTION_TIMEOUT seconds,
until it is terminated, or dies. With WORKER_LIFT_HEIF_GUARD=1 it renders without heic.check_names,
the header check that keeps libheif from reading a HEIF whose item names are not UTF-8: a file the
fuzzer found then crashes the interpreter inside pi-heif, as a crash nobody has found yet would.
The injection is the test's; the product code is unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from devkit import handlers
from devkit.poller import Poller
from photo_publish import bootstrap
from photo_publish.image import heic

ROOT = Path(__file__).resolve().parent.parent


def start(log: IO[bytes], **environment: str) -> subprocess.Popen[bytes]:
    """A worker in its own process, with this process' environment and `environment`, its output to
    `log`."""
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'functions' / 'process'}:{ROOT / 'shared'}:{ROOT}",
        **environment,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "tests.crashworker"], cwd=ROOT, env=env, stdout=log, stderr=log
    )


def main() -> None:
    if os.environ.get("WORKER_LIFT_HEIF_GUARD") == "1":
        heic.check_names = lambda data: None
    process = handlers.load("process")
    settings = bootstrap.settings()
    sqs = bootstrap.sqs_client()
    arn = sqs.get_queue_attributes(QueueUrl=settings.process_queue_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    poller = Poller(
        sqs,
        settings.process_queue_url,
        arn,
        process.lambda_handler,
        wait_seconds=1,
        timeout_seconds=float(os.environ["WORKER_FUNCTION_TIMEOUT"]),
    )
    print(json.dumps({"worker": os.getpid(), "ready": time.time()}), flush=True)
    while True:
        if poller.poll_once():
            print(json.dumps({"worker": os.getpid(), "received": poller.received}), flush=True)


if __name__ == "__main__":
    main()
