"""Every event shape of SPEC 6, turned into the photos the process function works on."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from urllib.parse import quote_plus
from uuid import UUID

import pytest

from photo_publish.events import (
    MalformedMessage,
    PhotoRequest,
    from_s3_records,
    from_sqs_body,
    is_s3_event,
)
from photo_publish.keys import OriginalKey, Upload
from tests.conftest import BUCKET, STAGE, load_event

ALBUM_ID = UUID("7d3c6a52-1f0e-4b59-9a57-2a1f1c0f4e11")
PHOTO_ID = UUID("0b9f2d4e-8c61-4f6a-b2a3-6d5e4c3b2a10")
FILE_NAME = "My photo (2) + [final] 100% été.jpg"
KEY = f"dev/originals/albums/{ALBUM_ID}/{PHOTO_ID}/{FILE_NAME}"
# The shipped events' upload: S3's sequencer, the object's eTag and the event's time (S3's
# notification to the millisecond, EventBridge's to the second).
SEQUENCER, ETAG = "0055AED6DCD90281E5", "32268be4325293ad107c6f595607e7ba"
UPLOAD = PhotoRequest(
    PHOTO_ID,
    OriginalKey(KEY, ALBUM_ID, PHOTO_ID, FILE_NAME),
    Upload(SEQUENCER, ETAG, datetime(2026, 11, 29, 10, 15, 30, 123000, tzinfo=UTC)),
)
EB_UPLOAD = PhotoRequest(
    PHOTO_ID,
    OriginalKey(KEY, ALBUM_ID, PHOTO_ID, FILE_NAME),
    Upload(SEQUENCER, ETAG, datetime(2026, 11, 29, 10, 15, 30, tzinfo=UTC)),
)
JOB = PhotoRequest(PHOTO_ID)


def bodies(event_file: str) -> list[str]:
    return [record["body"] for record in load_event(event_file)["Records"]]


def s3_notification(encoded_key: str, *, bucket: str = BUCKET, event_name: str = "ObjectCreated:Put") -> str:
    s3 = {"bucket": {"name": bucket}, "object": {"key": encoded_key, "size": 1}}
    return json.dumps({"Records": [{"eventSource": "aws:s3", "eventName": event_name, "s3": s3}]})


def eventbridge(encoded_key: str, *, bucket: str = BUCKET, detail_type: str = "Object Created") -> str:
    detail = {"bucket": {"name": bucket}, "object": {"key": encoded_key, "size": 1}}
    return json.dumps({"source": "aws.s3", "detail-type": detail_type, "detail": detail})


def parse(body: str) -> list[PhotoRequest]:
    return from_sqs_body(body, bucket=BUCKET, stage=STAGE)


@pytest.mark.parametrize(
    ("event_file", "expected"),
    [
        ("sqs_job_message", [JOB]),
        ("sqs_s3_notification", [UPLOAD]),
        ("sqs_eventbridge_object_created", [EB_UPLOAD]),
    ],
)
def test_an_sqs_body_of_each_shape_asks_for_its_photo(event_file: str, expected: list[PhotoRequest]) -> None:
    # GIVEN the body of a job message, an S3 notification or an EventBridge "Object Created" event
    (body,) = bodies(event_file)

    # WHEN it is read
    requests = parse(body)

    # THEN it asks for the photo; an upload also carries its decoded original key
    assert requests == expected


def test_a_direct_s3_event_asks_for_the_uploaded_photo() -> None:
    # GIVEN S3 invoking the function itself
    event = load_event("s3_object_created")

    # WHEN its records are read
    requests = from_s3_records(event["Records"], bucket=BUCKET, stage=STAGE)

    # THEN it asks for the uploaded photo with its decoded original key
    assert requests == [UPLOAD]


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (load_event("s3_object_created"), True),
        (load_event("sqs_s3_notification"), False),
        (load_event("sqs_job_message"), False),
        ({"Records": []}, False),
        ({}, False),
    ],
    ids=["s3", "sqs-s3-notification", "sqs-job", "no-records", "empty"],
)
def test_is_s3_event_tells_s3_invoking_the_function_from_an_sqs_batch(event: dict, expected: bool) -> None:
    # GIVEN / WHEN a Lambda event is classified
    # THEN only S3's own invocation counts as a direct S3 event
    assert is_s3_event(event) is expected


TRICKY_FILE_NAMES = [
    FILE_NAME,
    "a b.jpg",
    "c++.jpg",
    "100%.jpg",
    "100%25.jpg",
    "already%2Fescaped.jpg",
    "[final] (2).jpg",
    "été.jpg",
    "写真 📷.jpg",
    "~!@#$&'()*,;=.jpg",
]


@pytest.mark.parametrize("file_name", TRICKY_FILE_NAMES)
@pytest.mark.parametrize("safe", ["/", ""], ids=["aws", "emulator-escapes-slash"])
@pytest.mark.parametrize("envelope", [s3_notification, eventbridge], ids=["notification", "eventbridge"])
def test_an_encoded_key_is_decoded_once_into_the_uploaded_key(
    file_name: str, safe: str, envelope: Callable[[str], str]
) -> None:
    # GIVEN an upload whose key S3 (or an emulator that also escapes "/") encodes in its event
    key = f"dev/originals/albums/{ALBUM_ID}/{PHOTO_ID}/{file_name}"
    body = envelope(quote_plus(key, safe=safe))

    # WHEN the event is read
    requests = parse(body)

    # THEN the request carries the key exactly as uploaded
    assert requests == [PhotoRequest(PHOTO_ID, OriginalKey(key, ALBUM_ID, PHOTO_ID, file_name), Upload())]


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(bodies("sqs_irrelevant")[0], id="s3-test-event"),
        pytest.param(bodies("sqs_irrelevant")[1], id="variants-key"),
        pytest.param(bodies("sqs_irrelevant")[2], id="object-removed"),
        pytest.param(bodies("sqs_irrelevant")[3], id="another-stage-originals"),
        pytest.param(
            s3_notification(quote_plus(KEY, safe="/"), bucket="another-bucket"), id="another-bucket"
        ),
        pytest.param(eventbridge(quote_plus(KEY, safe="/"), bucket="another-bucket"), id="eb-another-bucket"),
        pytest.param(eventbridge(quote_plus(KEY, safe="/"), detail_type="Object Deleted"), id="eb-deleted"),
        pytest.param(json.dumps({"Records": []}), id="no-records"),
    ],
)
def test_an_irrelevant_body_asks_for_nothing(body: str) -> None:
    # GIVEN a well-formed record that is not ours to act on
    # WHEN it is read
    # THEN it asks for no photo (and raises nothing: it is acknowledged)
    assert parse(body) == []


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(bodies("sqs_malformed")[0], id="not-json"),
        pytest.param(bodies("sqs_malformed")[1], id="unknown-shape"),
        pytest.param(bodies("sqs_malformed")[2], id="photo-id-not-a-uuid"),
        pytest.param(bodies("sqs_malformed")[3], id="originals-key-off-the-layout"),
        pytest.param(bodies("sqs_malformed")[4], id="s3-record-without-s3"),
        pytest.param(json.dumps([{"photoId": str(PHOTO_ID)}]), id="json-list"),
        pytest.param(json.dumps("photo"), id="json-string"),
        pytest.param(json.dumps({"photoId": 42}), id="photo-id-a-number"),
        pytest.param(json.dumps({"photoId": None}), id="photo-id-null"),
        pytest.param(json.dumps({"Records": {"s3": {}}}), id="records-not-a-list"),
        pytest.param(json.dumps({"Records": [42]}), id="record-not-an-object"),
        pytest.param(
            eventbridge(f"dev/originals/albums/{ALBUM_ID}/x.jpg"), id="eb-originals-key-off-the-layout"
        ),
        pytest.param(
            json.dumps({"source": "aws.s3", "detail-type": "Object Created", "detail": {}}),
            id="eb-without-bucket",
        ),
        pytest.param(
            json.dumps({"source": "aws.s3", "detail": {"bucket": {"name": BUCKET}}}),
            id="eb-without-detail-type",
        ),
        # 200 KB of nested arrays: deeper than the JSON parser's recursion limit.
        pytest.param("[" * 100_000 + "]" * 100_000, id="nested-deeper-than-the-parser"),
        pytest.param('{"photoId": ' + "[" * 100_000 + "]" * 100_000 + "}", id="nested-in-an-object"),
    ],
)
def test_a_malformed_body_is_refused_as_malformed(body: str) -> None:
    # GIVEN a body no producer of ours would send
    # WHEN it is read
    # THEN it is refused as malformed (acknowledged and counted, never retried)
    with pytest.raises(MalformedMessage):
        parse(body)


def test_uploads_of_one_key_are_told_apart_by_sequencer_and_etag() -> None:
    # GIVEN two notifications of the same key: S3's own, and one from an emulator with no sequencer
    record = load_event("s3_object_created")["Records"][0]
    bare = json.loads(s3_notification(quote_plus(KEY, safe="/")))["Records"][0]
    bare["s3"]["object"]["eTag"] = "0123"

    # WHEN they are read
    (aws,) = from_s3_records([record], bucket=BUCKET, stage=STAGE)
    (emulator,) = from_s3_records([bare], bucket=BUCKET, stage=STAGE)

    # THEN each carries what identifies its upload
    assert aws.upload == UPLOAD.upload
    assert emulator.upload == Upload(None, "0123")


@pytest.mark.parametrize(
    ("version", "read"),
    [("3HL4kqtJlcpXroDTDmJ.rmSpXd3dIbrHY", "3HL4kqtJlcpXroDTDmJ.rmSpXd3dIbrHY"), ("null", None), ("", None)],
)
def test_an_uploads_object_version_is_read_from_either_shape_of_event(version: str, read: str | None) -> None:
    # GIVEN an S3 notification naming its object's versionId, and an EventBridge event its version-id
    # (a versioned bucket's; "null" is the version of an object written while versioning was off)
    notification = json.loads(s3_notification(quote_plus(KEY, safe="/")))
    notification["Records"][0]["s3"]["object"] |= {"eTag": ETAG, "versionId": version}
    bridged = json.loads(eventbridge(quote_plus(KEY, safe="/")))
    bridged["detail"]["object"] |= {"etag": ETAG, "version-id": version}

    # WHEN they are read
    (from_s3,) = parse(json.dumps(notification))
    (from_bridge,) = parse(json.dumps(bridged))

    # THEN each upload names the version the process function reads (none for "null": a later write
    # while versioning is off replaces it under the same id, so only the eTag pins it)
    assert from_s3.upload == from_bridge.upload == Upload(None, ETAG, None, read)
