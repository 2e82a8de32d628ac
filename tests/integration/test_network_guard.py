"""The test-wide guard (tests/network_guard.py): no AWS call while a database transaction is open.

Every test runs under it; these prove that it refuses such a call (and records it, so that a test
fails even where the code under test swallowed the error), and that it leaves alone a call made
after the commit or by another thread."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from sqlalchemy import Engine, text

from tests.conftest import BUCKET
from tests.network_guard import GUARD


@pytest.fixture
def s3(aws_endpoint: None) -> Any:
    """A client made as the code makes its own: on a boto3 session, after the guard was installed."""
    return boto3.session.Session().client("s3")


def test_an_aws_call_inside_a_transaction_is_refused(db: Engine, s3: Any) -> None:
    # GIVEN a transaction open on the engine
    with (
        GUARD.expecting() as caught,
        pytest.raises(AssertionError, match="ListObjectsV2"),
        db.begin() as connection,
    ):
        connection.execute(text("SELECT 1"))
        # WHEN S3 is called inside it
        s3.list_objects_v2(Bucket=BUCKET)

    # THEN the call was refused before it left, and recorded
    assert [v.operation.split(" ")[0] for v in caught] == ["s3.ListObjectsV2"]


def test_a_refused_call_is_recorded_even_when_the_code_swallows_the_error(db: Engine, s3: Any) -> None:
    # GIVEN code that catches every error of its S3 call, inside an autobegun transaction
    def careless() -> None:
        with db.connect() as connection, contextlib.suppress(Exception):
            connection.execute(text("SELECT 1"))
            s3.head_bucket(Bucket=BUCKET)

    # WHEN it runs
    with GUARD.expecting() as caught:
        careless()

    # THEN the guard still has the call, for the test's teardown to fail on
    assert [v.operation.split(" ")[0] for v in caught] == ["s3.HeadBucket"]


def test_calls_after_the_commit_and_from_other_threads_pass(db: Engine, s3: Any) -> None:
    # GIVEN a transaction committed, and one open in this thread while another thread calls S3
    with db.begin() as connection:
        connection.execute(text("SELECT 1"))
    results: list[Any] = []

    def call(into: list[Any], operation: Callable[[], Any]) -> None:
        into.append(operation())

    # WHEN S3 is called after the commit, and by the other thread during this one's transaction
    with GUARD.expecting() as caught:
        s3.head_bucket(Bucket=BUCKET)
        with db.begin() as connection:
            connection.execute(text("SELECT 1"))
            other = threading.Thread(target=call, args=(results, lambda: s3.head_bucket(Bucket=BUCKET)))
            other.start()
            other.join()

    # THEN neither is refused: the other thread's call waits inside no transaction of its own
    assert caught == []
    assert len(results) == 1
