"""A fault-injecting HTTP proxy on loopback, in front of an S3 + SQS endpoint (moto or LocalStack).

The functions under test reach AWS through it (their AWS_ENDPOINT_URL names it); the soak's own
checking clients go to the endpoint directly. Each request is forwarded unchanged, or, as the
seeded dice or an outage window say, answered with a fault the real services produce:

- `error_500` / `error_503`: an error answer in the service's own shape (S3's XML `InternalError` /
  `SlowDown`, SQS's JSON `InternalFailure` / `ServiceUnavailable`), without forwarding;
- `slow`: forwarded after a delay;
- `drop_request`: the connection closed (sometimes reset) before forwarding: nothing happened;
- `drop_response`: forwarded, then the connection closed: it happened, the caller cannot know;
- `truncate` (S3 GetObject): the headers and half the body, then the connection reset;
- `slow_body` (S3 GetObject, outages only): the headers at once, the body spread evenly over the
  outage's `body_seconds` (a congested or throttled link: every byte arrives, late);
- `stall_body` (S3 GetObject, outages only): the headers and half the body, then nothing for
  `body_seconds`, then the rest (a stalled connection: a client's read timeout ends it first).

botocore retries each of these (3 attempts in the functions' standard mode), so single faults test
the retries and outage windows (every request of a service, or of one operation, failing for a few
seconds) reach the code's own transient paths. A cursed key fails every GetObject of that original
until the proxy is made quiet: a photo whose storage keeps failing until its attempts run out.

Control (the harness, on the same port; no bucket is named `__soak__`):
GET /__soak__/stats, POST /__soak__/quiet, POST /__soak__/outage {"service", "kind", "seconds",
"operation"?, "body_seconds"?}, POST /__soak__/curse {"keys": [...]}.

Run: python -m devkit.faultproxy --upstream http://127.0.0.1:PORT --seed N --log FILE
(it prints its own URL on its first line of standard output).

Latency (`--latency aws`, for benchmarks/delivery.py): loopback makes every call nearly free, AWS
does not. Each answer leaves no earlier than its call's latency after the request arrived (the
upstream's own time counts within it): S3 GetObject's first byte after 30 ms and its body at
100 MB/s, PutObject after 50 ms (plus its body at 100 MB/s), other S3 calls 30 ms, SQS and
EventBridge 10 ms. With a `tcp://HOST:PORT` upstream (PostgreSQL) the proxy relays bytes instead,
each burst a client sends delayed by 1 ms: a round trip to a database in the same zone.
Both listen on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TextIO
from urllib.parse import unquote, urlsplit

KINDS = (
    "error_500",
    "error_503",
    "slow",
    "drop_request",
    "drop_response",
    "truncate",
    "slow_body",
    "stall_body",
)
# Kinds that act on a GetObject answer's body, for `body_seconds` (outages only: no dice for them).
BODY_KINDS = frozenset({"slow_body", "stall_body"})
# Faults per request while chaos is on, by service (a share of all requests); `truncate` applies to
# S3 GetObject only. botocore's three attempts absorb nearly all of them: outages do the rest.
DEFAULT_RATES = {
    "s3": {
        "error_500": 0.01,
        "error_503": 0.01,
        "slow": 0.01,
        "drop_request": 0.005,
        "drop_response": 0.005,
        "truncate": 0.01,
    },
    "sqs": {
        "error_500": 0.01,
        "error_503": 0.01,
        "slow": 0.01,
        "drop_request": 0.005,
        "drop_response": 0.005,
    },
}
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection"}
)
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
# The photo a request is about, for the soak's per-photo histories: an original's or a variant's
# key, or a job message's body.
PHOTO_IN_PATH = re.compile(rf"/(?:originals/albums/{UUID}|variants)/({UUID})/")
PHOTO_IN_BODY = re.compile(rf'photoId\\*"\s*:\s*\\*"({UUID})')


@dataclass(frozen=True)
class Latency:
    """What AWS's network and servers add to a call made from a function in the same region."""

    # Seconds from the request's arrival to the answer's first byte, by "service:operation", else
    # by service.
    first_byte: Mapping[str, float]
    # S3 bodies, both ways.
    bytes_per_second: float
    # Each burst of bytes a client sends to a TCP upstream (the database) waits this long.
    tcp_seconds: float = 0.0

    def seconds(self, service: str, operation: str) -> float:
        return self.first_byte.get(f"{service}:{operation}", self.first_byte.get(service, 0.0))


# Typical figures inside one region (S3's first byte tens of milliseconds, PUTs more; SQS's and
# EventBridge's calls about 10 ms; an Aurora round trip within a zone about 1 ms).
AWS_LATENCY = Latency(
    first_byte={"s3:GetObject": 0.030, "s3:PutObject": 0.050, "s3": 0.030, "sqs": 0.010, "events": 0.010},
    bytes_per_second=100e6,
    tcp_seconds=0.001,
)
# S3 at 70 ms a call (a slow day, or another region): the figure at which a hostile review found the
# sweep's purge of an album erasure outliving its function (tests/integration/test_sweep.py).
SLOW_S3_LATENCY = Latency(first_byte={"s3": 0.070}, bytes_per_second=100e6)
LATENCIES = {"aws": AWS_LATENCY, "slow-s3": SLOW_S3_LATENCY}


@dataclass
class Outage:
    service: str
    kind: str
    until: float
    operation: str | None = None
    # For a body kind: how long the body takes (`slow_body`) or stalls (`stall_body`).
    body_seconds: float = 0.0


@dataclass
class Faults:
    """What to inject, decided under one lock from one seeded generator."""

    seed: int
    rates: dict[str, dict[str, float]] = field(default_factory=lambda: DEFAULT_RATES)
    slow_seconds: tuple[float, float] = (0.2, 1.5)
    quiet: bool = False
    outages: list[Outage] = field(default_factory=list)
    cursed: set[str] = field(default_factory=set)
    counts: Counter[str] = field(default_factory=Counter)
    requests: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        self._lock = threading.Lock()

    def decide(self, service: str, operation: str, key: str | None) -> tuple[str | None, float]:
        """The fault for this request (or None) and its seconds: `slow`'s delay, a body kind's."""
        with self._lock:
            self.requests[f"{service}:{operation}"] += 1
            if self.quiet:
                return None, 0.0
            kind, body_seconds = self._imposed(service, operation, key)
            if kind is None:
                roll = self._random.random()
                for candidate, rate in self.rates.get(service, {}).items():
                    if candidate == "truncate" and operation != "GetObject":
                        continue
                    if roll < rate:
                        kind = candidate
                        break
                    roll -= rate
            delay = self._random.uniform(*self.slow_seconds) if kind == "slow" else body_seconds
            if kind is not None:
                self.counts[f"{service}:{kind}"] += 1
            return kind, delay

    def _imposed(self, service: str, operation: str, key: str | None) -> tuple[str | None, float]:
        """The fault a curse or an open outage imposes on this request, and its body seconds."""
        now = time.monotonic()
        self.outages = [o for o in self.outages if o.until > now]
        kind, body_seconds = None, 0.0
        if key is not None and key in self.cursed and operation == "GetObject":
            kind = "error_500"
        for outage in self.outages:
            if outage.service == service and outage.operation in (None, operation):
                kind, body_seconds = outage.kind, outage.body_seconds
        if kind in BODY_KINDS and operation != "GetObject":
            return None, 0.0
        return kind, body_seconds

    def coin(self) -> bool:
        with self._lock:
            return self._random.random() < 0.5

    def control(self, action: str, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if action == "quiet":
                self.quiet, self.outages, self.cursed = True, [], set()
            elif action == "outage":
                self.outages.append(
                    Outage(
                        body["service"],
                        body["kind"],
                        time.monotonic() + float(body["seconds"]),
                        body.get("operation"),
                        float(body.get("body_seconds", 0.0)),
                    )
                )
            elif action == "curse":
                self.cursed.update(body["keys"])
            return {"faults": dict(self.counts), "requests": dict(self.requests), "quiet": self.quiet}


def classify(method: str, path: str, headers: Any, body: bytes) -> tuple[str, str, str | None]:
    """(service, operation, S3 key or None) of a request, as the proxy needs to know them."""
    target = headers.get("X-Amz-Target", "")
    if target.startswith("AmazonSQS."):
        operation = target.split(".", 1)[1]
        # The dead-letter queue's sends are told apart: an outage can aim at them alone.
        if operation == "SendMessage" and b"-dlq" in body:
            operation = "SendMessage(dlq)"
        return "sqs", operation, None
    if b"Action=" in body[:200] and "x-www-form-urlencoded" in headers.get("Content-Type", ""):
        action = re.search(rb"Action=(\w+)", body)
        return "sqs", action.group(1).decode() if action else "unknown", None
    parts = unquote(urlsplit(path).path).lstrip("/").split("/", 1)
    key = parts[1] if len(parts) > 1 and parts[1] else None
    operation = {"GET": "GetObject", "PUT": "PutObject", "HEAD": "HeadObject", "DELETE": "DeleteObject"}.get(
        method, method
    )
    if key is None:
        operation = f"{method}Bucket"
    return "s3", operation, key


def error_answer(service: str, kind: str) -> tuple[int, str, bytes]:
    """(status, content type, body) of the service's own error answer for this fault."""
    status = 503 if kind == "error_503" else 500
    if service == "sqs":
        name = "ServiceUnavailable" if status == 503 else "InternalFailure"
        body = json.dumps({"__type": f"com.amazonaws.sqs#{name}", "message": "injected by the soak"})
        return status, "application/x-amz-json-1.0", body.encode()
    code = "SlowDown" if status == 503 else "InternalError"
    xml = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>injected by the soak</Message></Error>"
    return status, "application/xml", xml.encode()


class ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    # Many worker threads keep connections open at once.
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        upstream: str,
        faults: Faults,
        log: TextIO,
        latency: Latency | None = None,
    ) -> None:
        super().__init__(address, ProxyHandler)
        parsed = urlsplit(upstream)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.faults = faults
        self.latency = latency
        self.log = log
        self.log_lock = threading.Lock()
        self.local = threading.local()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away (a worker SIGKILLed mid-request) is part of the weather.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    def record(self, **fields: Any) -> None:
        with self.log_lock:
            self.log.write(json.dumps({"t": round(time.time(), 3), **fields}) + "\n")
            self.log.flush()


class ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body leave in two writes: with Nagle's algorithm and delayed ACKs each answer
    # would wait 40 ms.
    disable_nagle_algorithm = True
    server: ProxyServer

    def log_message(self, format: str, *args: Any) -> None:  # one line per request would bury the faults
        pass

    def do_GET(self) -> None:
        self._handle()

    do_PUT = do_POST = do_HEAD = do_DELETE = do_GET

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _handle(self) -> None:
        body = self._read_body()
        arrived = time.monotonic()
        if self.path.startswith("/__soak__/"):
            self._control(body)
            return
        service, operation, key = classify(self.command, self.path, self.headers, body)
        self._delay(arrived, service, operation, len(body))
        kind, delay = self.server.faults.decide(service, operation, key)
        if kind is not None:
            found = PHOTO_IN_PATH.search(self.path) or PHOTO_IN_BODY.search(body.decode("utf-8", "replace"))
            self.server.record(
                fault=kind, service=service, operation=operation, photo_id=found.group(1) if found else None
            )
        if kind in ("error_500", "error_503"):
            status, content_type, payload = error_answer(service, kind)
            self._answer(status, [("Content-Type", content_type)], payload)
            return
        if kind == "drop_request":
            self._drop()
            return
        if kind == "slow":
            time.sleep(delay)
        try:
            status, headers, payload = self._forward(body)
        except OSError:
            self._answer(502, [("Content-Type", "text/plain")], b"upstream unreachable")
            return
        self._deliver(kind, delay, status, headers, payload)

    def _deliver(
        self, kind: str | None, delay: float, status: int, headers: list[tuple[str, str]], payload: bytes
    ) -> None:
        """The upstream's answer, as the fault (if any) has it reach the client."""
        if kind == "drop_response":
            self._drop()
        elif kind == "truncate" and status == 200 and len(payload) > 1:
            self._answer(status, headers, payload[: len(payload) // 2], length=len(payload))
            self._drop(reset=True)
        elif kind == "slow_body" and status == 200 and payload and delay > 0:
            self._pace = len(payload) / delay
            self._answer(status, headers, payload)
        elif kind == "stall_body" and status == 200 and len(payload) > 1:
            self._answer(status, headers, payload[: len(payload) // 2], length=len(payload))
            time.sleep(delay)
            # The client has usually given up (its read timeout) and closed: the rest goes nowhere.
            with suppress(OSError):
                self.wfile.write(payload[len(payload) // 2 :])
                self.wfile.flush()
        else:
            self._answer(status, headers, payload)

    def _delay(self, arrived: float, service: str, operation: str, size: int) -> None:
        """When the answer may leave (`_due`) and the pace of its body (`_pace`, 0: at once)."""
        self._due, self._pace = arrived, 0.0
        latency = self.server.latency
        if latency is None:
            return
        # The dice's classification counts EventBridge as S3 (the soak's rates rely on it); its
        # latency is its own.
        called = "events" if self.headers.get("X-Amz-Target", "").startswith("AWSEvents.") else service
        self._due += latency.seconds(called, operation)
        if called == "s3":
            self._due += size / latency.bytes_per_second
            self._pace = latency.bytes_per_second if operation == "GetObject" else 0.0

    def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        if body or self.command in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        for fresh in (False, True):
            connection = self._upstream(fresh)
            try:
                connection.request(self.command, self.path, body=body, headers=headers)
                response = connection.getresponse()
                payload = response.read()
            except (http.client.HTTPException, OSError):
                connection.close()
                if fresh:
                    raise
                continue  # a kept-alive connection the upstream had closed: once more on a new one
            kept = [(k, v) for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP]
            if self.command == "HEAD":
                kept += [(k, v) for k, v in response.getheaders() if k.lower() == "content-length"]
            return response.status, kept, payload
        raise OSError("unreachable")

    def _upstream(self, fresh: bool) -> http.client.HTTPConnection:
        local = self.server.local
        if fresh or getattr(local, "connection", None) is None:
            host, port = self.server.upstream
            local.connection = http.client.HTTPConnection(host, port, timeout=60)
        connection: http.client.HTTPConnection = local.connection
        return connection

    def _answer(
        self, status: int, headers: list[tuple[str, str]], payload: bytes, *, length: int | None = None
    ) -> None:
        due = getattr(self, "_due", 0.0)
        if (wait := due - time.monotonic()) > 0:
            time.sleep(wait)
        self.send_response_only(status)
        for name, value in headers:
            self.send_header(name, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(payload) if length is None else length))
        self.end_headers()
        pace = getattr(self, "_pace", 0.0)
        if self.command != "HEAD" and pace and status == 200:
            self._paced(payload, pace)
        elif self.command != "HEAD":
            self.wfile.write(payload)
        self.wfile.flush()

    def _paced(self, payload: bytes, bytes_per_second: float) -> None:
        """The body at `bytes_per_second`, in 64 KiB pieces."""
        self.wfile.flush()
        started = time.monotonic()
        view = memoryview(payload)
        for offset in range(0, len(view), 65536):
            if (wait := started + offset / bytes_per_second - time.monotonic()) > 0:
                time.sleep(wait)
            self.wfile.write(view[offset : offset + 65536])

    def _drop(self, *, reset: bool | None = None) -> None:
        """Close the connection without (the rest of) an answer; sometimes as a reset (RST)."""
        if reset is None:
            reset = self.server.faults.coin()
        if reset:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True

    def _control(self, body: bytes) -> None:
        action = self.path.removeprefix("/__soak__/")
        state = self.server.faults.control(action, json.loads(body) if body else {})
        if action != "stats":
            self.server.record(control=action, **(json.loads(body) if body else {}))
        self._answer(200, [("Content-Type", "application/json")], json.dumps(state).encode())


@dataclass(frozen=True)
class ProxyControl:
    """The harness's handle on a running proxy."""

    url: str

    def call(self, action: str, **body: Any) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.url}/__soak__/{action}",
            data=json.dumps(body).encode() if body or action != "stats" else None,
            method="POST" if action != "stats" else "GET",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            answer: dict[str, Any] = json.load(response)
        return answer


class TcpDelayProxy:
    """A TCP relay on loopback whose client-to-server bursts each wait `delay` seconds: a database's
    round trip (one query's messages leave in one burst; the answers come back undelayed). The
    upstream is ("host", port), or a Unix socket's path (the embedded PostgreSQL listens on one)."""

    def __init__(self, upstream: tuple[str, int] | str, delay: float, port: int = 0) -> None:
        self.upstream = upstream
        self.delay = delay
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port: int = self._listener.getsockname()[1]

    def _connect(self) -> socket.socket:
        if isinstance(self.upstream, str):
            end = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            end.connect(self.upstream)
            return end
        end = socket.create_connection(self.upstream, timeout=10)
        end.settimeout(None)
        end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return end

    def serve_forever(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                server = self._connect()
            except OSError:
                client.close()
                continue
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pipe, args=(client, server, self.delay), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, 0.0), daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    @staticmethod
    def _pipe(source: socket.socket, target: socket.socket, delay: float) -> None:
        try:
            while data := source.recv(262144):
                if delay:
                    time.sleep(delay)
                target.sendall(data)
        except OSError:
            pass
        finally:
            # Either side gone: both directions end, and each pipe closes the end it read from (a
            # long run reconnects hundreds of times: never closed, their descriptors would pile up).
            for end in (source, target):
                with suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
            source.close()


class TcpGate(TcpDelayProxy):
    """A TCP relay that can be shut for a while: a database outage for the processes behind it (their
    connections cut, new ones refused) that outlasts their retries, on any server, the machine's own
    PostgreSQL included (which the harness cannot stop)."""

    def __init__(self, upstream: tuple[str, int] | str, port: int = 0) -> None:
        super().__init__(upstream, 0.0, port)
        self._shut_until = 0.0  # time.monotonic()
        self._ends: list[socket.socket] = []
        self._lock = threading.Lock()

    def shut(self, seconds: float) -> None:
        with self._lock:
            self._shut_until = time.monotonic() + seconds
            ends, self._ends = self._ends, []
        for end in ends:
            # The pipes see their server gone and close the client's side too.
            with suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def _connect(self) -> socket.socket:
        if time.monotonic() < self._shut_until:
            raise OSError("the gate is shut")
        end = super()._connect()
        with self._lock:
            self._ends = [e for e in self._ends if e.fileno() != -1] + [end]
        return end


@dataclass(frozen=True)
class RunningProxy:
    url: str
    pid: int


def database_upstream(url: str) -> str:
    """The tcp:// or unix:// address of a SQLAlchemy URL's PostgreSQL server."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    host = parsed.query.get("host") or parsed.host or "localhost"
    host = host if isinstance(host, str) else host[0]
    port = parsed.port or 5432
    return f"unix://{host}/.s.PGSQL.{port}" if host.startswith("/") else f"tcp://{host}:{port}"


def tcp_address(upstream: str) -> tuple[str, int] | str:
    """A tcp://HOST:PORT or unix://PATH upstream as a TCP relay connects to it."""
    parts = urlsplit(upstream)
    return parts.path if parts.scheme == "unix" else (parts.hostname or "", parts.port or 5432)


def database_through(url: str, proxy: str) -> str:
    """A SQLAlchemy URL's database, reached through the proxy at `proxy` (tcp://127.0.0.1:PORT)."""
    from sqlalchemy.engine import make_url

    parsed, address = make_url(url), urlsplit(proxy)
    query = {name: value for name, value in parsed.query.items() if name != "host"}
    return parsed.set(host=address.hostname, port=address.port, query=query).render_as_string(
        hide_password=False
    )


@contextmanager
def latency_proxy(upstream: str, latency: str = "aws") -> Iterator[RunningProxy]:
    """A latency proxy in its own process in front of `upstream` (http:// or tcp://)."""
    proxy = subprocess.Popen(
        [sys.executable, "-m", "devkit.faultproxy", "--upstream", upstream, "--latency", latency],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proxy.stdout is not None
        url = proxy.stdout.readline().strip()
        if not url:
            raise RuntimeError(f"the latency proxy for {upstream} did not start")
        yield RunningProxy(url, proxy.pid)
    finally:
        proxy.terminate()
        try:
            proxy.wait(10)
        except subprocess.TimeoutExpired:
            proxy.kill()
            proxy.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--upstream",
        required=True,
        help="http://HOST:PORT; with --latency also tcp://HOST:PORT or unix://PATH",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log", default="/dev/null")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--rates", default="", help="JSON {service: {kind: share}}, replacing the defaults")
    parser.add_argument("--latency", choices=sorted(LATENCIES), help="add these latencies to every call")
    args = parser.parse_args()
    latency = LATENCIES[args.latency] if args.latency else None
    upstream = urlsplit(args.upstream)
    if upstream.scheme in ("tcp", "unix"):
        if latency is None:
            parser.error(f"a {upstream.scheme}:// upstream needs --latency")
        relay = TcpDelayProxy(tcp_address(args.upstream), latency.tcp_seconds, args.port)
        print(f"tcp://127.0.0.1:{relay.port}", flush=True)
        try:
            relay.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            relay.close()
        return
    # Latency alone throws no dice unless told to.
    rates = json.loads(args.rates) if args.rates else {} if latency else DEFAULT_RATES
    faults = Faults(args.seed, rates=rates)
    with open(args.log, "a") as log:  # noqa: PTH123 - a text stream for the server's lifetime
        server = ProxyServer(("127.0.0.1", args.port), args.upstream, faults, log, latency)
        print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
        try:
            server.serve_forever(poll_interval=0.2)
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
            sys.stdout.flush()


if __name__ == "__main__":
    main()
