"""A stand-in for CloudFormation's pre-signed response URL: an HTTP server on 127.0.0.1 that
records each PUT (path, headers, JSON body), optionally failing the first ones, and can look at the
world while the PUT is in flight (`on_put`: the moment the answer is sent)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Put:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class ResponseUrl:
    base: str
    puts: list[Put] = field(default_factory=list)
    failures_left: int = 0
    # Called with each PUT before it is answered: what holds while the function is still sending.
    on_put: Callable[[Put], None] | None = None

    def url(self, name: str = "answer") -> str:
        """A URL shaped like S3's pre-signed ones (a query string the answer must keep)."""
        return f"{self.base}/cfn/{name}?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=f00d"

    def wait(self, count: int = 1, timeout: float = 30.0) -> list[Put]:
        deadline = time.monotonic() + timeout
        while len(self.puts) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.puts


@contextmanager
def response_url(host: str = "127.0.0.1") -> Iterator[ResponseUrl]:
    recorder: ResponseUrl

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if recorder.failures_left > 0:
                recorder.failures_left -= 1
                self.send_response(503)
            else:
                put = Put(self.path, dict(self.headers), json.loads(data))
                if recorder.on_put is not None:
                    recorder.on_put(put)
                recorder.puts.append(put)
                self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer((host, 0), Handler)
    recorder = ResponseUrl(f"http://{host}:{httpd.server_address[1]}")
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        httpd.shutdown()
        httpd.server_close()
