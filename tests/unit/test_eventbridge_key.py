"""An EventBridge "Object Created" event's `detail.object.key` is URL-encoded like an S3
notification's key, and decoded once with form decoding (SPEC 2, SPEC 6).

Real-shaped events: the shipped SQS record (tests/events/sqs_eventbridge_object_created.json) with
its key written as each producer writes it: form-encoded ("+" for a space, "%2B" for a plus), as
the shipped event has it, and percent-encoded with `urllib.parse.quote` ("%20" for a space), as
LocalStack's S3 writes it into both its notifications and its EventBridge events
(localstack-core/localstack/services/s3/notifications.py: `key_name=quote(s3_object.key)`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from urllib.parse import quote, quote_plus
from uuid import UUID

import pytest

from photo_publish.events import from_sqs_body
from tests.conftest import BUCKET, STAGE, load_event

ALBUM_ID = UUID("7d3c6a52-1f0e-4b59-9a57-2a1f1c0f4e11")
PHOTO_ID = UUID("0b9f2d4e-8c61-4f6a-b2a3-6d5e4c3b2a10")
# A space, a plus, a percent sign and non-ASCII letters (NFC and an emoji).
FILE_NAME = "Été à Paris + 100% 写真 📷.jpg"
KEY = f"{STAGE}/originals/albums/{ALBUM_ID}/{PHOTO_ID}/{FILE_NAME}"


def eventbridge_body(encoded_key: str) -> str:
    """The shipped EventBridge record's body, its object key replaced."""
    body = json.loads(load_event("sqs_eventbridge_object_created")["Records"][0]["body"])
    body["detail"]["object"]["key"] = encoded_key
    return json.dumps(body)


def test_the_shipped_eventbridge_event_holds_a_form_encoded_key() -> None:
    # GIVEN the shipped event  WHEN its key is read  THEN it is the form encoding of a key with a
    # space, a plus and non-ASCII letters, decoded by the process function to the uploaded key
    body = json.loads(load_event("sqs_eventbridge_object_created")["Records"][0]["body"])
    encoded = body["detail"]["object"]["key"]
    assert "+" in encoded and "%2B" in encoded and "%C3%A9" in encoded
    (request,) = from_sqs_body(json.dumps(body), bucket=BUCKET, stage=STAGE)
    assert request.original is not None
    assert request.original.file_name == "My photo (2) + [final] 100% été.jpg"


@pytest.mark.parametrize(
    "encode",
    [
        pytest.param(lambda key: quote_plus(key, safe="/"), id="form-encoded-as-s3"),
        pytest.param(quote, id="percent-encoded-as-localstack"),
    ],
)
def test_an_eventbridge_key_with_a_space_a_plus_and_non_ascii_decodes_to_the_uploaded_key(
    encode: Callable[[str], str],
) -> None:
    # GIVEN an EventBridge "Object Created" record whose key its producer URL-encoded
    body = eventbridge_body(encode(KEY))

    # WHEN the process function reads it
    (request,) = from_sqs_body(body, bucket=BUCKET, stage=STAGE)

    # THEN it asks for the photo with the key exactly as uploaded: "+" and "%20" are spaces, "%2B"
    # a plus, and the UTF-8 escapes its letters
    assert request.photo_id == PHOTO_ID
    assert request.original is not None
    assert (request.original.key, request.original.file_name) == (KEY, FILE_NAME)
