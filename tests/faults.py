"""Faults injected into the real clients: botocore's event hooks and SQLAlchemy's engine events."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from botocore.exceptions import EndpointConnectionError
from sqlalchemy import Engine, event, text


@contextmanager
def aws_fails(
    client: Any, operation: str, *, times: int | None = None, after: int = 0
) -> Iterator[list[float]]:
    """`operation` (e.g. "GetObject") fails as if the service were unreachable: `times` calls (all,
    if None) after the first `after` ones.

    Raised from `before-call`, once per API call (before botocore's own retries), so each failure
    is one the service sees. Yields the times of the calls, failed or not.
    """
    calls: list[float] = []

    def hook(**_: Any) -> None:
        calls.append(time.monotonic())
        if len(calls) > after and (times is None or len(calls) <= after + times):
            raise EndpointConnectionError(endpoint_url="http://unreachable.invalid")

    name = f"before-call.{client.meta.service_model.service_name}.{operation}"
    client.meta.events.register(name, hook)
    try:
        yield calls
    finally:
        client.meta.events.unregister(name, hook)


@contextmanager
def connection_killed(
    engine: Engine, admin: Engine, when: Callable[[str], bool], *, at_commit: bool = False, times: int = 1
) -> Iterator[list[str]]:
    """The server ends the session (pg_terminate_backend) before a statement matching `when`, or,
    with `at_commit`, before the commit of the transaction that ran it."""
    killed: list[str] = []

    def kill(connection: Any, label: str) -> None:
        if len(killed) < times:
            pid = connection.connection.dbapi_connection.info.backend_pid
            with admin.connect() as other:
                other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            killed.append(label)

    def before_cursor_execute(connection: Any, cursor: Any, statement: str, *args: Any) -> None:
        if when(statement):
            if at_commit:
                connection.info["kill_at_commit"] = True
            else:
                kill(connection, statement)

    def before_commit(connection: Any) -> None:
        if connection.info.pop("kill_at_commit", False):
            kill(connection, "COMMIT")

    event.listen(engine, "before_cursor_execute", before_cursor_execute)
    event.listen(engine, "commit", before_commit)
    try:
        yield killed
    finally:
        event.remove(engine, "before_cursor_execute", before_cursor_execute)
        event.remove(engine, "commit", before_commit)
