"""photo.deleted's payload (SPEC 17): typed, validated on write and on read."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from photo_publish.contracts import InvalidPayload, PhotoDeletedPayload


def test_a_deleted_payload_round_trips_in_utc() -> None:
    payload = PhotoDeletedPayload(
        photo_id=uuid.uuid4(),
        album_id=uuid.uuid4(),
        entity_version=3,
        deleted_at=datetime(2026, 12, 1, 21, 0, tzinfo=timezone(timedelta(hours=2))),
    )
    document = payload.to_json()
    assert document["deletedAt"] == "2026-12-01T19:00:00Z"
    assert PhotoDeletedPayload.from_json(document) == payload


@pytest.mark.parametrize(
    "change",
    [{"entityVersion": 0}, {"photoId": "x"}, {"deletedAt": "2026-12-01T19:00:00"}, {"extra": 1}],
)
def test_a_deleted_payload_that_breaks_the_contract_is_refused(change: dict[str, object]) -> None:
    document = (
        PhotoDeletedPayload(
            photo_id=uuid.uuid4(), album_id=uuid.uuid4(), entity_version=2, deleted_at=datetime.now(UTC)
        ).to_json()
        | change
    )
    with pytest.raises(InvalidPayload):
        PhotoDeletedPayload.from_json(document)
