"""What S3 refuses of a browser's upload (SPEC 17), against LocalStack's S3, which checks a POST's
policy where moto's server stores whatever is posted (tests/integration/test_uploads.py shows it).

A registration through the real library (real PostgreSQL, the upload function's S3 client), then a
multipart POST of its fields and a body, as a browser sends it. Each refusal is pinned to S3's
status, error code and, for a policy condition, the condition it names, so that a change in what
the policy binds fails here; and nothing is stored at any key. LocalStack 2026.3.0 enforces every
condition the policy carries: the key, both ends of `content-length-range` (an empty body is
EntityTooSmall), the Content-Type and the encryption. What it does not check is the policy's
signature: a policy rewritten by the client with its signature left as it was is accepted
(LocalStack's validate_post_policy: "TODO: validate the signature"), where AWS refuses it, the
signature no longer matching the policy; the last test pins that gap, so that nothing here claims
more.
"""

from __future__ import annotations

import base64
import json
import uuid
import xml.etree.ElementTree as ET
from dataclasses import replace
from typing import Any

import pytest
import requests
from botocore.exceptions import ClientError
from sqlalchemy import Engine

from devkit import handlers, samples, stack
from devkit.poller import LambdaContext
from photo_publish import bootstrap, uploads
from photo_publish.contracts import PHOTO_PUBLISHED, PhotoPublishedPayload
from tests.conftest import BUCKET, STAGE, Infra
from tests.localstack.flow import arrived, counts, outbox
from tests.polling import poll_until
from tests.rows import job, photo, published

pytestmark = pytest.mark.localstack
relay = handlers.load("relay")

JPEG = (samples.IMAGES / "Garden.jpg").read_bytes()


def register(infra: Infra, db: Engine, **overrides: Any) -> uploads.Registration:
    """A registration as the upload function makes it (its S3 client signs the POST)."""
    settings = overrides.pop("settings", infra.settings)
    request = {
        "album_id": str(uuid.uuid4()),
        "file_name": "Garden.jpg",
        "content_type": "image/jpeg",
        "size": len(JPEG),
        "caller": uploads.BACKEND,
    }
    return uploads.register(db, bootstrap.s3_client(), settings, **(request | overrides))


def post(registration: uploads.Registration, data: bytes, **fields: str) -> requests.Response:
    """What the browser does with the answer (a field changed where told): the fields, then the file."""
    return requests.post(
        registration.url,
        data=registration.fields | fields,
        files={"file": ("Garden.jpg", data)},
        timeout=30,
    )


def error(response: requests.Response) -> tuple[int, str, str]:
    """S3's answer to a refused POST: (status, error code, message)."""
    root = ET.fromstring(response.content)
    return response.status_code, root.findtext("Code") or "", root.findtext("Message") or ""


def stored(infra: Infra, key: str) -> bool:
    try:
        infra.s3.head_object(Bucket=BUCKET, Key=key)
    except ClientError as missing:
        assert missing.response["Error"]["Code"] == "404", missing.response
        return False
    return True


def condition_failed(condition: Any) -> str:
    """S3's message for a policy condition the POST does not meet, the condition as JSON."""
    return f"Invalid according to Policy: Policy Condition failed: {json.dumps(condition)}"


def test_a_body_larger_than_the_declared_size_is_refused_before_anything_is_stored(
    infra: Infra, db: Engine
) -> None:
    # GIVEN a registration that declared the file's size
    registration = register(infra, db)

    # WHEN the browser posts one byte more
    response = post(registration, JPEG + b"\0")

    # THEN S3 refuses it as too large, with the range's maximum, and stores nothing
    assert error(response)[:2] == (400, "EntityTooLarge")
    root = ET.fromstring(response.content)
    assert (root.findtext("MaxSizeAllowed"), root.findtext("ProposedSize")) == (
        str(len(JPEG)),
        str(len(JPEG) + 1),
    )
    assert not stored(infra, registration.key)


def test_without_a_declared_size_the_limit_is_max_original_bytes(infra: Infra, db: Engine) -> None:
    # GIVEN a registration without a size, under a small MAX_ORIGINAL_BYTES
    settings = replace(infra.settings, max_original_bytes=len(JPEG))
    registration = register(infra, db, size=None, settings=settings)

    # WHEN the browser posts more than that
    response = post(registration, JPEG + b"\0")

    # THEN S3 refuses it as too large, and stores nothing
    assert error(response)[:2] == (400, "EntityTooLarge")
    assert not stored(infra, registration.key)


def test_an_empty_body_is_refused_below_the_ranges_minimum(infra: Infra, db: Engine) -> None:
    registration = register(infra, db)

    response = post(registration, b"")

    assert error(response)[:2] == (400, "EntityTooSmall")
    assert ET.fromstring(response.content).findtext("MinSizeAllowed") == "1"
    assert not stored(infra, registration.key)


def test_the_fields_with_another_key_are_refused_and_nothing_is_stored_at_either(
    infra: Infra, db: Engine
) -> None:
    # GIVEN a registration, and another photo's key in the same album
    registration = register(infra, db)
    other = registration.key.replace(str(registration.photo_id), str(uuid.uuid4()))

    # WHEN the browser posts the fields with that key instead
    response = post(registration, JPEG, key=other)

    # THEN S3 refuses it by the key's condition, and neither key holds an object
    assert error(response) == (403, "AccessDenied", condition_failed(["eq", "$key", registration.key]))
    assert not stored(infra, other)
    assert not stored(infra, registration.key)


@pytest.mark.parametrize(
    ("field", "value", "condition"),
    [
        ("Content-Type", "image/png", {"Content-Type": "image/jpeg"}),
        ("Content-Type", "text/html", {"Content-Type": "image/jpeg"}),
        ("x-amz-server-side-encryption", "aws:kms", {"x-amz-server-side-encryption": "AES256"}),
    ],
)
def test_another_content_type_or_encryption_is_refused_and_nothing_is_stored(
    infra: Infra, db: Engine, field: str, value: str, condition: dict[str, str]
) -> None:
    registration = register(infra, db)

    response = post(registration, JPEG, **{field: value})

    assert error(response) == (403, "AccessDenied", condition_failed(condition))
    assert not stored(infra, registration.key)


def test_refused_posts_leave_the_photo_waiting_and_send_no_notification(infra: Infra, db: Engine) -> None:
    # GIVEN a registration whose every wrong POST was refused
    registration = register(infra, db)
    assert post(registration, JPEG + b"\0").status_code == 400
    assert post(registration, JPEG, **{"Content-Type": "image/png"}).status_code == 403

    # THEN the photo is still waiting for its upload, and the queue got nothing
    assert uploads.status(db, registration.photo_id, caller=uploads.BACKEND)["state"] == "processing"  # type: ignore[index]
    assert job(db, registration.photo_id)[0] == "pending"
    assert counts(infra, infra.queues.url) == (0, 0, 0)


def test_an_allowed_upload_is_stored_as_declared_and_published_to_the_bus(
    infra: Infra, db: Engine, bus: stack.Subscriber
) -> None:
    # GIVEN a registration, and a rule on the bus sending photo-publish's events to a queue
    registration = register(infra, db)
    assert registration.fields["x-amz-algorithm"] == "AWS4-HMAC-SHA256"

    # WHEN the browser posts the fields and the file as declared (SigV4, as AWS requires)
    response = post(registration, JPEG)

    # THEN S3 stores it at the key, with the declared type and the bucket's encryption
    assert (response.status_code, response.content) == (204, b"")
    head = infra.s3.head_object(Bucket=BUCKET, Key=registration.key)
    assert (head["ContentLength"], head["ContentType"], head["ServerSideEncryption"]) == (
        len(JPEG),
        "image/jpeg",
        "AES256",
    )
    assert registration.key.startswith(f"{STAGE}/originals/albums/{registration.album_id}/")

    # AND its notification reaches the process handler, which publishes the photo
    poll_until(infra, published(db, registration.photo_id))
    assert photo(db, registration.photo_id) == ("ready", None, 2)
    assert uploads.status(db, registration.photo_id, caller=uploads.BACKEND)["state"] == "published"  # type: ignore[index]

    # AND photo.published reaches the subscriber's queue through the bus (the hand-off after the
    # commit sent it; the relay, on its schedule, finds nothing left to send)
    (envelope,) = arrived(infra, bus, 1)
    assert (envelope["source"], envelope["detail-type"]) == ("photo-publish", PHOTO_PUBLISHED)
    (row,) = outbox(db, registration.photo_id)
    assert envelope["detail"]["eventId"] == str(row.id) and row.published_at is not None
    payload = PhotoPublishedPayload.from_json(envelope["detail"]["data"])
    assert (payload.photo_id, payload.entity_version) == (registration.photo_id, 2)
    assert relay.lambda_handler({"source": "aws.events"}, LambdaContext(60))["published"] == 0


def test_localstack_does_not_check_the_policys_signature(infra: Infra, db: Engine) -> None:
    """A gap of the emulator, pinned so that this file never claims more: AWS refuses a policy the
    client rewrote (the signature no longer matches it); LocalStack checks the rewritten policy's
    conditions and stores the upload."""
    # GIVEN a registration whose policy the client rewrote to allow a larger body
    registration = register(infra, db)
    policy = json.loads(base64.b64decode(registration.fields["policy"]))
    policy["conditions"] = [
        ["content-length-range", 1, 10 * len(JPEG)] if c[0] == "content-length-range" else c
        for c in policy["conditions"]
        if isinstance(c, list)
    ] + [c for c in policy["conditions"] if isinstance(c, dict)]
    forged = base64.b64encode(json.dumps(policy).encode()).decode()

    # WHEN the browser posts a larger body with it, the signature unchanged
    response = post(registration, JPEG + b"\0", policy=forged)

    # THEN LocalStack stores it (AWS would not)
    assert response.status_code == 204
    assert stored(infra, registration.key)


@pytest.mark.parametrize("file_name", ["${filename}", "holiday-${filename}", "$${filename}}"])
def test_a_form_registered_with_a_substitution_in_its_name_stores_only_the_registered_key(
    infra: Infra, db: Engine, file_name: str
) -> None:
    # GIVEN a registration whose file name asked S3 to substitute the posted file's name
    registration = register(infra, db, file_name=file_name)
    prefix = registration.key.rsplit("/", 1)[0] + "/"

    # WHEN the browser posts files of other names, and a form whose key asks for the substitution
    for part in ("holiday.jpg", "a/b/c.jpg", "other.jpg"):
        sent = requests.post(
            registration.url, data=registration.fields, files={"file": (part, JPEG)}, timeout=30
        )
        assert sent.status_code in (200, 201, 204), sent.text
    substituted = post(registration, JPEG, key=prefix + "${filename}")

    # THEN the substitution is refused by the key's condition, and the one object under the photo's
    # folder is the registered key, which holds no `${`
    assert error(substituted) == (403, "AccessDenied", condition_failed(["eq", "$key", registration.key]))
    listed = infra.s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    assert [o["Key"] for o in listed] == [registration.key]
    assert "${" not in registration.key
