"""The upload function (SPEC 11, 17) on API Gateway's HTTP API events (payload 2.0), as the sample
event and the gallery's stand-in shape them, through its real parts: PostgreSQL, moto's S3, the
process function and the sweep. A malformed request is answered with its reason, never a crash; an
unknown photo or route is 404; behind a JWT authorizer a photo is its registering user's."""

from __future__ import annotations

import base64
import copy
import json
import uuid
from typing import Any

import pytest
import requests
from sqlalchemy import Engine, func, select, text

from devkit import gallery, handlers
from devkit.poller import LambdaContext
from photo_publish import bootstrap, uploads
from photo_publish.adapters.models import Photo
from tests import cdn
from tests.conftest import BUCKET, STAGE, Infra, load_event
from tests.integration.test_uploads import JPEG
from tests.polling import poll_until
from tests.rows import published

upload = handlers.load("upload")


def http_event(method: str, path: str, route: str, body: Any = None, **parameters: str) -> dict[str, Any]:
    """A request as API Gateway hands it over (the sample's shape, the backend's authorizer)."""
    event = copy.deepcopy(load_event("http_api_register"))
    event["routeKey"] = event["requestContext"]["routeKey"] = f"{method} {route}"
    event["rawPath"] = event["requestContext"]["http"]["path"] = path
    event["requestContext"]["http"]["method"] = method
    event["pathParameters"] = parameters
    event["body"] = None if body is None else (body if isinstance(body, str) else json.dumps(body))
    return event


def call(method: str, path: str, route: str, body: Any = None, **parameters: str) -> dict[str, Any]:
    """The function's answer to a request."""
    answer: dict[str, Any] = upload.lambda_handler(
        http_event(method, path, route, body, **parameters), LambdaContext()
    )
    return answer


def register(album_id: str, body: Any) -> dict[str, Any]:
    return call("POST", f"/albums/{album_id}/photos", "/albums/{albumId}/photos", body, albumId=album_id)


def stand_in_event(
    method: str, path: str, route: str, params: dict[str, str], body: str | None, *, b64: bool = False
) -> dict[str, Any]:
    """A request as the gallery's stand-in for API Gateway's HTTP API hands it over (payload 2.0)."""
    data = b"" if body is None else (base64.b64decode(body) if b64 else body.encode())
    answer = gallery.json_request(method, route, path, params, data)
    if body == "":
        answer["body"] = ""
    return answer


def stand_in_register(body: str | None, b64: bool = False) -> dict[str, Any]:
    album = str(uuid.uuid4())
    return upload.lambda_handler(
        stand_in_event(
            "POST", f"/albums/{album}/photos", "/albums/{albumId}/photos", {"albumId": album}, body, b64=b64
        ),
        LambdaContext(10, function_name="upload"),
    )


def stand_in_call(
    method: str, path: str, route: str, params: dict[str, str], body: str | None = None
) -> dict[str, Any]:
    return upload.lambda_handler(
        stand_in_event(method, path, route, params, body), LambdaContext(10, function_name="upload")
    )


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


def test_an_unknown_photo_or_route_is_404(infra: Infra, db: Engine) -> None:
    for method in ("GET", "DELETE"):
        for pid in (str(uuid.uuid4()), "nonsense", str(uuid.uuid4()).upper()):
            a = stand_in_call(method, f"/photos/{pid}", "/photos/{photoId}", {"photoId": pid})
            assert a["statusCode"] == 404, (method, pid, a)
    a = stand_in_call("PUT", "/photos/x", "/photos/{photoId}", {"photoId": "x"})
    assert a["statusCode"] == 404


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


# --- who calls: the caller as the authorizer says ---------------------------------------------------


def as_caller(event: dict[str, Any], authorizer: Any) -> dict[str, Any]:
    """The event as API Gateway hands it over behind another authorizer (`authorizer` is the
    requestContext's block; a missing one is a route without authorization)."""
    if authorizer is None:
        event["requestContext"].pop("authorizer", None)
    else:
        event["requestContext"]["authorizer"] = authorizer
    return event


def jwt(sub: Any = None, **claims: Any) -> dict[str, Any]:
    return {"jwt": {"claims": ({"sub": sub} if sub is not None else {}) | claims, "scopes": None}}


def request(method: str, path: str, route: str, authorizer: Any, body: Any = None, **parameters: str) -> int:
    """The status of a request made under `authorizer`."""
    event = as_caller(http_event(method, path, route, body, **parameters), authorizer)
    return int(upload.lambda_handler(event, LambdaContext())["statusCode"])


def register_as(authorizer: Any, album_id: str, file_name: str = "a.jpg") -> dict[str, Any]:
    event = copy.deepcopy(load_event("http_api_register"))
    event["rawPath"] = event["requestContext"]["http"]["path"] = f"/albums/{album_id}/photos"
    event["pathParameters"] = {"albumId": album_id}
    event["body"] = json.dumps({"fileName": file_name, "contentType": "image/jpeg"})
    answer: dict[str, Any] = upload.lambda_handler(as_caller(event, authorizer), LambdaContext())
    return answer


@pytest.mark.parametrize(
    "authorizer",
    [
        jwt(None, client_id="machine"),
        jwt(""),
        jwt(42),
        jwt(["alice"]),
        {"jwt": {"claims": None}},
        {"jwt": None},
        {"lambda": {"sub": "alice"}},
        {},
        None,
    ],
    ids=[
        "jwt-no-sub",
        "jwt-empty-sub",
        "jwt-sub-number",
        "jwt-sub-list",
        "jwt-claims-null",
        "jwt-null",
        "lambda-authorizer",
        "empty-authorizer",
        "no-authorizer",
    ],
)
def test_a_request_without_a_usable_subject_is_401_and_touches_no_photo(
    infra: Infra, db: Engine, authorizer: Any
) -> None:
    # GIVEN alice's photo, registered behind the JWT authorizer
    made = register_as(jwt("alice"), str(uuid.uuid4()))
    assert made["statusCode"] == 201
    photo = json.loads(made["body"])["photoId"]

    # WHEN a caller with no usable subject reads it, deletes it, or registers
    path = f"/photos/{photo}"
    read = request("GET", path, "/photos/{photoId}", authorizer, photoId=photo)
    deleted = request("DELETE", path, "/photos/{photoId}", authorizer, photoId=photo)
    registered = register_as(authorizer, str(uuid.uuid4()))["statusCode"]

    # THEN each is 401, never the backend's rights, and alice's photo is still hers
    assert (read, deleted, registered) == (401, 401, 401)
    assert request("GET", path, "/photos/{photoId}", jwt("alice"), photoId=photo) == 200


def _with_jwt(e: dict[str, Any], sub: str) -> dict[str, Any]:
    """The event behind the JWT authorizer, with `sub`'s token."""
    e["headers"]["authorization"] = f"Bearer token-of-{sub}"
    return as_caller(e, jwt(sub, aud="app"))


def test_behind_a_jwt_authorizer_only_the_user_who_registered_a_photo_reads_or_deletes_it(
    infra: Infra, db: Engine
) -> None:
    """SPEC 17, who may call: behind a JWT authorizer the function is called with end users' tokens,
    and a photo's id is in every URL of its variants: seeing an image must not be enough to delete
    it. The token's subject that registered a photo owns it."""
    album = str(uuid.uuid4())
    body = '{"fileName": "alice.jpg", "contentType": "image/jpeg"}'
    e = stand_in_event(
        "POST", f"/albums/{album}/photos", "/albums/{albumId}/photos", {"albumId": album}, body
    )
    made = upload.lambda_handler(_with_jwt(e, "alice"), LambdaContext(10, function_name="upload"))
    assert made["statusCode"] == 201
    photo = json.loads(made["body"])["photoId"]

    def as_user(method: str, sub: str) -> int:
        e = stand_in_event(method, f"/photos/{photo}", "/photos/{photoId}", {"photoId": photo}, None)
        answer: dict[str, Any] = upload.lambda_handler(
            _with_jwt(e, sub), LambdaContext(10, function_name="upload")
        )
        return int(answer["statusCode"])

    # another user's token is answered as for an unknown photo, and changes nothing
    assert (as_user("GET", "mallory"), as_user("DELETE", "mallory")) == (404, 404)
    assert as_user("GET", "alice") == 200
    # the owner's deletion goes through; the app's backend (AWS_IAM, no token) may delete any photo
    assert as_user("DELETE", "alice") == 204
    again = uploads.register(
        db,
        infra.s3,
        infra.settings,
        album_id=album,
        file_name="b.jpg",
        content_type="image/jpeg",
        caller=uploads.User("alice"),
    )
    assert (
        stand_in_call(
            "DELETE", f"/photos/{again.photo_id}", "/photos/{photoId}", {"photoId": str(again.photo_id)}
        )["statusCode"]
        == 204
    )


# --- albums behind the JWT authorizer ---------------------------------------------------------------


def test_behind_a_jwt_authorizer_another_users_registration_into_an_album_is_403(
    infra: Infra, db: Engine
) -> None:
    # GIVEN alice's album: she registered into it first
    album = str(uuid.uuid4())
    assert register_as(jwt("alice"), album)["statusCode"] == 201

    # WHEN mallory registers into it
    answer = register_as(jwt("mallory"), album, "mine.jpg")

    # THEN 403 ALBUM_FORBIDDEN, and nothing of mallory's is written
    assert answer["statusCode"] == 403
    assert json.loads(answer["body"])["reason"] == "ALBUM_FORBIDDEN"
    with db.connect() as c:
        assert c.execute(text("SELECT owner FROM photos")).scalars().all() == ["alice"]


# --- malformed requests -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        "[" * 100_000 + "]" * 100_000,
        '{"fileName": "a.jpg", "contentType": "image/jpeg", "x": ' + "[" * 5_000 + "]" * 5_000 + "}",
        '{"fileName": "a.jpg", "contentType": "image/jpeg", "size": ' + "9" * 5_000 + "}",
        '{"fileName": "a.jpg", "contentType": "image/jpeg", "size": ' + "9" * 4_000 + "}",
        '{"fileName": "' + "a" * 20_000 + '.jpg", "contentType": "image/jpeg"}',
        json.dumps(json.dumps({"fileName": "a.jpg", "contentType": "image/jpeg"})),
    ],
    ids=[
        "nested-100000-deep",
        "nested-5000-deep-inside",
        "size-5000-digits",
        "size-4000-digits",
        "body-20-kb",
        "an-object-inside-a-string",
    ],
)
def test_a_malformed_body_is_400_with_a_reason_a_person_can_read(infra: Infra, db: Engine, body: str) -> None:
    # GIVEN a body no registration can be: too deep, a number too long, too large, not an object
    # WHEN it is posted
    answer = register(str(uuid.uuid4()), body)

    # THEN 400 with a reason and a sentence, never the function's crash, and nothing is written
    assert answer["statusCode"] == 400, answer
    refused = json.loads(answer["body"])
    assert set(refused) == {"reason", "message"}
    assert refused["reason"] in ("BODY_INVALID", "BODY_TOO_LARGE", "SIZE_INVALID")
    assert 10 < len(refused["message"]) < 300
    with db.connect() as c:
        assert c.scalar(text("SELECT count(*) FROM photos")) == 0


def test_a_base64_body_that_is_not_base64_is_400(infra: Infra, db: Engine) -> None:
    # GIVEN a body flagged base64 that is not
    event = copy.deepcopy(load_event("http_api_register"))
    event["body"], event["isBase64Encoded"] = "not base64!", True

    # WHEN it is posted, THEN 400 BODY_INVALID
    answer = upload.lambda_handler(event, LambdaContext())
    assert answer["statusCode"] == 400
    assert json.loads(answer["body"])["reason"] == "BODY_INVALID"


@pytest.mark.parametrize(
    ("body", "b64", "status"),
    [
        # a lone surrogate is valid JSON ("\ud800") but no UTF-8: cleaned away like a control
        ('{"fileName": "a\\ud800.jpg", "contentType": "image/jpeg", "size": 10}', False, 201),
        # a content type of the wrong JSON type: unhashable in `not in ACCEPTED_TYPES`
        ('{"fileName": "a.jpg", "contentType": ["image/jpeg"], "size": 10}', False, 400),
        ('{"fileName": "a.jpg", "contentType": {"x": 1}, "size": 10}', False, 400),
        # a base64 body that is not UTF-8 (API Gateway base64-encodes a binary body)
        (base64.b64encode(b"\xff\xfe{}").decode(), True, 400),
    ],
    ids=["lone-surrogate-file-name", "content-type-list", "content-type-object", "base64-not-utf8"],
)
def test_a_malformed_registration_is_answered_never_a_crash(
    infra: Infra, db: Engine, body: str, b64: bool, status: int
) -> None:
    """SPEC 17: bad requests get 400 with a reason (a crash is API Gateway's 500)."""
    answer = stand_in_register(body, b64)
    assert answer["statusCode"] == status, answer
    with db.connect() as c:
        assert c.scalar(select(func.count()).select_from(Photo)) == (status == 201)
    if status == 400:
        assert json.loads(answer["body"])["reason"] in ("BODY_INVALID", "CONTENT_TYPE_UNSUPPORTED")
    else:
        assert json.loads(answer["body"])["key"].endswith("/a.jpg")


@pytest.mark.parametrize(
    "body, status",
    [
        (None, 400),
        ("", 400),
        ("[]", 400),
        ("nul", 400),
        ('"x"', 400),
        ('{"fileName": "..", "contentType": "image/jpeg"}', 400),
        ('{"fileName": "a.jpg", "contentType": "image/jpeg", "size": "10"}', 400),
        ('{"fileName": "a.jpg", "contentType": "image/jpeg", "size": true}', 400),
        ('{"fileName": "a.jpg", "contentType": "image/jpeg", "size": 1e400}', 400),
        ('{"fileName": "a.jpg", "contentType": "image/svg+xml"}', 400),
        ('{"fileName": "a.jpg", "contentType": "image/jpeg", "size": 104857601}', 400),
        ('{"fileName": "' + "\u00e9" * 300 + '.jpeg", "contentType": "image/jpeg"}', 201),
        # a right-to-left override (shown as "exe.jpg") is a format character: cleaned away
        ('{"fileName": "\u202egpj.exe", "contentType": "image/jpeg"}', 201),
    ],
)
def test_a_registration_is_refused_or_cleaned(
    infra: Infra, db: Engine, body: str | None, status: int
) -> None:
    answer = stand_in_register(body)
    assert answer["statusCode"] == status, answer
    if status == 201:
        name = json.loads(answer["body"])["key"].rsplit("/", 1)[1]
        assert len(name.encode()) <= 255
        assert "\u202e" not in name


def members(method: str, authorizer: Any, album_id: str, user_id: str) -> dict[str, Any]:
    route = "/albums/{albumId}/members/{userId}"
    event = http_event(
        method, f"/albums/{album_id}/members/{user_id}", route, albumId=album_id, userId=user_id
    )
    answer: dict[str, Any] = upload.lambda_handler(as_caller(event, authorizer), LambdaContext())
    return answer


IAM = load_event("http_api_register")["requestContext"]["authorizer"]


def test_the_backend_shares_an_album_and_takes_it_back(infra: Infra, db: Engine) -> None:
    # GIVEN alice's album
    album = str(uuid.uuid4())
    assert register_as(jwt("alice"), album)["statusCode"] == 201

    # WHEN the backend shares it with bob, THEN bob registers into it
    assert members("PUT", IAM, album, "bob")["statusCode"] == 204
    assert members("PUT", IAM, album, "bob")["statusCode"] == 204  # again: nothing new
    assert register_as(jwt("bob"), album)["statusCode"] == 201

    # WHEN the backend takes it back, THEN bob is refused again, and a second removal is 404
    assert members("DELETE", IAM, album, "bob")["statusCode"] == 204
    assert register_as(jwt("bob"), album)["statusCode"] == 403
    assert members("DELETE", IAM, album, "bob")["statusCode"] == 404
    # AND alice, its owner, is no member to remove: she stays its owner
    assert members("DELETE", IAM, album, "alice")["statusCode"] == 404
    assert register_as(jwt("alice"), album)["statusCode"] == 201


def photo(method: str, user: str, photo_id: str) -> int:
    """A user's GET or DELETE of a photo, behind the JWT authorizer."""
    return request(method, f"/photos/{photo_id}", "/photos/{photoId}", jwt(user), photoId=photo_id)


def test_sharing_the_backends_album_gives_a_member_their_own_photos_and_an_unshare_takes_it_back(
    infra: Infra, db: Engine
) -> None:
    # GIVEN an album only the backend has registered into
    album = str(uuid.uuid4())
    backends = json.loads(register_as(IAM, album)["body"])["photoId"]

    # WHEN the backend shares it with carol
    assert members("PUT", IAM, album, "carol")["statusCode"] == 204

    # THEN carol registers and reads her own photo, dave does not register; the album stays the
    # backend's: carol neither reads nor deletes the backend's photo
    carols = json.loads(register_as(jwt("carol"), album)["body"])["photoId"]
    assert register_as(jwt("dave"), album)["statusCode"] == 403
    assert photo("GET", "carol", carols) == 200
    assert (photo("GET", "carol", backends), photo("DELETE", "carol", backends)) == (404, 404)

    # WHEN the backend takes it back, THEN carol registers no more: the membership was all she had
    assert members("DELETE", IAM, album, "carol")["statusCode"] == 204
    assert register_as(jwt("carol"), album)["statusCode"] == 403
    with db.connect() as c:
        assert c.execute(text("SELECT owner FROM albums")).scalars().all() == [None]


def test_an_album_the_backend_emptied_stays_no_users_to_claim(infra: Infra, db: Engine) -> None:
    # GIVEN an album the backend registered a photo into, then deleted it
    album = str(uuid.uuid4())
    first = json.loads(register_as(IAM, album)["body"])["photoId"]
    assert request("DELETE", f"/photos/{first}", "/photos/{photoId}", IAM, photoId=first) == 204

    # WHEN mallory registers into the empty album, and the backend puts another photo there
    claimed = register_as(jwt("mallory"), album)["statusCode"]
    later = json.loads(register_as(IAM, album)["body"])["photoId"]

    # THEN she was refused, and the backend's later photo is not hers to read or delete
    assert claimed == 403
    assert (photo("GET", "mallory", later), photo("DELETE", "mallory", later)) == (404, 404)


@pytest.mark.parametrize("method", ["PUT", "DELETE"])
def test_only_the_backend_shares_albums(infra: Infra, db: Engine, method: str) -> None:
    # GIVEN alice's album
    album = str(uuid.uuid4())
    assert register_as(jwt("alice"), album)["statusCode"] == 201

    # WHEN alice herself (a JWT) adds or removes a member
    answer = members(method, jwt("alice"), album, "mallory")

    # THEN 403 BACKEND_ONLY, and mallory is no member
    assert answer["statusCode"] == 403
    assert json.loads(answer["body"])["reason"] == "BACKEND_ONLY"
    assert register_as(jwt("mallory"), album)["statusCode"] == 403


def test_a_membership_of_an_album_id_that_is_no_uuid_is_400(infra: Infra, db: Engine) -> None:
    answer = members("PUT", IAM, "nope", "bob")
    assert answer["statusCode"] == 400
    assert json.loads(answer["body"])["reason"] == "ALBUM_ID_INVALID"


def test_an_albums_owner_reads_and_deletes_a_members_photo_and_the_member_not_the_owners(
    infra: Infra, db: Engine
) -> None:
    # GIVEN alice's album, shared with bob, and a photo of each in it
    album = str(uuid.uuid4())
    alices = json.loads(register_as(jwt("alice"), album)["body"])["photoId"]
    assert members("PUT", IAM, album, "bob")["statusCode"] == 204
    bobs = json.loads(register_as(jwt("bob"), album)["body"])["photoId"]

    # THEN bob neither reads nor deletes alice's photo (as for an unknown one)
    assert (photo("GET", "bob", alices), photo("DELETE", "bob", alices)) == (404, 404)
    # AND alice, the album's owner, reads and deletes bob's
    assert photo("GET", "alice", bobs) == 200
    assert photo("DELETE", "alice", bobs) == 204
    assert photo("GET", "bob", bobs) == 404


def test_an_album_the_backend_filled_is_no_users_to_claim(infra: Infra, db: Engine) -> None:
    # GIVEN an album the backend registered a photo into (no user owns it)
    album = str(uuid.uuid4())
    backends = json.loads(register_as(IAM, album)["body"])["photoId"]

    # WHEN mallory registers into it, reads and deletes the backend's photo
    claimed = register_as(jwt("mallory"), album)["statusCode"]
    path = f"/photos/{backends}"
    read = request("GET", path, "/photos/{photoId}", jwt("mallory"), photoId=backends)
    deleted = request("DELETE", path, "/photos/{photoId}", jwt("mallory"), photoId=backends)

    # THEN she is refused, and the photo is untouched: only the backend's sharing opens the album
    assert (claimed, read, deleted) == (403, 404, 404)
    with db.connect() as c:
        assert c.execute(text("SELECT owner FROM albums")).scalars().all() == [None]
        assert c.scalar(text("SELECT count(*) FROM photos")) == 1
