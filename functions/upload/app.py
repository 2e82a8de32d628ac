"""The upload function (SPEC 17): an HTTP API (payload 2.0) over photo_publish.uploads.

    POST   /albums/{albumId}/photos   {"fileName", "contentType", "size", "keepLocation"?}
                                      -> 201 {"photoId", "upload": {"url", "fields"}, "expiresAt"}
    GET    /photos/{photoId}          -> 200 the photo's state, error in words, variants, placeholder,
                                      capture metadata
    DELETE /photos/{photoId}          -> 204

Who may call it is the API's authorizer (AWS_IAM by default: the app's backend signs, a browser
never holds AWS credentials; or a JWT authorizer). Behind a JWT authorizer a photo belongs to the
token's subject that registered it: another user's GET or DELETE is answered as for an unknown
photo. Bad requests are 400 with a reason, an unknown photo 404.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types
from aws_lambda_powertools.utilities.typing import LambdaContext

from photo_publish import bootstrap, uploads
from photo_publish.adapters.storage import S3Store
from photo_publish.observability import logger, metrics

app = APIGatewayHttpResolver()


def _answer(status: HTTPStatus, body: dict[str, Any] | None = None) -> Response[str]:
    return Response(
        status_code=status,
        content_type=content_types.APPLICATION_JSON,
        body=json.dumps(body) if body is not None else "",
    )


def _refused(reason: str, message: str) -> Response[str]:
    return _answer(HTTPStatus.BAD_REQUEST, {"reason": reason, "message": message})


def _not_found() -> Response[str]:
    return _answer(HTTPStatus.NOT_FOUND, {"reason": "PHOTO_NOT_FOUND", "message": "no such photo"})


def _user() -> str | None:
    """The end user behind a JWT authorizer (its token's subject), who owns what it registers;
    None behind AWS_IAM, where the app's backend has checked its user itself."""
    subject = app.current_event.request_context.authorizer.jwt_claim.get("sub")
    return str(subject) if subject else None


@app.post("/albums/<album_id>/photos")
def register(album_id: str) -> Response[str]:
    try:
        request = json.loads(app.current_event.decoded_body or "")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _refused("BODY_INVALID", "the body must be a JSON object in UTF-8")
    if not isinstance(request, dict):
        return _refused("BODY_INVALID", "the body must be a JSON object")
    settings = bootstrap.settings()
    try:
        registration = uploads.register(
            bootstrap.engine(),
            bootstrap.s3_client(),
            settings,
            album_id=album_id,
            file_name=request.get("fileName") or "",
            content_type=request.get("contentType") or "",
            size=request.get("size"),
            keep_location=request.get("keepLocation", False),
            owner=_user(),
        )
    except uploads.Refused as refused:
        return _refused(refused.reason, str(refused))
    logger.info("upload registered", photo_id=str(registration.photo_id), album_id=album_id)
    return _answer(HTTPStatus.CREATED, registration.as_json())


@app.get("/photos/<photo_id>")
def status(photo_id: str) -> Response[str]:
    answer = uploads.status(
        bootstrap.engine(), photo_id, base_url=bootstrap.settings().variant_base_url, owner=_user()
    )
    if answer is None:
        return _not_found()
    return _answer(HTTPStatus.OK, answer)


@app.delete("/photos/<photo_id>")
def delete(photo_id: str) -> Response[str]:
    settings = bootstrap.settings()
    store = S3Store(bootstrap.s3_client(), settings.photo_bucket)
    if not uploads.delete(bootstrap.engine(), store, settings, photo_id, owner=_user(), cdn=bootstrap.cdn()):
        return _not_found()
    logger.info("photo deleted", photo_id=photo_id)
    return _answer(HTTPStatus.NO_CONTENT)


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)
