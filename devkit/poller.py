"""A local event-source mapping: what Lambda's SQS poller does, against any SQS endpoint.

It receives batches, hands the handler real Lambda SQS events (every attribute, including
ApproximateReceiveCount), deletes what succeeded and leaves reported failures to the queue. It does
not imitate visibility timeouts or the redrive policy: those are the queue's own.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Handler = Callable[[dict[str, Any], Any], dict[str, Any]]


@dataclass
class LambdaContext:
    """The parts of Lambda's context object the handlers use, with a real deadline."""

    timeout_seconds: float = 120.0
    function_name: str = "photo-publish-process"
    memory_limit_in_mb: int = 1769
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:000000000000:function:photo-publish-process"
    log_group_name: str = "/aws/lambda/photo-publish-process"
    log_stream_name: str = "local"
    function_version: str = "$LATEST"
    started: float = field(default_factory=time.monotonic)

    def get_remaining_time_in_millis(self) -> int:
        return max(int((self.timeout_seconds - (time.monotonic() - self.started)) * 1000), 0)


def _lambda_attribute(value: dict[str, Any]) -> dict[str, Any]:
    # SQS's API spells message attributes in PascalCase; Lambda's event in camelCase.
    return {
        "stringValue": value.get("StringValue"),
        "binaryValue": value.get("BinaryValue"),
        "stringListValues": value.get("StringListValues", []),
        "binaryListValues": value.get("BinaryListValues", []),
        "dataType": value["DataType"],
    }


def sqs_event(messages: list[dict[str, Any]], queue_arn: str) -> dict[str, Any]:
    """The event Lambda's SQS event source would build for these received messages."""
    region = queue_arn.split(":")[3]
    records = []
    for message in messages:
        record = {
            "messageId": message["MessageId"],
            "receiptHandle": message["ReceiptHandle"],
            "body": message["Body"],
            "attributes": message.get("Attributes", {}),
            "messageAttributes": {
                k: _lambda_attribute(v) for k, v in message.get("MessageAttributes", {}).items()
            },
            "md5OfBody": message["MD5OfBody"],
            "eventSource": "aws:sqs",
            "eventSourceARN": queue_arn,
            "awsRegion": region,
        }
        if "MD5OfMessageAttributes" in message:
            record["md5OfMessageAttributes"] = message["MD5OfMessageAttributes"]
        records.append(record)
    return {"Records": records}


@dataclass
class Poller:
    sqs: Any
    queue_url: str
    queue_arn: str
    handler: Handler
    batch_size: int = 10
    wait_seconds: int = 1
    timeout_seconds: float = 120.0
    received: int = 0
    failed: int = 0
    # Scheduled functions (the sweep's EventBridge rule): (every seconds, function), run when due.
    schedule: list[tuple[float, Callable[[], None]]] = field(default_factory=list)
    _next_runs: dict[int, float] = field(default_factory=dict, repr=False)

    def run_scheduled(self) -> None:
        now = time.monotonic()
        for index, (every, function) in enumerate(self.schedule):
            if now >= self._next_runs.get(index, now):
                self._next_runs[index] = now + every
                function()

    def poll_once(self) -> int:
        """One receive, one invocation; the number of records the handler saw."""
        response = self.sqs.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=self.batch_size,
            WaitTimeSeconds=self.wait_seconds,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        messages = response.get("Messages", [])
        if not messages:
            return 0
        result = self.handler(sqs_event(messages, self.queue_arn), LambdaContext(self.timeout_seconds))
        failures = {item["itemIdentifier"] for item in result.get("batchItemFailures", [])}
        done = [m for m in messages if m["MessageId"] not in failures]
        for start in range(0, len(done), 10):
            self.sqs.delete_message_batch(
                QueueUrl=self.queue_url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(done[start : start + 10])
                ],
            )
        self.received += len(messages)
        self.failed += len(failures)
        return len(messages)

    def run_until(
        self,
        finished: Callable[[], bool],
        *,
        deadline_seconds: float,
        on_batch: Callable[[], None] | None = None,
    ) -> bool:
        """Poll until `finished()` holds or the deadline passes; True if it finished."""
        deadline = time.monotonic() + deadline_seconds
        while time.monotonic() < deadline:
            self.run_scheduled()
            if self.poll_once() and on_batch is not None:
                on_batch()
            if finished():
                return True
        return finished()
