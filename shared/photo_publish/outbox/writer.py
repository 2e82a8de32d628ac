"""The outbox rows a transaction appends with the change they announce (SPEC 4.1, 12, 14)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, insert

from photo_publish.adapters.tables import outbox_events
from photo_publish.contracts import (
    PHOTO_DELETED,
    PHOTO_FAILED,
    PhotoDeletedPayload,
    PhotoFailedPayload,
    PhotoPublishedPayload,
)


def append_published(connection: Connection, event_type: str, payload: PhotoPublishedPayload) -> UUID:
    """A publication's or a re-render's event (the same payload); its outbox id."""
    event_id: UUID = connection.execute(
        insert(outbox_events)
        .values(_row(event_type, payload.photo_id, payload.to_json()))
        .returning(outbox_events.c.id)
    ).scalar_one()
    return event_id


def append_failed(connection: Connection, payloads: Sequence[PhotoFailedPayload]) -> None:
    """One photo.failed event for each photo a failure marked `processing_failed`."""
    rows = [_row(PHOTO_FAILED, payload.photo_id, payload.to_json()) for payload in payloads]
    if rows:
        connection.execute(insert(outbox_events), rows)


def append_deleted(connection: Connection, payload: PhotoDeletedPayload) -> None:
    """The photo's last event: it is gone."""
    connection.execute(insert(outbox_events).values(_row(PHOTO_DELETED, payload.photo_id, payload.to_json())))


def _row(event_type: str, photo_id: UUID, payload: dict[str, object]) -> dict[str, Any]:
    return {"aggregate_type": "photo", "aggregate_id": photo_id, "event_type": event_type, "payload": payload}
