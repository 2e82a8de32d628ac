"""The sweep (SPEC 7) on a real PostgreSQL, sending to moto's SQS; and a deleted photo's letters, which
the sweep and the operator's redrive take out of the dead-letter queue (SPEC 19)."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import boto3
import pytest
from sqlalchemy import Engine, func, insert, select, text, update

from devkit import handlers, samples, stack, uploads
from devkit.faultproxy import latency_proxy
from devkit.poller import LambdaContext, Poller
from photo_publish import bootstrap, operator
from photo_publish import uploads as app_uploads
from photo_publish.adapters.database import create_database_engine
from photo_publish.adapters.models import OutboxEvent, Photo, PhotoJob
from photo_publish.adapters.queue import SqsQueue
from photo_publish.adapters.storage import S3Store
from photo_publish.adapters.tables import cdn_invalidations, deleted_photos
from photo_publish.contracts import PHOTO_FAILED, PhotoFailedPayload
from photo_publish.errors import ErrorCode
from photo_publish.jobs import machine
from photo_publish.jobs.sweep import PURGE_FIRST_BATCH, Sweeper
from tests import cdn
from tests.conftest import BUCKET, STAGE, Infra
from tests.faults import aws_fails, connection_killed
from tests.letters import dead_letters
from tests.polling import poll_until
from tests.rows import in_state, job

MINUTE = timedelta(minutes=1)


def jobs(db: Engine, count: int, **values: Any) -> list[uuid.UUID]:
    """`count` photos with their jobs, the jobs' columns set as given (timestamps relative to now)."""
    ids = [uuid.uuid4() for _ in range(count)]
    with db.begin() as c:
        c.execute(
            insert(Photo),
            [
                {"id": i, "album_id": uuid.uuid4(), "original_key": f"{STAGE}/originals/albums/x/{i}/p.jpg"}
                for i in ids
            ],
        )
        c.execute(insert(PhotoJob), [{"photo_id": i} for i in ids])
        if values:
            c.execute(update(PhotoJob).where(PhotoJob.photo_id.in_(ids)).values(**in_state(**values)))
    return ids


def ago(delta: timedelta) -> Any:
    return func.now() - delta


def sent(infra: Infra, url: str | None = None) -> Counter[uuid.UUID]:
    """Every job message in the queue, by photo (received and deleted)."""
    count: Counter[uuid.UUID] = Counter()
    while messages := infra.sqs.receive_message(QueueUrl=url or infra.queues.url, MaxNumberOfMessages=10).get(
        "Messages", []
    ):
        for m in messages:
            count[uuid.UUID(json.loads(m["Body"])["photoId"])] += 1
            infra.sqs.delete_message(QueueUrl=url or infra.queues.url, ReceiptHandle=m["ReceiptHandle"])
    return count


def sweeper(infra: Infra, engine: Engine | None = None, batch_size: int = 500) -> Sweeper:
    queue = SqsQueue(infra.sqs, infra.settings.process_queue_url, infra.settings.dead_letter_queue_url)
    store = S3Store(infra.s3, BUCKET)
    return Sweeper(engine or bootstrap.engine(), queue, infra.settings, store=store, batch_size=batch_size)


def test_due_pending_rows_are_sent_once_and_rows_in_their_grace_are_left_alone(
    infra: Infra, db: Engine
) -> None:
    # GIVEN pending rows due for longer than SWEEP_AFTER_SECONDS (10 min), and rows inside it
    due = jobs(db, 3, created_at=ago(20 * MINUTE)) + jobs(db, 2, next_retry_at=ago(15 * MINUTE))
    jobs(db, 2)  # a new upload: its own message is on its way
    jobs(db, 2, created_at=ago(20 * MINUTE), next_retry_at=ago(5 * MINUTE))  # the queue's retry comes first
    jobs(db, 2, created_at=ago(20 * MINUTE), next_retry_at=func.now() + MINUTE)  # still in backoff
    jobs(db, 2, status="done", created_at=ago(60 * MINUTE))

    # WHEN the sweep runs, and runs again inside the lease
    first = sweeper(infra).run()
    second = sweeper(infra).run()

    # THEN the due rows were sent once, stamped, and nothing else was sent
    assert first.resent_pending == 5 and second.resent_pending == 0
    assert sent(infra) == Counter(dict.fromkeys(due, 1))
    with db.connect() as c:
        stamped = set(c.scalars(select(PhotoJob.photo_id).where(PhotoJob.enqueued_at.is_not(None))))
    assert stamped == set(due)

    # WHEN the lease runs out with the rows still pending (their messages were lost again)
    with db.begin() as c:
        c.execute(update(PhotoJob).where(PhotoJob.photo_id.in_(due)).values(enqueued_at=ago(11 * MINUTE)))
    third = sweeper(infra).run()

    # THEN they are sent again
    assert third.resent_pending == 5
    assert sent(infra) == Counter(dict.fromkeys(due, 1))


def test_a_row_whose_message_failed_to_send_is_sent_by_a_later_run(infra: Infra, db: Engine) -> None:
    # GIVEN due rows and SQS refusing the batch
    due = jobs(db, 12, created_at=ago(20 * MINUTE))
    with aws_fails(infra.sqs, "SendMessageBatch"):
        # WHEN the sweep runs
        failed = sweeper(infra).run()

    # THEN nothing counts as sent and the stamps were cleared
    assert (failed.resent_pending, failed.send_failed) == (0, 12)
    with db.connect() as c:
        assert (
            c.scalar(select(func.count()).select_from(PhotoJob).where(PhotoJob.enqueued_at.is_not(None))) == 0
        )

    # WHEN a later run finds SQS back
    later = sweeper(infra).run()

    # THEN every row is sent, once
    assert later.resent_pending == 12
    assert sent(infra) == Counter(dict.fromkeys(due, 1))


class RecordingQueue:
    """Records sends from both sweeps. moto's SendMessage is O(queue length) per message, which
    makes thousands of messages take minutes; what is under test here is the database's locking."""

    def __init__(self) -> None:
        self.sent: Counter[uuid.UUID] = Counter()
        self._lock = threading.Lock()

    def send_jobs(self, photo_ids: Any, *, spread_seconds: float = 0) -> list[uuid.UUID]:
        with self._lock:
            self.sent.update(photo_ids)
        return []

    def send_dead_letter(self, *args: Any, **kwargs: Any) -> bool:
        raise AssertionError("no dead letter expected")

    def depth(self) -> int:
        return 0

    def delete_variants(self, keys: Any) -> list[str]:
        raise AssertionError("no retired variant expected")


def test_two_sweeps_at_once_never_send_the_same_row_twice(infra: Infra, db: Engine) -> None:
    # GIVEN thousands of due rows, and two sweeps on separate connections, in small batches
    due = jobs(db, 3000, created_at=ago(20 * MINUTE))
    engines = [create_database_engine(infra.settings) for _ in range(2)]
    queue, start = RecordingQueue(), threading.Barrier(2)

    def run(engine: Engine) -> int:
        start.wait()
        return Sweeper(engine, queue, infra.settings, store=queue, batch_size=50).run().resent_pending

    # WHEN they run at the same moment
    with ThreadPoolExecutor(2) as pool:
        counts = list(pool.map(run, engines))
    for engine in engines:
        engine.dispose()

    # THEN each row was sent exactly once between them, and both did part of the work
    assert sum(counts) == len(due)
    assert min(counts) > 0
    assert queue.sent == Counter(dict.fromkeys(due, 1))


def test_stale_active_rows_are_re_sent_or_failed_with_worker_lost(infra: Infra, db: Engine) -> None:
    # GIVEN jobs whose workers died: with attempts left, with none left, and one whose photo is published
    retry = jobs(db, 2, status="active", attempt=1, claimed_at=ago(10 * MINUTE))
    lost = jobs(db, 1, status="active", attempt=3, claimed_at=ago(10 * MINUTE))
    published = jobs(db, 1, status="active", attempt=3, claimed_at=ago(10 * MINUTE))
    fresh = jobs(db, 1, status="active", attempt=1, claimed_at=ago(MINUTE))
    with db.begin() as c:
        c.execute(
            update(Photo)
            .where(Photo.id.in_(published))
            .values(processing_state="ready", visibility="published", published_at=func.now())
        )

    # WHEN the sweep runs
    summary = sweeper(infra).run()

    # THEN the retriable ones are pending again, stamped and sent; the exhausted ones failed
    assert (summary.resent_stale, summary.worker_lost) == (2, 2)
    assert sent(infra) == Counter(dict.fromkeys(retry, 1))
    with db.connect() as c:
        status = dict(c.execute(select(PhotoJob.photo_id, PhotoJob.status)).all())
        photo = dict(c.execute(select(Photo.id, Photo.processing_state)).all())
    assert [status[i] for i in retry + lost + published + fresh] == [
        "pending",
        "pending",
        "failed",
        "failed",
        "active",
    ]
    assert photo[lost[0]] == "processing_failed"
    assert photo[published[0]] == "ready"  # never downgraded
    # AND each final failure has its dead letter
    letters = sent(infra, infra.queues.dead_letter_url)
    assert letters == Counter(dict.fromkeys(lost + published, 1))
    # AND the photo marked failed has its photo.failed event, the published one none
    with db.connect() as c:
        events = c.execute(
            select(OutboxEvent.aggregate_id, OutboxEvent.event_type, OutboxEvent.payload)
        ).all()
    assert [(e.aggregate_id, e.event_type) for e in events] == [(lost[0], PHOTO_FAILED)]
    failed = PhotoFailedPayload.from_json(events[0].payload)
    assert (failed.error_code, failed.kind, failed.attempt, failed.entity_version) == (
        ErrorCode.WORKER_LOST,
        "final",
        3,
        1,
    )


def test_a_refused_dead_letter_neither_stops_the_run_nor_is_lost(infra: Infra, db: Engine) -> None:
    # GIVEN due pending rows, a lost worker that held its last attempt, and a dead-letter queue that
    # refuses messages (SendMessage; job messages go by SendMessageBatch)
    due = jobs(db, 3, created_at=ago(20 * MINUTE))
    lost = jobs(db, 1, status="active", attempt=3, claimed_at=ago(10 * MINUTE))
    with aws_fails(infra.sqs, "SendMessage"):
        # WHEN the sweep runs
        summary = sweeper(infra).run()

    # THEN the stamped rows were still sent, and the lost worker's job is failed, its letter owed
    assert (summary.resent_pending, summary.worker_lost, summary.dead_letters_sent) == (3, 1, 0)
    assert sent(infra) == Counter(dict.fromkeys(due, 1))
    with db.connect() as c:
        owed = c.scalar(select(PhotoJob.dead_letter_owed_at).where(PhotoJob.photo_id == lost[0]))
    assert owed is not None
    assert sent(infra, infra.queues.dead_letter_url) == Counter()

    # WHEN later sweeps run with the queue back
    early = sweeper(infra).run()
    later = sweeper(infra).run()
    again = sweeper(infra).run()

    # THEN the owed letter was sent once, by the next run (a refused letter is in nobody's hands: no
    # lease to wait out), and nothing is owed any more
    assert (early.dead_letters_sent, later.dead_letters_sent, again.dead_letters_sent) == (1, 0, 0)
    assert sent(infra, infra.queues.dead_letter_url) == Counter(dict.fromkeys(lost, 1))
    with db.connect() as c:
        assert c.scalar(select(PhotoJob.dead_letter_owed_at).where(PhotoJob.photo_id == lost[0])) is None


def test_due_pending_rows_are_left_to_a_queue_with_a_backlog(infra: Infra, db: Engine) -> None:
    # GIVEN rows pending for longer than SWEEP_AFTER_SECONDS, behind a backlog the queue is still
    # delivering (their own messages may be in it)
    infra.configure(sweep_max_backlog=3)
    due = jobs(db, 2, created_at=ago(20 * MINUTE))
    for _ in range(3):
        infra.sqs.send_message(
            QueueUrl=infra.queues.url, MessageBody=json.dumps({"photoId": str(uuid.uuid4())})
        )

    # WHEN the sweep runs
    waiting = sweeper(infra).run()

    # THEN it sends none of them (no second delivery path); once the backlog is gone, it does
    assert (waiting.resent_pending, waiting.backlog) == (0, True)
    assert len(sent(infra)) == 3  # the backlog's own messages, received and deleted here
    later = sweeper(infra).run()
    assert (later.resent_pending, later.backlog) == (2, False)
    assert sent(infra) == Counter(dict.fromkeys(due, 1))


def test_a_queue_that_cannot_say_its_depth_still_gets_the_lost_work(infra: Infra, db: Engine) -> None:
    # GIVEN due rows, and SQS refusing GetQueueAttributes
    due = jobs(db, 2, created_at=ago(20 * MINUTE))
    with aws_fails(infra.sqs, "GetQueueAttributes"):
        # WHEN the sweep runs
        summary = sweeper(infra).run()

    # THEN the lost work is sent all the same (the backfill, which can wait, is not)
    assert summary.resent_pending == 2
    assert sent(infra) == Counter(dict.fromkeys(due, 1))


def test_a_photo_whose_message_was_lost_is_published_after_a_sweep(infra: Infra, db: Engine) -> None:
    # GIVEN an upload whose notification was lost, long enough ago for the sweep to look at it
    shot = uploads.upload(
        db, infra.s3, BUCKET, STAGE, file_name="Garden.jpg", data=(samples.IMAGES / "Garden.jpg").read_bytes()
    )
    gone = infra.sqs.receive_message(QueueUrl=infra.queues.url, WaitTimeSeconds=2)["Messages"]
    infra.sqs.delete_message(QueueUrl=infra.queues.url, ReceiptHandle=gone[0]["ReceiptHandle"])
    with db.begin() as c:
        c.execute(
            update(PhotoJob).where(PhotoJob.photo_id == shot.photo_id).values(created_at=ago(11 * MINUTE))
        )

    # WHEN the scheduled sweep function runs, and the queue's messages reach the process function
    result = handlers.load("sweep").lambda_handler(
        {"source": "aws.events"}, LambdaContext(timeout_seconds=60)
    )
    poller = Poller(
        infra.sqs, infra.queues.url, infra.queues.arn, handlers.load("process").lambda_handler, wait_seconds=1
    )
    poller.poll_once()

    # THEN the sweep reported what it sent and the photo is published
    assert result["resentPending"] == 1
    with db.connect() as c:
        assert c.scalar(select(Photo.processing_state).where(Photo.id == shot.photo_id)) == "ready"


def test_the_sweep_stops_when_its_time_budget_is_spent(infra: Infra, db: Engine) -> None:
    jobs(db, 5, created_at=ago(20 * MINUTE))

    summary = sweeper(infra).run(lambda: 1.0)

    assert summary.out_of_time and summary.resent_pending == 0


def test_a_step_that_fails_is_counted_and_the_rest_of_the_run_goes_on(
    infra: Infra, db: Engine, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a lost message (a due pending row), and a database that ends the session of the run's
    # step that reads the retired objects
    shot = uploads.upload(
        db, infra.s3, BUCKET, STAGE, file_name="Garden.jpg", data=(samples.IMAGES / "Garden.jpg").read_bytes()
    )
    stack.drop_test_events(infra.sqs, infra.queues.url)
    with db.begin() as c:
        c.execute(
            update(PhotoJob).where(PhotoJob.photo_id == shot.photo_id).values(created_at=ago(11 * MINUTE))
        )
    capsys.readouterr()

    # WHEN the scheduled sweep function runs
    with connection_killed(bootstrap.engine(), engine, lambda s: "retired_variants" in s) as killed:
        result = handlers.load("sweep").lambda_handler(
            {"source": "aws.events"}, LambdaContext(timeout_seconds=60)
        )

    # THEN the run finished: the lost work was sent, the failed step counted, not raised
    assert killed and result["resentPending"] == 1 and result["errors"] == 1
    # AND the count went out as the metric its alarm reads (the stage's)
    emitted = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    (metrics,) = [m for m in emitted if "Sweep_errors" in m]
    assert metrics["Sweep_errors"] == [1.0] or metrics["Sweep_errors"] == 1.0
    assert (metrics["service"], metrics["stage"]) == ("photo-publish", STAGE)


def run_sweep() -> dict[str, Any]:
    bootstrap.reset()
    result: dict[str, Any] = handlers.load("sweep").lambda_handler(
        {"source": "aws.events"}, LambdaContext(timeout_seconds=60)
    )
    return result


def test_an_invalidation_cloudfront_refused_is_sent_by_a_later_sweep(infra: Infra, db: Engine) -> None:
    # GIVEN functions told of a distribution CloudFront does not have (NoSuchDistribution), and a
    # photo deleted meanwhile
    infra.monkeypatch.setenv("CDN_DISTRIBUTION_ID", "E0NOSUCHDISTRIB")
    bootstrap.reset()
    shot = uploads.upload(
        db, infra.s3, BUCKET, STAGE, file_name="Garden.jpg", data=(samples.IMAGES / "Garden.jpg").read_bytes()
    )
    with db.connect() as c:
        album = c.scalar(select(Photo.album_id).where(Photo.id == shot.photo_id))
    path = f"/{STAGE}/albums/{album}/variants/{shot.photo_id}/*"
    operator.main(["delete", str(shot.photo_id)])

    # THEN the deletion's own call was refused: its path waits, one attempt spent, and a sweep at
    # once leaves it to its backoff
    assert cdn.waiting(db) == {path: 1}
    assert run_sweep()["invalidated"] == 0
    # AND a sweep once it is due is refused too, and counts it: the path still waits
    with db.begin() as c:
        c.execute(update(cdn_invalidations).values(next_try_at=ago(MINUTE)))
    refused = run_sweep()
    assert (refused["invalidated"], refused["invalidationFailed"]) == (0, 1)
    assert cdn.waiting(db) == {path: 2}
    with db.connect() as c:
        assert c.scalar(select(cdn_invalidations.c.next_try_at > func.now()))

    # WHEN the stack's real distribution is named and the path is due again
    distribution = cdn.distribution(BUCKET)
    infra.monkeypatch.setenv("CDN_DISTRIBUTION_ID", distribution)
    with db.begin() as c:
        c.execute(update(cdn_invalidations).values(next_try_at=ago(MINUTE)))
    sent = run_sweep()

    # THEN the sweep sent it: the path is invalidated at the distribution, and waits no more
    assert (sent["invalidated"], sent["invalidationFailed"]) == (1, 0)
    assert cdn.invalidations(distribution) == [[path]]
    assert cdn.waiting(db) == {}


def test_the_sweep_sends_waiting_paths_in_calls_of_at_most_15_wildcards(infra: Infra, db: Engine) -> None:
    # GIVEN paths left over from deletions: two albums' erasures (30 and 20 photos) and 17 single
    # photos of albums of their own
    distribution = cdn.distribution(BUCKET)
    infra.monkeypatch.setenv("CDN_DISTRIBUTION_ID", distribution)
    erased = [uuid.uuid4(), uuid.uuid4()]
    singles = [uuid.uuid4() for _ in range(17)]

    def path(album: uuid.UUID) -> str:
        return f"/{STAGE}/albums/{album}/variants/{uuid.uuid4()}/*"

    rows = [path(erased[0]) for _ in range(30)] + [path(erased[1]) for _ in range(20)]
    rows += [path(album) for album in singles]
    with db.begin() as c:
        c.execute(insert(cdn_invalidations).values([{"path": p, "next_try_at": ago(MINUTE)} for p in rows]))

    # WHEN the sweep runs twice
    first, second = run_sweep(), run_sweep()

    # THEN each run made one call of at most 15 wildcard paths, an erased album's photos as the
    # album's one path; every row is covered and gone after the second run
    calls = cdn.invalidations(distribution)
    assert len(calls) == 2 and all(len(call) <= 15 for call in calls)
    paths = {p for call in calls for p in call}
    assert {f"/{STAGE}/albums/{album}/variants/*" for album in erased} <= paths
    for row in rows:
        assert row in paths or row.rsplit("/", 2)[0] + "/*" in paths
    assert first["invalidated"] + second["invalidated"] == len(rows)
    assert cdn.waiting(db) == {}


# --- bounded work (SPEC 19) ----------------------------------------------------------------------

# The review's album erasure (500 photos, S3 at 70 ms a call, a 60 s function) scaled down: 100
# photos, 5 s a run, 1 s of it kept in reserve. Purging one costs 2 S3 calls (a listing of each of its
# two prefixes, nothing left to delete): 14 s for the album, so no single run can do it all.
ERASED_PHOTOS = 100
RUN_SECONDS = 5.0
RESERVE_SECONDS = 1.0


def erased_album(db: Engine, count: int) -> uuid.UUID:
    """An album of `count` photos erased by the operator (`delete --album`), their tombstones due."""
    album = uuid.uuid4()
    ids = jobs(db, count)
    with db.begin() as c:
        c.execute(update(Photo).where(Photo.id.in_(ids)).values(album_id=album))
    assert len(operator.delete_photos([], album)) == count
    with db.begin() as c:
        c.execute(update(deleted_photos).values(purge_after=ago(MINUTE)))
    return album


def test_a_sweep_with_no_deadline_purges_an_album_erasure_in_one_run(infra: Infra, db: Engine) -> None:
    # GIVEN an erased album of more photos than the purge's first batch takes
    erased_album(db, 3 * PURGE_FIRST_BATCH)
    queue = SqsQueue(infra.sqs, infra.settings.process_queue_url, infra.settings.dead_letter_queue_url)

    # WHEN the sweep runs with no clock (as the operator's commands and the soak's sweeps run it)
    summary = Sweeper(db, queue, infra.settings, store=S3Store(infra.s3, BUCKET)).run()

    # THEN its later batches are sized by the batch size alone, and every photo is purged
    assert summary.deleted_purged == 3 * PURGE_FIRST_BATCH and not summary.out_of_time
    with db.connect() as c:
        assert c.scalar(select(func.count()).where(deleted_photos.c.purged_at.is_(None))) == 0


def test_an_album_erasure_is_purged_over_several_runs_each_inside_its_time(infra: Infra, db: Engine) -> None:
    # GIVEN an erased album whose tombstones are due, and S3 answering each call after 70 ms
    erased_album(db, ERASED_PHOTOS)
    runs: list[tuple[int, float]] = []
    with latency_proxy(os.environ["AWS_ENDPOINT_URL"], "slow-s3") as proxy:
        queue = SqsQueue(infra.sqs, infra.settings.process_queue_url, infra.settings.dead_letter_queue_url)
        store = S3Store(boto3.client("s3", endpoint_url=proxy.url), BUCKET)
        slow = Sweeper(db, queue, infra.settings, store=store)

        # WHEN the sweep runs again and again, each run with 5 s left on its clock
        while sum(purged for purged, _ in runs) < ERASED_PHOTOS and len(runs) < 10:
            deadline = time.monotonic() + RUN_SECONDS
            summary = slow.run(lambda: deadline - time.monotonic(), reserve_seconds=RESERVE_SECONDS)  # noqa: B023
            runs.append((summary.deleted_purged, deadline - time.monotonic()))
    print("photos purged per run, and seconds left at its end:", runs)

    # THEN the first run purged some of them and kept them purged, later runs went on from there
    # until all were, and no run outlived its time
    assert 0 < runs[0][0] < ERASED_PHOTOS
    assert sum(purged for purged, _ in runs) == ERASED_PHOTOS
    assert all(left > 0 for _, left in runs)
    with db.connect() as c:
        assert c.scalar(select(func.count()).where(deleted_photos.c.purged_at.is_(None))) == 0


# --- letters follow the photo (SPEC 19) ----------------------------------------------------------


def dead_letter_photos(infra: Infra) -> Counter[uuid.UUID]:
    """The photos the dead-letter queue's letters name."""
    return Counter(uuid.UUID(m["MessageAttributes"]["photoId"]["StringValue"]) for m in dead_letters(infra))


def delete(infra: Infra, db: Engine, photo_id: uuid.UUID) -> None:
    """The user's DELETE, from another thread: a request of its own, not the sweep's."""
    done: list[bool] = []
    user = threading.Thread(
        target=lambda: done.append(
            app_uploads.delete(
                db, S3Store(infra.s3, BUCKET), infra.settings, photo_id, caller=app_uploads.BACKEND
            )
        )
    )
    user.start()
    user.join()
    assert done == [True]


def test_a_photo_deleted_while_the_sweep_holds_its_letter_pages_nobody(
    infra: Infra, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a photo whose worker died on its last attempt, and its user deleting it once the sweep
    # has failed it (WORKER_LOST, its letter now the sweep's to send) and before the letter is sent
    (lost,) = jobs(db, 1, status="active", attempt=3, claimed_at=ago(10 * MINUTE))
    lease_letters, deleted = machine.lease_letters, []

    def deleted_meanwhile(*args: Any, **kwargs: Any) -> Any:
        # The sweep's next step after failing it: the failure is committed, its letter not sent.
        if not deleted:
            delete(infra, db, lost)
            deleted.append(lost)
        return lease_letters(*args, **kwargs)

    monkeypatch.setattr(machine, "lease_letters", deleted_meanwhile)

    # WHEN the sweep runs
    summary = sweeper(infra).run()

    # THEN the photo was failed, but its letter was not sent: nobody is paged for a deleted photo
    assert dead_letter_photos(infra) == Counter()
    assert (summary.worker_lost, summary.dead_letters_sent, summary.letters_withdrawn) == (1, 0, 1)


def test_a_deleted_photos_letter_leaves_the_dead_letter_queue_at_the_next_sweep(
    infra: Infra, db: Engine
) -> None:
    # GIVEN two photos whose workers died on their last attempt, paged by a sweep run
    kept, deleted = jobs(db, 2, status="active", attempt=3, claimed_at=ago(10 * MINUTE))
    sweep = handlers.load("sweep").lambda_handler
    assert sweep({"source": "aws.events"}, LambdaContext(timeout_seconds=60))["deadLettersSent"] == 2
    assert dead_letter_photos(infra) == Counter({kept: 1, deleted: 1})

    # WHEN the user deletes one of them, and the sweep runs again
    delete(infra, db, deleted)
    result = sweep({"source": "aws.events"}, LambdaContext(timeout_seconds=60))

    # THEN the deleted photo's letter is gone from the queue; the failed photo's stays, visible
    assert result["lettersRemoved"] == 1
    assert dead_letter_photos(infra) == Counter({kept: 1})


def failed_for_good(fast: Infra, db: Engine) -> uploads.Upload:
    """A photograph whose every read of its original fails: three attempts, then failed for good."""
    shot = uploads.upload(
        db,
        fast.s3,
        BUCKET,
        STAGE,
        file_name="LadyBird.jpg",
        data=(samples.IMAGES / "LadyBird.jpg").read_bytes(),
    )
    poll_until(fast, lambda: job(db, shot.photo_id)[0] == "failed")
    return shot


def test_a_deleted_photos_dead_letter_is_removed_by_the_redrive(fast: Infra, db: Engine) -> None:
    """SPEC 16 (2): the DLQ holds a letter only for a photo that is failed. SPEC 17: deletion leaves
    nothing behind. Here the user deletes a finally-failed photo (the common thing to do with a
    broken tile); its letter stays in the DLQ (alarm > 0) and the operator's redrive refuses to
    remove it, calling it 'an upload the API never registered'."""
    with aws_fails(bootstrap.s3_client(), "GetObject"):
        shot = failed_for_good(fast, db)
    assert len(dead_letters(fast)) == 1

    # WHEN the user deletes the failed photo
    assert app_uploads.delete(
        db, S3Store(fast.s3, BUCKET), fast.settings, shot.photo_id, caller=app_uploads.BACKEND
    )

    # AND the operator redrives the DLQ, as the alarm's runbook says
    summary = operator.redrive(bootstrap.engine(), fast.sqs, fast.settings)
    print("redrive summary:", summary)
    attrs = fast.sqs.get_queue_attributes(
        QueueUrl=fast.queues.dead_letter_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    print("DLQ after the redrive:", attrs)
    # THEN (promise) no letter remains for a photo that no longer exists
    assert summary.left_in_queue == 0 and attrs == {
        "ApproximateNumberOfMessages": "0",
        "ApproximateNumberOfMessagesNotVisible": "0",
    }, "a deleted photo's dead letter stays in the DLQ; every redrive leaves it there"
    # AND a second redrive, after the letter's 300 s invisibility, would say the same (unknown photo)


def test_a_letter_the_sweep_sends_as_the_photo_is_deleted_is_removed_by_the_sweep(
    fast: Infra, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race the brief names: a final failure whose letter is owed (the DLQ refused it once), the
    sweep leases it, the user deletes the photo, the sweep sends it: a page for a deleted photo."""
    with aws_fails(bootstrap.s3_client(), "GetObject"), aws_fails(bootstrap.sqs_client(), "SendMessage"):
        shot = failed_for_good(fast, db)
    with db.connect() as c:
        owed = c.execute(
            text("select dead_letter_owed_at from photo_jobs where photo_id=:p"), {"p": shot.photo_id}
        ).scalar()
    print("letter owed since", owed)
    assert owed is not None and dead_letters(fast) == []
    # the lease has passed (the sender that was refused released it)
    with db.begin() as c:
        c.execute(
            text("update photo_jobs set dead_letter_owed_at = now() - interval '1 hour' where photo_id=:p"),
            {"p": shot.photo_id},
        )

    real = SqsQueue.send_dead_letter

    def deleted_meanwhile(self: SqsQueue, photo_id: uuid.UUID, *args: Any, **kw: Any) -> bool:
        # the user's DELETE commits while the sweep holds the letter
        assert app_uploads.delete(
            db, S3Store(fast.s3, BUCKET), fast.settings, photo_id, caller=app_uploads.BACKEND
        )
        return real(self, photo_id, *args, **kw)

    monkeypatch.setattr(SqsQueue, "send_dead_letter", deleted_meanwhile)
    bootstrap.reset()
    summary = run_sweep()
    print("sweep summary:", json.dumps(summary))
    left = dead_letters(fast)
    with db.connect() as c:
        assert c.scalar(select(func.count()).select_from(Photo)) == 0
    # THEN the letter on its way as the deletion committed landed, and the same run's sweep of the
    # dead-letter queue removed it (SPEC 19: letters follow the photo)
    assert left == [] and summary["lettersRemoved"] == 1
    # AND a redrive finds nothing to do
    redriven = operator.redrive(bootstrap.engine(), fast.sqs, fast.settings)
    assert (redriven.messages_removed, redriven.left_in_queue, redriven.photos) == (0, 0, [])
