"""Events leave the database (SPEC 12): the hand-off after a commit, and the relay, through real parts.

PostgreSQL, and moto's server over HTTP for EventBridge and SQS: a custom bus with a subscriber's
rule to a queue (devkit.stack.subscribe), so that delivery is asserted on what a consumer receives.
Faults go into the real clients (tests/faults.py): PutEvents unreachable, or failing entry by entry
as EventBridge answers a partial failure; the server ending the relay's session at its commit.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import boto3
import pytest
from sqlalchemy import Engine, event, func, insert, select, update

from devkit import handlers, samples, stack, uploads
from devkit.poller import LambdaContext
from photo_publish import bootstrap
from photo_publish import uploads as app_uploads
from photo_publish.adapters.database import create_database_engine
from photo_publish.adapters.models import OutboxEvent
from photo_publish.adapters.storage import S3Store
from photo_publish.contracts import (
    PHOTO_DELETED,
    PHOTO_FAILED,
    PHOTO_PUBLISHED,
    PhotoFailedPayload,
    PhotoPublishedPayload,
)
from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.outbox.relay import SOURCE, EventBridgeBus, Relay
from photo_publish.settings import InvalidSettings
from tests.conftest import BUCKET, STAGE, Infra
from tests.faults import PutEventsCall, aws_fails, connection_killed, put_events_refusing
from tests.polling import poll_until
from tests.rows import job, photo

relay_app = handlers.load("relay")
MARK = "UPDATE outbox_events SET published_at"


@pytest.fixture
def bus(infra: Infra) -> stack.Subscriber:
    """A bus of the stack's shape with a subscriber's queue, and the functions pointed at it."""
    subscriber = stack.subscribe(stack.events_client(), infra.sqs, f"photo-publish-{uuid.uuid4().hex[:10]}")
    infra.configure(event_bus_name=subscriber.bus_name)
    return subscriber


def received(infra: Infra, bus: stack.Subscriber) -> list[dict[str, Any]]:
    return stack.received(infra.sqs, bus.queue_url)


def event_ids(envelopes: list[dict[str, Any]]) -> Counter[str]:
    return Counter(e["detail"]["eventId"] for e in envelopes)


def run_relay(timeout: float = 60) -> dict[str, Any]:
    result: dict[str, Any] = relay_app.lambda_handler({"source": "aws.events"}, LambdaContext(timeout))
    return result


def waiting(db: Engine) -> int:
    with db.connect() as c:
        return (
            c.scalar(select(func.count()).select_from(OutboxEvent).where(OutboxEvent.published_at.is_(None)))
            or 0
        )


def outbox(db: Engine) -> dict[str, Any]:
    """Every outbox row by its id (as text, as consumers see it)."""
    with db.connect() as c:
        return {str(row.id): row for row in c.execute(select(OutboxEvent).order_by(OutboxEvent.created_at))}


def write_events(db: Engine, counts: list[int], *, age: float = 3600) -> list[list[str]]:
    """Outbox rows as the transactions write them: photo i gets counts[i] events, the n-th of each
    photo written after every photo's (n-1)-th (the first `age` seconds ago, a millisecond apart),
    with entityVersion and seq counting up. Returns the ids, per photo, in the order written."""
    base = time.time() - age
    rows, ids = [], [[] for _ in counts]
    for n in range(max(counts, default=0)):
        for i, count in enumerate(counts):
            if n >= count:
                continue
            photo_id, event_id = uuid.UUID(int=i + 1), uuid.uuid4()
            last = n == count - 1
            rows.append(
                {
                    "id": event_id,
                    "aggregate_type": "photo",
                    "aggregate_id": photo_id,
                    "event_type": PHOTO_PUBLISHED if last and count > 1 else PHOTO_FAILED,
                    "payload": {
                        "photoId": str(photo_id),
                        "entityVersion": 1 + int(last and count > 1),
                        "seq": n,
                    },
                    "created_at": datetime.fromtimestamp(base + len(rows) / 1000, UTC),
                }
            )
            ids[i].append(str(event_id))
    with db.begin() as c:
        for start in range(0, len(rows), 5000):
            c.execute(insert(OutboxEvent), rows[start : start + 5000])
    return ids


def emf(output: str) -> dict[str, tuple[list[float], dict[str, str]]]:
    """The metrics Powertools printed (CloudWatch's embedded metric format): by name, the values of
    the last flush that had it, and its dimensions."""
    found: dict[str, tuple[list[float], dict[str, str]]] = {}
    for line in output.splitlines():
        if line.startswith("{") and '"_aws"' in line:
            document = json.loads(line)
            for directive in document["_aws"]["CloudWatchMetrics"]:
                for metric in directive["Metrics"]:
                    dimensions = {d: document[d] for d in directive["Dimensions"][0]}
                    value = document[metric["Name"]]
                    found[metric["Name"]] = (value if isinstance(value, list) else [value], dimensions)
    return found


# --- the publish path: hand-off after the commit ------------------------------------------------


def test_both_event_types_reach_the_bus_at_once_through_the_hand_off(
    infra: Infra, db: Engine, bus: stack.Subscriber
) -> None:
    # GIVEN a photo and a corrupt upload
    good = uploads.upload(
        db, infra.s3, BUCKET, STAGE, file_name="Wood.jpg", data=(samples.IMAGES / "Wood.jpg").read_bytes()
    )
    bad = uploads.upload(
        db,
        infra.s3,
        BUCKET,
        STAGE,
        file_name="x.jpg",
        data=samples.truncated((samples.IMAGES / "Wood.jpg").read_bytes()),
    )

    # WHEN both are processed
    poll_until(infra, lambda: photo(db, good.photo_id)[0] == "ready" and job(db, bad.photo_id)[0] == "failed")

    # THEN the subscriber already has both events, no relay having run: SPEC 11's entries
    rows = outbox(db)
    envelopes = received(infra, bus)
    assert sorted(e["detail-type"] for e in envelopes) == [PHOTO_FAILED, PHOTO_PUBLISHED]
    for envelope in envelopes:
        row = rows[envelope["detail"]["eventId"]]
        assert envelope["source"] == SOURCE == "photo-publish"
        assert envelope["detail-type"] == row.event_type
        assert set(envelope["detail"]) == {"eventId", "data"}
        assert envelope["detail"]["data"] == row.payload
        assert row.published_at is not None
    published = next(e for e in envelopes if e["detail-type"] == PHOTO_PUBLISHED)
    failed = next(e for e in envelopes if e["detail-type"] == PHOTO_FAILED)
    assert PhotoPublishedPayload.from_json(published["detail"]["data"]).photo_id == good.photo_id
    assert PhotoFailedPayload.from_json(failed["detail"]["data"]).error_code is ErrorCode.DECODE_FAILED
    # AND the relay finds nothing left to send
    assert run_relay()["published"] == 0
    assert received(infra, bus) == []


def test_with_the_bus_down_records_succeed_and_the_relay_delivers_every_waiting_event_once(
    infra: Infra, db: Engine, bus: stack.Subscriber
) -> None:
    # GIVEN the bus unreachable while two photos publish and a third fails
    shots = [
        uploads.upload(db, infra.s3, BUCKET, STAGE, file_name=name, data=(samples.IMAGES / name).read_bytes())
        for name in ("Aqua.jpg", "Storm.jpg")
    ]
    bad = uploads.upload(db, infra.s3, BUCKET, STAGE, file_name="bad.jpg", data=b"not a photo")
    with aws_fails(bootstrap.handoff_events_client(), "PutEvents") as calls:
        # WHEN they are processed
        poller = poll_until(
            infra,
            lambda: (
                all(photo(db, s.photo_id)[0] == "ready" for s in shots)
                and job(db, bad.photo_id)[0] == "failed"
            ),
        )

    # THEN every record succeeded, each hand-off tried once (no retries), and the events wait
    assert poller.failed == 0
    assert len(calls) == 3
    assert received(infra, bus) == []
    assert waiting(db) == 3

    # WHEN the bus is back and the relay runs
    first = run_relay()

    # THEN every waiting event is delivered once, and a second run sends nothing
    assert first["published"] == 3 and first["notAccepted"] == 0
    assert event_ids(received(infra, bus)) == Counter(dict.fromkeys(outbox(db), 1))
    assert waiting(db) == 0
    assert run_relay()["published"] == 0
    assert received(infra, bus) == []


@pytest.fixture
def hung_endpoint() -> Iterator[str]:
    """A loopback endpoint that accepts connections and never answers (a bus that hangs)."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for connection in held:
        connection.close()
    server.close()


def test_a_bus_that_hangs_costs_a_record_its_short_timeout_and_nothing_else(
    infra: Infra, db: Engine, bus: stack.Subscriber, hung_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN EventBridge that takes connections and never answers, and a hand-off timeout of 0.5 s
    infra.monkeypatch.setenv("AWS_ENDPOINT_URL_EVENTBRIDGE", hung_endpoint)
    infra.configure(event_handoff_timeout_seconds=0.5)
    shot = uploads.upload(
        db, infra.s3, BUCKET, STAGE, file_name="Wood.jpg", data=(samples.IMAGES / "Wood.jpg").read_bytes()
    )

    # WHEN the photo is processed
    poller = poll_until(infra, lambda: photo(db, shot.photo_id)[0] == "ready")

    # THEN the record succeeded; its hand-off failed after about its timeout, once, and said so
    assert poller.failed == 0
    metrics = emf(capsys.readouterr().out)
    assert metrics["EventHandOffFailures"][0] == [1]
    assert metrics["EventsHandedOff"][0] == [0]
    (duration,) = metrics["EventHandOffDuration"][0]
    assert 400 <= duration < 1500
    assert waiting(db) == 1

    # WHEN the bus answers again and the relay runs: it delivers the event
    infra.monkeypatch.delenv("AWS_ENDPOINT_URL_EVENTBRIDGE")
    bootstrap.reset()
    assert run_relay()["published"] == 1
    assert len(received(infra, bus)) == 1


def test_the_hand_off_sends_a_photos_older_waiting_event_first_and_never_overtakes_it(
    infra: Infra, db: Engine, bus: stack.Subscriber
) -> None:
    # GIVEN a photo whose photo.failed still waits (its hand-off failed) and whose photo.published
    # was just committed
    ((older, newer),) = write_events(db, [2])
    handoff = bootstrap.handoff()

    # WHEN its hand-off runs while the bus refuses the older event
    with put_events_refusing(
        bootstrap.handoff_events_client(), lambda call, detail: detail["eventId"] == older
    ) as calls:
        refused = handoff.hand_off(UUID(int=1))

    # THEN nothing was sent after it: the newer event did not overtake the older one
    assert (refused.sent, refused.failed) == (0, True)
    assert [c.details[0]["eventId"] for c in calls] == [older]
    assert waiting(db) == 2

    # WHEN the bus takes events again: both go, oldest first
    accepted = handoff.hand_off(UUID(int=1))
    assert (accepted.sent, accepted.failed) == (2, False)
    assert [e["detail"]["eventId"] for e in received(infra, bus)] == [older, newer]
    nothing = handoff.hand_off(UUID(int=1))
    assert (nothing.sent, nothing.failed) == (0, False)


# --- the relay ---------------------------------------------------------------------------------


def test_a_relay_killed_between_put_events_and_its_commit_only_sends_duplicates_with_the_same_event_id(
    infra: Infra, db: Engine, engine: Engine, bus: stack.Subscriber
) -> None:
    # GIVEN 15 waiting events, and the server ending the relay's session at its commit
    ids = [i for (i,) in write_events(db, [1] * 15)]
    # WHEN the relay runs (and dies)
    with (
        connection_killed(bootstrap.engine(), engine, lambda s: s.startswith(MARK), at_commit=True) as killed,
        pytest.raises(PhotoError) as died,
    ):
        run_relay()
    assert killed == ["COMMIT"]
    assert died.value.code is ErrorCode.DATABASE_UNAVAILABLE

    # THEN the events reached the bus, but nothing was recorded
    first = received(infra, bus)
    assert event_ids(first) == Counter(dict.fromkeys(ids, 1))
    assert waiting(db) == 15

    # AND a run before their lease has passed leaves them to the relay that may still be sending
    assert run_relay()["published"] == 0

    # WHEN the next run comes once the lease has passed
    with db.begin() as connection:
        connection.execute(update(OutboxEvent).values(leased_until=func.now() - timedelta(seconds=1)))
    assert run_relay()["published"] == 15

    # THEN it sent them again with the same eventId (EventBridge's own ids differ: dedupe on eventId)
    second = received(infra, bus)
    assert event_ids(second) == Counter(dict.fromkeys(ids, 1))
    assert not {e["id"] for e in first} & {e["id"] for e in second}
    assert waiting(db) == 0
    assert run_relay()["published"] == 0


def test_two_relays_at_once_never_send_the_same_row_in_one_pass(
    infra: Infra, db: Engine, bus: stack.Subscriber
) -> None:
    # GIVEN 300 waiting events and two relays, each with its own connection pool and client, whose
    # PutEvents calls take a little while (so that their batches interleave)
    ids = {i for (i,) in write_events(db, [1] * 300)}
    engines = [create_database_engine(infra.settings) for _ in range(2)]
    clients = [stack.events_client() for _ in range(2)]
    for client in clients:
        client.meta.events.register("before-call.events.PutEvents", lambda **_: time.sleep(0.01))
    relays = [
        Relay(engine, EventBridgeBus(client, bus.bus_name), infra.settings, batch_size=20)
        for engine, client in zip(engines, clients, strict=True)
    ]
    start = threading.Barrier(2)

    def run(relay: Relay) -> int:
        start.wait()
        return relay.publish_pending().published

    # WHEN both run at the same moment
    with (
        put_events_refusing(clients[0]) as first,
        put_events_refusing(clients[1]) as second,
        ThreadPoolExecutor(2) as pool,
    ):
        counts = list(pool.map(run, relays))
    for engine in engines:
        engine.dispose()

    # THEN each row was sent by one of them, once; both did part of the work
    sent = [d["eventId"] for calls in (first, second) for call in calls for d in call.details]
    assert Counter(sent) == Counter(dict.fromkeys(ids, 1))
    assert sum(counts) == 300 and min(counts) > 0
    assert event_ids(received(infra, bus)) == Counter(dict.fromkeys(ids, 1))


def test_a_partial_failure_sends_again_exactly_the_entries_that_failed(
    infra: Infra, db: Engine, bus: stack.Subscriber
) -> None:
    # GIVEN ten waiting events, and a bus whose first answer fails the third and sixth entries
    ids = [i for (i,) in write_events(db, [1] * 10)]
    with put_events_refusing(
        bootstrap.events_client(), lambda call, detail: call == 0 and detail["eventId"] in (ids[2], ids[5])
    ) as calls:
        # WHEN the relay runs
        summary = run_relay()

    # THEN one call of ten, then one of exactly the two that failed; all delivered once
    assert [[d["eventId"] for d in c.details] for c in calls] == [ids, [ids[2], ids[5]]]
    assert calls[1].accepted == [True, True]
    assert (summary["published"], summary["notAccepted"], summary["errors"]) == (
        10,
        0,
        {"InternalFailure": 2},
    )
    assert event_ids(received(infra, bus)) == Counter(dict.fromkeys(ids, 1))
    assert waiting(db) == 0


def test_an_entry_the_bus_keeps_refusing_waits_without_holding_back_the_others(
    infra: Infra, db: Engine, bus: stack.Subscriber
) -> None:
    # GIVEN 250 waiting events (three batches), one of which the bus refuses every time
    ids = [i for (i,) in write_events(db, [1] * 250)]
    with put_events_refusing(
        bootstrap.events_client(), lambda call, detail: detail["eventId"] == ids[0]
    ) as calls:
        summary = run_relay()

    # THEN it was tried three times in this run, and the rest was delivered behind it
    assert sum(d["eventId"] == ids[0] for c in calls for d in c.details) == 3
    assert (summary["published"], summary["notAccepted"], summary["busDown"]) == (249, 1, False)
    assert event_ids(received(infra, bus)) == Counter(dict.fromkeys(ids[1:], 1))
    # AND the next run delivers it
    assert run_relay()["published"] == 1
    assert event_ids(received(infra, bus)) == Counter({ids[0]: 1})


def test_a_photo_deleted_while_the_relay_sends_its_event_is_not_announced_after_its_deletion(
    infra: Infra, db: Engine, bus: stack.Subscriber
) -> None:
    # GIVEN a photo's waiting photo.failed event, and a bus that takes as long as the user's
    # deletion of the photo, then refuses the entry (a throttle)
    shot = uploads.register(db, STAGE, "a.jpg")
    with db.begin() as c:
        c.execute(
            insert(OutboxEvent).values(
                aggregate_type="photo",
                aggregate_id=shot.photo_id,
                event_type=PHOTO_FAILED,
                payload={"photoId": str(shot.photo_id), "entityVersion": 1},
            )
        )
    real = EventBridgeBus(bootstrap.events_client(), bus.bus_name)

    class DeletedMeanwhile:
        def put_entries(self, entries: Any) -> list[str | None]:
            deleted = app_uploads.delete(
                db, S3Store(infra.s3, BUCKET), infra.settings, shot.photo_id, caller=app_uploads.BACKEND
            )
            assert deleted
            return ["ThrottlingException"] * len(entries)

    # WHEN the relay's try is refused, and the next run sends what waits
    Relay(db, DeletedMeanwhile(), infra.settings, attempts=1).publish_pending()
    Relay(db, real, infra.settings).publish_pending()

    # THEN the deletion is the photo's last word: its failure, refused while the deletion
    # committed, is not told after it
    assert [e["detail-type"] for e in received(infra, bus)] == [PHOTO_DELETED]
    assert waiting(db) == 0


def test_a_photos_events_reach_the_bus_in_order_whatever_failed_in_between(
    infra: Infra, db: Engine, bus: stack.Subscriber
) -> None:
    # GIVEN five photos with three events each, and a bus that refuses the first event of photo 0
    ids = write_events(db, [3] * 5)
    with put_events_refusing(
        bootstrap.events_client(), lambda call, detail: detail["eventId"] == ids[0][0]
    ) as calls:
        # WHEN the relay runs
        summary = run_relay()

    # THEN the other photos' events went, each photo's in order, one at a time; none of photo 0's
    order = [d["eventId"] for c in calls for d, ok in zip(c.details, c.accepted, strict=True) if ok]
    assert summary["published"] == 12
    for events in ids[1:]:
        assert [i for i in order if i in events] == events
    assert not set(ids[0]) & set(order)
    for call in calls:
        photos = [d["data"]["photoId"] for d in call.details]
        assert len(photos) == len(set(photos)), "two events of one photo in one call"

    # WHEN the bus takes it: photo 0's events follow, in order
    assert run_relay()["published"] == 3
    assert [e["detail"]["eventId"] for e in received(infra, bus)][-3:] == ids[0]


def test_an_unreachable_bus_ends_the_run_after_one_call_and_its_tries(
    infra: Infra, db: Engine, bus: stack.Subscriber, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN 250 waiting events, the oldest 10 minutes old, and the bus unreachable
    write_events(db, [1] * 250, age=600)
    with aws_fails(bootstrap.events_client(), "PutEvents") as calls:
        # WHEN the relay runs
        summary = run_relay()

    # THEN it tried one call three times and stopped (not every batch), and said how old the
    # oldest waiting event is: the metric the alarm reads, per stage
    assert len(calls) == 3
    assert (summary["published"], summary["busDown"]) == (0, True)
    assert 595 < summary["oldestUnpublishedSeconds"] < 620
    (value,), dimensions = emf(capsys.readouterr().out)[relay_app.OLDEST_UNPUBLISHED]
    assert 595 < value < 620
    assert dimensions == {"service": "photo-publish", "stage": STAGE}
    assert waiting(db) == 250

    # AND once the bus is back, one run delivers them all and the age is 0
    after = run_relay()
    assert (after["published"], after["oldestUnpublishedSeconds"]) == (250, 0)
    assert emf(capsys.readouterr().out)[relay_app.OLDEST_UNPUBLISHED][0] == [0]


def test_published_rows_past_the_retention_are_deleted_in_bounded_batches(
    infra: Infra, db: Engine, engine: Engine, bus: stack.Subscriber
) -> None:
    # GIVEN 17 rows published 8 days ago, 3 published yesterday, and 5 waiting for 30 days
    ids = [i for (i,) in write_events(db, [1] * 25)]
    with db.begin() as c:
        c.execute(
            update(OutboxEvent)
            .where(OutboxEvent.id.in_(ids[:17]))
            .values(published_at=func.now() - timedelta(days=8))
        )
        c.execute(
            update(OutboxEvent)
            .where(OutboxEvent.id.in_(ids[17:20]))
            .values(published_at=func.now() - timedelta(days=1))
        )
        c.execute(
            update(OutboxEvent)
            .where(OutboxEvent.id.in_(ids[20:]))
            .values(created_at=func.now() - timedelta(days=30))
        )
    client = stack.events_client()
    relay = Relay(engine, EventBridgeBus(client, bus.bus_name), infra.settings, delete_batch_size=5)
    deletes: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.startswith("DELETE") and "published_at <" in statement:  # the retention's
            deletes.append(statement)

    # WHEN the relay runs with a retention of 7 days (the default), 5 rows a statement
    event.listen(engine, "before_cursor_execute", count)
    try:
        with aws_fails(client, "PutEvents"):
            summary = relay.publish_pending()
    finally:
        event.remove(engine, "before_cursor_execute", count)

    # THEN the 17 expired rows went, in four statements; the rest stays (waiting rows are never deleted)
    assert summary.deleted == 17 and len(deletes) == 4
    assert set(outbox(db)) == set(ids[17:])


def test_the_relay_stops_when_its_time_budget_is_spent(
    infra: Infra, db: Engine, bus: stack.Subscriber
) -> None:
    write_events(db, [1] * 5)
    # a run with less time left than its reserve sends nothing, and says why
    summary = run_relay(timeout=5)
    assert (summary["published"], summary["outOfTime"]) == (0, True)
    assert waiting(db) == 5


def test_a_relay_out_of_time_after_a_batch_keeps_it_and_the_next_run_resumes_after_it(
    infra: Infra, db: Engine, engine: Engine, bus: stack.Subscriber
) -> None:
    # GIVEN 25 waiting events, a relay taking 10 a batch, and a budget that runs out once one
    # batch has been marked published
    ids = [i for (i,) in write_events(db, [1] * 25)]
    relay = Relay(engine, EventBridgeBus(stack.events_client(), bus.bus_name), infra.settings, batch_size=10)
    marks: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.startswith(MARK):
            marks.append(statement)

    # WHEN it runs
    event.listen(engine, "before_cursor_execute", count)
    try:
        summary = relay.publish_pending(lambda: 60.0 if not marks else 0.0)
    finally:
        event.remove(engine, "before_cursor_execute", count)

    # THEN it stopped before the next batch, saying so, with the first batch committed
    assert (summary.batches, summary.published, summary.out_of_time) == (1, 10, True)
    assert waiting(db) == 15

    # WHEN the next run has time
    after = relay.publish_pending()

    # THEN it sent the other 15: every event reached the bus once
    assert (after.published, after.out_of_time) == (15, False)
    assert event_ids(received(infra, bus)) == Counter(dict.fromkeys(ids, 1))


def test_the_relay_refuses_to_start_without_a_bus(infra: Infra) -> None:
    infra.configure(event_bus_name="")
    with pytest.raises(InvalidSettings, match="EVENT_BUS_NAME"):
        bootstrap.relay()


# --- at scale: thousands of photos, the bus failing at random ---------------------------------------

# 2,500 photos in `make test`; `make soak` runs it with RELAY_PHOTOS=10000 (a few minutes more).
PHOTOS = int(os.environ.get("RELAY_PHOTOS", "2500"))


@pytest.fixture
def logged_bus(infra: Infra) -> Iterator[tuple[str, Callable[[], list[dict[str, Any]]]]]:
    """A bus whose subscriber is a rule to a CloudWatch Logs group, and how to read what it got.
    (moto's SQS slows down as a queue grows: 10,000 events through it would take many minutes.)"""
    events, logs = stack.events_client(), boto3.client("logs")
    name = f"photo-publish-{uuid.uuid4().hex[:10]}"
    group = f"/aws/events/{name}"
    events.create_event_bus(Name=name)
    logs.create_log_group(logGroupName=group)
    arn = f"arn:aws:logs:{stack.REGION}:123456789012:log-group:{group}"
    events.put_rule(Name=name, EventBusName=name, EventPattern=json.dumps({"source": [SOURCE]}))
    events.put_targets(Rule=name, EventBusName=name, Targets=[{"Id": "log", "Arn": arn}])
    infra.configure(event_bus_name=name)

    def read() -> list[dict[str, Any]]:
        found, token = [], {}
        while True:
            page = logs.filter_log_events(logGroupName=group, **token)
            found += [json.loads(e["message"]) for e in page["events"]]
            if "nextToken" not in page:
                return found
            token = {"nextToken": page["nextToken"]}

    yield name, read


def test_thousands_of_photos_with_the_bus_failing_at_random_are_all_delivered_in_order(
    infra: Infra, db: Engine, engine: Engine, logged_bus: tuple[str, Callable[[], list[dict[str, Any]]]]
) -> None:
    # GIVEN PHOTOS photos' events (a quarter more: some photos failed before they published), and a bus
    # that fails 10% of calls whole and 15% of entries one by one, at random
    bus_name, read_subscriber = logged_bus
    ids = write_events(db, [1] * (PHOTOS * 16 // 20) + [2] * (PHOTOS * 3 // 20) + [3] * (PHOTOS // 20))
    rows = outbox(db)
    dice, lock = random.Random(14), threading.Lock()

    def chance(p: float) -> bool:
        with lock:
            return dice.random() < p

    engines = [create_database_engine(infra.settings) for _ in range(3)]
    clients = [stack.events_client() for _ in range(3)]
    # Runs of a second, so batches of a second: a killed run's lease (three batches' time) passes
    # within a few runs, as a minute's lease passes between the real relay's runs.
    first, second, handoff = (
        Relay(e, EventBridgeBus(c, bus_name), infra.settings, retry_seconds=0, batch_seconds=1.0)
        for e, c in zip(engines, clients, strict=True)
    )

    def one_run(relay: Relay) -> None:
        # A second of work a run, so that there are many runs (and killed ones among them).
        deadline = time.monotonic() + 1
        # The killed run (its database unavailable at the commit): its rows go again next time.
        with contextlib.suppress(PhotoError):
            relay.publish_pending(lambda: deadline - time.monotonic(), reserve_seconds=0)

    # WHEN two relays run side by side, run after run, while the process function's hand-offs come
    # and go, and every fourth run of the first relay dies at its commit after PutEvents
    runs, killed = 0, []
    with (
        put_events_refusing(
            clients[0], lambda c, d: chance(0.15), unreachable=lambda c: chance(0.1)
        ) as calls_0,
        put_events_refusing(
            clients[1], lambda c, d: chance(0.15), unreachable=lambda c: chance(0.1)
        ) as calls_1,
        put_events_refusing(clients[2], lambda c, d: chance(0.3)) as calls_2,
        ThreadPoolExecutor(3) as pool,
    ):
        while waiting(db) and runs < 300:
            runs += 1
            photos = [UUID(int=dice.randrange(1, len(ids) + 1)) for _ in range(20)]
            dying = (
                connection_killed(engines[0], engine, lambda s: s.startswith(MARK), at_commit=True)
                if runs % 4 == 0
                else contextlib.nullcontext([])
            )
            with dying as kills:
                work = [pool.submit(one_run, first), pool.submit(one_run, second)]
                work.append(pool.submit(hand_off_each, handoff, photos))
                for job_ in work:
                    job_.result()
            killed += kills
    for e in engines:
        e.dispose()
    assert waiting(db) == 0, f"still waiting after {runs} runs"

    # THEN every row reached the subscriber at least once, its duplicates (from the killed runs)
    # with the same eventId and the same data
    envelopes = read_subscriber()
    counts = event_ids(envelopes)
    assert set(counts) == set(rows)
    for envelope in envelopes:
        assert envelope["detail"]["data"] == rows[envelope["detail"]["eventId"]].payload
    duplicates = sum(counts.values()) - len(counts)
    assert killed and duplicates > 0
    # AND each photo's events were first accepted by the bus in the order they were written
    assert_first_accepted_in_order(calls_0 + calls_1 + calls_2, ids)
    print(f"{runs} runs ({len(killed)} killed), {len(envelopes)} events received, {duplicates} duplicates")


def hand_off_each(relay: Relay, photos: list[UUID]) -> None:
    for photo_id in photos:
        relay.hand_off(photo_id)


def assert_first_accepted_in_order(calls: list[PutEventsCall], ids: list[list[str]]) -> None:
    """Each photo's events (ids, as written) were first accepted in the order written."""
    first_accepted: dict[str, int] = {}
    for call in sorted(calls, key=lambda c: c.started):
        for detail, accepted in zip(call.details, call.accepted, strict=True):
            if accepted:
                first_accepted.setdefault(detail["eventId"], len(first_accepted))
    for events in ids:
        assert [first_accepted[i] for i in events] == sorted(first_accepted[i] for i in events)
