"""LocalStack listens on loopback only (SPEC 15).

Its default server (twisted) ignores the host part of GATEWAY_LISTEN for IPv4 and binds every
interface; scripts/localstack starts its hypercorn server, which honours 127.0.0.1. Read from the
kernel's socket tables, as `ss -ltn` shows them: LocalStack's port and every other socket its
process group listens on.
"""

from __future__ import annotations

from urllib.parse import urlparse

import pytest

from awslocal import sockets

pytestmark = pytest.mark.localstack


def test_localstack_listens_on_loopback_only(localstack_endpoint: str) -> None:
    # GIVEN LocalStack as scripts/localstack started it
    port = urlparse(localstack_endpoint).port
    # WHEN the kernel's listening sockets are read
    on_port = [listener for listener in sockets.listeners() if listener.port == port]
    # THEN its port is bound on 127.0.0.1 alone, and so is anything else its processes listen on
    assert on_port, f"nothing listens on {port}"
    assert [str(listener) for listener in on_port] == [f"127.0.0.1:{port}"]
    pid = sockets.owner(on_port[0])
    assert pid is not None
    everything = sockets.of_process_group(pid)
    assert everything and all(listener.loopback for listener in everything), sorted(map(str, everything))
