"""The LocalStack target (`make test-localstack`, which runs them through scripts/localstack).

Without LOCALSTACK=1 these tests skip: the normal run uses moto's server. With LOCALSTACK=1 a
LocalStack that does not answer is a failure, never a skip.
"""

from __future__ import annotations

import pytest

from devkit import stack


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
