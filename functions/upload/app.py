"""The upload function (SPEC 17, 19): an HTTP API (payload 2.0) over photo_publish.uploads.

    POST   /albums/{albumId}/photos   {"fileName", "contentType", "size"?, "keepLocation"?}
                                      -> 201 {"photoId", "upload": {"url", "fields"}, "expiresAt"}
    GET    /photos/{photoId}          -> 200 the photo's state, error in words, variants, placeholder,
                                      capture metadata
    DELETE /photos/{photoId}          -> 204
    PUT    /albums/{albumId}/members/{userId}   -> 204 (the backend only: AWS_IAM in every mode)
    DELETE /albums/{albumId}/members/{userId}   -> 204

Who calls is what authorized the request, read once: AWS_IAM is the app's backend, which may do
everything; a JWT with a non-empty string `sub` is that user; anything else is 401, never the
backend's rights. A user registers into their own albums (the first to register into one owns
it) or those the backend shared with them (else 403 ALBUM_FORBIDDEN), and reads and deletes the
photos they registered or that are in their album; another's is answered as an unknown photo (404).
A body is bounded in size and depth before it is parsed, then parsed by its declared model: every
malformed request is 400 {"reason", "message"}.
"""

from __future__ import annotations

import json
import re
from http import HTTPStatus
from itertools import accumulate
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types
from aws_lambda_powertools.event_handler.middlewares import NextMiddleware
from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from photo_publish import bootstrap, uploads
from photo_publish.adapters.storage import S3Store
from photo_publish.observability import logger, metrics

# A registration's body is a few hundred bytes; a file name is cut to 255 bytes anyway.
MAX_BODY_BYTES = 16 * 1024
# The register body is flat: one object of scalars. Checked before parsing, so that no parser
# recurses into a body built to exhaust its stack.
MAX_BODY_DEPTH = 8
# A JSON string, or an unterminated one to the end: possessive, so that every match succeeds and the
# scan is linear (a body of escaped quotes would otherwise take a second).
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*+(?:"|\\?\Z)', re.DOTALL)
_NESTING = {"{": 1, "[": 1, "}": -1, "]": -1}
# What a refusal of the model says, by the field it names (the library's own codes).
_REASONS = {
    "fileName": "FILE_NAME_INVALID",
    "contentType": "CONTENT_TYPE_UNSUPPORTED",
    "size": "SIZE_INVALID",
    "keepLocation": "KEEP_LOCATION_INVALID",
}


class RegisterRequest(BaseModel):
    """The body of POST /albums/{albumId}/photos. Strict: "10" is no size, 1 no boolean. What
    the values may be (the types SPEC 3 decodes, the size limit) is the library's check."""

    model_config = ConfigDict(strict=True, frozen=True)

    file_name: str = Field(alias="fileName")
    content_type: str = Field(alias="contentType")
    size: int | None = None
    keep_location: bool = Field(default=False, alias="keepLocation")


class BadRequest(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


app = APIGatewayHttpResolver()


def _answer(status: HTTPStatus, body: dict[str, Any] | None = None) -> Response[str]:
    return Response(
        status_code=status,
        content_type=content_types.APPLICATION_JSON,
        body=json.dumps(body) if body is not None else "",
    )


def _refused(status: HTTPStatus, reason: str, message: str) -> Response[str]:
    return _answer(status, {"reason": reason, "message": message})


def _not_found() -> Response[str]:
    return _refused(HTTPStatus.NOT_FOUND, "PHOTO_NOT_FOUND", "There is no such photo.")


def caller_of(request_context: object) -> uploads.Caller | None:
    """Who sent the request, from how API Gateway authorized it: `iam` is the app's backend (the
    route's AWS_IAM), `jwt` with a usable `sub` that user; None for anything else (a token without
    a subject, an empty or non-string one, an authorizer this API does not configure)."""
    authorizer = request_context.get("authorizer") if isinstance(request_context, dict) else None
    if not isinstance(authorizer, dict):
        return None
    if isinstance(authorizer.get("iam"), dict):
        return uploads.BACKEND
    token = authorizer.get("jwt")
    claims = token.get("claims") if isinstance(token, dict) else None
    sub = claims.get("sub") if isinstance(claims, dict) else None
    return uploads.User(sub) if uploads.usable_subject(sub) else None


def _caller() -> uploads.Caller:
    caller: uploads.Caller = app.context["caller"]
    return caller


def authorize(app: APIGatewayHttpResolver, next_middleware: NextMiddleware) -> Response[Any]:
    """Every route's first step: the caller as a value, or 401."""
    caller = caller_of(app.current_event.raw_event.get("requestContext"))
    if caller is None:
        return _refused(
            HTTPStatus.UNAUTHORIZED, "CALLER_UNKNOWN", "The request's token names no user (no usable 'sub')."
        )
    app.append_context(caller=caller)
    return next_middleware(app)


app.use(middlewares=[authorize])


@app.exception_handler(BadRequest)
def _bad_request(error: BadRequest) -> Response[str]:
    return _refused(HTTPStatus.BAD_REQUEST, error.reason, str(error))


@app.exception_handler(uploads.Refused)
def _refusal(refused: uploads.Refused) -> Response[str]:
    status = HTTPStatus.FORBIDDEN if isinstance(refused, uploads.Forbidden) else HTTPStatus.BAD_REQUEST
    return _refused(status, refused.reason, str(refused))


def _body() -> str:
    """The request's body as text, bounded in size and depth before anything parses it."""
    event = app.current_event
    raw = event.body or ""
    # A base64 body is 4/3 of its bytes.
    if len(raw) > MAX_BODY_BYTES * 4 // 3 + 4:
        raise BadRequest("BODY_TOO_LARGE", f"The body is larger than {MAX_BODY_BYTES} bytes.")
    try:
        text = event.decoded_body or ""
    except ValueError:  # bad base64, or bytes that are no UTF-8 (binascii.Error, UnicodeError)
        raise BadRequest("BODY_INVALID", "The body must be a JSON object in UTF-8.") from None
    if len(text.encode(errors="surrogatepass")) > MAX_BODY_BYTES:
        raise BadRequest("BODY_TOO_LARGE", f"The body is larger than {MAX_BODY_BYTES} bytes.")
    depth = max(accumulate(_NESTING.get(c, 0) for c in _STRINGS.sub("", text)), default=0)
    if depth > MAX_BODY_DEPTH:
        raise BadRequest("BODY_INVALID", f"The body is nested deeper than {MAX_BODY_DEPTH} levels.")
    return text


def _request(model: type[RegisterRequest]) -> RegisterRequest:
    text = _body()
    try:
        # Python's own JSON reader, not pydantic's: it keeps a lone surrogate escape ("\ud800", valid
        # JSON that a browser sends for a Windows file name), which the file name's cleaning drops.
        data = json.loads(text)
    except ValueError as error:  # not JSON, or a number longer than Python's integer-string limit
        raise BadRequest("BODY_INVALID", f"The body must be a JSON object: {_first_line(error)}.") from None
    if not isinstance(data, dict):
        # The parser would read a string as JSON once more: the model is for the object itself.
        raise BadRequest("BODY_INVALID", "The body must be a JSON object.")
    try:
        return parse(event=data, model=model)
    except ValidationError as invalid:
        first = invalid.errors(include_url=False, include_input=False, include_context=False)[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        where = f"{field}: " if field else "The body: "
        raise BadRequest(_REASONS.get(field, "BODY_INVALID"), f"{where}{first['msg']}.") from None


def _first_line(error: ValueError) -> str:
    return str(error).split(";")[0][:120]


@app.post("/albums/<album_id>/photos")
def register(album_id: str) -> Response[str]:
    request = _request(RegisterRequest)
    settings = bootstrap.settings()
    registration = uploads.register(
        bootstrap.engine(),
        bootstrap.s3_client(),
        settings,
        album_id=album_id,
        file_name=request.file_name,
        content_type=request.content_type,
        size=request.size,
        keep_location=request.keep_location,
        caller=_caller(),
    )
    logger.info("upload registered", photo_id=str(registration.photo_id), album_id=album_id)
    return _answer(HTTPStatus.CREATED, registration.as_json())


@app.get("/photos/<photo_id>")
def status(photo_id: str) -> Response[str]:
    answer = uploads.status(
        bootstrap.engine(), photo_id, caller=_caller(), base_url=bootstrap.settings().variant_base_url
    )
    if answer is None:
        return _not_found()
    return _answer(HTTPStatus.OK, answer)


@app.delete("/photos/<photo_id>")
def delete(photo_id: str) -> Response[str]:
    settings = bootstrap.settings()
    store = S3Store(bootstrap.s3_client(), settings.photo_bucket)
    if not uploads.delete(
        bootstrap.engine(), store, settings, photo_id, caller=_caller(), cdn=bootstrap.cdn()
    ):
        return _not_found()
    logger.info("photo deleted", photo_id=photo_id)
    return _answer(HTTPStatus.NO_CONTENT)


@app.put("/albums/<album_id>/members/<user_id>")
def share(album_id: str, user_id: str) -> Response[str]:
    uploads.share_album(bootstrap.engine(), album_id, user_id, caller=_caller())
    logger.info("album shared", album_id=album_id)
    return _answer(HTTPStatus.NO_CONTENT)


@app.delete("/albums/<album_id>/members/<user_id>")
def unshare(album_id: str, user_id: str) -> Response[str]:
    if not uploads.unshare_album(bootstrap.engine(), album_id, user_id, caller=_caller()):
        return _refused(HTTPStatus.NOT_FOUND, "MEMBER_NOT_FOUND", "That user is not a member of this album.")
    logger.info("album unshared", album_id=album_id)
    return _answer(HTTPStatus.NO_CONTENT)


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)
