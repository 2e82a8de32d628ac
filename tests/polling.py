"""Driving the queue in a test: the real process handler fed by devkit's Poller until a condition holds."""

from __future__ import annotations

import time
from collections.abc import Callable

from devkit import handlers
from devkit.poller import Handler, Poller
from tests.conftest import Infra

process = handlers.load("process")


def poll_until(
    infra: Infra,
    done: Callable[[], bool],
    *,
    handler: Handler = process.lambda_handler,
    queue_url: str | None = None,
    queue_arn: str | None = None,
    timeout: float = 30,
) -> Poller:
    poller = Poller(
        infra.sqs,
        queue_url or infra.queues.url,
        queue_arn or infra.queues.arn,
        handler,
        wait_seconds=0,
    )
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out waiting for the queue"
        if not poller.poll_once():
            time.sleep(0.05)
    return poller
