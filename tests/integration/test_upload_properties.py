"""The upload function's answer to any request API Gateway could hand it (SPEC 19), as a property.

Whole HTTP API 2.0 events for every route (and some no route has) go through `lambda_handler` on
the real database and moto's S3: bodies of any JSON shape, size and depth, text that is no JSON,
bytes that are no UTF-8, base64 flags on what is no base64, authorizers of every shape (AWS_IAM, a
JWT whose `sub` is absent, empty, of the wrong type, or a user's), path ids and names from every
Unicode category (lone surrogates included), sizes of any magnitude. The invariant: the answer is
one of 200/201/204/400/401/403/404 (never an exception, never a 5xx), and every photo row written
holds the key the server built (the canonical photo and album ids, a cleaned file name without
`${`) and the policy it answered binds exactly that key.

Sizes are Hypothesis profiles: `upload-ci` (the default, well under a minute) and `upload-long`
(HYPOTHESIS_PROFILE=long: 10,000 examples).
"""

from __future__ import annotations

import base64
import copy
import json
import os
import uuid
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, text

from devkit import handlers
from devkit.poller import LambdaContext
from photo_publish.keys import clean_file_name, parse_original_key
from photo_publish.uploads import ACCEPTED_TYPES
from tests.conftest import STAGE, Infra, load_event

upload = handlers.load("upload")

settings.register_profile(
    "upload-ci", max_examples=500, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.register_profile(
    "upload-long", max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck)
)
PROFILE = "upload-long" if os.environ.get("HYPOTHESIS_PROFILE") == "long" else "upload-ci"
ANSWERS = frozenset({200, 201, 204, 400, 401, 403, 404})
SAMPLE = load_event("http_api_register")
IAM = SAMPLE["requestContext"]["authorizer"]
# A few ids used again and again, so that albums have owners and members, and photos are found.
ALBUMS = [str(uuid.UUID(int=n)) for n in (1, 2, 3)]
USERS = ["alice", "bob", "carol"]
# Photo ids answered 201 by earlier examples: later ones read and delete them.
REGISTERED: list[str] = []

# Every Unicode category, lone surrogates (Cs) included: API Gateway's JSON can carry "\ud800".
anything_text = st.text(st.characters(exclude_categories=()), max_size=40)
names = st.one_of(
    anything_text,
    st.sampled_from(
        ["${filename}", "a/${filename}", "$${filename}}", "photo.jpg", "..", "/", "\u202egpj.exe"]
    ),
    st.builds(lambda a, b: a + "${filename}" + b, anything_text, anything_text),
    st.text(st.characters(exclude_categories=()), min_size=200, max_size=400),
)
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), anything_text
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(anything_text, inner, max_size=4),
    max_leaves=20,
)
# Of any magnitude: as JSON number text, built by hand (Python will not print an int of 5,000 digits).
size_texts = st.one_of(
    st.integers(min_value=-(10**20), max_value=10**12).map(str),
    st.from_regex(r"-?[0-9]{1,6000}(\.[0-9]{1,5})?([eE][-+]?[0-9]{1,5})?", fullmatch=True),
    st.sampled_from(["1e400", "-0", "0.0", "true", "null", '"10"', "[]", "{}"]),
)


@st.composite
def register_bodies(draw: st.DrawFn) -> str:
    """A registration's body, close to a good one in every way it can be wrong."""
    fields: dict[str, str] = {}
    if draw(st.booleans()):
        fields["fileName"] = json.dumps(draw(names | json_values))
    if draw(st.booleans()):
        fields["contentType"] = json.dumps(draw(st.sampled_from(sorted(ACCEPTED_TYPES)) | json_values))
    if draw(st.booleans()):
        fields["size"] = draw(size_texts)
    if draw(st.booleans()):
        fields["keepLocation"] = json.dumps(draw(st.booleans() | json_values))
    for key, value in draw(st.dictionaries(anything_text, json_values, max_size=2)).items():
        fields.setdefault(json.dumps(key)[1:-1], json.dumps(value))
    return "{" + ", ".join(f'"{key}": {value}' for key, value in fields.items()) + "}"


@st.composite
def good_bodies(draw: st.DrawFn) -> str:
    """A registration that may well be accepted: any file name, a type SPEC 3 decodes."""
    body = {"fileName": draw(names), "contentType": draw(st.sampled_from(sorted(ACCEPTED_TYPES)))}
    if draw(st.booleans()):
        body["size"] = draw(st.integers(min_value=1, max_value=104_857_600))
    if draw(st.booleans()):
        body["keepLocation"] = draw(st.booleans())
    return json.dumps(body, ensure_ascii=draw(st.booleans()))


# Branches repeat to weight them: a third of the bodies are registrations that may pass.
bodies = st.one_of(
    good_bodies(),
    good_bodies(),
    register_bodies(),
    register_bodies(),
    json_values.map(lambda v: json.dumps(v, ensure_ascii=False)),
    json_values.map(json.dumps),
    st.integers(min_value=1, max_value=100_000).map(lambda n: "[" * n + "]" * n),
    st.integers(min_value=1, max_value=20_000).map(
        lambda n: '{"fileName": "a.jpg", "contentType": "image/jpeg", "x": ' + "{" * n + "}" * n + "}"
    ),
    anything_text,
    st.none(),
)


@st.composite
def encoded(draw: st.DrawFn) -> tuple[str | None, bool]:
    """The body as API Gateway passes it: text, base64 of its UTF-8, base64 of bytes that are no
    UTF-8, or text flagged base64 that is none."""
    body = draw(bodies)
    how = draw(st.sampled_from(["plain", "plain", "plain", "base64", "bad-utf8", "bad-base64"]))
    if how == "base64" and body is not None:
        return base64.b64encode(body.encode(errors="surrogatepass")).decode(), True
    if how == "bad-utf8":
        return base64.b64encode(draw(st.binary(max_size=64))).decode(), True
    if how == "bad-base64":
        return draw(anything_text), True
    return body, False


subjects = st.one_of(
    st.sampled_from(USERS), anything_text, st.integers(), st.booleans(), st.none(), st.just(""), json_values
)
authorizers = st.one_of(
    st.just(IAM),
    st.just(IAM),
    st.just(IAM),
    st.sampled_from(USERS).map(lambda sub: {"jwt": {"claims": {"sub": sub}, "scopes": None}}),
    st.sampled_from(USERS).map(lambda sub: {"jwt": {"claims": {"sub": sub}, "scopes": None}}),
    subjects.map(lambda sub: {"jwt": {"claims": {"sub": sub, "aud": "app"}, "scopes": None}}),
    st.sampled_from(USERS).map(lambda sub: {"jwt": {"claims": {"sub": sub}, "scopes": None}}),
    st.just({"jwt": {"claims": {"client_id": "machine"}}}),
    json_values.map(lambda v: {"jwt": v}),
    json_values,
    st.none(),
)
ids = st.one_of(
    st.sampled_from(ALBUMS),
    st.sampled_from(ALBUMS),
    st.sampled_from(ALBUMS),
    st.uuids().map(str),
    st.uuids().map(lambda u: str(u).upper()),
    anything_text,
)
photo_ids = st.one_of(
    st.builds(
        lambda i: REGISTERED[i % len(REGISTERED)] if REGISTERED else str(uuid.uuid4()), st.integers(0, 99)
    ),
    st.uuids().map(str),
    anything_text,
)
user_ids = st.one_of(st.sampled_from(USERS), st.sampled_from(USERS), anything_text)


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    """A whole HTTP API 2.0 event, on one of the function's routes or none of them; a quarter are
    registrations that may well pass (a known caller, album and good body), so that photos exist
    for the others to read, delete and collide with."""
    plausible = draw(st.integers(0, 3)) == 0
    routes = ["register"] if plausible else ["register", "status", "delete", "share", "unshare", "elsewhere"]
    route = draw(st.sampled_from(routes))
    album = draw(st.sampled_from(ALBUMS) if plausible else ids)
    photo, user = draw(photo_ids), draw(user_ids)
    method, key, path, parameters = {
        "register": ("POST", "/albums/{albumId}/photos", f"/albums/{album}/photos", {"albumId": album}),
        "status": ("GET", "/photos/{photoId}", f"/photos/{photo}", {"photoId": photo}),
        "delete": ("DELETE", "/photos/{photoId}", f"/photos/{photo}", {"photoId": photo}),
        "share": (
            "PUT",
            "/albums/{albumId}/members/{userId}",
            f"/albums/{album}/members/{user}",
            {"albumId": album, "userId": user},
        ),
        "unshare": (
            "DELETE",
            "/albums/{albumId}/members/{userId}",
            f"/albums/{album}/members/{user}",
            {"albumId": album, "userId": user},
        ),
        "elsewhere": (
            draw(st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE"])),
            "$default",
            draw(anything_text.map(lambda p: "/" + p)),
            {},
        ),
    }[route]
    event = copy.deepcopy(SAMPLE)
    event["routeKey"] = event["requestContext"]["routeKey"] = f"{method} {key}" if key != "$default" else key
    event["rawPath"] = event["requestContext"]["http"]["path"] = path
    event["requestContext"]["http"]["method"] = method
    event["pathParameters"] = parameters
    event["body"], event["isBase64Encoded"] = (draw(good_bodies()), False) if plausible else draw(encoded())
    authorizer = draw(
        st.sampled_from([IAM, *({"jwt": {"claims": {"sub": u}}} for u in USERS)])
        if plausible
        else authorizers
    )
    if authorizer is None:
        del event["requestContext"]["authorizer"]
    else:
        event["requestContext"]["authorizer"] = authorizer
    return event


@settings(settings.get_profile(PROFILE))
@given(request=requests())
def test_any_request_is_answered_in_words_and_stores_only_the_servers_keys(
    infra: Infra, db: Engine, request: dict[str, Any]
) -> None:
    """`db` is emptied once for all the examples: albums owned and photos registered by earlier ones
    are what later ones run into."""
    # GIVEN the database's clock before the request
    with db.connect() as c:
        before = c.execute(text("SELECT clock_timestamp()")).scalar_one()

    # WHEN the function is given the request
    response = upload.lambda_handler(request, LambdaContext(10, function_name="upload"))

    # THEN it answers with one of its statuses, a refusal in words
    status = int(response["statusCode"])
    event(f"{request['requestContext']['http']['method']} {status}")
    assert status in ANSWERS, response
    if status in (400, 401, 403):
        refused = json.loads(response["body"])
        assert set(refused) == {"reason", "message"} and refused["message"], refused
    # AND every photo it wrote holds the key the server built, and the policy binds just that key
    with db.connect() as c:
        written = c.execute(
            text("SELECT id, album_id, original_key FROM photos WHERE created_at >= :t"), {"t": before}
        ).all()
    assert len(written) == (status == 201)
    for photo_id, album_id, key in written:
        parsed = parse_original_key(key, STAGE)
        assert parsed is not None and (parsed.photo_id, parsed.album_id) == (photo_id, album_id)
        assert clean_file_name(parsed.file_name) == parsed.file_name and "${" not in key
        registered = json.loads(response["body"])
        assert registered["key"] == key == registered["upload"]["fields"]["key"]
        policy = json.loads(base64.b64decode(registered["upload"]["fields"]["policy"]))
        on_key = [c for c in policy["conditions"] if "$key" in c or (isinstance(c, dict) and "key" in c)]
        assert on_key and all(c in ({"key": key}, ["eq", "$key", key]) for c in on_key), policy
        REGISTERED.append(str(photo_id))
