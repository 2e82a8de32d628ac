"""The photo.published payload (SPEC 4.2) and the closed set of error codes (SPEC 5)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from unittest.mock import ANY
from uuid import UUID

import pytest

from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.outbox.contracts import (
    InvalidPayload,
    PhotoPublishedPayload,
    Placeholder,
    PublishedVariants,
    VariantRef,
)

ALBUM_ID = UUID("7d3c6a52-1f0e-4b59-9a57-2a1f1c0f4e11")
PHOTO_ID = UUID("0b9f2d4e-8c61-4f6a-b2a3-6d5e4c3b2a10")
PUBLISHED_AT = datetime(2026, 11, 29, 10, 15, 30, tzinfo=UTC)
VARIANTS = f"dev/albums/{ALBUM_ID}/variants/{PHOTO_ID}/1"
# A ThumbHash of evanw/thumbhash's own examples, and an average colour.
PLACEHOLDER = Placeholder("1QcSHQRnh493V4dIh4eXh1h4kJUI", "#7d6a4f")


def variant(kind: str, **overrides: Any) -> dict[str, Any]:
    return {
        "key": f"{VARIANTS}/{kind}.webp",
        "width": 400,
        "height": 250,
        "size": 12_345,
        "content_type": "image/webp",
    } | overrides


# The responsive ladder (SPEC 18) in both formats, by width.
LADDER = [
    variant("w320-webp", width=320, height=200),
    variant("w320-avif", width=320, height=200, content_type="image/avif"),
    variant("w640-webp", width=640, height=400),
    variant("w640-avif", width=640, height=400, content_type="image/avif"),
]


def payload(**overrides: Any) -> PhotoPublishedPayload:
    """A payload as the publish transaction writes it, with some fields changed.

    `variants` is given as {kind: {field: value}} and `ladder` as [{field: value}], so that a case
    can break one variant's field.
    """
    fields: dict[str, Any] = {
        "photo_id": PHOTO_ID,
        "album_id": ALBUM_ID,
        "entity_version": 2,
        "published_at": PUBLISHED_AT,
        "width": 4000,
        "height": 2500,
        "variants": {"thumb": variant("thumb"), "browse": variant("browse", width=2048, height=1280)},
        "placeholder": PLACEHOLDER,
        "ladder": LADDER,
    }
    fields |= overrides
    if isinstance(fields["ladder"], list):
        fields["ladder"] = tuple(VariantRef(**ref) for ref in fields["ladder"])
    if isinstance(fields["placeholder"], tuple):  # (thumbhash, averageColor), built here to be refused
        fields["placeholder"] = Placeholder(*fields["placeholder"])
    refs = {kind: VariantRef(**ref) for kind, ref in fields.pop("variants").items()}
    return PhotoPublishedPayload(**fields, variants=PublishedVariants(**refs))


def test_the_payload_json_has_exactly_the_camel_case_keys_of_the_spec() -> None:
    # GIVEN a payload written by the publish transaction
    # WHEN it is turned into the outbox's JSON
    document = payload().to_json()

    # THEN it has exactly SPEC 4.2's keys (and SPEC 13's placeholder, SPEC 18's ladder), camelCase,
    # ids as strings
    assert document == {
        "schemaVersion": 3,
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
        "placeholder": {"thumbhash": "1QcSHQRnh493V4dIh4eXh1h4kJUI", "averageColor": "#7d6a4f"},
        "ladder": [
            {
                "key": f"{VARIANTS}/{kind}.webp",
                "width": width,
                "height": height,
                "bytes": 12_345,
                "contentType": content_type,
            }
            for kind, width, height, content_type in [
                ("w320-webp", 320, 200, "image/webp"),
                ("w320-avif", 320, 200, "image/avif"),
                ("w640-webp", 640, 400, "image/webp"),
                ("w640-avif", 640, 400, "image/avif"),
            ]
        ],
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

    # WHEN the consumer validates it
    read_back = PhotoPublishedPayload.from_json(document)

    # THEN it reads back the same payload
    assert read_back == original


THUMB = variant("thumb")


@pytest.mark.parametrize(
    ("overrides", "rule"),
    [
        pytest.param(
            {"entity_version": 1}, "entityVersion must be an integer of at least 2", id="entity-version-1"
        ),
        pytest.param(
            {"published_at": datetime(2026, 11, 29, 10, 15, 30)},
            "publishedAt must carry a time zone",
            id="naive-datetime",
        ),
        pytest.param({"schema_version": 4}, "schemaVersion must be 1, 2 or 3", id="unknown-schema-version"),
        pytest.param({"schema_version": True}, "schemaVersion must be 1, 2 or 3", id="schema-version-true"),
        pytest.param(
            {"placeholder": None}, "placeholder must be a Placeholder from schema 2 on", id="v3-without"
        ),
        pytest.param(
            {"schema_version": 1}, "placeholder must be a Placeholder from schema 2 on", id="v1-with"
        ),
        pytest.param({"ladder": None}, "ladder must be a list from schema 3 on", id="v3-without-ladder"),
        pytest.param({"schema_version": 2}, "ladder must be a list from schema 3 on", id="v2-with-ladder"),
        pytest.param(
            {"ladder": [LADDER[2], LADDER[0]]},
            r"ladder must be ordered by width, got widths \[640, 320\]",
            id="unordered",
        ),
        pytest.param(
            {"ladder": [variant("w320-webp", size=0)]},
            "bytes must be an integer of at least 1",
            id="empty-step",
        ),
        pytest.param(
            {"placeholder": ("not base64!", "#000000")},
            "placeholder.thumbhash must be a base64 ThumbHash",
            id="thumbhash-not-base64",
        ),
        pytest.param(
            {"placeholder": ("AAAA", "#000000")},
            "placeholder.thumbhash must be a base64 ThumbHash",
            id="thumbhash-too-short",
        ),
        pytest.param(
            {"placeholder": ("1QcSHQRnh493V4dIh4eXh1h4kJUI", "#FFF")},
            "placeholder.averageColor must be #rrggbb",
            id="colour-short-upper",
        ),
        pytest.param({"width": 0}, "width must be an integer of at least 1", id="zero-width"),
        pytest.param({"height": -1}, "height must be an integer of at least 1", id="negative-height"),
        pytest.param({"width": 4000.0}, "width must be an integer", id="float-width"),
        pytest.param({"photo_id": str(PHOTO_ID)}, "photoId must be a UUID", id="photo-id-as-text"),
        pytest.param(
            {"variants": {"thumb": variant("thumb", width=0), "browse": THUMB}},
            "width must be an integer of at least 1",
            id="zero-variant-width",
        ),
        pytest.param(
            {"variants": {"thumb": variant("thumb", height=-1), "browse": THUMB}},
            "height must be an integer of at least 1",
            id="negative-variant-height",
        ),
        pytest.param(
            {"variants": {"thumb": variant("thumb", size=0), "browse": THUMB}},
            "bytes must be an integer of at least 1",
            id="zero-variant-bytes",
        ),
        pytest.param(
            {"variants": {"thumb": variant("thumb", key=""), "browse": THUMB}},
            "key must be a non-empty string",
            id="empty-variant-key",
        ),
    ],
)
def test_an_invalid_payload_is_refused_on_write(overrides: dict[str, Any], rule: str) -> None:
    # GIVEN a payload that breaks a rule of SPEC 4.2
    # WHEN it is built
    # THEN it is refused before it reaches the outbox, naming the key and the rule
    with pytest.raises(InvalidPayload, match=f"^{rule}"):
        payload(**overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"variants": {"thumb": THUMB}}, id="missing-browse"),
        pytest.param({"variants": {"browse": THUMB}}, id="missing-thumb"),
        pytest.param({"unexpected": "field"}, id="extra-field"),
        pytest.param({"variants": {"thumb": THUMB, "browse": THUMB, "poster": THUMB}}, id="extra-variant"),
        pytest.param(
            {"variants": {"thumb": variant("thumb", etag="x"), "browse": THUMB}}, id="extra-variant-field"
        ),
    ],
)
def test_a_payload_of_the_wrong_shape_cannot_be_built(overrides: dict[str, Any]) -> None:
    # GIVEN a payload with a field or a variant missing, or one SPEC 4.2 does not have
    # WHEN it is built
    # THEN it is refused before it reaches the outbox
    with pytest.raises(
        TypeError, match=r"missing 1 required keyword-only argument|unexpected keyword argument"
    ):
        payload(**overrides)


def document(**changes: Any) -> dict[str, Any]:
    """The outbox's JSON of the default payload, as a consumer reads it, with some keys changed."""
    read: dict[str, Any] = json.loads(json.dumps(payload().to_json()))
    return read | changes


def without(mapping: dict[str, Any], key: str) -> dict[str, Any]:
    return {name: value for name, value in mapping.items() if name != key}


BROWSE = document()["variants"]["browse"]


@pytest.mark.parametrize(
    ("changed", "error"),
    [
        *[
            pytest.param(without(document(), key), f"payload lacks {key}$", id=f"missing-{key}")
            for key in document()
        ],
        pytest.param(document(etag="x"), "payload has unknown keys 'etag'$", id="unknown-key"),
        pytest.param(document(variants={"browse": BROWSE}), "variants lacks thumb$", id="missing-thumb"),
        pytest.param(
            document(variants={"thumb": BROWSE, "browse": BROWSE, "poster": BROWSE}),
            "variants has unknown keys 'poster'$",
            id="unknown-variant",
        ),
        pytest.param(
            document(variants={"thumb": without(BROWSE, "bytes"), "browse": BROWSE}),
            "variants.thumb lacks bytes$",
            id="missing-variant-bytes",
        ),
        pytest.param(
            document(variants={"thumb": BROWSE | {"size": 1}, "browse": BROWSE}),
            "variants.thumb has unknown keys 'size'$",
            id="snake-case-variant-key",
        ),
        pytest.param(
            document(variants={"thumb": BROWSE, "browse": BROWSE | {"width": 0}}),
            "variants.browse.width must be an integer of at least 1, got 0$",
            id="zero-variant-width",
        ),
        pytest.param(
            document(variants={"thumb": BROWSE, "browse": BROWSE | {"bytes": "88210"}}),
            "variants.browse.bytes must be an integer",
            id="variant-bytes-as-text",
        ),
        pytest.param(document(variants=[BROWSE, BROWSE]), "variants must be an object", id="variants-a-list"),
        pytest.param(
            document(schemaVersion=4), "schemaVersion must be 1, 2 or 3, got 4$", id="schema-version-4"
        ),
        pytest.param(
            without(document(schemaVersion=1), "ladder"),
            "payload has unknown keys 'placeholder'$",
            id="v1-with-placeholder",
        ),
        pytest.param(document(schemaVersion=2), "payload has unknown keys 'ladder'$", id="v2-with-ladder"),
        pytest.param(document(ladder={"w320-webp": BROWSE}), "ladder must be a list", id="ladder-an-object"),
        pytest.param(
            document(ladder=[without(BROWSE, "bytes")]), r"ladder\[0\] lacks bytes$", id="step-without-bytes"
        ),
        pytest.param(
            document(ladder=[BROWSE | {"width": 640}, BROWSE | {"width": 320}]),
            r"ladder must be ordered by width",
            id="ladder-unordered",
        ),
        pytest.param(
            document(ladder=[BROWSE | {"contentType": None}]),
            r"ladder\[0\].contentType must be a string",
            id="step-without-type",
        ),
        pytest.param(
            document(placeholder={"thumbhash": PLACEHOLDER.thumbhash}),
            "placeholder lacks averageColor$",
            id="placeholder-without-colour",
        ),
        pytest.param(
            document(placeholder={"thumbhash": PLACEHOLDER.thumbhash, "averageColor": "red"}),
            "placeholder.averageColor must be #rrggbb",
            id="placeholder-colour-by-name",
        ),
        pytest.param(
            document(entityVersion=1), "entityVersion must be an integer of at least 2", id="version-1"
        ),
        pytest.param(document(width=True), "width must be an integer", id="width-true"),
        pytest.param(document(height=2500.0), "height must be an integer", id="height-a-float"),
        pytest.param(document(photoId="not-a-uuid"), "photoId must be a UUID", id="photo-id-not-a-uuid"),
        pytest.param(document(albumId=None), "albumId must be a UUID", id="album-id-null"),
        pytest.param(
            document(publishedAt="2026-11-29T10:15:30"), "publishedAt must carry a time zone", id="naive-time"
        ),
        pytest.param(
            document(publishedAt="yesterday"),
            "publishedAt must be an ISO-8601 date and time",
            id="not-a-time",
        ),
        pytest.param(
            document(publishedAt=1_700_000_000), "publishedAt must be an ISO-8601 date and time", id="epoch"
        ),
    ],
)
def test_a_consumer_refuses_a_document_that_breaks_the_contract(changed: Any, error: str) -> None:
    # GIVEN an outbox document with a key missing, one SPEC 4.2 does not have, or a wrong value
    # WHEN a consumer reads it
    # THEN it is refused, naming where
    with pytest.raises(InvalidPayload, match=f"^{error}"):
        PhotoPublishedPayload.from_json(changed)


def test_a_consumer_reads_schema_version_1_documents_too() -> None:
    # GIVEN a document written before placeholders (schema version 1: no placeholder key)
    old = without(without(document(schemaVersion=1), "placeholder"), "ladder")

    # WHEN a consumer reads it
    read = PhotoPublishedPayload.from_json(old)

    # THEN it is that version's payload, with no placeholder, and it writes back the same document
    assert (read.schema_version, read.placeholder, read.ladder) == (1, None, None)
    assert read.to_json() == old


def test_a_consumer_reads_schema_version_2_documents_too() -> None:
    # GIVEN a document written before the ladder (schema version 2: a placeholder, no ladder key)
    old = without(document(schemaVersion=2), "ladder")

    # WHEN a consumer reads it
    read = PhotoPublishedPayload.from_json(old)

    # THEN it is that version's payload, with its placeholder and no ladder, written back the same
    assert (read.schema_version, read.placeholder, read.ladder) == (2, PLACEHOLDER, None)
    assert read.to_json() == old


def test_a_recipe_without_a_ladder_writes_schema_3_with_an_empty_ladder() -> None:
    # GIVEN a photo rendered with VARIANT_WIDTHS=none
    written = payload(ladder=()).to_json()

    # WHEN a consumer reads it back
    read = PhotoPublishedPayload.from_json(json.loads(json.dumps(written)))

    # THEN it is schema 3 with an empty list: the key is there whatever the recipe
    assert (written["schemaVersion"], written["ladder"], read.ladder) == (3, [], ())


@pytest.mark.parametrize("changed", [None, [], "payload"], ids=["null", "list", "text"])
def test_a_consumer_refuses_a_document_that_is_no_object(changed: Any) -> None:
    # GIVEN JSON that is not an object at all
    # WHEN / THEN a consumer refuses it
    with pytest.raises(InvalidPayload, match=r"^payload must be an object"):
        PhotoPublishedPayload.from_json(changed)


# Error codes (SPEC 5): the user's bad input is permanent, everything else may succeed next time.
PERMANENT = {
    ErrorCode.ORIGINAL_NOT_FOUND,
    ErrorCode.ORIGINAL_TOO_LARGE,
    ErrorCode.UNSUPPORTED_FORMAT,
    ErrorCode.DECODE_FAILED,
    ErrorCode.DIMENSIONS_EXCEEDED,
    ErrorCode.ENCODE_FAILED,
    # Past the render's own deadline: the file's fault, no attempt renders it faster.
    ErrorCode.RENDER_TIME_EXCEEDED,
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
