"""The photo.published payload (SPEC 4.2) and the closed set of error codes (SPEC 5)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from unittest.mock import ANY
from uuid import UUID

import pytest
from pydantic import ValidationError

from photo_publish.contracts import PhotoPublishedPayload
from photo_publish.errors import ErrorCode, PhotoError

ALBUM_ID = UUID("7d3c6a52-1f0e-4b59-9a57-2a1f1c0f4e11")
PHOTO_ID = UUID("0b9f2d4e-8c61-4f6a-b2a3-6d5e4c3b2a10")
PUBLISHED_AT = datetime(2026, 11, 29, 10, 15, 30, tzinfo=UTC)
VARIANTS = f"dev/albums/{ALBUM_ID}/variants/{PHOTO_ID}/1"


def variant(kind: str, **overrides: Any) -> dict[str, Any]:
    return {
        "key": f"{VARIANTS}/{kind}.webp",
        "width": 400,
        "height": 250,
        "size": 12_345,
        "content_type": "image/webp",
    } | overrides


def payload(**overrides: Any) -> PhotoPublishedPayload:
    """A payload as the publish transaction writes it, with some fields changed."""
    fields = {
        "photo_id": PHOTO_ID,
        "album_id": ALBUM_ID,
        "entity_version": 2,
        "published_at": PUBLISHED_AT,
        "width": 4000,
        "height": 2500,
        "variants": {"thumb": variant("thumb"), "browse": variant("browse", width=2048, height=1280)},
    }
    return PhotoPublishedPayload.model_validate(fields | overrides)


def test_the_payload_json_has_exactly_the_camel_case_keys_of_the_spec() -> None:
    # GIVEN a payload written by the publish transaction
    # WHEN it is turned into the outbox's JSON
    document = payload().to_json()

    # THEN it has exactly SPEC 4.2's keys, camelCase, ids as strings
    assert document == {
        "schemaVersion": 1,
        "photoId": str(PHOTO_ID),
        "albumId": str(ALBUM_ID),
        "entityVersion": 2,
        "publishedAt": ANY,
        "width": 4000,
        "height": 2500,
        "variants": {
            "thumb": {
                "key": f"{VARIANTS}/thumb.webp",
                "width": 400,
                "height": 250,
                "bytes": 12_345,
                "contentType": "image/webp",
            },
            "browse": {
                "key": f"{VARIANTS}/browse.webp",
                "width": 2048,
                "height": 1280,
                "bytes": 12_345,
                "contentType": "image/webp",
            },
        },
    }


@pytest.mark.parametrize(
    "zone",
    [UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-5, minutes=-30))],
    ids=["utc", "plus-2", "minus-5-30"],
)
def test_published_at_is_serialised_as_iso_8601_utc(zone: timezone) -> None:
    # GIVEN the publish instant, given in some time zone
    published_at = PUBLISHED_AT.astimezone(zone)

    # WHEN the payload is turned into JSON
    text = payload(published_at=published_at).to_json()["publishedAt"]

    # THEN it is an ISO-8601 string of the same instant, in UTC
    assert isinstance(text, str)
    parsed = datetime.fromisoformat(text)
    assert parsed == PUBLISHED_AT
    assert parsed.utcoffset() == timedelta(0)


def test_the_payload_json_round_trips_through_the_model() -> None:
    # GIVEN the JSON a consumer reads from the outbox
    original = payload(published_at=PUBLISHED_AT.astimezone(timezone(timedelta(hours=9))))
    document = json.loads(json.dumps(original.to_json()))

    # WHEN the consumer validates it by its aliases
    read_back = PhotoPublishedPayload.model_validate(document, by_alias=True)

    # THEN it reads back the same payload
    assert read_back == original


THUMB = variant("thumb")


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"entity_version": 1}, id="entity-version-1"),
        pytest.param({"published_at": datetime(2026, 11, 29, 10, 15, 30)}, id="naive-datetime"),
        pytest.param({"schema_version": 2}, id="unknown-schema-version"),
        pytest.param({"variants": {"thumb": THUMB}}, id="missing-browse"),
        pytest.param({"variants": {"browse": THUMB}}, id="missing-thumb"),
        pytest.param({"width": 0}, id="zero-width"),
        pytest.param({"height": -1}, id="negative-height"),
        pytest.param(
            {"variants": {"thumb": variant("thumb", width=0), "browse": THUMB}}, id="zero-variant-width"
        ),
        pytest.param(
            {"variants": {"thumb": variant("thumb", height=-1), "browse": THUMB}},
            id="negative-variant-height",
        ),
        pytest.param(
            {"variants": {"thumb": variant("thumb", size=0), "browse": THUMB}}, id="zero-variant-bytes"
        ),
        pytest.param(
            {"variants": {"thumb": variant("thumb", key=""), "browse": THUMB}}, id="empty-variant-key"
        ),
        pytest.param({"unexpected": "field"}, id="extra-field"),
        pytest.param({"variants": {"thumb": THUMB, "browse": THUMB, "poster": THUMB}}, id="extra-variant"),
        pytest.param(
            {"variants": {"thumb": variant("thumb", etag="x"), "browse": THUMB}}, id="extra-variant-field"
        ),
    ],
)
def test_an_invalid_payload_is_refused_on_write(overrides: dict[str, Any]) -> None:
    # GIVEN a payload that breaks SPEC 4.2
    # WHEN it is built
    # THEN it is refused before it reaches the outbox
    with pytest.raises(ValidationError):
        payload(**overrides)


# Error codes (SPEC 5): the user's bad input is permanent, everything else may succeed next time.
PERMANENT = {
    ErrorCode.ORIGINAL_NOT_FOUND,
    ErrorCode.ORIGINAL_TOO_LARGE,
    ErrorCode.UNSUPPORTED_FORMAT,
    ErrorCode.DECODE_FAILED,
    ErrorCode.DIMENSIONS_EXCEEDED,
    ErrorCode.ENCODE_FAILED,
}


def test_the_permanent_codes_are_exactly_the_users_bad_input() -> None:
    # GIVEN / WHEN every code is classified
    # THEN exactly the bad-input codes are permanent
    assert {code for code in ErrorCode if code.permanent} == PERMANENT


@pytest.mark.parametrize("code", list(ErrorCode))
def test_a_photo_error_is_permanent_exactly_when_its_code_is(code: ErrorCode) -> None:
    # GIVEN a failure with a code of the closed set
    error = PhotoError(code, "detail for the logs")

    # WHEN / THEN it is classified by its code alone, as a bool
    assert error.permanent is (code in PERMANENT)
    assert error.code == code
