"""Faults injected into the real clients: botocore's event hooks and SQLAlchemy's engine events."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
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


@dataclass
class PutEventsCall:
    """One PutEvents call as the code made it: its entries' details, which were accepted, and when
    it started (time.monotonic)."""

    details: list[dict[str, Any]]
    accepted: list[bool]
    started: float = field(default_factory=time.monotonic)


class _PutEventsFaults:
    """botocore's hooks of one PutEvents call: entries taken out before it, answered as failed after."""

    def __init__(
        self,
        refuse: Callable[[int, dict[str, Any]], bool],
        unreachable: Callable[[int], bool],
        code: str,
    ) -> None:
        self.calls: list[PutEventsCall] = []
        self._refuse, self._unreachable, self._code = refuse, unreachable, code
        self._lock = threading.Lock()

    def before_parameter_build(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        entries = list(params["Entries"])
        call = PutEventsCall([json.loads(e["Detail"]) for e in entries], [True] * len(entries))
        with self._lock:
            number = len(self.calls)
            self.calls.append(call)
        if self._unreachable(number):
            call.accepted = [False] * len(entries)
            context["refusing"] = None
            return
        refused = [i for i, detail in enumerate(call.details) if self._refuse(number, detail)]
        for i in refused:
            call.accepted[i] = False
        context["refusing"] = (len(entries), refused)
        if len(refused) < len(entries):
            params["Entries"] = [e for i, e in enumerate(entries) if i not in refused]

    def before_call(self, context: dict[str, Any], **_: Any) -> Any:
        if context["refusing"] is None:
            raise EndpointConnectionError(endpoint_url="http://unreachable.invalid")
        total, refused = context["refusing"]
        if len(refused) == total:
            # Nothing to send: EventBridge answers without any entry reaching the bus.
            return SimpleNamespace(status_code=200, headers={}), {"FailedEntryCount": 0, "Entries": []}
        return None

    def after_call(self, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        total, refused = context["refusing"]
        sent = iter(parsed.get("Entries", []))
        failure = {"ErrorCode": self._code, "ErrorMessage": "injected"}
        parsed["Entries"] = [failure if i in refused else next(sent) for i in range(total)]
        parsed["FailedEntryCount"] = parsed.get("FailedEntryCount", 0) + len(refused)


@contextmanager
def put_events_refusing(
    client: Any,
    refuse: Callable[[int, dict[str, Any]], bool] = lambda call, detail: False,
    *,
    unreachable: Callable[[int], bool] = lambda call: False,
    code: str = "InternalFailure",
) -> Iterator[list[PutEventsCall]]:
    """PutEvents fails entry by entry, as EventBridge does in a partial failure: `refuse(call,
    detail)` picks the entries answered with `code` (an ErrorCode in their place, FailedEntryCount
    up); the others really reach the bus. `unreachable(call)` fails a whole call instead, as an
    unreachable endpoint does. Yields every call made, in the order they started (numbered from 0
    across the threads that share the client), each entry marked accepted or not."""
    faults = _PutEventsFaults(refuse, unreachable, code)
    handlers = (
        ("before-parameter-build.events.PutEvents", faults.before_parameter_build),
        ("before-call.events.PutEvents", faults.before_call),
        ("after-call.events.PutEvents", faults.after_call),
    )
    for name, handler in handlers:
        client.meta.events.register(name, handler)
    try:
        yield faults.calls
    finally:
        for name, handler in handlers:
            client.meta.events.unregister(name, handler)
