"""The gallery's stand-in for API Gateway (devkit/gallery.py): the template's routes, payload 2.0."""

from __future__ import annotations

import base64

from devkit.gallery import http_api_event, template_routes


def test_the_stand_in_answers_the_templates_routes_and_only_them() -> None:
    # GIVEN the routes read from template.yaml
    routes = {route.key: route for route in template_routes()}

    # THEN they are the upload API's five, and each matches its own paths only
    assert set(routes) == {
        "POST /albums/{albumId}/photos",
        "GET /photos/{photoId}",
        "DELETE /photos/{photoId}",
        "PUT /albums/{albumId}/members/{userId}",
        "DELETE /albums/{albumId}/members/{userId}",
    }
    match = routes["POST /albums/{albumId}/photos"].pattern.match("/albums/a-b/photos")
    assert match and match.groupdict() == {"albumId": "a-b"}
    assert not routes["GET /photos/{photoId}"].pattern.match("/photos/a/b")
    assert not routes["GET /photos/{photoId}"].pattern.match("/photos/")


def test_a_request_becomes_the_payload_2_0_event_api_gateway_sends() -> None:
    # GIVEN a registration as the page sends it, and a body that is not text
    route = next(r for r in template_routes() if r.method == "POST")
    common = {"method": "POST", "path": "/albums/a/photos", "query": "x=1&x=2", "source_ip": "127.0.0.1"}

    # WHEN each becomes an event
    event = http_api_event(
        route, {"albumId": "a"}, headers={"host": "127.0.0.1:8022"}, body=b'{"fileName": "a.jpg"}', **common
    )
    binary = http_api_event(route, {"albumId": "a"}, headers={}, body=b"\xff\xd8", **common)

    # THEN they carry what the upload function's resolver reads, as API Gateway spells it
    assert event["version"] == "2.0"
    assert event["routeKey"] == event["requestContext"]["routeKey"] == "POST /albums/{albumId}/photos"
    assert event["rawPath"] == event["requestContext"]["http"]["path"] == "/albums/a/photos"
    assert event["requestContext"]["http"]["method"] == "POST"
    assert event["pathParameters"] == {"albumId": "a"}
    assert event["queryStringParameters"] == {"x": "1,2"}
    assert (event["body"], event["isBase64Encoded"]) == ('{"fileName": "a.jpg"}', False)
    assert base64.b64decode(binary["body"]) == b"\xff\xd8" and binary["isBase64Encoded"] is True
