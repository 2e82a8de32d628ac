"""SQS, the queue: what a delivery needs besides acknowledging or failing its record."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

from botocore.exceptions import BotoCoreError, ClientError

from photo_publish.errors import ErrorCode
from photo_publish.events import MalformedMessage, from_sqs_body
from photo_publish.keys import MalformedKey, parse_uuid
from photo_publish.observability import logger

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import (
        ChangeMessageVisibilityBatchRequestEntryTypeDef,
        DeleteMessageBatchRequestEntryTypeDef,
        SendMessageBatchRequestEntryTypeDef,
    )

# SQS caps both a message's delay and a visibility timeout (the latter at 12 hours).
MAX_DELAY_SECONDS = 900
MAX_VISIBILITY_SECONDS = 43_200


QUEUE_ERRORS = (ClientError, BotoCoreError)


def job_body(photo_id: UUID) -> str:
    return json.dumps({"photoId": str(photo_id)})


class SqsQueue:
    def __init__(self, client: SQSClient, queue_url: str, dead_letter_queue_url: str) -> None:
        self._client = client
        self._queue_url = queue_url
        self._dead_letter_queue_url = dead_letter_queue_url

    def retry_later(self, receipt_handle: str, seconds: float) -> None:
        """The record comes back after `seconds` (its visibility), when it is reported as failed."""
        self._client.change_message_visibility(
            QueueUrl=self._queue_url,
            ReceiptHandle=receipt_handle,
            # Up, and never 0: a visibility rounded down to 0 makes the record visible at once to
            # every poller, each receive burning a receive count towards the redrive (the soak saw a
            # healthy photo dead-lettered that way).
            VisibilityTimeout=min(max(math.ceil(seconds), 1), MAX_VISIBILITY_SECONDS),
        )

    def depth(self) -> int | None:
        """Messages waiting in the process queue (visible, so not yet worked on); None if the queue
        could not say."""
        try:
            attributes = self._client.get_queue_attributes(
                QueueUrl=self._queue_url, AttributeNames=["ApproximateNumberOfMessages"]
            )["Attributes"]
        except QUEUE_ERRORS as error:
            logger.warning("queue depth unknown", reason=repr(error))
            return None
        return int(attributes["ApproximateNumberOfMessages"])

    def send_job(self, photo_id: UUID, delay_seconds: float = 0) -> None:
        self.send(job_body(photo_id), delay_seconds)

    def send(self, body: str, delay_seconds: float = 0) -> None:
        """Any message for the process queue (a job, or an S3 event handed over from a direct invoke)."""
        self._client.send_message(
            QueueUrl=self._queue_url,
            MessageBody=body,
            DelaySeconds=min(max(math.ceil(delay_seconds), 0), MAX_DELAY_SECONDS),
        )

    def send_jobs(self, photo_ids: Sequence[UUID], *, spread_seconds: float = 0) -> list[UUID]:
        """SendMessageBatch, ten a call; the ids whose message was not accepted.

        With `spread_seconds`, the messages are delayed evenly across that time (a trickle, not a
        burst that work arriving meanwhile would queue behind).
        """
        unsent: list[UUID] = []
        step = spread_seconds / len(photo_ids) if photo_ids else 0
        for start in range(0, len(photo_ids), 10):
            chunk = list(photo_ids[start : start + 10])
            entries: list[SendMessageBatchRequestEntryTypeDef] = [
                {
                    "Id": str(i),
                    "MessageBody": job_body(p),
                    "DelaySeconds": min(math.ceil((start + i) * step), MAX_DELAY_SECONDS),
                }
                for i, p in enumerate(chunk)
            ]
            try:
                response = self._client.send_message_batch(QueueUrl=self._queue_url, Entries=entries)
            except QUEUE_ERRORS:
                unsent.extend(chunk)
                continue
            unsent.extend(chunk[int(failure["Id"])] for failure in response.get("Failed", []))
        return unsent

    def send_dead_letter(
        self, photo_id: UUID, attempt: int, code: ErrorCode, detail: str = "", *, kind: str = "photo"
    ) -> bool:
        """True once the dead-letter queue has accepted the message; False if it could not be sent
        (the job still owes it, for a redelivery or the sweep to send). `kind` says what failed: a
        photo (`photo`: it is not published) or a published photo's re-render (`rerender`: it stays
        published on its old variants)."""
        try:
            self._client.send_message(
                QueueUrl=self._dead_letter_queue_url,
                MessageBody=json.dumps(
                    {
                        "photoId": str(photo_id),
                        "attempt": attempt,
                        "errorCode": code.value,
                        "kind": kind,
                        "detail": detail[:1000],
                    }
                ),
                MessageAttributes={
                    "photoId": {"DataType": "String", "StringValue": str(photo_id)},
                    "attempt": {"DataType": "Number", "StringValue": str(attempt)},
                    "errorCode": {"DataType": "String", "StringValue": code.value},
                    "kind": {"DataType": "String", "StringValue": kind},
                },
            )
        except QUEUE_ERRORS as error:
            logger.warning("dead letter not sent", photo_id=str(photo_id), reason=repr(error))
            return False
        return True


def letter_photo(message: Any, *, bucket: str, stage: str) -> UUID | None:
    """The photo a dead letter is about: our own letters name it in an attribute, the queue's
    (a message past its receive limit) in a job message's or an S3 event's body; None for one that
    names none (or nonsense)."""
    attribute = message.get("MessageAttributes", {}).get("photoId", {}).get("StringValue")
    try:
        if attribute:
            return parse_uuid(attribute)
        requests = from_sqs_body(message.get("Body", ""), bucket=bucket, stage=stage)
    except (MalformedKey, MalformedMessage):
        return None
    return requests[0].photo_id if requests else None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    receipt_handle: str
    photo_id: UUID | None


class DeadLetterQueue:
    """The dead-letter queue as the sweep reads it: a few letters at a time, those of deleted photos
    removed, the others made visible again at once (for the operator, and the alarm)."""

    def __init__(self, client: SQSClient, url: str, *, bucket: str, stage: str) -> None:
        self._client = client
        self._dead_letter_url = url
        self._bucket = bucket
        self._stage = stage

    def receive_letters(self, visibility_seconds: int) -> list[DeadLetter]:
        """Up to ten letters, hidden from other readers for `visibility_seconds`."""
        response = self._client.receive_message(
            QueueUrl=self._dead_letter_url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=visibility_seconds,
            WaitTimeSeconds=0,
            MessageAttributeNames=["All"],
        )
        messages = response.get("Messages", [])
        return [
            DeadLetter(m["ReceiptHandle"], letter_photo(m, bucket=self._bucket, stage=self._stage))
            for m in messages
        ]

    def remove_letters(self, letters: Sequence[DeadLetter]) -> int:
        """Delete the letters, ten a call; how many the queue deleted."""
        removed = 0
        for start in range(0, len(letters), 10):
            entries: list[DeleteMessageBatchRequestEntryTypeDef] = [
                {"Id": str(i), "ReceiptHandle": letter.receipt_handle}
                for i, letter in enumerate(letters[start : start + 10])
            ]
            response = self._client.delete_message_batch(QueueUrl=self._dead_letter_url, Entries=entries)
            removed += len(response.get("Successful", []))
        return removed

    def show_letters(self, letters: Sequence[DeadLetter]) -> None:
        """Visible again now; one that stays hidden is visible once its timeout passes."""
        for start in range(0, len(letters), 10):
            entries: list[ChangeMessageVisibilityBatchRequestEntryTypeDef] = [
                {"Id": str(i), "ReceiptHandle": letter.receipt_handle, "VisibilityTimeout": 0}
                for i, letter in enumerate(letters[start : start + 10])
            ]
            self._client.change_message_visibility_batch(QueueUrl=self._dead_letter_url, Entries=entries)
