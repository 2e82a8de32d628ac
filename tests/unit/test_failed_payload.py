"""The photo.failed payload (SPEC 12): typed, versioned, validated on write and on read."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from uuid import UUID

import pytest

from photo_publish.contracts import InvalidPayload, PhotoFailedPayload
from photo_publish.errors import ErrorCode
from photo_publish.retry import PERMANENT

ALBUM_ID = UUID("7d3c6a52-1f0e-4b59-9a57-2a1f1c0f4e11")
PHOTO_ID = UUID("0b9f2d4e-8c61-4f6a-b2a3-6d5e4c3b2a10")
FAILED_AT = datetime(2026, 11, 29, 10, 15, 30, 123456, tzinfo=UTC)


def payload(**overrides: Any) -> PhotoFailedPayload:
    fields: dict[str, Any] = {
        "photo_id": PHOTO_ID,
        "album_id": ALBUM_ID,
        "entity_version": 1,
        "error_code": ErrorCode.DECODE_FAILED,
        "kind": "permanent",
        "attempt": 1,
        "failed_at": FAILED_AT,
    }
    return PhotoFailedPayload(**(fields | overrides))


def document(**changes: Any) -> dict[str, Any]:
    read: dict[str, Any] = json.loads(json.dumps(payload().to_json()))
    return read | changes


def test_the_json_has_the_camel_case_keys_a_consumer_reads() -> None:
    # GIVEN a failure recorded in some time zone
    failed = payload(failed_at=FAILED_AT.astimezone(timezone(timedelta(hours=-5))), kind="final", attempt=3)

    # WHEN it is turned into the outbox's JSON
    # THEN every key is there, ids as strings, the code by name, the instant in UTC with "Z"
    assert failed.to_json() == {
        "schemaVersion": 1,
        "photoId": str(PHOTO_ID),
        "albumId": str(ALBUM_ID),
        "entityVersion": 1,
        "errorCode": "DECODE_FAILED",
        "kind": "final",
        "attempt": 3,
        "failedAt": "2026-11-29T10:15:30.123456Z",
    }


@pytest.mark.parametrize("code", list(ErrorCode))
def test_every_error_code_round_trips_through_a_consumers_reading(code: ErrorCode) -> None:
    # GIVEN the JSON of a failure with any code of the closed set
    original = payload(error_code=code, kind="permanent" if code in PERMANENT else "final")

    # WHEN a consumer reads it
    read_back = PhotoFailedPayload.from_json(json.loads(json.dumps(original.to_json())))

    # THEN it is the same payload
    assert read_back == original


@pytest.mark.parametrize(
    ("overrides", "rule"),
    [
        pytest.param({"entity_version": 0}, "entityVersion must be an integer of at least 1", id="version-0"),
        pytest.param({"attempt": 0}, "attempt must be an integer of at least 1", id="attempt-0"),
        pytest.param({"attempt": True}, "attempt must be an integer", id="attempt-true"),
        pytest.param({"kind": "transient"}, "kind must be permanent or final", id="transient"),
        pytest.param({"error_code": "DECODE_FAILED"}, "errorCode must be one of", id="code-as-text"),
        pytest.param({"failed_at": datetime(2026, 11, 29)}, "failedAt must carry a time zone", id="naive"),
        pytest.param({"schema_version": 2}, "schemaVersion must be 1", id="schema-2"),
        pytest.param({"album_id": str(ALBUM_ID)}, "albumId must be a UUID", id="album-as-text"),
    ],
)
def test_an_invalid_payload_is_refused_on_write(overrides: dict[str, Any], rule: str) -> None:
    with pytest.raises(InvalidPayload, match=f"^{rule}"):
        payload(**overrides)


@pytest.mark.parametrize(
    ("changed", "error"),
    [
        *[
            pytest.param(
                {k: v for k, v in document().items() if k != key},
                f"payload lacks {key}$",
                id=f"missing-{key}",
            )
            for key in document()
        ],
        pytest.param(document(detail="x"), "payload has unknown keys 'detail'$", id="unknown-key"),
        pytest.param(document(errorCode="OUT_OF_CHEESE"), "errorCode must be one of", id="unknown-code"),
        pytest.param(document(kind="retrying"), "kind must be permanent or final", id="unknown-kind"),
        pytest.param(document(failedAt="2026-11-29T10:15:30"), "failedAt must carry", id="naive-time"),
        pytest.param(document(failedAt="soon"), "failedAt must be an ISO-8601", id="not-a-time"),
        pytest.param(document(photoId="x"), "photoId must be a UUID", id="photo-id"),
        pytest.param(document(entityVersion="1"), "entityVersion must be an integer", id="version-text"),
    ],
)
def test_a_consumer_refuses_a_document_that_breaks_the_contract(changed: Any, error: str) -> None:
    with pytest.raises(InvalidPayload, match=f"^{error}"):
        PhotoFailedPayload.from_json(changed)
