"""What a queue delivery does with the service's results: acknowledge, or return after a delay."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit

from photo_publish.budget import Remaining, forever
from photo_publish.events import MalformedMessage, PhotoRequest, from_s3_records, from_sqs_body
from photo_publish.observability import logger
from photo_publish.publish.outcomes import Outcome, Result
from photo_publish.publish.service import JobQueue, PhotoService
from photo_publish.settings import Settings


class RetryLater(Exception):
    """Raised for a record the queue must deliver again (its visibility already set)."""

    def __init__(self, results: Sequence[Result]) -> None:
        super().__init__(", ".join(f"{r.photo_id}: {r.code or r.outcome}" for r in results))


class ConcurrentBatchProcessor:
    """An SQS batch's partial response, working on up to `workers` records of the batch at once.

    The contract of Powertools' `process_partial_response` with an SQS `BatchProcessor`: every
    record goes to the handler; the message id of each one that raised is in `batchItemFailures`;
    a batch whose every record failed is still a partial response, not a function error (each
    record's visibility is already set, and errors alarm on crashes, not bad photos). Not
    Powertools' own: its batch package cannot be imported narrowly (any of its modules runs the
    package's `__init__`, which imports asyncio and every event data class, about 45 ms of a
    python3.12 cold start before the first record, issue 17), and this is all of it we use.

    libvips releases the GIL and JPEG decoding is single-threaded, so one photo never fills two
    cores. Every guarantee of SPEC 4 and 5 holds per record: each has its own claim, fencing token,
    transaction and visibility, and the records' log keys are thread-local.
    """

    def __init__(self, workers: int) -> None:
        self._workers = workers

    def process(
        self, records: Sequence[dict[str, Any]], handler: Callable[[dict[str, Any]], object]
    ) -> dict[str, list[dict[str, str]]]:
        """Each record through `handler`; the partial batch response for those that raised."""
        if self._workers <= 1 or len(records) <= 1:
            failed = [self._failed(handler, record) for record in records]
        else:
            with ThreadPoolExecutor(min(self._workers, len(records))) as pool:
                failed = list(pool.map(lambda record: self._failed(handler, record), records))
        return {"batchItemFailures": [{"itemIdentifier": message_id} for message_id in failed if message_id]}

    @staticmethod
    def _failed(handler: Callable[[dict[str, Any]], object], record: dict[str, Any]) -> str | None:
        """The record's message id if the handler raised, else None."""
        try:
            handler(record)
        except RetryLater:
            # Its visibility is set and its results are logged: the queue brings it back.
            return str(record["messageId"])
        except Exception:
            # What Powertools logs when given a logger: the record fails alone, with its traceback.
            logger.warning(
                "Record processing exception; skipping this record",
                message_id=record.get("messageId"),
                exc_info=True,
            )
            return str(record["messageId"])
        return None


class Delivery:
    def __init__(self, service: PhotoService, queue: JobQueue, settings: Settings, metrics: Metrics) -> None:
        self._service = service
        self._queue = queue
        self._settings = settings
        self._metrics = metrics
        # Powertools' metric set is a plain dict: records finishing together must not interleave.
        self._metrics_lock = threading.Lock()

    def ensure_recipe(self) -> None:
        self._service.ensure_recipe()

    def sqs_record(
        self,
        *,
        message_id: str,
        body: str,
        receipt_handle: str,
        receive_count: int,
        remaining: Remaining = forever,
    ) -> list[Result]:
        """Handle one SQS record; raises RetryLater when it must come back."""
        try:
            requests = from_sqs_body(body, bucket=self._settings.photo_bucket, stage=self._settings.stage)
        except MalformedMessage as error:
            self._malformed(message_id, body, error)
            return []
        if not requests:
            logger.debug("irrelevant message", message_id=message_id)
            with self._metrics_lock:
                self._metrics.add_metric(name="IgnoredMessages", unit=MetricUnit.Count, value=1)
            return []

        results = self._process(requests, receive_count, remaining)
        retries = [r for r in results if r.outcome is Outcome.RETRY]
        if not retries:
            return results
        delay = max(r.retry_in or 0 for r in retries)
        if self._settings.retry.hands_on(receive_count):
            # The redrive would soon dead-letter this message although the job has attempts left:
            # acknowledge it and let a fresh copy carry it on (how early: retry.HAND_ON_SLACK).
            # The body itself, not a job message: an upload's record is what proves it (its key,
            # sequencer and eTag), and only that reopens a failed job; records in it that did
            # succeed arrive as duplicates.
            self._queue.send(body, delay)
            logger.info(
                "handed on to a fresh message",
                message_id=message_id,
                receive_count=receive_count,
                delay=delay,
            )
            return results
        self._queue.retry_later(receipt_handle, delay)
        raise RetryLater(retries)

    def s3_records(self, records: list[dict[str, Any]], remaining: Remaining = forever) -> list[Result]:
        """S3 invoking the function directly. A record that must be tried again is handed to the
        process queue as an S3 notification, delayed by its backoff: the queue then counts its
        receives and dead-letters it, as for any upload (Lambda's own retries of an asynchronous
        invocation would drop it silently after two)."""
        results = []
        for record in records:
            try:
                requests = from_s3_records(
                    [record], bucket=self._settings.photo_bucket, stage=self._settings.stage
                )
            except MalformedMessage as error:
                self._malformed("", json.dumps(record), error)
                continue
            record_results = self._process(requests, 1, remaining)
            retries = [r for r in record_results if r.outcome is Outcome.RETRY]
            if retries:
                self._queue.send(json.dumps({"Records": [record]}), max(r.retry_in or 0 for r in retries))
            results.extend(record_results)
        return results

    def _malformed(self, message_id: str, body: str, error: MalformedMessage) -> None:
        # A producer's bug, not a photo's fault: retrying cannot help and nobody is paged.
        logger.warning("malformed message", message_id=message_id, body=body[:4096], reason=str(error))
        with self._metrics_lock:
            self._metrics.add_metric(name="MalformedMessages", unit=MetricUnit.Count, value=1)

    def _process(
        self, requests: list[PhotoRequest], receive_count: int, remaining: Remaining
    ) -> list[Result]:
        results = []
        for request in requests:
            result = self._service.process(request, receive_count=receive_count, remaining=remaining)
            self._record(result)
            results.append(result)
        return results

    def _record(self, result: Result) -> None:
        logger.info(
            "photo processed",
            outcome=result.outcome,
            photo_id=str(result.photo_id),
            attempt=result.attempt,
            error_code=result.code,
            retry_in=result.retry_in,
            steps_ms=None if result.steps is None else result.steps.milliseconds(),
            handoff=None if result.handoff is None else asdict(result.handoff),
        )
        with self._metrics_lock:
            self._metrics.add_metric(name=f"Photos_{result.outcome}", unit=MetricUnit.Count, value=1)
            if result.code is not None:
                self._metrics.add_metric(name=f"Failures_{result.code}", unit=MetricUnit.Count, value=1)
            if result.handoff is not None:
                # Failed hand-offs are not errors (the relay delivers): a rising count says the
                # bus, or the way to it, is unwell.
                self._metrics.add_metric(
                    name="EventsHandedOff", unit=MetricUnit.Count, value=result.handoff.sent
                )
                self._metrics.add_metric(
                    name="EventHandOffFailures", unit=MetricUnit.Count, value=int(result.handoff.failed)
                )
                self._metrics.add_metric(
                    name="EventHandOffDuration",
                    unit=MetricUnit.Milliseconds,
                    value=result.handoff.seconds * 1000,
                )
            if result.steps is not None:
                self._metrics.add_metric(
                    name="RenderDuration", unit=MetricUnit.Milliseconds, value=result.steps.render * 1000
                )
                self._metrics.add_metric(
                    name="VariantBytes", unit=MetricUnit.Bytes, value=result.variant_bytes
                )
