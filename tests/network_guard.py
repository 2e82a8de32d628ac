"""No network call while a database transaction is open (SPEC 19), enforced in every test.

A transaction that waits on S3, SQS, EventBridge, CloudFront, Secrets Manager or Rekognition holds
its locks (and a pooled connection) for as long as the other service takes: a slow S3 turns a purge
into a transaction that outlives its function. The guard:

- knows which SQLAlchemy connections are inside a transaction from the engine's `begin` event
  (fired on an explicit begin and on autobegin alike), asked again at call time with
  `Connection.in_transaction()` so that a commit, a rollback or an invalidated connection ends it;
- sees every AWS call through botocore's `before-send` event, registered on each client as it is
  created (`botocore.session.Session.create_client`, which boto3's clients go through too).

Transactions are counted per thread: a call is refused when the thread that makes it has a
transaction open. The process function renders records in threads at once, each with its own
transaction, and a call of one thread while another thread's transaction is open is no wait inside
that transaction. (Not seen: a thread that hands work to another thread and waits for it inside a
transaction.) A refused call raises AssertionError and is recorded: the test fails at teardown even
if the code under test swallowed the error.
"""

from __future__ import annotations

import threading
import traceback
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import botocore.session
from sqlalchemy import Connection, Engine, event


@dataclass(frozen=True)
class Violation:
    operation: str
    stack: str

    def __str__(self) -> str:
        return f"{self.operation} called inside a database transaction:\n{self.stack}"


class NetworkGuard:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Per thread: the connections it began a transaction on (weak: a dropped one is gone).
        self._open: dict[int, weakref.WeakSet[Connection]] = {}
        self.violations: list[Violation] = []
        # Connections that stand for another process (a test's stuck session): not this thread's.
        self._elsewhere: weakref.WeakSet[Connection] = weakref.WeakSet()

    # -- SQLAlchemy --------------------------------------------------------------------------------

    def _begin(self, connection: Connection) -> None:
        with self._lock:
            self._open.setdefault(threading.get_ident(), weakref.WeakSet()).add(connection)

    def _end(self, connection: Connection) -> None:
        with self._lock:
            for connections in self._open.values():
                connections.discard(connection)

    def open_transactions(self) -> list[Connection]:
        """The current thread's connections inside a transaction."""
        with self._lock:
            connections = list(self._open.get(threading.get_ident(), ()))
        return [
            c
            for c in connections
            if c not in self._elsewhere and not c.closed and not c.invalidated and c.in_transaction()
        ]

    def another_session(self, connection: Connection) -> Connection:
        """`connection` stands for another process (a test's frozen worker holding a lock): its
        transaction is not the calling code's."""
        with self._lock:
            self._elsewhere.add(connection)
        return connection

    # -- botocore ----------------------------------------------------------------------------------

    def _before_send(self, request: Any, **kwargs: Any) -> None:
        if not self.open_transactions():
            return
        operation = kwargs.get("event_name", "before-send").removeprefix("before-send.")
        # The project's frames (and the tests'), not botocore's and pytest's.
        frames = [f for f in traceback.extract_stack()[:-1] if "site-packages" not in f.filename]
        violation = Violation(
            f"{operation} ({request.method} {request.url})", "".join(traceback.format_list(frames))
        )
        with self._lock:
            self.violations.append(violation)
        raise AssertionError(str(violation))

    def watch(self, client: Any) -> None:
        client.meta.events.register("before-send", self._before_send)

    # -- installing --------------------------------------------------------------------------------

    def install(self) -> None:
        event.listen(Engine, "begin", self._begin)
        event.listen(Engine, "commit", self._end)
        event.listen(Engine, "rollback", self._end)
        create_client = botocore.session.Session.create_client
        guard = self

        def watched_client(session: Any, *args: Any, **kwargs: Any) -> Any:
            client = create_client(session, *args, **kwargs)
            guard.watch(client)
            return client

        botocore.session.Session.create_client = watched_client  # type: ignore[method-assign]

    @contextmanager
    def checking(self) -> Iterator[list[Violation]]:
        """The violations of one test (each also raised where it happened)."""
        with self._lock:
            self.violations = []
        yield self.violations

    @contextmanager
    def expecting(self) -> Iterator[list[Violation]]:
        """The violations made inside, taken off the test's list (the guard's own tests)."""
        with self._lock:
            before = len(self.violations)
        caught: list[Violation] = []
        try:
            yield caught
        finally:
            with self._lock:
                caught.extend(self.violations[before:])
                del self.violations[before:]


GUARD = NetworkGuard()
