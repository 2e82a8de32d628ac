"""What one warm process container asks of PostgreSQL per published photo and per invocation.

Transactions are PostgreSQL's own count (`pg_stat_database.xact_commit + xact_rollback` of the test
database). pgserver's build ships no `pg_stat_statements`, so statements are counted on the engine:
every statement SQLAlchemy sends (its `before_cursor_execute` event), and the pool's pre-ping, a
`SELECT 1` in autocommit that PostgreSQL counts as a committed transaction of its own. The engine's
own tally of transactions must equal PostgreSQL's: a surplus on PostgreSQL's side is another
backend's work in the window (autovacuum visits every database once a minute), and the batch is
measured again.

A backend reports its counters when it goes idle, at most once a second; what it held back is
reported within PGSTAT_IDLE_INTERVAL (10 s, pgstat.c) of going idle. So a reading waits that long
after the last transaction, and then until PostgreSQL's count has caught up with the engine's.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, event, make_url, select

from devkit import handlers, samples, stack, uploads
from devkit.poller import LambdaContext, sqs_event
from photo_publish import bootstrap
from photo_publish.adapters.models import OutboxEvent, Photo
from tests.conftest import BUCKET, STAGE, Infra

process = handlers.load("process")

# pgstat.c's PGSTAT_IDLE_INTERVAL (10 s), and a margin for a busy machine to wake the backend.
REPORTED_WITHIN = 11.0
# The most a reading waits, past that, for PostgreSQL's count to reach the engine's.
CATCH_UP = 10.0
# The bounds this test holds the process function to (docs/performance.md#round-trips-to-the-database),
# per published photo with its event handed off. Four transactions: found and claimed (committed
# before the render, SPEC 5), the claim's check before the variants are written, the publish with
# its event leased, the hand-off's mark (after PutEvents, SPEC 12); each checkout of a pooled
# connection adds its pre-ping, a transaction of its own to PostgreSQL.
TRANSACTIONS_PER_PHOTO = 4 + 4
# 4 + 1 + 6 + 2 statements in those transactions, and the pre-pings.
STATEMENTS_PER_PHOTO = 13 + 4


@dataclass(frozen=True)
class Trips:
    transactions: int
    statements: int


class EngineTally:
    """What the process function's engine sends: statements, transactions begun, pre-pings."""

    def __init__(self, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        event.listen(engine, "before_cursor_execute", lambda *_: self._add("statements"))
        event.listen(engine, "begin", lambda *_: self._add("transactions"))
        ping = engine.dialect.do_ping

        def counted_ping(dbapi_connection: Any) -> bool:
            self._add("pings")
            return ping(dbapi_connection)

        monkeypatch.setattr(engine.dialect, "do_ping", counted_ping)

    def _add(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def read(self) -> Counter[str]:
        with self._lock:
            return Counter(self._counts)


class DatabaseCounters:
    """`pg_stat_database` of the test database, read on a connection of its own. Each reading is a
    transaction of that connection, which `pg_stat_force_next_flush()` reports as it ends: the
    readings' own are taken off, so that a difference of two readings is the other backends' work."""

    def __init__(self, database_url: str) -> None:
        url = make_url(database_url).set(drivername="postgresql")
        self._connection = psycopg.connect(url.render_as_string(hide_password=False), autocommit=True)
        self._readings = 0
        # The first reading reports what the connection's start counted (PostgreSQL's own).
        self.transactions()

    def transactions(self) -> int:
        row = self._connection.execute(
            "SELECT xact_commit + xact_rollback, pg_stat_force_next_flush()"
            " FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        assert row is not None
        count = int(row[0]) - self._readings
        self._readings += 1
        return count

    def close(self) -> None:
        self._connection.close()


@pytest.fixture
def counters(database_url: str) -> Iterator[DatabaseCounters]:
    reader = DatabaseCounters(database_url)
    yield reader
    reader.close()


@pytest.fixture
def bus(infra: Infra) -> None:
    """A bus, so that each publication's event is handed off after its commit, as in production."""
    name = f"photo-publish-{uuid.uuid4().hex[:10]}"
    stack.events_client().create_event_bus(Name=name)
    infra.configure(event_bus_name=name)


def small_jpeg() -> bytes:
    # The render's cost is not measured here: a small photograph keeps the test short.
    data: bytes = samples.photograph("GreenMeadow.jpg").thumbnail_image(480).jpegsave_buffer(Q=85)
    return data


@dataclass(frozen=True)
class Batch:
    photo_ids: list[uuid.UUID]
    event: dict[str, Any]


@dataclass
class Meter:
    """The process handler's round trips, invocation by invocation, in the test's stack."""

    infra: Infra
    db: Engine
    counters: DatabaseCounters
    tally: EngineTally

    def uploaded(self, size: int) -> Batch:
        """`size` photos registered and uploaded, and their S3 notifications as one SQS event."""
        data = small_jpeg()
        photo_ids = [
            uploads.upload(
                self.db, self.infra.s3, BUCKET, STAGE, file_name=f"photo-{i}.jpg", data=data
            ).photo_id
            for i in range(size)
        ]
        messages: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        while len(messages) < size and time.monotonic() < deadline:
            messages += self.infra.sqs.receive_message(
                QueueUrl=self.infra.queues.url,
                MaxNumberOfMessages=10,
                AttributeNames=["All"],
                MessageAttributeNames=["All"],
                VisibilityTimeout=600,
            ).get("Messages", [])
        assert len(messages) == size
        return Batch(photo_ids, sqs_event(messages, self.infra.queues.arn))

    def settled(self, *, at_least: int = 0) -> int:
        """PostgreSQL's count once every backend has reported: after REPORTED_WITHIN, and once it
        has reached `at_least` (by the engine's own tally)."""
        time.sleep(REPORTED_WITHIN)
        deadline = time.monotonic() + CATCH_UP
        while (count := self.counters.transactions()) < at_least and time.monotonic() < deadline:
            time.sleep(0.5)
        return count

    def invoked(self, batch: Batch, before: int) -> tuple[Trips, int]:
        """One invocation of the process handler with `batch`: PostgreSQL's transactions and the
        engine's statements while it ran; and the reading after it."""
        for _ in range(3):
            engine_before = self.tally.read()
            response = process.lambda_handler(batch.event, LambdaContext())
            engine = self.tally.read() - engine_before
            transactions = engine["transactions"] + engine["pings"]
            after = self.settled(at_least=before + transactions)
            assert response == {"batchItemFailures": []}
            if after - before == transactions:
                # (this reading is the next one's before: nothing touched the database since)
                return Trips(transactions, engine["statements"] + engine["pings"]), after
            # More than the engine began: another backend (autovacuum) worked in the window. Again,
            # with new photos.
            assert after - before > transactions, (after - before, transactions)
            batch = self.uploaded(len(batch.photo_ids))
            before = self.settled()
        pytest.fail("another backend worked in the database during each of 3 measurements")


def test_a_warm_container_publishes_each_photo_in_a_few_round_trips_whatever_the_batch(
    infra: Infra, db: Engine, bus: None, counters: DatabaseCounters, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a warm process container: its pool's connections open, its recipe checked, one photo
    # published and its event handed off
    engine = bootstrap.engine()
    meter = Meter(infra, db, counters, EngineTally(engine, monkeypatch))
    connections = [engine.connect() for _ in range(infra.settings.record_concurrency)]
    for connection in connections:
        connection.close()
    warm_up = meter.uploaded(1)
    assert process.lambda_handler(warm_up.event, LambdaContext()) == {"batchItemFailures": []}
    # AND batches of 2 and 5 uploaded photos, their notifications received
    two_photos, five_photos = meter.uploaded(2), meter.uploaded(5)

    # WHEN it is invoked with the batch of 2, then with the batch of 5
    two, reading = meter.invoked(two_photos, meter.settled())
    five, _ = meter.invoked(five_photos, reading)

    # THEN each photo costs the same few round trips, and an invocation none of its own
    transactions, odd_transactions = divmod(five.transactions - two.transactions, 3)
    statements, odd_statements = divmod(five.statements - two.statements, 3)
    per_photo = Trips(transactions, statements)
    per_invocation = Trips(two.transactions - 2 * transactions, two.statements - 2 * statements)
    figures = f"batch of 2 {two}, of 5 {five}: per photo {per_photo}, per invocation {per_invocation}"
    assert (odd_transactions, odd_statements) == (0, 0), figures
    assert per_photo.transactions <= TRANSACTIONS_PER_PHOTO, figures
    assert per_photo.statements <= STATEMENTS_PER_PHOTO, figures
    assert per_invocation == Trips(0, 0), figures
    # AND every photo was published, and its event left with its hand-off
    with db.connect() as connection:
        states = connection.scalars(select(Photo.processing_state))
        assert set(states) == {"ready"}
        waiting = connection.scalars(select(OutboxEvent.id).where(OutboxEvent.published_at.is_(None)))
        assert list(waiting) == []
