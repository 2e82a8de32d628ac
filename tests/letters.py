"""The dead-letter queue as a test reads it."""

from __future__ import annotations

from typing import Any

from tests.conftest import Infra


def dead_letters(infra: Infra) -> list[dict[str, Any]]:
    """Every letter in the queue, each left visible again (for the operator's redrive, the sweep)."""
    messages: list[dict[str, Any]] = []
    while batch := infra.sqs.receive_message(
        QueueUrl=infra.queues.dead_letter_url,
        MaxNumberOfMessages=10,
        VisibilityTimeout=30,
        MessageAttributeNames=["All"],
    ).get("Messages", []):
        messages.extend(batch)
    for m in messages:  # visible again, so the operator's redrive can read them
        infra.sqs.change_message_visibility(
            QueueUrl=infra.queues.dead_letter_url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
        )
    return messages
