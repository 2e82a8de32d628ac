"""The photo.published payload (SPEC 4.2, 13, 18)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from unittest.mock import ANY
from uuid import UUID

import pytest

from photo_publish.contracts import (
    NO_CAPTURE,
    Capture,
    InvalidPayload,
    Location,
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
# An iPhone's, as its EXIF says it (taken at 14:33:08.302 in UTC+3), with the position kept.
CAPTURE = Capture(
    taken_at=datetime(2023, 2, 21, 14, 33, 8, 302000, tzinfo=timezone(timedelta(hours=3))),
    taken_at_local=datetime(2023, 2, 21, 14, 33, 8, 302000),
    make="Apple",
    model="iPhone 13 Pro",
    lens="iPhone 13 Pro back dual wide camera 5.7mm f/1.5",
    f_number=1.5,
    exposure_time=1 / 121,
    iso=125,
    focal_length=5.7,
    location=Location(latitude=44.850477777777776, longitude=34.976647222222226, altitude=29.1355),
)


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
        "capture": CAPTURE,
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

    # THEN it has exactly SPEC 4.2's keys (and SPEC 13's placeholder, SPEC 18's ladder and capture),
    # camelCase, ids as strings, the instant taken in UTC and the camera's clock as it was
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
        "capture": {
            "takenAt": "2023-02-21T11:33:08.302000Z",
            "takenAtLocal": "2023-02-21T14:33:08.302000",
            "make": "Apple",
            "model": "iPhone 13 Pro",
            "lens": "iPhone 13 Pro back dual wide camera 5.7mm f/1.5",
            "fNumber": 1.5,
            "exposureTime": 1 / 121,
            "iso": 125,
            "focalLength": 5.7,
            "location": {
                "latitude": 44.850477777777776,
                "longitude": 34.976647222222226,
                "altitude": 29.1355,
            },
        },
    }


def test_a_photo_whose_exif_says_nothing_has_a_capture_of_nulls() -> None:
    # GIVEN a payload of a photo with no EXIF
    # WHEN it is turned into JSON
    document = payload(capture=NO_CAPTURE).to_json()

    # THEN its capture is there, every key of it null
    capture: Any = document["capture"]
    assert set(capture) == set(CAPTURE.to_json())
    assert set(capture.values()) == {None}


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


@pytest.mark.parametrize(
    "capture",
    [
        CAPTURE,
        NO_CAPTURE,
        # Only the camera's clock (no offset recorded), no position, an integer f-number (JSON's 2)
        Capture(taken_at_local=datetime(2008, 4, 20, 19, 12, 6), make="Canon", f_number=2, iso=100),
        Capture(location=Location(latitude=-33.86, longitude=-151.2, altitude=None)),
    ],
    ids=["iphone", "nothing", "local-time-only", "south-west-no-altitude"],
)
def test_the_payload_json_round_trips_through_the_model(capture: Capture) -> None:
    # GIVEN the JSON a consumer reads from the outbox
    original = payload(published_at=PUBLISHED_AT.astimezone(timezone(timedelta(hours=9))), capture=capture)
    document = json.loads(json.dumps(original.to_json()))

    # WHEN the consumer validates it
    read_back = PhotoPublishedPayload.from_json(document)

    # THEN it reads back the same payload, and writes back the same document
    assert read_back == original
    assert read_back.to_json() == document


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
        pytest.param(
            {"capture": None}, "capture must be a Capture from schema 3 on", id="v3-without-capture"
        ),
        pytest.param(
            {"schema_version": 2}, "capture must be a Capture from schema 3 on", id="v2-with-capture"
        ),
        pytest.param({"ladder": None}, "ladder must be a list from schema 3 on", id="v3-without-ladder"),
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
CAPTURE_DOCUMENT = document()["capture"]


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
            "payload has unknown keys 'placeholder', 'capture'$",
            id="v1-with-placeholder",
        ),
        pytest.param(
            without(document(schemaVersion=2), "ladder"),
            "payload has unknown keys 'capture'$",
            id="v2-with-capture",
        ),
        pytest.param(
            without(document(schemaVersion=2), "capture"),
            "payload has unknown keys 'ladder'$",
            id="v2-with-ladder",
        ),
        pytest.param(
            document(capture=without(CAPTURE_DOCUMENT, "iso")), "capture lacks iso$", id="capture-without-iso"
        ),
        pytest.param(
            document(capture=CAPTURE_DOCUMENT | {"gps": None}),
            "capture has unknown keys 'gps'$",
            id="capture-unknown-key",
        ),
        pytest.param(
            document(capture=CAPTURE_DOCUMENT | {"takenAt": "2023-02-21T14:33:08"}),
            "capture.takenAt must carry a time zone",
            id="taken-at-naive",
        ),
        pytest.param(
            document(capture=CAPTURE_DOCUMENT | {"takenAtLocal": "2023-02-21T14:33:08+03:00"}),
            "capture.takenAtLocal must be a date and time with no zone",
            id="taken-at-local-zoned",
        ),
        pytest.param(
            document(capture=CAPTURE_DOCUMENT | {"takenAt": "0001-01-01T00:00:00+01:00"}),
            "capture.takenAt is out of range",
            id="taken-at-before-year-1-in-utc",
        ),
        pytest.param(
            document(capture=CAPTURE_DOCUMENT | {"fNumber": "1.5"}),
            "capture.fNumber must be a finite number",
            id="f-number-as-text",
        ),
        pytest.param(
            document(
                capture=CAPTURE_DOCUMENT | {"location": {"latitude": 91, "longitude": 0, "altitude": None}}
            ),
            "location.latitude must be a number within",
            id="latitude-over-90",
        ),
        pytest.param(
            document(capture=CAPTURE_DOCUMENT | {"location": {"latitude": 1, "longitude": 2}}),
            "capture.location lacks altitude$",
            id="location-without-altitude-key",
        ),
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
    old = without(without(without(document(schemaVersion=1), "placeholder"), "ladder"), "capture")

    # WHEN a consumer reads it
    read = PhotoPublishedPayload.from_json(old)

    # THEN it is that version's payload, with no placeholder, and it writes back the same document
    assert (read.schema_version, read.placeholder, read.ladder, read.capture) == (1, None, None, None)
    assert read.to_json() == old


def test_a_consumer_reads_schema_version_2_documents_too() -> None:
    # GIVEN a document written before the ladder and capture metadata (schema version 2: a
    # placeholder, neither key)
    old = without(without(document(schemaVersion=2), "ladder"), "capture")

    # WHEN a consumer reads it
    read = PhotoPublishedPayload.from_json(old)

    # THEN it is that version's payload, its placeholder and neither ladder nor capture, written back
    # the same
    assert (read.schema_version, read.placeholder, read.ladder, read.capture) == (2, PLACEHOLDER, None, None)
    assert read.to_json() == old


@pytest.mark.parametrize(
    ("fields", "rule"),
    [
        pytest.param({"make": ""}, "capture.make must be printable text", id="empty-make"),
        pytest.param({"model": "x" * 129}, "capture.model must be printable text", id="model-too-long"),
        pytest.param({"lens": "50mm\x00"}, "capture.lens must be printable text", id="lens-with-nul"),
        pytest.param({"make": " Canon"}, "capture.make must be printable text", id="make-not-stripped"),
        pytest.param({"f_number": 0}, "capture.fNumber must be positive", id="f-number-0"),
        pytest.param({"exposure_time": float("nan")}, "capture.exposureTime must be a finite", id="nan"),
        pytest.param({"focal_length": True}, "capture.focalLength must be a finite number", id="bool"),
        pytest.param({"iso": 0}, "capture.iso must be an integer of at least 1", id="iso-0"),
        pytest.param({"iso": 2**31}, "capture.iso must be at most", id="iso-over-int32"),
        pytest.param({"iso": 100.0}, "capture.iso must be an integer", id="iso-a-float"),
        pytest.param(
            {"taken_at": datetime(2023, 1, 1), "taken_at_local": datetime(2023, 1, 1)},
            "capture.takenAt must carry a time zone",
            id="naive-instant",
        ),
        pytest.param(
            {"taken_at": datetime(2023, 1, 1, tzinfo=UTC)},
            "capture.takenAtLocal must be given with capture.takenAt",
            id="instant-without-clock",
        ),
        pytest.param(
            {"location": Location(latitude=10, longitude=20).to_json()},
            "capture.location must be a Location",
            id="location-a-dict",
        ),
    ],
)
def test_an_invalid_capture_is_refused_on_write(fields: dict[str, Any], rule: str) -> None:
    # GIVEN capture metadata that breaks a rule of SPEC 18's shape
    # WHEN it is built
    # THEN it is refused, naming the key and the rule
    with pytest.raises(InvalidPayload, match=f"^{rule}"):
        Capture(**fields)


@pytest.mark.parametrize(
    ("latitude", "longitude"), [(90.5, 0), (0, -180.01), (float("inf"), 0), (None, 3)], ids=str
)
def test_a_location_off_the_globe_is_refused(latitude: Any, longitude: Any) -> None:
    with pytest.raises(InvalidPayload, match=r"^location\.(latitude|longitude) must be a (finite )?number"):
        Location(latitude=latitude, longitude=longitude)


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
