"""A stateful property test of the job state machine (SPEC 4.1, 5, 16 and 17) on a real PostgreSQL.

Hypothesis interleaves deliveries, duplicates, upload events, transient and permanent failures,
crashed workers, time passing (stale claims, backoffs running out), sweeps, operator retries, new
recipes deployed and backfilled (`rerender --all`, `--stop`) and users' deletions (also one that
lands while a render is putting its variants) over a few photos, and checks the invariants after every step. The repository, the service, the
sweep and libvips are the real ones; in the first machine the object store and the queue are
in-process recordings. The second drives every delivery through the real process handler: a real
SQS message (moto's server) in a Lambda-shaped event, the real S3 store and queue behind it.

Sizes are Hypothesis profiles: `ci` (the default) and `soak` (HYPOTHESIS_PROFILE=soak, which
`make soak` sets: 200 examples of 50 steps over 10 photos).
"""

from __future__ import annotations

import json
import os
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import Engine, func, select, text

from devkit import handlers, samples, stack, uploads
from devkit.poller import LambdaContext, sqs_event
from photo_publish import bootstrap, operator
from photo_publish import uploads as app_uploads
from photo_publish.adapters.models import OutboxEvent, Photo, PhotoJob, PhotoVariant
from photo_publish.adapters.storage import S3Store
from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.events import PhotoRequest
from photo_publish.jobs import backfill
from photo_publish.jobs.sweep import Sweeper
from photo_publish.keys import Upload, parse_original_key, photo_prefixes
from photo_publish.outbox.contracts import (
    PHOTO_DELETED,
    PHOTO_FAILED,
    PHOTO_PUBLISHED,
    PHOTO_VARIANTS_UPDATED,
    PhotoFailedPayload,
)
from photo_publish.publish.outcomes import Outcome
from photo_publish.publish.repository import PhotoRepository
from photo_publish.publish.service import PhotoService
from photo_publish.settings import Settings
from tests.conftest import STAGE, TABLES, load_event
from tests.faults import aws_fails

settings.register_profile(
    "ci", max_examples=40, stateful_step_count=25, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.register_profile(
    "soak", max_examples=200, stateful_step_count=50, deadline=None, suppress_health_check=list(HealthCheck)
)
PROFILE = "soak" if os.environ.get("HYPOTHESIS_PROFILE") == "soak" else "ci"
PHOTOS = 10 if PROFILE == "soak" else 3
process = handlers.load("process")
ORIGINAL = bytes(samples.photograph("LadyBird.jpg").thumbnail_image(96).jpegsave_buffer(Q=85))
FAULTS = st.sampled_from([None, None, ErrorCode.STORAGE_READ_FAILED, ErrorCode.DECODE_FAILED])


@dataclass
class Store:
    """The originals, with the next read's fault set by the test; the variants put."""

    fault: ErrorCode | None = None
    puts: int = 0
    objects: set[str] = field(default_factory=set)
    # Called once, at the next put: what happens while a render is storing its variants.
    during_put: Callable[[], None] | None = None

    def open_original(self, key: str, max_bytes: int) -> Any:
        fault, self.fault = self.fault, None
        if fault is not None:
            raise PhotoError(fault, "injected")
        import io

        return io.BytesIO(ORIGINAL)

    def put_variant(self, key: str, data: bytes, content_type: str) -> None:
        self.puts += 1
        if self.during_put is not None:
            self.during_put, during = None, self.during_put
            during()
        self.objects.add(key)

    def delete_variants(self, keys: Any) -> list[str]:
        self.objects.difference_update(keys)
        return list(keys)

    def delete_under(self, prefixes: Any) -> bool:
        self.objects = {k for k in self.objects if not k.startswith(tuple(prefixes))}
        return True


@dataclass
class Queue:
    """Messages in flight, by photo; what reached the dead-letter queue."""

    inflight: deque[uuid.UUID] = field(default_factory=deque)
    dead: list[tuple[uuid.UUID, ErrorCode]] = field(default_factory=list)
    # The dead-letter queue refuses the next sends (an outage, a throttle, a policy mistake).
    refusing: int = 0

    def retry_later(self, receipt_handle: str, seconds: float) -> None: ...

    def depth(self) -> int:
        return len(self.inflight)

    def send_job(self, photo_id: uuid.UUID, delay_seconds: float = 0) -> None:
        self.inflight.append(photo_id)

    def send(self, body: str, delay_seconds: float = 0) -> None:
        raise AssertionError("only the direct S3 path hands records to the queue")

    def send_jobs(self, photo_ids: Any, *, spread_seconds: float = 0) -> list[uuid.UUID]:
        self.inflight.extend(photo_ids)
        return []

    def send_dead_letter(
        self, photo_id: uuid.UUID, attempt: int, code: ErrorCode, detail: str = "", *, kind: str = "photo"
    ) -> bool:
        if self.refusing:
            self.refusing -= 1
            return False
        self.dead.append((photo_id, code))
        return True


class JobStateMachine(RuleBasedStateMachine):
    engine: Engine
    base: Settings

    def __init__(self) -> None:
        super().__init__()
        with self.engine.begin() as connection:
            connection.execute(text(f"TRUNCATE {TABLES} CASCADE"))
        self.settings = replace(
            self.base, retry_base_seconds=60, stale_after_seconds=300, sweep_after_seconds=600
        )
        self.store, self.queue = Store(), Queue()
        self.service = PhotoService(PhotoRepository(self.engine), self.store, self.queue, self.settings)
        self.sweeper = Sweeper(self.engine, self.queue, self.settings, store=self.store, batch_size=2)
        self.photos = [uploads.register(self.engine, STAGE, f"p{i}.jpg") for i in range(PHOTOS)]
        self.queue.inflight.extend(p.photo_id for p in self.photos)
        self.ever_ready: set[uuid.UUID] = set()
        # Each photo's uploads so far: an upload event announces the newest (or, late, an older one).
        self.uploads = [1] * PHOTOS
        self.deleted: set[uuid.UUID] = set()
        self.version = 1  # the recipe version the deployed functions render

    # --- what the world does ------------------------------------------------------------

    def _deliver(self, index: int, fault: ErrorCode | None, *, upload: int | None = None) -> Outcome:
        shot = self.photos[index]
        self.store.fault = fault
        request = PhotoRequest(shot.photo_id)
        if upload is not None:
            mark = Upload(sequencer=f"{upload:08X}", etag=f"etag-{upload}")
            request = PhotoRequest(shot.photo_id, parse_original_key(shot.key, STAGE), mark)
        result = self.service.process(request)
        self.store.fault = None
        if result.outcome is Outcome.RETRY:
            self.queue.inflight.append(shot.photo_id)  # the queue brings the record back
        return result.outcome

    @rule(index=st.integers(0, PHOTOS - 1), fault=FAULTS)
    def deliver_a_message(self, index: int, fault: ErrorCode | None) -> None:
        """A message for the photo (possibly a duplicate: S3 and the sweep may send twice)."""
        if self.photos[index].photo_id in self.queue.inflight:
            self.queue.inflight.remove(self.photos[index].photo_id)
        self._deliver(index, fault)

    @rule(index=st.integers(0, PHOTOS - 1), fault=FAULTS, which=st.sampled_from(["same", "new", "older"]))
    def deliver_an_upload_event(self, index: int, fault: ErrorCode | None, which: str) -> None:
        """The newest upload's event again (a duplicate, a redelivery), a new upload, or a late one."""
        if which == "new":
            self.uploads[index] += 1
        upload = self.uploads[index] - (which == "older")
        self._deliver(index, fault, upload=upload)

    @rule(sends=st.integers(1, 3))
    def the_dead_letter_queue_refuses(self, sends: int) -> None:
        self.queue.refusing = sends

    @rule(index=st.integers(0, PHOTOS - 1))
    def a_message_is_lost(self, index: int) -> None:
        """The one thing the queue cannot redeliver: work only the sweep can find again."""
        if self.photos[index].photo_id in self.queue.inflight:
            self.queue.inflight.remove(self.photos[index].photo_id)

    @rule(index=st.integers(0, PHOTOS - 1))
    def a_worker_dies_holding_the_job(self, index: int) -> None:
        PhotoRepository(self.engine).claim(
            self.photos[index].photo_id,
            stale_after=self.settings.stale_after_seconds,
            max_attempts=self.settings.max_attempts,
        )

    @rule()
    def time_passes(self) -> None:
        """An hour goes by: claims go stale, backoffs run out, sweep leases expire."""
        with self.engine.begin() as connection:
            connection.execute(
                text(
                    "UPDATE photo_jobs SET claimed_at = claimed_at - interval '1 hour',"
                    " next_retry_at = next_retry_at - interval '1 hour', enqueued_at = enqueued_at - interval '1 hour',"
                    " created_at = created_at - interval '1 hour',"
                    " dead_letter_owed_at = dead_letter_owed_at - interval '1 hour'"
                )
            )
            connection.execute(
                text("UPDATE deleted_photos SET purge_after = purge_after - interval '1 hour'")
            )

    @rule()
    def the_sweep_runs(self) -> None:
        self.sweeper.run()

    @rule(index=st.integers(0, PHOTOS - 1))
    def an_operator_retries(self, index: int) -> None:
        for photo_id in operator.reset_failed(self.engine, [self.photos[index].photo_id]):
            self.queue.send_job(photo_id)

    @precondition(lambda self: self.version < 3 and bool(self.ever_ready))
    @rule()
    def a_new_recipe_is_deployed_and_backfilled(self) -> None:
        """The next recipe (a larger thumb) deployed once a photo is published, then the operator's
        `rerender --all`: the sweep sends the marked photos while the queue is short, each
        re-render publishing anew."""
        self.version += 1
        # (and the responsive ladder: the photos start at the recipe before it)
        ladder = Settings.__dataclass_fields__["variant_widths"].default
        self._deploy(
            replace(
                self.settings,
                variant_version=self.version,
                thumb_size=300 + 20 * self.version,
                variant_widths=ladder,  # type: ignore[arg-type]
            )
        )
        backfill.mark(
            self.engine, self.version, backfill.Selection(), lease_seconds=self.settings.stale_after_seconds
        )

    @rule()
    def the_operator_stops_the_backfill(self) -> None:
        backfill.stop(self.engine)

    def _deploy(self, settings: Settings) -> None:
        self.settings = settings
        self.service = PhotoService(PhotoRepository(self.engine), self.store, self.queue, settings)
        self.sweeper = Sweeper(self.engine, self.queue, settings, store=self.store, batch_size=2)

    @rule(index=st.integers(0, PHOTOS - 1))
    def a_user_deletes_the_photo(self, index: int) -> None:
        """In whatever state it is: pending, its worker dead holding it, a retry due, failed with a
        letter owed, published; its messages stay in flight."""
        self._delete(self.photos[index].photo_id)

    @rule(index=st.integers(0, PHOTOS - 1))
    def a_user_deletes_the_photo_while_it_renders(self, index: int) -> None:
        """The deletion commits while a delivery's render is putting its variants."""
        photo_id = self.photos[index].photo_id
        self.store.during_put = lambda: self._delete(photo_id)
        self._deliver(index, None)
        if self.store.during_put is not None:  # nothing was rendered (or not through this store)
            self.store.during_put = None
            self._delete(photo_id)

    def _delete(self, photo_id: uuid.UUID) -> None:
        app_uploads.delete(self.engine, self._object_store(), self.settings, photo_id)
        self.deleted.add(photo_id)

    def _object_store(self) -> Any:
        return self.store

    def _objects_of(self, photo_id: uuid.UUID, album_id: uuid.UUID) -> list[str]:
        prefixes = tuple(photo_prefixes(STAGE, album_id, photo_id))
        return sorted(k for k in self.store.objects if k.startswith(prefixes))

    # --- what must always hold ---------------------------------------------------------

    @invariant()
    def a_deleted_photo_has_no_row_and_nothing_after_its_deletion(self) -> None:
        """SPEC 17: its rows go with it, and nothing of it is published or failed afterwards."""
        with self.engine.connect() as connection:
            for photo_id in self.deleted:
                for table, column in ((Photo, Photo.id), (PhotoJob, PhotoJob.photo_id)):
                    assert connection.scalar(select(func.count()).where(column == photo_id)) == 0, table
                variants = select(func.count()).where(PhotoVariant.photo_id == photo_id)
                assert connection.scalar(variants) == 0
                types = connection.scalars(
                    select(OutboxEvent.event_type)
                    .where(OutboxEvent.aggregate_id == photo_id)
                    .order_by(OutboxEvent.created_at)
                ).all()
                assert types == [PHOTO_DELETED], f"events of a deleted photo: {types}"

    @invariant()
    def at_most_one_event_and_one_version_bump_per_photo(self) -> None:
        """One photo.published each, and a version bump for it and for each re-render's
        photo.variants_updated, nothing else."""
        with self.engine.connect() as connection:
            events = dict(
                connection.execute(
                    select(OutboxEvent.aggregate_id, func.count())
                    .where(OutboxEvent.event_type == PHOTO_PUBLISHED)
                    .group_by(OutboxEvent.aggregate_id)
                ).all()
            )
            rerendered = dict(
                connection.execute(
                    select(OutboxEvent.aggregate_id, func.count())
                    .where(OutboxEvent.event_type == PHOTO_VARIANTS_UPDATED)
                    .group_by(OutboxEvent.aggregate_id)
                ).all()
            )
            photos = connection.execute(
                select(Photo.id, Photo.processing_state, Photo.visibility, Photo.entity_version)
            ).all()
        for photo in photos:
            published = events.get(photo.id, 0)
            assert published <= 1
            assert photo.entity_version == 1 + published + rerendered.get(photo.id, 0)
            assert not rerendered.get(photo.id) or published == 1, "a re-render of an unpublished photo"
            assert (
                (photo.processing_state == "ready") == (published == 1) == (photo.visibility == "published")
            )
            if photo.id in self.ever_ready:
                assert photo.processing_state == "ready", "a published photo was downgraded"
            if photo.processing_state == "ready":
                self.ever_ready.add(photo.id)

    @invariant()
    def a_failed_photo_was_told_and_a_published_one_never_after(self) -> None:
        """SPEC 12: photo.failed with each marking, at the version it had, never after publication."""
        with self.engine.connect() as connection:
            history: dict[Any, list[Any]] = {}
            for event in connection.execute(
                select(OutboxEvent.aggregate_id, OutboxEvent.event_type, OutboxEvent.payload).order_by(
                    OutboxEvent.created_at
                )
            ):
                history.setdefault(event.aggregate_id, []).append(event)
            failed = connection.scalars(select(Photo.id).where(Photo.processing_state == "processing_failed"))
            for photo_id in failed:
                assert any(e.event_type == PHOTO_FAILED for e in history.get(photo_id, []))
        for events in history.values():
            types = [e.event_type for e in events]
            if PHOTO_PUBLISHED in types:
                assert PHOTO_FAILED not in types[types.index(PHOTO_PUBLISHED) :], "a published photo failed"
            for e in events:
                if e.event_type == PHOTO_FAILED:
                    assert PhotoFailedPayload.from_json(e.payload).entity_version == 1

    @invariant()
    def attempts_stay_within_the_limit(self) -> None:
        with self.engine.connect() as connection:
            assert (
                connection.scalar(select(func.coalesce(func.max(PhotoJob.attempt), 0)))
                <= self.settings.max_attempts
            )

    def teardown(self) -> None:
        """With faults gone and time passing, every photo settles: ready or processing_failed."""
        self.queue.refusing = 0
        for _ in range(10):
            self.time_passes()
            self.the_sweep_runs()
            for _ in range(len(self.queue.inflight)):
                self._deliver(self._index(self.queue.inflight.popleft()), None)
        with self.engine.connect() as connection:
            states = connection.execute(select(Photo.processing_state)).scalars().all()
            jobs = connection.execute(select(PhotoJob.status)).scalars().all()
        assert set(states) <= {"ready", "processing_failed"}
        assert not set(jobs) & {"active", "pending"}
        # Every final failure reached the dead-letter queue; permanent ones did not.
        with self.engine.connect() as connection:
            failed = connection.execute(
                select(PhotoJob.photo_id, PhotoJob.last_error_code).where(PhotoJob.status == "failed")
            ).all()
        dead = self.dead_letters()
        for photo_id, code in failed:
            assert ((photo_id, ErrorCode(code)) in dead) != ErrorCode(code).permanent
        with self.engine.connect() as connection:
            owed = connection.scalar(select(func.count()).where(PhotoJob.dead_letter_owed_at.is_not(None)))
        assert owed == 0, "a dead letter is still owed after the sweeps"
        # A deleted photo's variants, put by a render that raced its deletion, were purged.
        for shot in self.photos:
            if shot.photo_id in self.deleted:
                assert self._objects_of(shot.photo_id, shot.album_id) == [], (
                    "a deleted photo's objects stayed"
                )

    def dead_letters(self) -> list[tuple[uuid.UUID, ErrorCode]]:
        return self.queue.dead

    def _index(self, photo_id: uuid.UUID) -> int:
        return next(i for i, p in enumerate(self.photos) if p.photo_id == photo_id)


@pytest.mark.slow
def test_the_job_state_machine_keeps_its_invariants(db: Engine, database_url: str) -> None:
    JobStateMachine.engine = db
    # The photos start at version 1, the recipe before the responsive ladder; a rule deploys newer ones.
    JobStateMachine.base = Settings(
        database_url=database_url,
        photo_bucket="photo-publish-test",
        stage=STAGE,
        variant_version=1,
        variant_widths=(),
    )
    run_state_machine_as_test(JobStateMachine, settings=settings.get_profile(PROFILE))


# The real handler's flavour: smaller in CI (each step is a few HTTP calls to moto's server).
settings.register_profile(
    "ci-handler",
    max_examples=8,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
REAL_BUCKET = "photo-publish-machine"


class RealHandlerMachine(JobStateMachine):
    """The same world, each delivery a real SQS message handed to the real process handler.

    The handler runs as Lambda runs it (bootstrap's S3 store, SQS queue and engine, from the
    functions' environment); its answer decides what the model puts back in flight, and the
    message itself is deleted (the model, not moto's visibility clock, says when it comes back,
    since `time_passes` moves the database's clock only). Dead letters are read from moto's queue.
    """

    s3: Any
    sqs: Any
    queues: stack.Queues

    def __init__(self) -> None:
        super().__init__()
        # The first recipe, whatever an earlier example deployed; the sweep's purges and
        # retirements reach the bucket the handler writes.
        self._deploy(self.settings)
        for shot in self.photos:
            uploads.put_original(self.s3, REAL_BUCKET, shot.key, ORIGINAL)
        while messages := self.sqs.receive_message(
            QueueUrl=self.queues.dead_letter_url, MaxNumberOfMessages=10
        ).get("Messages", []):
            for message in messages:
                self.sqs.delete_message(
                    QueueUrl=self.queues.dead_letter_url, ReceiptHandle=message["ReceiptHandle"]
                )

    def _deliver(self, index: int, fault: ErrorCode | None, *, upload: int | None = None) -> Outcome:
        shot = self.photos[index]
        body = (
            json.dumps({"photoId": str(shot.photo_id)}) if upload is None else notification(shot.key, upload)
        )
        self.sqs.send_message(QueueUrl=self.queues.url, MessageBody=body)
        (message,) = self.sqs.receive_message(
            QueueUrl=self.queues.url,
            MaxNumberOfMessages=1,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        )["Messages"]
        with self._fault(shot, fault) as sends:
            answer = process.lambda_handler(sqs_event([message], self.queues.arn), LambdaContext())
        # The dead-letter queue refused as many sends as were tried, up to what it was told to.
        self.queue.refusing -= min(len(sends), self.queue.refusing)
        self.sqs.delete_message(QueueUrl=self.queues.url, ReceiptHandle=message["ReceiptHandle"])
        if answer["batchItemFailures"]:
            self.queue.inflight.append(shot.photo_id)  # the queue brings the record back
            return Outcome.RETRY
        return Outcome.PUBLISHED

    @contextmanager
    def _fault(self, shot: uploads.Upload, fault: ErrorCode | None) -> Iterator[list[float]]:
        """This delivery's fault; yields the SendMessage calls the dead-letter queue refused."""
        with ExitStack() as stack_:
            if fault is ErrorCode.STORAGE_READ_FAILED:
                stack_.enter_context(aws_fails(bootstrap.s3_client(), "GetObject"))
            elif fault is ErrorCode.DECODE_FAILED and shot.photo_id not in self.deleted:
                # This delivery reads a broken original; the photo's own comes back afterwards.
                uploads.put_original(self.s3, REAL_BUCKET, shot.key, ORIGINAL[: len(ORIGINAL) // 2])
                stack_.callback(uploads.put_original, self.s3, REAL_BUCKET, shot.key, ORIGINAL)
            sends: list[float] = []
            if self.queue.refusing:
                # A delivery's only SendMessage is its dead letter (every receive count here is 1).
                sends = stack_.enter_context(
                    aws_fails(bootstrap.sqs_client(), "SendMessage", times=self.queue.refusing)
                )
            yield sends

    def _object_store(self) -> Any:
        return S3Store(self.s3, REAL_BUCKET)

    def _deploy(self, settings: Settings) -> None:
        """The functions' environment at the new recipe, as a deploy sets it (new containers)."""
        self.settings = settings
        recipe = settings.environment()
        for name in ("VARIANT_VERSION", "THUMB_SIZE", "VARIANT_WIDTHS"):
            os.environ[name] = recipe[name]
        bootstrap.reset()
        self.sweeper = Sweeper(
            self.engine, self.queue, settings, store=S3Store(self.s3, REAL_BUCKET), batch_size=2
        )

    def _objects_of(self, photo_id: uuid.UUID, album_id: uuid.UUID) -> list[str]:
        keys = []
        for prefix in photo_prefixes(STAGE, album_id, photo_id):
            listed = self.s3.list_objects_v2(Bucket=REAL_BUCKET, Prefix=prefix).get("Contents", [])
            keys += [o["Key"] for o in listed]
        return sorted(keys)

    def dead_letters(self) -> list[tuple[uuid.UUID, ErrorCode]]:
        dead = list(self.queue.dead)  # the sweep's (it is given the recording queue)
        while messages := self.sqs.receive_message(
            QueueUrl=self.queues.dead_letter_url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=60,
            MessageAttributeNames=["All"],
        ).get("Messages", []):
            for message in messages:
                attributes = message["MessageAttributes"]
                dead.append(
                    (
                        uuid.UUID(attributes["photoId"]["StringValue"]),
                        ErrorCode(attributes["errorCode"]["StringValue"]),
                    )
                )
        return dead


def notification(key: str, upload: int) -> str:
    """The S3 event notification of the `upload`-th upload of `key` (its body as SQS carries it),
    marked as the stand-in machine marks it: S3's sequencer and eTag."""
    record = json.loads(load_event("sqs_s3_notification")["Records"][0]["body"])["Records"][0]
    record["s3"]["bucket"]["name"] = REAL_BUCKET
    record["s3"]["object"] |= {"key": key, "sequencer": f"{upload:08X}", "eTag": f"etag-{upload}"}
    return json.dumps({"Records": [record]})


@pytest.mark.slow
def test_the_real_handler_keeps_the_invariants(
    db: Engine, database_url: str, aws_endpoint: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3, sqs = stack.clients()
    s3.create_bucket(Bucket=REAL_BUCKET)
    queues = stack.create_queues(
        sqs, f"machine-{uuid.uuid4().hex[:12]}", max_receive_count=5, visibility_timeout=60
    )
    # The photos start at version 1, the recipe before the responsive ladder; a rule deploys newer ones.
    base = Settings(
        variant_version=1,
        variant_widths=(),
        database_url=database_url,
        photo_bucket=REAL_BUCKET,
        stage=STAGE,
        process_queue_url=queues.url,
        dead_letter_queue_url=queues.dead_letter_url,
        retry_base_seconds=60,
        stale_after_seconds=300,
        sweep_after_seconds=600,
    )
    # The functions' environment, as the template sets it, for bootstrap to build the real parts.
    for name, value in base.environment().items():
        monkeypatch.setenv(name, value)
    bootstrap.reset()
    RealHandlerMachine.engine, RealHandlerMachine.base = db, base
    RealHandlerMachine.s3, RealHandlerMachine.sqs, RealHandlerMachine.queues = s3, sqs, queues
    try:
        run_state_machine_as_test(
            RealHandlerMachine, settings=settings.get_profile("soak" if PROFILE == "soak" else "ci-handler")
        )
    finally:
        bootstrap.reset()
