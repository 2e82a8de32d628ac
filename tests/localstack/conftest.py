"""The LocalStack target (`make test-localstack`, which runs them through scripts/localstack).

Without LOCALSTACK=1 these tests skip: the normal run uses moto's server. With LOCALSTACK=1 a
LocalStack that does not answer is a failure, never a skip.
"""

from __future__ import annotations

import uuid

import pytest

from devkit import stack
from tests.conftest import Infra


def pytest_configure(config: pytest.Config) -> None:
    # Also registered in pyproject.toml; here so that this folder runs under --strict-markers alone.
    config.addinivalue_line("markers", "localstack: needs LocalStack (make test-localstack)")


@pytest.fixture(scope="session", autouse=True)
def localstack_endpoint() -> str:
    """Set up before the session's `aws_endpoint`, so that moto never stands in for LocalStack."""
    if not stack.localstack():
        pytest.skip(
            "LocalStack tests: run `make test-localstack` "
            "(scripts/localstack starts LocalStack and sets LOCALSTACK=1)"
        )
    endpoint = stack.localstack_endpoint()
    problem = None
    try:
        stack.check_localstack(endpoint)
    except RuntimeError as error:
        problem = str(error)
    if problem:
        pytest.fail(problem, pytrace=False)
    return endpoint


@pytest.fixture
def bus(infra: Infra) -> stack.Subscriber:
    """A bus of this test's own, a rule on it to a subscriber's queue, and the functions pointed at it."""
    stack.check_localstack(stack.localstack_endpoint(), ("s3", "sqs", "events"))
    subscriber = stack.subscribe(stack.events_client(), infra.sqs, f"photo-publish-{uuid.uuid4().hex[:10]}")
    infra.configure(event_bus_name=subscriber.bus_name)
    return subscriber
