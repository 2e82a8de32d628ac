"""The dead-letter queue as a test reads it, and the letters the jobs owe it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

from sqlalchemy import Engine, func, select, update

from photo_publish.adapters.models import PhotoJob
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


def attributes(letter: dict[str, Any]) -> dict[str, Any]:
    """A letter's message attributes, by name."""
    return {k: v.get("StringValue") for k, v in letter.get("MessageAttributes", {}).items()}


def letter_codes(infra: Infra) -> list[tuple[UUID | None, str | None]]:
    """(photoId, errorCode) of every letter in the queue, each left visible again."""
    letters = []
    for letter in dead_letters(infra):
        named = attributes(letter)
        photo_id = named.get("photoId")
        letters.append((UUID(photo_id) if photo_id else None, named.get("errorCode")))
    return letters


def owed(db: Engine, photo_id: UUID) -> Any:
    """When the photo's job began to owe its letter (None: it owes none)."""
    with db.connect() as c:
        return c.scalar(select(PhotoJob.dead_letter_owed_at).where(PhotoJob.photo_id == photo_id))


def lease_passes(db: Engine) -> None:
    """Letters still owed were taken longer than STALE_AFTER_SECONDS ago (as test_sweep ages them);
    a letter no longer owed stays so."""
    with db.begin() as c:
        c.execute(
            update(PhotoJob)
            .where(PhotoJob.dead_letter_owed_at.is_not(None))
            .values(dead_letter_owed_at=func.now() - timedelta(minutes=6))
        )
