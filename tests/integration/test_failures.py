"""Every failure path of a delivery ends in a recorded state (SPEC 5), through real parts.

Faults are injected into the real clients (see tests/faults.py); the queue is moto's server, whose
visibility timeouts and redrive policy decide when a record comes back. A re-upload's record handed
on at the receive limit carries what it proved. The operator's retry and redrive take back a
failure's owed letter without paging for the photo they publish, even while the sweep is sending it
(SPEC 16 (2)).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from typing import Any
from uuid import UUID

import pytest
from sqlalchemy import Engine, func, select, text, update

from devkit import handlers, samples, uploads
from devkit.poller import LambdaContext, Poller, sqs_event
from photo_publish import bootstrap, operator
from photo_publish import uploads as app_uploads
from photo_publish.adapters.models import OutboxEvent, PhotoJob, PhotoVariant
from photo_publish.adapters.queue import SqsQueue
from photo_publish.adapters.storage import S3Store
from photo_publish.contracts import PHOTO_FAILED, PHOTO_PUBLISHED, PhotoFailedPayload
from photo_publish.errors import ErrorCode
from photo_publish.keys import original_key
from photo_publish.publish.failures import Failures
from tests.conftest import BUCKET, STAGE, Infra
from tests.faults import aws_fails, connection_killed
from tests.letters import dead_letters, lease_passes, letter_codes, owed
from tests.network_guard import GUARD
from tests.originals import small
from tests.originals import upload as upload_small
from tests.polling import carried, drain, poll_until, sweep
from tests.rows import job, photo, published

process = handlers.load("process")
PUBLISH_UPDATE = "UPDATE photos SET processing_state"


def events(db: Engine, photo_id: UUID, event_type: str = PHOTO_PUBLISHED) -> int:
    with db.connect() as c:
        return (
            c.scalar(
                select(func.count())
                .select_from(OutboxEvent)
                .where(OutboxEvent.aggregate_id == photo_id, OutboxEvent.event_type == event_type)
            )
            or 0
        )


def failed_payloads(db: Engine, photo_id: UUID) -> list[PhotoFailedPayload]:
    """The photo's photo.failed events, oldest first, as a consumer reads them."""
    with db.connect() as c:
        documents = c.scalars(
            select(OutboxEvent.payload)
            .where(OutboxEvent.aggregate_id == photo_id, OutboxEvent.event_type == PHOTO_FAILED)
            .order_by(OutboxEvent.created_at)
        )
        return [PhotoFailedPayload.from_json(document) for document in documents]


def upload(infra: Infra, db: Engine, name: str = "LadyBird.jpg") -> uploads.Upload:
    return uploads.upload(
        db, infra.s3, BUCKET, STAGE, file_name=name, data=(samples.IMAGES / name).read_bytes()
    )


# --- one transient failure at each step, then the retry publishes ------------------------------


@pytest.mark.parametrize("operation", ["GetObject", "PutObject"])
def test_an_s3_failure_is_retried_after_its_backoff_and_the_photo_published_once(
    fast: Infra, db: Engine, operation: str
) -> None:
    # GIVEN S3 failing the first read of the original, or the first variant write
    with aws_fails(bootstrap.s3_client(), operation, times=1) as calls:
        shot = upload(fast, db)

        # WHEN the notification is delivered and comes back
        poller = poll_until(fast, published(db, shot.photo_id))

    # THEN the first attempt was recorded as transient and the second published, once
    code = "STORAGE_READ_FAILED" if operation == "GetObject" else "STORAGE_WRITE_FAILED"
    assert poller.failed == 1
    assert job(db, shot.photo_id) == ("done", 2, code)
    assert photo(db, shot.photo_id) == ("ready", None, 2)
    assert events(db, shot.photo_id) == 1
    # AND the record came back after about its backoff (1 s), not the queue's 60 s visibility
    assert 0.9 < calls[-1] - calls[0] < 5


def test_the_second_variant_write_failing_leaves_nothing_half_published(fast: Infra, db: Engine) -> None:
    # GIVEN S3 accepting the first variant's write and failing the second's, once
    with aws_fails(bootstrap.s3_client(), "PutObject", times=1, after=1) as calls:
        shot = upload(fast, db)

        # WHEN the photo is delivered
        poll_until(fast, lambda: job(db, shot.photo_id)[:2] == ("pending", 1))

        # THEN the attempt is released (every put was tried: they run at once); the photo is not
        # published and no variant row exists
        first = len(calls)
        assert job(db, shot.photo_id) == ("pending", 1, "STORAGE_WRITE_FAILED")
        assert photo(db, shot.photo_id) == ("uploaded", None, 1)
        assert events(db, shot.photo_id) == 0

        # AND the retry writes them all (the same keys again) and publishes once
        poll_until(fast, published(db, shot.photo_id))
    with db.connect() as connection:
        objects = connection.scalar(
            select(func.count(func.distinct(PhotoVariant.storage_key))).where(
                PhotoVariant.photo_id == shot.photo_id
            )
        )
    assert first == objects >= 2
    assert len(calls) == 2 * objects
    assert events(db, shot.photo_id) == 1


def test_an_unexpected_error_while_rendering_is_retried(
    fast: Infra, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the renderer failing once in a way nobody planned for (a bug, memory)
    from photo_publish.publish import service

    real, failures = service.render, []

    def render_once_failing(*args: Any, **kwargs: Any) -> Any:
        if not failures:
            failures.append(1)
            raise MemoryError("injected")
        return real(*args, **kwargs)

    monkeypatch.setattr(service, "render", render_once_failing)
    shot = upload(fast, db)

    # WHEN the photo is delivered, and again after its backoff
    poll_until(fast, published(db, shot.photo_id))

    # THEN the first attempt was recorded as UNEXPECTED_ERROR (transient) and the second published
    assert job(db, shot.photo_id) == ("done", 2, "UNEXPECTED_ERROR")
    assert events(db, shot.photo_id) == 1


@pytest.mark.parametrize("fault", ["statement", "commit"])
def test_the_database_dying_in_the_publish_transaction_is_transient(
    fast: Infra, db: Engine, engine: Engine, fault: str
) -> None:
    # GIVEN the server ending the session at the publish UPDATE, or at the commit
    shot = upload(fast, db)
    publishing = lambda statement: statement.startswith(PUBLISH_UPDATE)  # noqa: E731
    with connection_killed(bootstrap.engine(), engine, publishing, at_commit=fault == "commit") as killed:
        # WHEN the photo is delivered, and delivered again after the backoff
        poller = poll_until(fast, published(db, shot.photo_id))

    # THEN the first attempt was lost as DATABASE_UNAVAILABLE, and nothing of it was committed
    assert killed and poller.failed == 1
    assert job(db, shot.photo_id) == ("done", 2, "DATABASE_UNAVAILABLE")
    assert photo(db, shot.photo_id) == ("ready", None, 2)
    assert events(db, shot.photo_id) == 1


def test_an_unreachable_database_returns_the_record_without_spending_an_attempt(
    fast: Infra, db: Engine
) -> None:
    # GIVEN a database that refuses connections
    shot = upload(fast, db)
    fast.configure(database_url="postgresql://postgres@127.0.0.1:9/none")

    # WHEN the notification is delivered
    poller = Poller(fast.sqs, fast.queues.url, fast.queues.arn, process.lambda_handler, wait_seconds=1)
    poller.poll_once()

    # THEN it is a batch item failure, the job untouched; it comes back once the database is back
    assert poller.failed == 1
    assert job(db, shot.photo_id) == ("pending", 0, None)
    fast.configure(database_url=db.url.render_as_string(hide_password=False))
    poll_until(fast, published(db, shot.photo_id))
    assert job(db, shot.photo_id) == ("done", 1, None)


@pytest.mark.parametrize("session_options", [True, False], ids=["startup-options", "set-local"])
def test_a_row_locked_by_a_stuck_transaction_is_a_transient_failure_not_a_hang(
    fast: Infra, db: Engine, engine: Engine, session_options: bool
) -> None:
    # GIVEN a one-second statement timeout (a lock is waited for half of it), sent as startup
    # options or, as behind RDS Proxy, set by each transaction; and another session holding the
    # photo's job row in a transaction that never ends (a frozen worker, a person at a psql prompt)
    fast.configure(db_statement_timeout_seconds=1, db_session_options=session_options)
    shot = upload(fast, db)
    with bootstrap.engine().connect() as probe:
        assert probe.scalar(text("SHOW lock_timeout")) == "500ms"
    with engine.connect() as stuck:
        # Another process's session, as far as the test-wide guard of network calls is concerned.
        GUARD.another_session(stuck)
        stuck.execute(select(PhotoJob).where(PhotoJob.photo_id == shot.photo_id).with_for_update())

        # WHEN the notification is delivered
        started = time.monotonic()
        poller = Poller(fast.sqs, fast.queues.url, fast.queues.arn, process.lambda_handler, wait_seconds=1)
        poller.poll_once()

        # THEN the claim gave up after the lock timeout: a batch item failure, the job untouched
        assert time.monotonic() - started < 10
        assert poller.failed == 1
        stuck.rollback()
    assert job(db, shot.photo_id) == ("pending", 0, None)

    # AND once the lock is gone the photo publishes
    poll_until(fast, published(db, shot.photo_id))


def test_a_sub_second_retry_is_a_whole_second_of_visibility_never_zero(infra: Infra) -> None:
    # GIVEN a received message whose job becomes claimable in a fraction of a second
    infra.sqs.send_message(QueueUrl=infra.queues.url, MessageBody=json.dumps({"photoId": str(uuid.uuid4())}))
    (message,) = infra.sqs.receive_message(QueueUrl=infra.queues.url, WaitTimeSeconds=2)["Messages"]

    # WHEN it is returned to the queue for 0.2 s
    bootstrap.queue().retry_later(message["ReceiptHandle"], 0.2)

    # THEN it is not visible again at once (a visibility of 0 would spin it through every poller,
    # each receive burning a receive count towards the redrive), and is after a second
    assert infra.sqs.receive_message(QueueUrl=infra.queues.url, WaitTimeSeconds=0).get("Messages", []) == []
    time.sleep(1.1)
    assert len(infra.sqs.receive_message(QueueUrl=infra.queues.url, WaitTimeSeconds=1)["Messages"]) == 1


def test_a_crash_after_the_commit_redelivers_and_answers_already(infra: Infra, db: Engine) -> None:
    # GIVEN a published photo whose message was never deleted (the run died after the commit)
    shot = upload(infra, db)
    message = infra.sqs.receive_message(QueueUrl=infra.queues.url, WaitTimeSeconds=2, AttributeNames=["All"])[
        "Messages"
    ]
    process.lambda_handler(sqs_event(message, infra.queues.arn), LambdaContext())
    infra.sqs.change_message_visibility(
        QueueUrl=infra.queues.url, ReceiptHandle=message[0]["ReceiptHandle"], VisibilityTimeout=0
    )

    # WHEN the message is delivered again
    poller = Poller(infra.sqs, infra.queues.url, infra.queues.arn, process.lambda_handler, wait_seconds=1)
    assert poller.poll_once() == 1

    # THEN it is acknowledged as `already`: one event, one version bump
    assert poller.failed == 0
    assert photo(db, shot.photo_id) == ("ready", None, 2)
    assert events(db, shot.photo_id) == 1


# --- attempts, the dead-letter queue and the operator ---------------------------------------


def test_three_transient_failures_dead_letter_once_and_an_operator_retry_publishes(
    fast: Infra, db: Engine
) -> None:
    # GIVEN S3 unreachable for reads
    with aws_fails(bootstrap.s3_client(), "GetObject") as calls:
        shot = upload(fast, db)

        # WHEN the photo is delivered until it is given up
        poll_until(fast, lambda: job(db, shot.photo_id)[0] == "failed")

    # THEN each attempt came back after its backoff (1 s, then 2 s), not the queue's visibility
    assert len(calls) == 3
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert 0.9 < gaps[0] < 4 and 1.9 < gaps[1] < 5
    # AND it is a final failure: recorded on the job and the photo, one dead-letter message
    assert job(db, shot.photo_id) == ("failed", 3, "STORAGE_READ_FAILED")
    assert photo(db, shot.photo_id) == ("processing_failed", "STORAGE_READ_FAILED", 1)
    letters = dead_letters(fast)
    assert len(letters) == 1
    attributes = {k: v["StringValue"] for k, v in letters[0]["MessageAttributes"].items()}
    assert attributes == {
        "photoId": str(shot.photo_id),
        "attempt": "3",
        "errorCode": "STORAGE_READ_FAILED",
        "kind": "photo",
    }
    # AND one photo.failed event, final, written with the marking (the version unchanged)
    (failed,) = failed_payloads(db, shot.photo_id)
    assert (failed.error_code, failed.kind, failed.attempt, failed.entity_version) == (
        ErrorCode.STORAGE_READ_FAILED,
        "final",
        3,
        1,
    )
    assert (failed.photo_id, failed.album_id) == (shot.photo_id, shot.album_id)

    # WHEN S3 is back and the operator redrives the dead-letter queue
    summary = operator.redrive(bootstrap.engine(), fast.sqs, fast.settings)
    poll_until(fast, published(db, shot.photo_id))

    # THEN the photo is published, the dead letter removed, with one message for the photo
    assert summary.photos == [shot.photo_id] and summary.messages_removed == 1
    assert dead_letters(fast) == []
    assert photo(db, shot.photo_id) == ("ready", None, 2)
    assert events(db, shot.photo_id) == 1


def test_a_photo_deleted_as_its_final_failure_is_recorded_pages_nobody(
    fast: Infra, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN S3 unreachable for reads, and the photo's user deleting it the moment its last attempt's
    # failure is committed (before the worker sends the letter)
    record_failure, deleted = Failures._fail, threading.Event()

    def deleted_meanwhile(self: Failures, *args: Any, **kwargs: Any) -> Any:
        failed = record_failure(self, *args, **kwargs)
        if kwargs.get("final"):
            user = threading.Thread(
                target=lambda: app_uploads.delete(
                    db, S3Store(fast.s3, BUCKET), fast.settings, shot.photo_id, caller=app_uploads.BACKEND
                )
            )
            user.start()
            user.join()
            deleted.set()
        return failed

    monkeypatch.setattr(Failures, "_fail", deleted_meanwhile)
    with aws_fails(bootstrap.s3_client(), "GetObject"):
        shot = upload(fast, db)

        # WHEN the photo is delivered until it is given up
        poll_until(fast, deleted.is_set)

    # THEN no letter was sent for it: nobody is paged for a photo that no longer exists
    assert dead_letters(fast) == []
    with db.connect() as c:
        assert (
            c.scalar(select(func.count()).select_from(PhotoJob).where(PhotoJob.photo_id == shot.photo_id))
            == 0
        )


def test_a_final_failure_whose_dead_letter_is_refused_sends_it_when_the_message_comes_back(
    fast: Infra, db: Engine
) -> None:
    # GIVEN S3 unreachable for reads, and the dead-letter queue refusing the first letter
    fast.configure(stale_after_seconds=2)
    with (
        aws_fails(bootstrap.s3_client(), "GetObject"),
        aws_fails(bootstrap.sqs_client(), "SendMessage", times=1),
    ):
        shot = upload(fast, db)

        # WHEN the photo is delivered until it is given up, and its message comes back
        poller = poll_until(fast, lambda: job(db, shot.photo_id)[0] == "failed")
        poll_until(fast, lambda: len(dead_letters(fast)) == 1)

    # THEN it is a final failure whose letter reached the dead-letter queue once, owed no more
    assert job(db, shot.photo_id) == ("failed", 3, "STORAGE_READ_FAILED")
    letters = dead_letters(fast)
    assert [m["MessageAttributes"]["errorCode"]["StringValue"] for m in letters] == ["STORAGE_READ_FAILED"]
    with db.connect() as c:
        assert (
            c.scalar(select(PhotoJob.dead_letter_owed_at).where(PhotoJob.photo_id == shot.photo_id)) is None
        )
    # AND the message itself was acknowledged once the letter was sent
    poller.poll_once()
    assert fast.sqs.get_queue_attributes(
        QueueUrl=fast.queues.url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"] == {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}
    assert len(dead_letters(fast)) == 1


def test_a_redrive_leaves_nonsense_in_the_queue_and_retries_every_photo_around_it(
    fast: Infra, db: Engine
) -> None:
    # GIVEN two photos given up after their attempts, and between their dead letters a body nested
    # deeper than the JSON parser and a letter whose photoId attribute is not a UUID
    with aws_fails(bootstrap.s3_client(), "GetObject"):
        first = upload(fast, db, "Aqua.jpg")
        poll_until(fast, lambda: job(db, first.photo_id)[0] == "failed")
        fast.sqs.send_message(QueueUrl=fast.queues.dead_letter_url, MessageBody="[" * 100_000 + "]" * 100_000)
        fast.sqs.send_message(
            QueueUrl=fast.queues.dead_letter_url,
            MessageBody="{}",
            MessageAttributes={"photoId": {"DataType": "String", "StringValue": "not-a-uuid"}},
        )
        second = upload(fast, db, "Garden.jpg")
        poll_until(fast, lambda: job(db, second.photo_id)[0] == "failed")

    # WHEN the operator redrives the dead-letter queue
    summary = operator.redrive(bootstrap.engine(), fast.sqs, fast.settings)
    poll_until(fast, lambda: all(photo(db, s.photo_id)[0] == "ready" for s in (first, second)))

    # THEN both photos were retried and published; the two nonsense messages wait for a person
    assert sorted(summary.photos) == sorted([first.photo_id, second.photo_id])
    assert summary.left_in_queue == 2
    assert len(dead_letters(fast)) == 2


def test_an_operator_retry_of_chosen_photos_sends_one_message_each(fast: Infra, db: Engine) -> None:
    # GIVEN two photos that failed for good, and one that is published
    with aws_fails(bootstrap.s3_client(), "GetObject"):
        failed = [upload(fast, db, "Aqua.jpg"), upload(fast, db, "Garden.jpg")]
        poll_until(fast, lambda: all(job(db, s.photo_id)[0] == "failed" for s in failed))
    ok = upload(fast, db, "Storm.jpg")
    poll_until(fast, published(db, ok.photo_id))

    # WHEN the operator retries all three by id
    sent = operator.retry(bootstrap.engine(), bootstrap.queue(), [s.photo_id for s in failed] + [ok.photo_id])

    # THEN only the failed ones are reset and sent, once each, and they publish
    assert sorted(sent) == sorted(s.photo_id for s in failed)
    poll_until(fast, lambda: all(photo(db, s.photo_id)[0] == "ready" for s in failed))
    assert [events(db, s.photo_id) for s in failed] == [1, 1]


def test_an_operator_retry_takes_back_an_owed_dead_letter_so_the_published_photo_never_pages(
    infra: Infra, db: Engine
) -> None:
    """Finding 3 (retry): the owed letter survives the retry; after publication the sweep dead-letters it."""
    # GIVEN a final failure (S3 unreadable through the attempts) whose dead letter the queue refused
    infra.configure(retry_base_seconds=1)
    with aws_fails(bootstrap.s3_client(), "GetObject"), aws_fails(bootstrap.sqs_client(), "SendMessage"):
        shot = upload_small(infra, db, "LadyBird.jpg")
        poll_until(infra, lambda: job(db, shot.photo_id)[0] == "failed")
    assert job(db, shot.photo_id) == ("failed", 3, "STORAGE_READ_FAILED")
    assert owed(db, shot.photo_id) is not None and letter_codes(infra) == []

    # WHEN the operator retries it, it publishes, and the sweep runs after the letter's lease
    assert operator.retry(bootstrap.engine(), bootstrap.queue(), [shot.photo_id]) == [shot.photo_id]
    poll_until(infra, published(db, shot.photo_id))
    lease_passes(db)
    summary = sweep()

    # THEN no dead letter was sent for the published photo
    assert letter_codes(infra) == [], f"a published photo paged (sweep {summary})"
    assert summary["deadLettersSent"] == 0


def test_an_operator_redrive_takes_back_an_owed_dead_letter_so_the_published_photo_never_pages(
    infra: Infra, db: Engine
) -> None:
    """Finding 3 (redrive): the owed letter survives the redrive; after publication the sweep dead-letters it."""
    # GIVEN a photo that failed for good and was dead-lettered, then was retried while S3 was still
    # down and failed for good again while the dead-letter queue refused the second letter
    infra.configure(retry_base_seconds=1)
    with aws_fails(bootstrap.s3_client(), "GetObject"):
        shot = upload_small(infra, db, "LadyBird.jpg")
        poll_until(infra, lambda: job(db, shot.photo_id)[0] == "failed")
        assert letter_codes(infra) == [(shot.photo_id, "STORAGE_READ_FAILED")]
        assert operator.retry(bootstrap.engine(), bootstrap.queue(), [shot.photo_id]) == [shot.photo_id]
        with aws_fails(bootstrap.sqs_client(), "SendMessage"):
            poll_until(
                infra, lambda: job(db, shot.photo_id)[0] == "failed" and owed(db, shot.photo_id) is not None
            )
    assert job(db, shot.photo_id) == ("failed", 3, "STORAGE_READ_FAILED")

    # WHEN S3 is back and the operator redrives the dead-letter queue, the photo publishes, and the
    # sweep runs after the owed letter's lease
    redriven = operator.redrive(bootstrap.engine(), infra.sqs, infra.settings)
    poll_until(infra, published(db, shot.photo_id))
    lease_passes(db)
    summary = sweep()

    # THEN the redrive took the photo up and removed its letter, and no dead letter was sent for the
    # published photo afterwards
    assert redriven.photos == [shot.photo_id] and redriven.messages_removed == 1
    assert letter_codes(infra) == [], f"a published photo paged (sweep {summary})"
    assert summary["deadLettersSent"] == 0


def test_a_retry_while_the_sweep_sends_an_owed_letter_never_pages_for_the_published_photo(
    infra: Infra, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC 5 (paging, as amended) and SPEC 16 (2): a retry takes back any letter still owed; the
    dead-letter queue holds a letter only for a photo that is failed."""
    # GIVEN a final failure whose dead letter the queue refused: owed, and past its lease
    infra.configure(retry_base_seconds=1)
    with aws_fails(bootstrap.s3_client(), "GetObject"), aws_fails(bootstrap.sqs_client(), "SendMessage"):
        shot = upload_small(infra, db, "LadyBird.jpg")
        poll_until(infra, lambda: job(db, shot.photo_id)[0] == "failed")
    assert owed(db, shot.photo_id) is not None and letter_codes(infra) == []
    lease_passes(db)

    # WHEN the sweep leases the owed letter, and the operator retries the photo before the sweep's
    # SendMessage reaches the dead-letter queue (the operator's command and the scheduled sweep run
    # independently)
    real_send = SqsQueue.send_dead_letter
    retried: list[Any] = []

    def operator_first(self: SqsQueue, *args: Any, **kwargs: Any) -> bool:
        if not retried:
            retried.append(operator.retry(bootstrap.engine(), bootstrap.queue(), [shot.photo_id]))
        return real_send(self, *args, **kwargs)

    monkeypatch.setattr(SqsQueue, "send_dead_letter", operator_first)
    sweep()
    monkeypatch.setattr(SqsQueue, "send_dead_letter", real_send)

    # THEN the retry left the photo whose letter was in flight (a letter taken back then would page
    # for a photo no longer failed): the letter was sent while the photo was failed, and settled
    assert retried == [[]]
    assert [code for _, code in letter_codes(infra)] == ["STORAGE_READ_FAILED"]
    assert owed(db, shot.photo_id) is None and photo(db, shot.photo_id)[0] == "processing_failed"

    # WHEN the operator retries again, the letter sent, THEN the photo publishes and pages no more
    assert operator.retry(bootstrap.engine(), bootstrap.queue(), [shot.photo_id]) == [shot.photo_id]
    drain(infra, published(db, shot.photo_id), timeout=20)
    assert photo(db, shot.photo_id)[0] == "ready"
    summary = sweep()
    assert len(letter_codes(infra)) == 1, f"a published photo paged again (sweep {summary})"


def test_a_message_whose_receives_run_out_before_its_attempts_is_handed_on_not_dead_lettered(
    infra: Infra, db: Engine
) -> None:
    # GIVEN the template's redrive (dead-lettered at the sixth receive) and three attempts per job
    database_url = db.url.render_as_string(hide_password=False)
    infra.use_queues(
        f"{infra.queues.url.rsplit('/', 1)[1]}-r5",
        max_receive_count=5,
        retry_base_seconds=1,
        database_url="postgresql://postgres@127.0.0.1:9/none",
    )

    # WHEN three receives spend no attempt (the database refused connections): the third, the first
    # from which a record that must come back is handed on, goes to a fresh message (acknowledged,
    # not failed)
    shot = upload(infra, db)
    poller = Poller(infra.sqs, infra.queues.url, infra.queues.arn, process.lambda_handler, wait_seconds=2)
    deadline = time.monotonic() + 30
    while poller.received - poller.failed < 1:
        assert time.monotonic() < deadline, f"never handed on; {poller.received} receives"
        poller.poll_once()
    assert (poller.received, poller.failed, job(db, shot.photo_id)) == (3, 2, ("pending", 0, None))
    # AND then the first two attempts fail transiently
    infra.configure(database_url=database_url)
    with aws_fails(bootstrap.s3_client(), "GetObject", times=2):
        poll_until(infra, published(db, shot.photo_id))

    # THEN the fresh message carried the three attempts, the last of which published (on the first
    # message, the third attempt's would have been its sixth receive: dead-lettered by the redrive);
    # nothing was dead-lettered
    assert job(db, shot.photo_id) == ("done", 3, "STORAGE_READ_FAILED")
    assert dead_letters(infra) == []


def test_a_handed_on_message_whose_acknowledgement_is_lost_is_not_dead_lettered(
    infra: Infra, db: Engine
) -> None:
    # GIVEN the template's redrive (dead-lettered at the sixth receive), a visibility of 2 s, and a
    # database that refuses connections: every receive fails before a claim, spending no attempt
    database_url = _redrive_at_the_sixth_receive_and_the_database_down(infra, db, "ack")
    shot = upload(infra, db)

    # WHEN the run that hands the notification on to a fresh message answers, but its
    # acknowledgement is lost (the event source's delete failed, or the container died after
    # answering): the notification comes back after its visibility
    lost: list[int] = []

    def ack_lost_once(event: dict[str, Any], context: Any) -> dict[str, Any]:
        response: dict[str, Any] = process.lambda_handler(event, context)
        failed = {item["itemIdentifier"] for item in response["batchItemFailures"]}
        for record in event["Records"]:
            if record["messageId"] not in failed and not lost:
                lost.append(int(record["attributes"]["ApproximateReceiveCount"]))
                failed.add(record["messageId"])
        return {"batchItemFailures": [{"itemIdentifier": m} for m in sorted(failed)]}

    poller = Poller(infra.sqs, infra.queues.url, infra.queues.arn, ack_lost_once, wait_seconds=1)
    deadline = time.monotonic() + 60
    while not lost:
        assert time.monotonic() < deadline, "no run answered the notification"
        poller.poll_once()
    # (until a later run's answer is kept, or long enough for the notification's redrive)
    deadline = time.monotonic() + 8
    while poller.received - poller.failed < 1 and time.monotonic() < deadline:
        poller.poll_once()
    # ... and the database comes back
    infra.configure(database_url=database_url)
    poll_until(infra, published(db, shot.photo_id))

    # THEN the redrive kept nothing: a lost acknowledgement is not a run that never finished
    assert lost and lost[0] < 5, f"handed on at receive {lost}: no receive was left for a lost ack"
    assert dead_letters(infra) == []
    assert job(db, shot.photo_id)[:2] == ("done", 1)


def peek(infra: Infra) -> list[str]:
    """The bodies of the messages now in the process queue, left there (visible again at once)."""
    messages = infra.sqs.receive_message(
        QueueUrl=infra.queues.url, MaxNumberOfMessages=10, WaitTimeSeconds=2
    ).get("Messages", [])
    for m in messages:
        infra.sqs.change_message_visibility(
            QueueUrl=infra.queues.url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
        )
    return [m["Body"] for m in messages]


def test_a_reupload_of_a_failed_photo_through_a_database_outage_at_the_receive_limit_is_published(
    infra: Infra, db: Engine
) -> None:
    """Finding 1: at MAX_RECEIVE_COUNT the re-upload's record is replaced by a bare job message and dropped."""
    # GIVEN a photo that failed permanently: its first original could not be decoded
    infra.configure(retry_base_seconds=0)  # each receive's backoff: the shortest visibility, 1 s
    database_url = infra.settings.database_url
    fixed = small("Garden.jpg")
    shot = upload_small(infra, db, "Garden.jpg", fixed[: len(fixed) // 2])
    poll_until(infra, lambda: job(db, shot.photo_id)[0] == "failed")
    assert photo(db, shot.photo_id)[:2] == ("processing_failed", "DECODE_FAILED")

    # WHEN the user uploads the fixed file while the database is down through every receive of its
    # notification, up to the one it is handed on from (two short of the redrive's MAX_RECEIVE_COUNT)
    infra.configure(retry_base_seconds=0, database_url="postgresql://postgres@127.0.0.1:9/none")
    uploads.put_original(infra.s3, BUCKET, shot.key, fixed)
    records: list[dict[str, Any]] = []

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        records.extend(event["Records"])
        response: dict[str, Any] = process.lambda_handler(event, context)
        return response

    outage = Poller(infra.sqs, infra.queues.url, infra.queues.arn, handler, wait_seconds=1)
    deadline = time.monotonic() + 30
    while outage.received - outage.failed < 1:  # until the notification is acknowledged
        assert time.monotonic() < deadline, "the notification was never acknowledged"
        outage.poll_once()
    assert [int(r["attributes"]["ApproximateReceiveCount"]) for r in records] == [1, 2, 3]
    handed_back = peek(infra)

    # ... and the database comes back, and the queue's messages reach the process function
    infra.configure(retry_base_seconds=0, database_url=database_url)
    drain(infra, published(db, shot.photo_id))

    # THEN the new upload was processed: the photo is published
    assert photo(db, shot.photo_id)[0] == "ready", (
        f"the re-upload was dropped: photo {photo(db, shot.photo_id)}, job {job(db, shot.photo_id)},"
        f" handed back as {handed_back}"
    )
    # AND the message that carried the record on carried what the record proved: key, sequencer, eTag
    assert [carried(body) for body in handed_back] == [carried(records[0]["body"])]


# --- permanent failures and late uploads ---------------------------------------------------


def test_a_missing_original_fails_permanently_and_its_late_upload_publishes(infra: Infra, db: Engine) -> None:
    # GIVEN a photo registered by the API whose original is not in S3, delivered by a job message
    shot = uploads.register(db, STAGE, "Wood.jpg")
    infra.sqs.send_message(QueueUrl=infra.queues.url, MessageBody=json.dumps({"photoId": str(shot.photo_id)}))
    poll_until(infra, lambda: job(db, shot.photo_id)[0] == "failed")

    # THEN it failed permanently: no retry, no dead letter, one photo.failed event saying so
    assert photo(db, shot.photo_id) == ("processing_failed", "ORIGINAL_NOT_FOUND", 1)
    assert dead_letters(infra) == []
    (failed,) = failed_payloads(db, shot.photo_id)
    assert (failed.error_code, failed.kind, failed.attempt) == (ErrorCode.ORIGINAL_NOT_FOUND, "permanent", 1)

    # WHEN the original arrives (its upload is new proof that it exists)
    uploads.put_original(infra.s3, BUCKET, shot.key, (samples.IMAGES / "Wood.jpg").read_bytes())
    poll_until(infra, published(db, shot.photo_id))

    # THEN the failed job was reopened and the photo published, its events in version order
    # (a reopened job starts afresh: the code of the failure its upload replaced is not carried on)
    assert job(db, shot.photo_id) == ("done", 1, None)
    assert photo(db, shot.photo_id) == ("ready", None, 2)
    with db.connect() as c:
        history = c.execute(
            select(OutboxEvent.event_type, OutboxEvent.payload["entityVersion"].as_integer())
            .where(OutboxEvent.aggregate_id == shot.photo_id)
            .order_by(OutboxEvent.created_at)
        ).all()
    assert [tuple(h) for h in history] == [(PHOTO_FAILED, 1), (PHOTO_PUBLISHED, 2)]


# --- claims that are not this delivery's --------------------------------------------------


def test_a_stale_job_with_no_attempts_left_is_a_final_failure_with_worker_lost(
    infra: Infra, db: Engine
) -> None:
    # GIVEN a job whose worker died holding its last attempt
    shot = uploads.register(db, STAGE, "Aqua.jpg")
    with db.begin() as c:
        c.execute(
            update(PhotoJob)
            .where(PhotoJob.photo_id == shot.photo_id)
            .values(status="active", attempt=3, claimed_at=func.now() - func.make_interval(0, 0, 0, 0, 0, 10))
        )

    # WHEN the next delivery arrives
    infra.sqs.send_message(QueueUrl=infra.queues.url, MessageBody=json.dumps({"photoId": str(shot.photo_id)}))
    poll_until(infra, lambda: job(db, shot.photo_id)[0] == "failed")

    # THEN it is failed with WORKER_LOST, the photo marked, one dead letter, the message acknowledged
    assert job(db, shot.photo_id) == ("failed", 3, "WORKER_LOST")
    assert photo(db, shot.photo_id) == ("processing_failed", "WORKER_LOST", 1)
    assert len(dead_letters(infra)) == 1
    (failed,) = failed_payloads(db, shot.photo_id)
    assert (failed.error_code, failed.kind, failed.attempt) == (ErrorCode.WORKER_LOST, "final", 3)


class Crash(BaseException):
    """The run dies mid-render (out of memory, a libvips segfault): nothing after it runs."""


def test_an_input_that_crashes_its_workers_is_failed_once_and_not_reopened_by_its_own_message(
    infra: Infra, db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN an upload whose render kills the run every time
    from photo_publish.publish import service

    def crash(*args: Any, **kwargs: Any) -> Any:
        raise Crash

    shot = upload(infra, db)
    (message,) = infra.sqs.receive_message(
        QueueUrl=infra.queues.url, WaitTimeSeconds=2, AttributeNames=["All"]
    )["Messages"]
    monkeypatch.setattr(service, "render", crash)
    with pytest.raises(Crash):
        process.lambda_handler(sqs_event([message], infra.queues.arn), LambdaContext())
    # ... and twice more: its job holds its last attempt, stale
    with db.begin() as c:
        c.execute(
            update(PhotoJob)
            .where(PhotoJob.photo_id == shot.photo_id)
            .values(attempt=3, claimed_at=func.now() - func.make_interval(0, 0, 0, 0, 0, 10))
        )

    # WHEN the same notification comes back (the queue's redelivery), and again (a duplicate)
    for _ in range(2):
        response = process.lambda_handler(sqs_event([message], infra.queues.arn), LambdaContext())
        assert response == {"batchItemFailures": []}

    # THEN the job failed once with WORKER_LOST and one dead letter; its own message reopened nothing
    assert job(db, shot.photo_id) == ("failed", 3, "WORKER_LOST")
    assert len(dead_letters(infra)) == 1

    # WHEN the user uploads the original again (a new object: a new eTag)
    monkeypatch.undo()
    uploads.put_original(infra.s3, BUCKET, shot.key, (samples.IMAGES / "Garden.jpg").read_bytes())
    poll_until(infra, published(db, shot.photo_id))

    # THEN that upload reopened the job, which published
    assert job(db, shot.photo_id)[:2] == ("done", 1)


def test_a_delivery_for_a_job_in_backoff_goes_back_to_the_queue_until_due(infra: Infra, db: Engine) -> None:
    # GIVEN a job not due for another 5 seconds (time enough to be delivered early on a busy machine)
    shot = upload(infra, db)
    with db.begin() as c:
        c.execute(
            update(PhotoJob)
            .where(PhotoJob.photo_id == shot.photo_id)
            .values(next_retry_at=func.now() + func.make_interval(0, 0, 0, 0, 0, 0, 5))
        )
    started = time.monotonic()

    # WHEN its message is delivered (and again, whenever the queue brings it back)
    poller = poll_until(infra, published(db, shot.photo_id))

    # THEN it came back when due (not after the queue's 60 s) and published on the first attempt
    assert poller.failed >= 1
    assert 4.5 < time.monotonic() - started < 30  # its backoff (5 s), far from the queue's 60 s
    assert job(db, shot.photo_id) == ("done", 1, None)


def test_the_time_budget_releases_a_record_that_cannot_finish(infra: Infra, db: Engine) -> None:
    # GIVEN a Lambda with less time left than a record needs
    shot = upload(infra, db)

    # WHEN the record is delivered
    poller = Poller(infra.sqs, infra.queues.url, infra.queues.arn, process.lambda_handler, wait_seconds=1)
    poller.timeout_seconds = infra.settings.record_budget_seconds / 2
    poller.poll_once()

    # THEN it is returned at once, without spending an attempt
    assert poller.failed == 1
    assert job(db, shot.photo_id) == ("pending", 0, None)


def test_the_time_budget_between_steps_releases_a_claimed_attempt(infra: Infra, db: Engine) -> None:
    # GIVEN time enough to start, but not to write the variants and commit after rendering
    infra.configure(record_budget_seconds=0, commit_budget_seconds=1000, retry_base_seconds=1)
    shot = upload(infra, db)

    # WHEN the record is delivered
    poller = Poller(infra.sqs, infra.queues.url, infra.queues.arn, process.lambda_handler, wait_seconds=1)
    poller.poll_once()

    # THEN the attempt is released as TIME_BUDGET_EXCEEDED, with nothing written
    assert poller.failed == 1
    assert job(db, shot.photo_id) == ("pending", 1, "TIME_BUDGET_EXCEEDED")
    assert photo(db, shot.photo_id) == ("uploaded", None, 1)
    prefix = f"{STAGE}/albums/{shot.album_id}/"
    assert infra.s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("KeyCount") == 0


def test_an_upload_whose_photo_row_never_appears_is_dead_lettered_after_the_attempts(
    fast: Infra, db: Engine
) -> None:
    # GIVEN an original uploaded under ids the API never registered
    photo_id = uuid.uuid4()
    key = original_key(STAGE, uuid.uuid4(), photo_id, "orphan.jpg")
    uploads.put_original(fast.s3, BUCKET, key, (samples.IMAGES / "Aqua.jpg").read_bytes())

    # WHEN its notification is delivered until it is given up
    poll_until(fast, lambda: len(dead_letters(fast)) == 1)

    # THEN it was retried (transient) and then dead-lettered once, with the code; no rows appeared
    letter = dead_letters(fast)[0]
    assert letter["MessageAttributes"]["errorCode"]["StringValue"] == "PHOTO_NOT_FOUND"
    assert letter["MessageAttributes"]["photoId"]["StringValue"] == str(photo_id)
    assert letter["MessageAttributes"]["attempt"]["StringValue"] == "3"
    with db.connect() as c:
        assert c.scalar(select(func.count()).select_from(PhotoJob)) == 0


def test_a_redrive_asked_to_move_messages_falls_back_to_sending_where_the_endpoint_cannot(
    fast: Infra, db: Engine
) -> None:
    # GIVEN a photo given up after its attempts, and a second dead letter for it (a redriven one)
    with aws_fails(bootstrap.s3_client(), "GetObject"):
        shot = upload(fast, db)
        poll_until(fast, lambda: job(db, shot.photo_id)[0] == "failed")
    fast.sqs.send_message(
        QueueUrl=fast.queues.dead_letter_url, MessageBody=json.dumps({"photoId": str(shot.photo_id)})
    )

    # WHEN the operator redrives with StartMessageMoveTask, which moto does not implement
    summary = operator.redrive(bootstrap.engine(), fast.sqs, fast.settings, move_task=True)
    poll_until(fast, published(db, shot.photo_id))

    # THEN it fell back to one job message for the photo, and both dead letters are gone
    assert not summary.moved_by_task and summary.photos == [shot.photo_id]
    assert dead_letters(fast) == []
    assert events(db, shot.photo_id) == 1


def test_a_run_that_dies_and_a_hand_on_whose_send_fails_leave_a_receive_to_hand_on_from(
    infra: Infra, db: Engine
) -> None:
    # GIVEN the template's redrive (dead-lettered at the sixth receive), a visibility of 2 s, and a
    # database that refuses connections: every receive fails before a claim, spending no attempt
    database_url = _redrive_at_the_sixth_receive_and_the_database_down(infra, db, "die")
    first_hand_on = bootstrap.settings().retry.first_hand_on
    shot = upload(infra, db)

    # WHEN the run on the first receive a hand-on may come from dies before it answers (the
    # message comes back after its visibility), and the next run's hand-on meets an SQS error (the
    # soak's schedule: a kill, then a fault on SendMessage)
    receives: list[int] = []
    send_failed: list[list[float]] = []

    def dies_then_send_fails(event: dict[str, Any], context: Any) -> dict[str, Any]:
        counts = [int(record["attributes"]["ApproximateReceiveCount"]) for record in event["Records"]]
        receives.extend(counts)
        if first_hand_on in counts:  # the run dies: no answer, every record comes back
            return {"batchItemFailures": [{"itemIdentifier": r["messageId"]} for r in event["Records"]]}
        if first_hand_on + 1 in counts and not send_failed:
            with aws_fails(bootstrap.sqs_client(), "SendMessage") as calls:
                response: dict[str, Any] = process.lambda_handler(event, context)
            send_failed.append(calls)
            return response
        return process.lambda_handler(event, context)

    poller = Poller(infra.sqs, infra.queues.url, infra.queues.arn, dies_then_send_fails, wait_seconds=1)
    deadline = time.monotonic() + 60
    while poller.received - poller.failed < 1:  # until a run's answer acknowledges the notification
        assert time.monotonic() < deadline, f"never acknowledged; receives {receives}"
        poller.poll_once()
    # ... and the database comes back
    infra.configure(database_url=database_url)
    poll_until(infra, published(db, shot.photo_id))

    # THEN a later receive still handed it on: nothing was dead-lettered, the photo published
    assert send_failed and send_failed[0], f"the hand-on's send was never tried; receives {receives}"
    assert dead_letters(infra) == [], f"receives {receives}"
    assert job(db, shot.photo_id)[:2] == ("done", 1)


def _redrive_at_the_sixth_receive_and_the_database_down(infra: Infra, db: Engine, suffix: str) -> str:
    """Queues of their own (the template's maxReceiveCount, a 2 s visibility) notified of uploads, the
    functions pointed at a database that refuses connections; the real database's URL, to go back."""
    from devkit import stack

    queues = stack.create_queues(
        infra.sqs, f"{infra.queues.url.rsplit('/', 1)[1]}-{suffix}", max_receive_count=5, visibility_timeout=2
    )
    stack.notify(infra.s3, BUCKET, queue_arn=queues.arn, originals_prefix=f"{STAGE}/originals/")
    stack.drop_test_events(infra.sqs, queues.url)
    infra.queues = queues
    infra.configure(
        retry_base_seconds=0,
        process_queue_url=queues.url,
        dead_letter_queue_url=queues.dead_letter_url,
        database_url="postgresql://postgres@127.0.0.1:9/none",
    )
    return db.url.render_as_string(hide_password=False)
