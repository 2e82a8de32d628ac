"""The delivery benchmark's latency proxy adds AWS's latencies, not more and not less: S3's first
byte, its bandwidth, PutObject's, SQS's and the database's round trip (benchmarks/delivery.py)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import boto3
import psycopg
import pytest
from sqlalchemy.engine import make_url

from devkit.faultproxy import AWS_LATENCY, RunningProxy, database_through, database_upstream, latency_proxy
from tests.conftest import BUCKET

GET = AWS_LATENCY.seconds("s3", "GetObject")
PUT = AWS_LATENCY.seconds("s3", "PutObject")
SQS = AWS_LATENCY.seconds("sqs", "SendMessage")
# What loopback, moto and a loaded 2-core machine may add on top.
SLACK = 0.25


@pytest.fixture(scope="module")
def proxy(aws_endpoint: None) -> Iterator[RunningProxy]:
    with latency_proxy(os.environ["AWS_ENDPOINT_URL"]) as running:
        yield running


def timed(call: object) -> float:
    started = time.perf_counter()
    call()  # type: ignore[operator]
    return time.perf_counter() - started


def test_it_listens_on_loopback_only(proxy: RunningProxy) -> None:
    assert urlsplit(proxy.url).hostname == "127.0.0.1"
    listening = [
        line.split()[1]
        for line in open("/proc/net/tcp").read().splitlines()[1:]  # noqa: PTH123, SIM115
        if line.split()[3] == "0A"  # LISTEN
    ]
    port = f"{urlsplit(proxy.url).port:04X}"
    assert f"0100007F:{port}" in listening


def test_s3_calls_take_aws_latencies_and_bodies_its_bandwidth(proxy: RunningProxy) -> None:
    # GIVEN the S3 client through the proxy, and a 4 MB object
    s3 = boto3.client("s3", endpoint_url=proxy.url)
    key = f"dev/originals/albums/{uuid.uuid4()}/{uuid.uuid4()}/a.jpg"
    body = os.urandom(4_000_000)
    s3.put_object(Bucket=BUCKET, Key=key, Body=body)  # warm: the connection

    # WHEN it is got (first byte, then whole) and a small one put, the quietest of three each (a
    # busy machine's one slow call is not the proxy's)
    def get() -> tuple[float, float]:
        started = time.perf_counter()
        stream = s3.get_object(Bucket=BUCKET, Key=key)["Body"]
        first = time.perf_counter() - started
        assert stream.read() == body
        return first, time.perf_counter() - started

    put = min(timed(lambda: s3.put_object(Bucket=BUCKET, Key=key + "x", Body=b"v")) for _ in range(3))
    firsts, wholes = zip(*(get() for _ in range(3)), strict=True)
    first, whole = min(firsts), min(wholes)

    # THEN each takes its latency (and the body 4 MB at 100 MB/s: 40 ms), not much more
    assert PUT <= put < PUT + SLACK
    assert GET <= first < GET + SLACK
    assert GET + len(body) / AWS_LATENCY.bytes_per_second <= whole < GET + 0.04 + SLACK


def test_sqs_calls_take_their_latency(proxy: RunningProxy) -> None:
    sqs = boto3.client("sqs", endpoint_url=proxy.url)
    url = sqs.create_queue(QueueName=f"latency-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    send = min(timed(lambda: sqs.send_message(QueueUrl=url, MessageBody="{}")) for _ in range(3))
    assert SQS <= send < SQS + SLACK


def test_the_database_round_trip_takes_a_millisecond_more(database_url: str) -> None:
    # GIVEN the database direct, and through the TCP proxy
    with latency_proxy(database_upstream(database_url)) as running:
        direct_dsn, proxied_dsn = (
            make_url(u).set(drivername="postgresql").render_as_string(hide_password=False)
            for u in (database_url, database_through(database_url, running.url))
        )
        with psycopg.connect(direct_dsn) as direct, psycopg.connect(proxied_dsn) as proxied:
            # WHEN 50 round trips are made on each
            rounds = 50

            def trips(connection: psycopg.Connection[object]) -> float:
                return timed(lambda: [connection.execute("SELECT 1").fetchone() for _ in range(rounds)])

            trips(direct), trips(proxied)  # warm
            extra = (min(trips(proxied) for _ in range(3)) - min(trips(direct) for _ in range(3))) / rounds

    # THEN each took about AWS_LATENCY.tcp_seconds (1 ms) more
    assert AWS_LATENCY.tcp_seconds * 0.9 <= extra < AWS_LATENCY.tcp_seconds + 0.002
