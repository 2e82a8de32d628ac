"""`make gallery`: the gallery page (SPEC 17) on loopback, against the local stack of `make demo`.

A person picks photos in a browser. The page registers each through the upload function, POSTs
the file straight to S3 with the fields it got back, and polls the photo's status: its tile shows
the average colour, then the ThumbHash, then the browse image; a failed one says why; a tile can
be deleted. This server is three honest stand-ins on 127.0.0.1:
- API Gateway: a request to one of the template's routes becomes the HTTP API payload 2.0 event
  that functions/upload/app.py's lambda_handler receives in AWS from the app's backend (AWS_IAM:
  the page is the backend's stand-in, on loopback only);
- CloudFront: /cdn/ serves the bucket's variants, and only them (never an original), and is the
  functions' VARIANT_BASE_URL, so the status answer carries the URLs the page shows;
- the app's origin, which the bucket's CORS rule allows to POST (the template's AppOrigins).
Behind it, the local poller feeds the real process handler, the sweep and relay on their
schedules; PostgreSQL is embedded (or DATABASE_URL), S3/SQS/EventBridge moto's server (or
AWS_ENDPOINT_URL). GALLERY_PORT (or --port; 0 for any free one) says where it listens.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import parse_qs

import requests

from devkit import demo, handlers, stack
from devkit.poller import LambdaContext, Poller

ROOT = stack.ROOT
STATIC = Path(__file__).with_name("gallery")
LOGS = ROOT / ".local" / "gallery"
# The browser decodes the ThumbHash with the reference itself, the npm package, installed here on
# first use (not copied into the project).
THUMBHASH_VERSION = "0.1.1"
NODE_PREFIX = ROOT / ".local" / "gallery-node"
THUMBHASH_JS = NODE_PREFIX / "node_modules" / "thumbhash" / "thumbhash.js"
DEFAULT_PORT = 8022
# Powertools says so on every invocation that counted nothing (a status poll): noise here.
warnings.filterwarnings("ignore", message="No application metrics to publish")
# API Gateway's own limit on a request's payload; the registrations are a few hundred bytes.
MAX_BODY_BYTES = 10 * 1024 * 1024
STATIC_FILES = {
    "/": (STATIC / "index.html", "text/html; charset=utf-8"),
    "/gallery.js": (STATIC / "gallery.js", "text/javascript; charset=utf-8"),
    "/gallery.css": (STATIC / "gallery.css", "text/css; charset=utf-8"),
    "/vendor/thumbhash.js": (THUMBHASH_JS, "text/javascript; charset=utf-8"),
}


def install_thumbhash() -> Path:
    """The npm package's ESM file, installed with npm into .local (gitignored) when not there."""
    manifest = THUMBHASH_JS.with_name("package.json")
    if manifest.exists() and json.loads(manifest.read_text())["version"] == THUMBHASH_VERSION:
        return THUMBHASH_JS
    if shutil.which("npm") is None:
        raise SystemExit("the gallery decodes ThumbHashes with the npm package `thumbhash`: install npm")
    subprocess.run(
        [
            "npm",
            "install",
            "--prefix",
            str(NODE_PREFIX),
            "--no-audit",
            "--no-fund",
            f"thumbhash@{THUMBHASH_VERSION}",
        ],
        check=True,
        timeout=300,
    )
    return THUMBHASH_JS


@dataclass(frozen=True)
class Route:
    key: str  # "GET /photos/{photoId}", as the template names it
    method: str
    pattern: re.Pattern[str]


def template_routes(template: Path = ROOT / "template.yaml") -> list[Route]:
    """The upload API's routes, read from the template: the stand-in answers what the API would."""
    keys = re.findall(r"^\s+RouteKey: (\S+ /\S+)$", template.read_text(), flags=re.MULTILINE)
    routes = []
    for key in keys:
        method, path = key.split(" ", 1)
        regex = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(path))
        routes.append(Route(key, method, re.compile(f"^{regex}$")))
    return routes


def http_api_event(
    route: Route,
    parameters: dict[str, str],
    *,
    method: str,
    path: str,
    query: str,
    headers: dict[str, str],
    body: bytes,
    source_ip: str,
) -> dict[str, Any]:
    """The HTTP API payload format 2.0 event API Gateway would hand the function for this request."""
    now = time.time()
    host = headers.get("host", "127.0.0.1")
    text: str | None = None
    encoded = False
    if body:
        try:
            text = body.decode()
        except UnicodeDecodeError:
            text, encoded = base64.b64encode(body).decode(), True
    return {
        "version": "2.0",
        "routeKey": route.key,
        "rawPath": path,
        "rawQueryString": query,
        "headers": headers,
        # API Gateway joins a repeated parameter's values with commas.
        "queryStringParameters": {k: ",".join(v) for k, v in parse_qs(query, keep_blank_values=True).items()}
        or None,
        "requestContext": {
            "accountId": "000000000000",
            "apiId": "gallery",
            # The loopback page stands in for the app's backend: what API Gateway's AWS_IAM route
            # passes for a request the backend signed.
            "authorizer": {
                "iam": {
                    "accessKey": "GALLERY",
                    "accountId": "000000000000",
                    "callerId": "gallery",
                    "principalOrgId": None,
                    "userArn": "arn:aws:iam::000000000000:user/gallery",
                    "userId": "gallery",
                }
            },
            "domainName": host,
            "domainPrefix": host.split(".", 1)[0],
            "http": {
                "method": method,
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": source_ip,
                "userAgent": headers.get("user-agent", ""),
            },
            "requestId": uuid.uuid4().hex,
            "routeKey": route.key,
            "stage": "$default",
            "time": formatdate(now, usegmt=True),
            "timeEpoch": int(now * 1000),
        },
        "pathParameters": parameters,
        "body": text,
        "isBase64Encoded": encoded,
    }


def json_request(
    method: str, route: str, path: str, parameters: dict[str, str], body: bytes = b""
) -> dict[str, Any]:
    """An app's JSON request on one of the template's routes, from loopback, as API Gateway hands it
    over (for tests and benchmarks that call the function as the stand-in does)."""
    routes = {r.key: r for r in template_routes()}
    key = f"{method} {route}"
    found = routes.get(key) or Route(key, method, re.compile("^$"))  # a route the API lacks
    return http_api_event(
        found,
        parameters,
        method=method,
        path=path,
        query="",
        headers={"content-type": "application/json"},
        body=body,
        source_ip="127.0.0.1",
    )


def moto_without_global_cors() -> None:
    """moto's server answers CORS for every origin unless told not to, which would let a page the
    bucket does not allow upload anyway: this makes the bucket's own CORS rules decide. Read when
    moto's server module is imported, so before it is."""
    os.environ["MOTO_DISABLE_GLOBAL_CORS"] = "true"
    from moto.moto_server import werkzeug_app

    if not vars(werkzeug_app)["DISABLE_GLOBAL_CORS"]:
        raise RuntimeError("moto's server was imported before its global CORS could be turned off")


def moto_post_answers_cors() -> None:
    """moto answers a preflight from the bucket's CORS rules, but leaves them off a POST's own
    answer (S3 sends Access-Control-Allow-Origin for an origin a rule allows), so a browser would
    refuse to read the upload's result. The same rules, by moto's own matching, on that answer."""
    from moto.s3.responses import S3Response

    post = S3Response._bucket_response_post
    if getattr(post, "gallery_cors", False):
        return

    def with_cors(self: S3Response, request: Any, bucket_name: str) -> Any:
        status, headers, body = post(self, request, bucket_name)
        return status, {**self._get_cors_headers_other(), **headers}, body

    with_cors.gallery_cors = True  # type: ignore[attr-defined]
    S3Response._bucket_response_post = with_cors  # type: ignore[method-assign]


def allow_uploads_from(s3: Any, bucket: str, origins: list[str]) -> None:
    """The template's CORS rule (AppOrigins): browsers may POST from these origins, nothing else."""
    s3.put_bucket_cors(
        Bucket=bucket,
        CORSConfiguration={
            "CORSRules": [
                {
                    "ID": "browser-uploads",
                    "AllowedMethods": ["POST"],
                    "AllowedOrigins": origins,
                    "AllowedHeaders": ["*"],
                    "MaxAgeSeconds": 3600,
                }
            ]
        },
    )


def preflight(url: str, origin: str) -> str | None:
    """The Access-Control-Allow-Origin the endpoint answers a browser's preflight for a POST from
    `origin` with (None: the browser would not send the POST)."""
    answer = requests.options(
        url,
        headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
        timeout=10,
    )
    allowed = answer.headers.get("Access-Control-Allow-Origin")
    return allowed if answer.ok else None


def check_cors(url: str, origin: str) -> None:
    """The bucket's rule, not the endpoint, decides: its origin is allowed, another is not."""
    if preflight(url, origin) != origin:
        raise RuntimeError(f"{url} does not allow a POST from {origin} (its bucket's CORS rule)")
    if preflight(url, "http://elsewhere.invalid") is not None:
        raise RuntimeError(f"{url} allows a POST from any origin: its bucket's CORS rule is not applied")


class Gallery:
    """What the gallery's HTTP server answers: the page, the API's routes, the variants."""

    def __init__(self, s3: Any, bucket: str, stage: str, *, origin: str, s3_url: str) -> None:
        self.s3 = s3
        self.bucket = bucket
        self.routes = template_routes()
        self.upload = handlers.load("upload")
        # One function at a time in this process, as one Lambda container serves one request:
        # the handlers share Powertools' logger and metrics (the poller takes it too).
        self.lock = threading.Lock()
        self.variants = re.compile(rf"^{re.escape(stage)}/albums/[0-9a-f-]{{36}}/variants/[\w./-]+$")
        # The page talks to this server and the bucket, nothing else; its images are the variants
        # (under this origin, whichever name the browser used for it) and decoded ThumbHashes.
        self.csp = (
            f"default-src 'self'; img-src 'self' {origin} data:; style-src 'self'; script-src 'self'; "
            f"connect-src 'self' {s3_url}"
        )

    def answer(self, request: BaseHTTPRequestHandler, method: str) -> None:
        path, _, query = request.path.partition("?")
        if method == "GET" and path in STATIC_FILES:
            file, content_type = STATIC_FILES[path]
            headers = {"Content-Type": content_type, "Cache-Control": "no-store"}
            if path == "/":
                headers["Content-Security-Policy"] = self.csp
            return send(request, HTTPStatus.OK, file.read_bytes(), headers)
        if method == "GET" and path.startswith("/cdn/"):
            return self.variant(request, path.removeprefix("/cdn/"))
        for route in self.routes:
            match = route.pattern.match(path)
            if match and route.method == method:
                return self.invoke(request, route, match.groupdict(), method=method, path=path, query=query)
        # API Gateway's answer for a request no route matches.
        return send_json(request, HTTPStatus.NOT_FOUND, {"message": "Not Found"})

    def invoke(
        self,
        request: BaseHTTPRequestHandler,
        route: Route,
        parameters: dict[str, str],
        *,
        method: str,
        path: str,
        query: str,
    ) -> None:
        length = int(request.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            return send_json(
                request, HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"message": "Request Entity Too Large"}
            )
        body = request.rfile.read(length) if length else b""
        headers = {name.lower(): value for name, value in request.headers.items()}
        event = http_api_event(
            route,
            parameters,
            method=method,
            path=path,
            query=query,
            headers=headers,
            body=body,
            source_ip=request.client_address[0],
        )
        context = LambdaContext(30, function_name="photo-publish-upload")
        with self.lock:
            result = self.upload.lambda_handler(event, context)
        payload = result.get("body") or ""
        data = base64.b64decode(payload) if result.get("isBase64Encoded") else payload.encode()
        return send(request, HTTPStatus(result["statusCode"]), data, result.get("headers") or {})

    def variant(self, request: BaseHTTPRequestHandler, key: str) -> None:
        """A variant, as the distribution serves it (Origin Access Control on the variants only)."""
        if not self.variants.match(key):
            return send_json(request, HTTPStatus.FORBIDDEN, {"message": "only variants are served"})
        try:
            found = self.s3.get_object(Bucket=self.bucket, Key=key)
        except self.s3.exceptions.NoSuchKey:
            return send_json(request, HTTPStatus.NOT_FOUND, {"message": "no such variant"})
        headers = {"Content-Type": found.get("ContentType", "application/octet-stream")}
        if found.get("CacheControl"):
            headers["Cache-Control"] = found["CacheControl"]
        return send(request, HTTPStatus.OK, found["Body"].read(), headers)


def send(request: BaseHTTPRequestHandler, status: HTTPStatus, body: bytes, headers: dict[str, str]) -> None:
    request.send_response(status)
    for name, value in headers.items():
        if name.lower() != "content-length":
            request.send_header(name, value)
    request.send_header("Content-Length", str(len(body)))
    request.send_header("X-Content-Type-Options", "nosniff")
    request.end_headers()
    if request.command != "HEAD":
        request.wfile.write(body)


def send_json(request: BaseHTTPRequestHandler, status: HTTPStatus, body: dict[str, Any]) -> None:
    send(request, status, json.dumps(body).encode(), {"Content-Type": "application/json"})


def requests_to(gallery: Gallery) -> type[BaseHTTPRequestHandler]:
    class Requests(BaseHTTPRequestHandler):
        server_version = "photo-publish-gallery"

        def do_GET(self) -> None:
            gallery.answer(self, "GET")

        def do_POST(self) -> None:
            gallery.answer(self, "POST")

        def do_DELETE(self) -> None:
            gallery.answer(self, "DELETE")

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the functions' own logs say what happened

    return Requests


def deliver(local: demo.Stack, lock: threading.Lock, stop: threading.Event) -> None:
    """The queue's event source and the sweep's and relay's schedules, until `stop`."""
    process, sweep, relay = handlers.load("process"), handlers.load("sweep"), handlers.load("relay")

    def locked(function: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        def call(*args: Any) -> dict[str, Any]:
            with lock:
                return function(*args)

        return call

    def scheduled(function: Callable[..., dict[str, Any]]) -> Callable[[], None]:
        """A run on the function's EventBridge schedule (rate(1 minute) in the template)."""

        def run() -> None:
            locked(function)({"source": "aws.events"}, LambdaContext(60))

        return run

    # One record a batch: a render holds the lock, and the page's polls wait for it.
    poller = Poller(
        local.sqs, local.queues.url, local.queues.arn, locked(process.lambda_handler), batch_size=1
    )
    poller.schedule += [(60.0, scheduled(sweep.lambda_handler)), (60.0, scheduled(relay.lambda_handler))]
    while not stop.is_set():
        try:
            poller.run_scheduled()
            poller.poll_once()
        except Exception:  # the page stays up; what went wrong is said, and delivery goes on
            traceback.print_exc()
            stop.wait(1)


@contextmanager
def functions_log(path: Path) -> Iterator[None]:
    """The functions log JSON (and their metrics) to stdout, as in Lambda; here to a file, and this
    server's own words to the real stdout."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as log, redirect_stdout(log):
        for handler in logging.getLogger(os.environ["POWERTOOLS_SERVICE_NAME"]).handlers:
            if isinstance(handler, logging.StreamHandler):
                handler.setStream(log)
        yield


def say(text: str) -> None:
    print(text, file=sys.__stdout__, flush=True)


def stop_on_sigterm() -> None:
    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def run(port: int) -> None:
    install_thumbhash()
    started_moto = not stack.localstack() and not stack.endpoint_named()
    if started_moto:
        moto_without_global_cors()
        moto_post_answers_cors()
    stop_on_sigterm()
    # Bound first: the bucket's CORS rule and the variants' URLs name this origin.
    server = ThreadingHTTPServer(("127.0.0.1", port), BaseHTTPRequestHandler)
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    with (
        stack.database(ROOT / ".local" / "postgres", name="photo_publish_gallery") as url,
        stack.aws_endpoint(),
    ):
        local = demo.start_stack(url, variant_base_url=f"{origin}/cdn")
        bucket, stage = local.settings.photo_bucket, local.settings.stage
        # What a browser opens: 127.0.0.1, or localhost (its own origin).
        allow_uploads_from(local.s3, bucket, [origin, origin.replace("127.0.0.1", "localhost")])
        s3_url = local.s3.meta.endpoint_url.rstrip("/")
        check_cors(f"{s3_url}/{bucket}", origin)
        gallery = Gallery(local.s3, bucket, stage, origin=origin, s3_url=s3_url)
        server.RequestHandlerClass = requests_to(gallery)
        stop = threading.Event()
        with functions_log(LOGS / "functions.log"):
            delivery = threading.Thread(target=deliver, args=(local, gallery.lock, stop), daemon=True)
            delivery.start()
            say(f"photo-publish gallery: {origin}/")
            say(f"  S3: {s3_url} bucket {bucket} (stage {stage}); CORS: POST from {origin}")
            say(f"  function logs: {LOGS / 'functions.log'}; Ctrl-C stops it")
            try:
                server.serve_forever()
            except KeyboardInterrupt:
                pass
            finally:
                stop.set()
                server.server_close()
                delivery.join(timeout=30)
                local.engine.dispose()
    say("gallery stopped")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m devkit.gallery", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=int(os.environ.get("GALLERY_PORT", DEFAULT_PORT)))
    run(parser.parse_args(argv).port)


if __name__ == "__main__":
    main()
