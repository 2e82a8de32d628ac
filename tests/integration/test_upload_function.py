"""The upload function (SPEC 11, 17) on API Gateway's HTTP API events (payload 2.0), through its
real parts: PostgreSQL, moto's S3, the process function and the sweep."""

from __future__ import annotations

import base64
import copy
import json
import uuid
from typing import Any

import pytest
import requests
from sqlalchemy import Engine

from devkit import handlers
from devkit.poller import LambdaContext
from photo_publish import bootstrap
from tests import cdn
from tests.conftest import BUCKET, STAGE, Infra, load_event
from tests.integration.test_uploads import JPEG
from tests.polling import poll_until
from tests.rows import published

upload = handlers.load("upload")


def call(method: str, path: str, route: str, body: Any = None, **parameters: str) -> dict[str, Any]:
    """The function's answer to a request as API Gateway hands it over (the sample's shape)."""
    event = copy.deepcopy(load_event("http_api_register"))
    event["routeKey"] = event["requestContext"]["routeKey"] = f"{method} {route}"
    event["rawPath"] = event["requestContext"]["http"]["path"] = path
    event["requestContext"]["http"]["method"] = method
    event["pathParameters"] = parameters
    event["body"] = None if body is None else (body if isinstance(body, str) else json.dumps(body))
    answer: dict[str, Any] = upload.lambda_handler(event, LambdaContext())
    return answer


def register(album_id: str, body: Any) -> dict[str, Any]:
    return call("POST", f"/albums/{album_id}/photos", "/albums/{albumId}/photos", body, albumId=album_id)


def test_a_registration_answers_201_with_a_post_that_publishes(infra: Infra, db: Engine) -> None:
    # GIVEN the sample event (a backend signed it; IAM authorized it): a HEIC of 2.4 MB
    answer = upload.lambda_handler(load_event("http_api_register"), LambdaContext())

    # THEN 201 with the photo id, the POST and its expiry
    assert answer["statusCode"] == 201
    registered = json.loads(answer["body"])
    assert set(registered) == {"photoId", "albumId", "key", "upload", "expiresAt"}
    assert registered["upload"]["fields"]["Content-Type"] == "image/heic"
    policy = json.loads(base64.b64decode(registered["upload"]["fields"]["policy"]))
    assert ["content-length-range", 1, 2481152] in policy["conditions"]

    # WHEN a JPEG is registered and posted, THEN it publishes and its status says so
    album = str(uuid.uuid4())
    answer = register(album, {"fileName": "Garden.jpg", "contentType": "image/jpeg", "size": len(JPEG)})
    registered = json.loads(answer["body"])
    form = registered["upload"]
    assert requests.post(form["url"], data=form["fields"], files={"file": ("g.jpg", JPEG)}, timeout=30).ok
    photo_id = uuid.UUID(registered["photoId"])
    poll_until(infra, published(db, photo_id))
    status = call("GET", f"/photos/{photo_id}", "/photos/{photoId}", photoId=str(photo_id))
    assert status["statusCode"] == 200
    assert json.loads(status["body"])["state"] == "published"

    # AND a deletion answers 204, then 404
    gone = call("DELETE", f"/photos/{photo_id}", "/photos/{photoId}", photoId=str(photo_id))
    assert gone["statusCode"] == 204
    again = call("DELETE", f"/photos/{photo_id}", "/photos/{photoId}", photoId=str(photo_id))
    assert again["statusCode"] == 404
    unknown = call("GET", f"/photos/{photo_id}", "/photos/{photoId}", photoId=str(photo_id))
    assert unknown["statusCode"] == 404


def test_a_photo_deleted_through_the_api_leaves_the_cdn_at_once(infra: Infra, db: Engine) -> None:
    # GIVEN the stack's distribution named to the function (the template's CDN_DISTRIBUTION_ID), and a
    # published photo whose variants its edges may hold for a year (immutable)
    distribution = cdn.distribution(BUCKET)
    infra.monkeypatch.setenv("CDN_DISTRIBUTION_ID", distribution)
    bootstrap.reset()
    album = str(uuid.uuid4())
    answer = register(album, {"fileName": "Garden.jpg", "contentType": "image/jpeg", "size": len(JPEG)})
    form = json.loads(answer["body"])["upload"]
    assert requests.post(form["url"], data=form["fields"], files={"file": ("g.jpg", JPEG)}, timeout=30).ok
    photo_id = uuid.UUID(json.loads(answer["body"])["photoId"])
    poll_until(infra, published(db, photo_id))

    # WHEN the app deletes it
    gone = call("DELETE", f"/photos/{photo_id}", "/photos/{photoId}", photoId=str(photo_id))

    # THEN CloudFront was asked, before the answer, to invalidate the photo's variants: one call, one
    # wildcard path covering every version and size
    assert gone["statusCode"] == 204
    assert cdn.invalidations(distribution) == [[f"/{STAGE}/albums/{album}/variants/{photo_id}/*"]]
    # AND nothing is left for the sweep to send
    assert cdn.waiting(db) == {}


@pytest.mark.parametrize(
    ("album", "body", "reason"),
    [
        ("nope", {"fileName": "a.jpg", "contentType": "image/jpeg"}, "ALBUM_ID_INVALID"),
        (None, {"fileName": "a.jpg", "contentType": "image/jpeg", "size": 10**12}, "SIZE_INVALID"),
        (None, {"fileName": "a.pdf", "contentType": "application/pdf"}, "CONTENT_TYPE_UNSUPPORTED"),
        (None, {"fileName": "///", "contentType": "image/png"}, "FILE_NAME_INVALID"),
        (None, "{not json", "BODY_INVALID"),
        (None, ["a list"], "BODY_INVALID"),
        (
            None,
            {"fileName": "a.jpg", "contentType": "image/jpeg", "keepLocation": "yes"},
            "KEEP_LOCATION_INVALID",
        ),
    ],
)
def test_a_bad_request_is_400_with_its_reason(
    infra: Infra, album: str | None, body: Any, reason: str
) -> None:
    answer = register(album or str(uuid.uuid4()), body)
    assert answer["statusCode"] == 400
    assert json.loads(answer["body"])["reason"] == reason
