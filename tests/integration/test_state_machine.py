"""A stateful property test of the job state machine (SPEC 4.1, 5, 16 and 17) on a real PostgreSQL.

Hypothesis interleaves deliveries, duplicates, upload events, transient and permanent failures,
crashed workers, time passing (stale claims, backoffs running out), sweeps, operator retries, new
recipes deployed and backfilled (`rerender --all`, `--stop`) and users' deletions (also one that
lands while a render is putting its variants) over a few photos, and checks the invariants after every step. The repository, the service, the
sweep and libvips are the real ones; in the first machine the object store and the queue are
in-process recordings. The second drives every delivery through the real process handler: a real
SQS message (moto's server) in a Lambda-shaped event, the real S3 store and queue behind it.

Issue 21 added the actors SPEC 16 names that it lacked, and its invariants: re-uploads whose S3
sequencers differ in length (an older or repeated event never reopens a failed job; the newest upload
is recorded and reopens one); a re-upload through a database outage at every receive up to the
delivery's hand-on, then the database back (the upload the record proved is processed); S3 bodies
slower than the render's limit (never a permanent RENDER_TIME_EXCEEDED); the operator's redrive
(`operator.redrive` on the recording queue, which answers its SQS calls), a retry committed while a
sender holds a letter, and `rerender --all` resumed; every letter, as it reaches the dead-letter
queue, is for a failed job with that code; and after the settling sweeps, a photo a backfill marked
reaches the version or has its re-render's letter waiting in the queue. Then the actors that make
final failures and their races come within a few steps: an original S3 cannot read for a few rounds
of the queue (three failed attempts fail its job for good), the queue catching up, a user replacing a
file at once (two uploads, the second's sequencer as often shorter), and the operator's retry or
`rerender --all` committing while a sender holds that photo's letter.

Issue 32's mutants (tests/mutants, `make mutants`) added what three of them needed to be found: a
deletion between a sender's lease of a letter and its last look (the letter must not be sent), a
slow body's fault checked where it was met (a fixed file uploaded right after could take the failure
back before the step's invariants ran), and the sweep's removal of deleted photos' letters checked
after every run, not only after the teardown's (by when a redrive may have taken the letter).

Sizes are Hypothesis profiles: `ci` (the default), `soak` (HYPOTHESIS_PROFILE=soak, which
`make soak` sets: 200 examples of 50 steps over 10 photos) and `find` (mutation runs: long schedules
until the first failure).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import Engine, create_engine, func, select, text

from devkit import handlers, samples, stack, uploads
from devkit.poller import LambdaContext, sqs_event
from photo_publish import bootstrap, operator
from photo_publish import uploads as app_uploads
from photo_publish.adapters import storage
from photo_publish.adapters.models import OutboxEvent, Photo, PhotoJob, PhotoVariant
from photo_publish.adapters.queue import DeadLetterQueue
from photo_publish.adapters.storage import OriginalReplaced, OriginalStream, S3Store
from photo_publish.adapters.tables import photo_jobs
from photo_publish.contracts import (
    PHOTO_DELETED,
    PHOTO_FAILED,
    PHOTO_PUBLISHED,
    PHOTO_VARIANTS_UPDATED,
    PhotoFailedPayload,
)
from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.events import PhotoRequest, from_sqs_body
from photo_publish.image import pipeline
from photo_publish.jobs import backfill, machine
from photo_publish.jobs.sweep import LETTER_RECEIVES, Sweeper
from photo_publish.keys import Upload, parse_original_key, photo_prefixes
from photo_publish.publish import repository
from photo_publish.publish.delivery import Delivery, RetryLater
from photo_publish.publish.outcomes import Outcome
from photo_publish.publish.service import PhotoService
from photo_publish.retry import PERMANENT
from photo_publish.settings import Settings
from tests.conftest import STAGE, TABLES, load_event
from tests.faults import aws_fails
from tests.rows import committed

settings.register_profile(
    "ci", max_examples=40, stateful_step_count=25, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.register_profile(
    "soak", max_examples=200, stateful_step_count=50, deadline=None, suppress_health_check=list(HealthCheck)
)
# `find`: the mutation runs' setting (a scratch copy with one defect put back): long schedules, many of
# them, stopped at the first failure, which is reported as it was generated (the figures of a
# detection: checks run, seconds, the schedule's steps). `find-shrink`, run again with the same
# `--hypothesis-seed`, finds the same failure and shrinks it (minutes more: each replay renders).
# HYPOTHESIS_PROFILE=find.
settings.register_profile(
    "find",
    max_examples=100_000,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    report_multiple_bugs=False,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target],
)
settings.register_profile(
    "find-shrink", settings.get_profile("find"), phases=[*settings.get_profile("find").phases, Phase.shrink]
)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if PROFILE not in ("soak", "find", "find-shrink"):
    PROFILE = "ci"
PHOTOS = 10 if PROFILE == "soak" else 3
# Steps run in all (every example's), printed at the end of a run: how far a schedule went before a
# failure, beside the shrunk example Hypothesis prints.
STEPS = {"run": 0}
process = handlers.load("process")
ORIGINAL = bytes(samples.photograph("LadyBird.jpg").thumbnail_image(96).jpegsave_buffer(Q=85))
# SLOW: S3's body makes the reader wait longer than the render's own limit (SPEC 5: the network's
# time is never the file's fault).
SLOW = "slow"
FAULTS = st.sampled_from([None, None, ErrorCode.STORAGE_READ_FAILED, ErrorCode.DECODE_FAILED, SLOW])
# What a later upload's sequencer ends with: S3's sequencers of one key differ in length, and the
# shorter is right-padded with zeros to compare (SPEC 5). Any of these after a fixed-width prefix
# keeps the uploads' order under that rule; left-padding would reverse some of them.
SEQUENCER_TAILS = st.sampled_from(["", "0", "00", "5", "A0", "0000"])


class Skewed:
    """The clock the render's deadline and the original's stream read (`time` in both modules): real
    time, plus whatever a slow body made them wait. No test sleeps for a slow S3."""

    def __init__(self) -> None:
        self.skew = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.skew

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


CLOCK = Skewed()


class SlowBody(io.BytesIO):
    """An S3 body whose first read waits past the render's limit (the clock moves on, nobody sleeps)."""

    def __init__(self, data: bytes, wait: float) -> None:
        super().__init__(data)
        self.wait = wait

    def read(self, size: int | None = -1, /) -> bytes:
        CLOCK.skew += self.wait
        self.wait = 0.0
        return super().read(size)


def s3_after(a: str, b: str) -> bool:
    """S3's order of two sequencers of one key: the shorter right-padded with zeros (AWS's rule)."""
    width = max(len(a), len(b))
    return a.upper().ljust(width, "0") > b.upper().ljust(width, "0")


def etag_of(upload: int) -> str:
    """The stand-in's eTag of a key's `upload`-th upload: each upload a different file."""
    return f"etag-{upload}"


@dataclass
class Store:
    """The originals, with the next read's fault set by the test; the variants put."""

    puts: int = 0
    objects: set[str] = field(default_factory=set)
    # Called once, at the next put: what happens while a render is storing its variants.
    during_put: Callable[[], None] | None = None

    fault: ErrorCode | str | None = None
    # Each key's newest upload, by its eTag (a key not in it holds its first upload): a form
    # re-posted writes the key again, and a read pinned to an older upload finds it written over,
    # as in a bucket without versions.
    current: dict[str, str] = field(default_factory=dict)

    def open_original(self, key: str, max_bytes: int, pin: Any = None) -> Any:
        fault, self.fault = self.fault, None
        etag = self.current.get(key, etag_of(1))
        if pin is not None and pin.etag and pin.etag != etag:
            raise OriginalReplaced("PreconditionFailed")
        if fault == SLOW:
            # The render's own limit and then some, spent waiting for the body's bytes.
            return OriginalStream(SlowBody(ORIGINAL, RENDER_LIMIT + 10), max_bytes, etag=etag)
        if fault is not None:
            raise PhotoError(ErrorCode(fault), "injected")
        return OriginalStream(io.BytesIO(ORIGINAL), max_bytes, etag=etag)

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


class LastLook:
    """What happens just before a sender's last look at the letters it leased (`machine.still_owed`,
    which the test puts behind this): set by a rule for one photo, run once, from a thread of its own
    (another request, with no transaction of the sender's), at the look that holds that photo's letter."""

    def __init__(self) -> None:
        self.before: tuple[uuid.UUID, Callable[[], None]] | None = None

    def around(self, still_owed: Callable[..., Any]) -> Callable[..., Any]:
        def look(connection: Any, letters: Any) -> Any:
            if self.before is not None and any(letter.photo_id == self.before[0] for letter in letters):
                (_, act), self.before = self.before, None
                other = threading.Thread(target=act)
                other.start()
                other.join()
            return still_owed(connection, letters)

        return look


LAST_LOOK = LastLook()


@dataclass
class Queue:
    """Messages in flight, by photo; what reached the dead-letter queue. It also answers the few
    SQS calls the operator's redrive makes (receive, delete and release dead letters, send job
    messages), so that the real `operator.redrive` runs against it."""

    inflight: deque[uuid.UUID] = field(default_factory=deque)
    # Every letter ever accepted, in order; `removed` are those a redrive took out of the queue.
    dead: list[tuple[uuid.UUID, ErrorCode]] = field(default_factory=list)
    removed: set[int] = field(default_factory=set)
    received: set[int] = field(default_factory=set)
    # The dead-letter queue refuses the next sends (an outage, a throttle, a policy mistake).
    refusing: int = 0
    # Called with each letter as it is accepted (the model's check of SPEC 16's invariant 2).
    on_letter: Callable[[uuid.UUID, ErrorCode], None] | None = None
    # Called once, while the next letter of the photo is on its way: what happens while a sender
    # holds it.
    during_send: tuple[uuid.UUID, Callable[[], None]] | None = None
    # Upload records handed back to the queue (the receive limit's hand-on): their bodies.
    handed_on: list[str] = field(default_factory=list)

    def retry_later(self, receipt_handle: str, seconds: float) -> None: ...

    def depth(self) -> int:
        return len(self.inflight)

    def send_job(self, photo_id: uuid.UUID, delay_seconds: float = 0) -> None:
        self.inflight.append(photo_id)

    def send(self, body: str, delay_seconds: float = 0) -> None:
        self.handed_on.append(body)

    def send_jobs(self, photo_ids: Any, *, spread_seconds: float = 0) -> list[uuid.UUID]:
        self.inflight.extend(photo_ids)
        return []

    def send_dead_letter(
        self, photo_id: uuid.UUID, attempt: int, code: ErrorCode, detail: str = "", *, kind: str = "photo"
    ) -> bool:
        if self.during_send is not None and self.during_send[0] == photo_id:
            (_, during), self.during_send = self.during_send, None
            during()
        if self.refusing:
            self.refusing -= 1
            return False
        if self.on_letter is not None:
            self.on_letter(photo_id, code)
        self.dead.append((photo_id, code))
        return True

    def letters(self) -> list[tuple[uuid.UUID, ErrorCode]]:
        """What the dead-letter queue holds now."""
        return [letter for i, letter in enumerate(self.dead) if i not in self.removed]

    # --- the SQS client the operator's redrive is given --------------------------------------

    def receive_message(self, *, QueueUrl: str, **_: Any) -> dict[str, Any]:
        batch = [i for i in range(len(self.dead)) if i not in self.removed | self.received][:10]
        self.received.update(batch)
        return {
            "Messages": [
                {
                    "ReceiptHandle": str(i),
                    "Body": "{}",
                    "MessageAttributes": {
                        "photoId": {"StringValue": str(self.dead[i][0])},
                        "errorCode": {"StringValue": self.dead[i][1].value},
                    },
                }
                for i in batch
            ]
        }

    def delete_message(self, *, QueueUrl: str, ReceiptHandle: str) -> None:
        self.removed.add(int(ReceiptHandle))

    def change_message_visibility(self, *, ReceiptHandle: str, **_: Any) -> None:
        self.received.discard(int(ReceiptHandle))

    def delete_message_batch(self, *, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        for entry in Entries:
            self.delete_message(QueueUrl=QueueUrl, ReceiptHandle=entry["ReceiptHandle"])
        return {"Successful": [{"Id": entry["Id"]} for entry in Entries]}

    def change_message_visibility_batch(self, *, QueueUrl: str, Entries: list[dict[str, Any]]) -> None:
        for entry in Entries:
            self.change_message_visibility(ReceiptHandle=entry["ReceiptHandle"])

    def send_message_batch(self, *, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        self.inflight.extend(uuid.UUID(json.loads(e["MessageBody"])["photoId"]) for e in Entries)
        return {}


DEAD_LETTER_URL = "dead-letters"
# The database as the functions see it during an outage: nothing listens (connections refused at once).
UNREACHABLE = create_engine(
    "postgresql+psycopg://postgres@127.0.0.1:9/none", connect_args={"connect_timeout": 2}
)


class NoMetrics:
    def add_metric(self, **_: Any) -> None: ...


NO_METRICS: Any = NoMetrics()
RENDER_LIMIT = 30.0  # Settings.render_timeout_seconds' default, which the machine's functions keep


class JobStateMachine(RuleBasedStateMachine):
    engine: Engine
    base: Settings

    def __init__(self) -> None:
        super().__init__()
        with self.engine.begin() as connection:
            connection.execute(text(f"TRUNCATE {TABLES} CASCADE"))
        self.settings = replace(
            self.base,
            retry_base_seconds=60,
            stale_after_seconds=300,
            sweep_after_seconds=600,
            process_queue_url=self.base.process_queue_url or "jobs",
            dead_letter_queue_url=self.base.dead_letter_queue_url or DEAD_LETTER_URL,
        )
        self.store, self.queue = Store(), Queue()
        LAST_LOOK.before = None
        self.queue.on_letter = self._letter_accepted
        self.service = PhotoService(self.engine, self.store, self.queue, self.settings)
        self.sweeper = self._sweeper(self.settings)
        # The photos in the rules' places; a new upload takes a deleted one's place.
        self.photos = [uploads.register(self.engine, STAGE, f"p{i}.jpg") for i in range(PHOTOS)]
        self.everyone = list(self.photos)
        self.queue.inflight.extend(p.photo_id for p in self.photos)
        self.ever_ready: set[uuid.UUID] = set()
        # The uploads announced to each photo: each may be a picture of its own (SPEC 19).
        self.announced: dict[uuid.UUID, set[int]] = {}
        # Each photo's uploads so far: an upload event announces the newest (or, late, an older one).
        self.uploads = [1] * PHOTOS
        # Each upload's S3 sequencer, once an event announced it: a fixed-width count and a tail of
        # its own, so that sequencers of one key differ in length.
        self.tails: dict[tuple[int, int], str] = {}
        # The recipe version the operator's last `rerender --all` marked for, until a `--stop`.
        self.backfilling: int | None = None
        self.deleted: set[uuid.UUID] = set()
        # Photos deleted while a sender held their letter, past its last look (SPEC 19): the one
        # letter that may still reach the queue for a deleted photo, which the sweep removes.
        self.deleted_in_send: set[uuid.UUID] = set()
        self.version = 1  # the recipe version the deployed functions render

    # --- what the world does ------------------------------------------------------------

    def _sequencer(self, index: int | uploads.Upload, upload: int) -> str:
        """The `upload`-th upload's sequencer: with its tail for the photo in place `index`."""
        tail = self.tails.get((index, upload), "") if isinstance(index, int) else ""
        return f"{upload:08X}{tail}"

    def _deliver(
        self, index: int | uploads.Upload, fault: ErrorCode | str | None, *, upload: int | None = None
    ) -> Outcome:
        """A message for the photo in place `index` (or for a photo given, perhaps deleted since); an
        upload's event where `upload` is given."""
        shot = self.photos[index] if isinstance(index, int) else index
        self.store.fault = fault
        request = PhotoRequest(shot.photo_id)
        if upload is not None:
            self.announced.setdefault(shot.photo_id, set()).add(upload)
            mark = Upload(sequencer=self._sequencer(index, upload), etag=etag_of(upload))
            request = PhotoRequest(shot.photo_id, parse_original_key(shot.key, STAGE), mark)
        result = self.service.process(request)
        self.store.fault = None
        # SPEC 5, where the slow body was met: a later step in the same rule (the fixed file's upload
        # right after) may take the failure back before the invariant below would see it.
        assert not (fault == SLOW and result.code is ErrorCode.RENDER_TIME_EXCEEDED), (
            "a slow S3 body failed a photo for good"
        )
        if result.outcome is Outcome.RETRY:
            self.queue.inflight.append(shot.photo_id)  # the queue brings the record back
        return result.outcome

    @rule(index=st.integers(0, PHOTOS - 1), fault=FAULTS)
    def deliver_a_message(self, index: int, fault: ErrorCode | None) -> None:
        """A message for the photo (possibly a duplicate: S3 and the sweep may send twice)."""
        if self.photos[index].photo_id in self.queue.inflight:
            self.queue.inflight.remove(self.photos[index].photo_id)
        self._deliver(index, fault)

    @rule(
        index=st.integers(0, PHOTOS - 1),
        fault=FAULTS,
        which=st.sampled_from(["same", "new", "older"]),
        tail=SEQUENCER_TAILS,
    )
    def deliver_an_upload_event(
        self, index: int, fault: ErrorCode | str | None, which: str, tail: str
    ) -> None:
        """The newest upload's event again (a duplicate, a redelivery), a new upload (its sequencer
        longer or shorter than the one before), or a late one."""
        if which == "new":
            self._new_upload(index, tail)
        upload = self.uploads[index] - (which == "older")
        sequencer = self._sequencer(index, upload)
        before = self._job(index)
        outcome = self._deliver(index, fault, upload=upload)
        after = self._job(index)
        if before is None or after is None:
            return  # deleted (or never had a job): nothing to reopen
        # Invariant 3: an older or repeated event never reopens a job that failed working from
        # this upload or a newer one ...
        if (
            before.status == "failed"
            and before.attempt_sequencer is not None
            and not s3_after(sequencer, before.attempt_sequencer)
        ):
            assert after.status == "failed", (
                f"upload {sequencer} reopened a job that failed on {before.attempt_sequencer}"
            )
        # ... and the newest upload is always recorded and processed: a failed job it did not
        # reopen failed working from it (or is waiting for its letter's sender, and comes back).
        if which == "new":
            self._assert_upload_taken(index, sequencer, outcome)

    @rule(index=st.integers(0, PHOTOS - 1), first=SEQUENCER_TAILS, second=SEQUENCER_TAILS, fault=FAULTS)
    def a_user_replaces_the_file_at_once(
        self, index: int, first: str, second: str, fault: ErrorCode | None
    ) -> None:
        """Two uploads in quick succession (a broken file, then the fixed one): the first's event, its
        delivery meeting `fault`, then the second's, whose sequencer is as often shorter as longer."""
        self.deliver_an_upload_event(index, fault, "new", first)
        self.deliver_an_upload_event(index, None, "new", second)

    def _new_upload(self, index: int, tail: str) -> int:
        """The user posts the photo's form again with another file (before or after it published:
        the form is valid for minutes); its event is not sent yet."""
        self.uploads[index] += 1
        upload = self.uploads[index]
        self.tails[(index, upload)] = tail
        self.store.current[self.photos[index].key] = self._etag(upload)
        return upload

    def _etag(self, upload: int) -> str:
        return etag_of(upload)

    def _assert_upload_taken(self, index: int, sequencer: str, outcome: Outcome) -> None:
        after = self._job(index)
        if after is None or after.processing_state == "ready":
            return  # deleted; or published, which a new upload does not reopen (SPEC 4.1: `already`)
        assert after.upload_sequencer is not None and not s3_after(sequencer, after.upload_sequencer), (
            f"the newest upload {sequencer} was not recorded (the job holds {after.upload_sequencer})"
        )
        if after.status == "failed" and outcome is not Outcome.RETRY:
            assert after.attempt_sequencer is not None and not s3_after(sequencer, after.attempt_sequencer), (
                f"a failed job was not reopened by the newer upload {sequencer}"
                f" (its attempt worked from {after.attempt_sequencer})"
            )

    def _job(self, index: int) -> Any:
        with self.engine.connect() as connection:
            return connection.execute(
                select(
                    photo_jobs.c.status,
                    photo_jobs.c.upload_sequencer,
                    photo_jobs.c.attempt_sequencer,
                    photo_jobs.c.last_error_code,
                    photo_jobs.c.dead_letter_owed_at,
                    Photo.processing_state,
                )
                .join(Photo, Photo.id == photo_jobs.c.photo_id)
                .where(photo_jobs.c.photo_id == self.photos[index].photo_id)
            ).one_or_none()

    @rule(index=st.integers(0, PHOTOS - 1), tail=SEQUENCER_TAILS, receives=st.integers(1, 5))
    def a_reupload_meets_a_database_outage(self, index: int, tail: str, receives: int) -> None:
        """A user uploads a new file (typically to fix a failed photo) while the database refuses
        the process function through `receives` receives of its notification (up to the one the
        delivery hands it on from); then the database is back and the queue's messages arrive."""
        upload = self._new_upload(index, tail)
        self.announced.setdefault(self.photos[index].photo_id, set()).add(upload)
        sequencer = self._sequencer(index, upload)
        body = notification(
            self.photos[index].key,
            upload,
            sequencer,
            bucket=self.settings.photo_bucket,
            etag=self._etag(upload),
        )
        waiting = len(self.queue.inflight)
        acknowledged = self._through_an_outage(body, receives)
        # The database is back, and what the receives left arrives: what they handed on to the queue
        # (upload records, or job messages), else the notification itself, still in the queue.
        handed_on, self.queue.handed_on = self.queue.handed_on, []
        jobs = [self.queue.inflight.pop() for _ in range(len(self.queue.inflight) - waiting)]
        outcome = Outcome.RETRY
        for carried in handed_on + ([] if acknowledged else [body]):
            outcome = self._deliver_body(carried)
        for photo_id in jobs:
            outcome = self._arrive(photo_id)
        self._assert_upload_taken(index, sequencer, outcome)

    def _through_an_outage(self, body: str, receives: int) -> bool:
        """True if a receive acknowledged the notification (handed it on)."""
        down = PhotoService(UNREACHABLE, self.store, self.queue, self.settings)
        delivery = Delivery(down, self.queue, self.settings, NO_METRICS)
        for count in range(1, receives + 1):
            try:
                delivery.sqs_record(
                    message_id=f"m{count}", body=body, receipt_handle="r", receive_count=count
                )
            except RetryLater:
                continue
            return True
        return False

    def _deliver_body(self, body: str) -> Outcome:
        """A message the queue carries whole (an upload record handed on), through the delivery."""
        delivery = Delivery(self.service, self.queue, self.settings, NO_METRICS)
        try:
            results = delivery.sqs_record(message_id="m", body=body, receipt_handle="r", receive_count=1)
        except RetryLater:
            # The queue brings it back: as a job message here (its upload has been recorded).
            for request in from_sqs_body(body, bucket=self.settings.photo_bucket, stage=STAGE):
                self.queue.inflight.append(request.photo_id)
            return Outcome.RETRY
        return results[0].outcome if results else Outcome.IGNORED

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
        committed(
            self.engine,
            repository.claim,
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
        # SPEC 19: a run reads up to LETTER_RECEIVES batches of ten letters and removes those of
        # deleted photos: with no more waiting, none is left once it has run (not only after the
        # teardown's sweeps, by when a redrive may have taken it).
        if len(self.queue.letters()) <= LETTER_RECEIVES * 10:
            self._assert_no_letter_of_a_deleted_photo()

    @rule()
    def the_queue_catches_up(self) -> None:
        """An hour of the queue: time passes, the sweep runs, and every message in flight arrives."""
        self._a_round()

    @rule(
        index=st.integers(0, PHOTOS - 1),
        rounds=st.integers(1, 4),
        meanwhile=st.sampled_from([None, "retry", "rerender", "delete", "delete before the look"]),
        answered=st.booleans(),
    )
    def the_original_cannot_be_read_for_a_while(
        self, index: int, rounds: int, meanwhile: str | None, answered: bool
    ) -> None:
        """S3 fails every read of one photo's original (a throttled prefix, a key's permissions being
        rotated) for `rounds` rounds of the queue, each an hour passing, a sweep and the photo's
        messages arriving (the others' wait), then reads it again. Three failed attempts and its job
        (a first render's, or a backfill's re-render) fails for good and pages: final failures come
        within a few steps, and with them what an operator who saw the failures does `meanwhile`
        (a retry of the photo, `rerender --all` resumed, its deletion before or after the sender's
        last look) while its letter is on its way (in the real handler's machine, while the sweep
        sends it: the worker's own letters go to moto's queue, not through the recording one). If
        `answered`, the on-call then answers the page with the runbook's `redrive`."""
        if meanwhile is not None:
            self.the_operator_acts_while_a_letter_is_on_its_way(index, meanwhile)
        for _ in range(rounds):
            self._a_round(unreadable=self.photos[index].photo_id)
        if answered:
            self._redrive()

    @precondition(lambda self: bool(self._behind()))
    @rule(
        pick=st.integers(0, 20),
        meanwhile=st.sampled_from([None, "retry", "rerender", "delete"]),
        answered=st.booleans(),
    )
    def a_rerender_cannot_read_the_original(self, pick: int, meanwhile: str | None, answered: bool) -> None:
        """The same, for a published photo a backfill marked (its re-render not failed yet): the
        re-render fails for good within the step (SPEC 16 (4): it pages, the photo stays published).
        The rule above reaches this only where a publish, a deploy and three rounds on that photo
        meet by chance."""
        places = self._behind()
        self.the_original_cannot_be_read_for_a_while(places[pick % len(places)], 3, meanwhile, answered)

    def _behind(self) -> list[int]:
        """The places of published photos a backfill marked whose re-render has not failed yet."""
        with self.engine.connect() as connection:
            behind = set(
                connection.scalars(
                    select(Photo.id)
                    .join(PhotoJob, PhotoJob.photo_id == Photo.id)
                    .where(
                        Photo.processing_state == "ready",
                        PhotoJob.rerender_to.is_not(None),
                        PhotoJob.status != "failed",
                    )
                )
            )
        return [i for i, shot in enumerate(self.photos) if shot.photo_id in behind]

    def _a_round(self, *, unreadable: uuid.UUID | None = None) -> None:
        """Time passes, the sweep runs, and the messages in flight arrive: all of them, or only the
        unreadable photo's (which fail to read it)."""
        self.time_passes()
        self.the_sweep_runs()
        arriving = [p for p in self.queue.inflight if unreadable in (None, p)]
        self.queue.inflight = deque(p for p in self.queue.inflight if p not in arriving)
        for photo_id in arriving:
            self._arrive(photo_id, ErrorCode.STORAGE_READ_FAILED if photo_id == unreadable else None)

    def _arrive(self, photo_id: uuid.UUID, fault: ErrorCode | None = None) -> Outcome:
        """A message in flight arrives (one for a deleted photo too)."""
        return self._deliver(next(p for p in self.everyone if p.photo_id == photo_id), fault)

    def _a_new_photo_in_place_of(self, photo_id: uuid.UUID) -> None:
        """The user uploads a new photo where a deleted one was: registered, its original put, a job
        message for it in flight (so that photos not yet published, and their first renders'
        failures, keep coming; the deleted one's messages still arrive, and a rule sends it more)."""
        index = next(i for i, p in enumerate(self.photos) if p.photo_id == photo_id)
        shot = uploads.register(self.engine, STAGE, f"p{len(self.everyone)}.jpg")
        self._put_original(shot)
        self.photos[index] = shot
        self.everyone.append(shot)
        self.uploads[index] = 1
        self.tails = {k: v for k, v in self.tails.items() if k[0] != index}
        self.queue.inflight.append(shot.photo_id)

    def _put_original(self, shot: uploads.Upload) -> None:
        """The stand-in store reads one original for every key."""

    @rule(index=st.integers(0, PHOTOS - 1))
    def an_operator_retries(self, index: int) -> None:
        for photo_id in operator.reset_failed(self.engine, [self.photos[index].photo_id]):
            self.queue.send_job(photo_id)

    @rule(
        index=st.integers(0, PHOTOS - 1),
        act=st.sampled_from(["retry", "rerender", "delete", "delete before the look"]),
    )
    def the_operator_acts_while_a_letter_is_on_its_way(self, index: int, act: str) -> None:
        """A retry of the photo, or `rerender --all` resumed, commits while some sender (a worker,
        the sweep) holds the photo's next letter: taken back then, it would page for a photo no
        longer failed. Or its user deletes it then, past the sender's last look (SPEC 19): that
        letter may reach the queue, and the sweep removes it; or before the look, once the letter
        is the sender's: then it pages nobody."""
        photo_id = self.photos[index].photo_id
        if act == "retry":
            self.queue.during_send = (photo_id, lambda: self.an_operator_retries(index))
        elif act == "delete":
            self.queue.during_send = (photo_id, lambda: self._delete_in_send(photo_id))
        elif act == "delete before the look":
            LAST_LOOK.before = (photo_id, lambda: self._delete(photo_id))
        elif self.version > 1:
            self.queue.during_send = (photo_id, self.the_operator_resumes_the_backfill)

    def _delete_in_send(self, photo_id: uuid.UUID) -> None:
        self.deleted_in_send.add(photo_id)
        self._delete(photo_id)

    @rule()
    def an_operator_redrives(self) -> None:
        """`redrive`: the photos whose letters sit in the dead-letter queue retried, the letters removed."""
        self._redrive()

    def _redrive(self) -> None:
        operator.redrive(self.engine, self.queue, self.settings)  # type: ignore[arg-type]
        self.queue.received.clear()

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
        self.backfilling = self.version

    @precondition(lambda self: self.version > 1)
    @rule()
    def the_operator_resumes_the_backfill(self) -> None:
        """`rerender --all` again (after a stop, or while re-renders failed): marking resumes."""
        backfill.mark(
            self.engine, self.version, backfill.Selection(), lease_seconds=self.settings.stale_after_seconds
        )
        self.backfilling = self.version

    @rule()
    def the_operator_stops_the_backfill(self) -> None:
        backfill.stop(self.engine)
        self.backfilling = None

    def _deploy(self, settings: Settings) -> None:
        self.settings = settings
        self.service = PhotoService(self.engine, self.store, self.queue, settings)
        self.sweeper = self._sweeper(settings)

    def _sweeper(self, settings: Settings) -> Sweeper:
        """The sweep, reading the recording dead-letter queue for letters of deleted photos."""
        letters = DeadLetterQueue(self.queue, DEAD_LETTER_URL, bucket=settings.photo_bucket, stage=STAGE)  # type: ignore[arg-type]
        return Sweeper(
            self.engine, self.queue, settings, store=self.store, batch_size=2, dead_letters=letters
        )

    @precondition(lambda self: bool(self.deleted))
    @rule(pick=st.integers(0, 20), what=st.sampled_from(["upload", "message", "delete"]), fault=FAULTS)
    def something_arrives_for_a_deleted_photo(self, pick: int, what: str, fault: ErrorCode | None) -> None:
        """For a deleted photo: a late upload event (S3 delivers late, a phone retries its upload),
        a job message, or the user's deletion again (a double click, a retried request)."""
        gone = [p for p in self.everyone if p.photo_id in self.deleted]
        shot = gone[pick % len(gone)]
        if what == "delete":
            self._delete(shot.photo_id)
        else:
            self._deliver(shot, fault, upload=0x99 if what == "upload" else None)

    @rule(index=st.integers(0, PHOTOS - 1))
    def a_user_deletes_the_photo(self, index: int) -> None:
        """In whatever state it is: pending, its worker dead holding it, a retry due, failed with a
        letter owed, published; its messages stay in flight. The user uploads a new one in its place."""
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
        app_uploads.delete(
            self.engine, self._object_store(), self.settings, photo_id, caller=app_uploads.BACKEND
        )
        self.deleted.add(photo_id)
        if self.queue.during_send is not None and self.queue.during_send[0] == photo_id:
            self.queue.during_send = None  # no letter of it will be sent
        if LAST_LOOK.before is not None and LAST_LOOK.before[0] == photo_id:
            LAST_LOOK.before = None
        if any(p.photo_id == photo_id for p in self.photos):
            self._a_new_photo_in_place_of(photo_id)

    def _object_store(self) -> Any:
        return self.store

    def _objects_of(self, photo_id: uuid.UUID, album_id: uuid.UUID) -> list[str]:
        prefixes = tuple(photo_prefixes(STAGE, album_id, photo_id))
        return sorted(k for k in self.store.objects if k.startswith(prefixes))

    # --- what must always hold ---------------------------------------------------------

    def _letter_accepted(self, photo_id: uuid.UUID, code: ErrorCode) -> None:
        """Invariant 2, as each letter reaches the queue: its photo's job is failed, with that code
        (a letter sent for a photo taken back by a retry, a reopening or a backfill pages for a photo
        that is not failed)."""
        with self.engine.connect() as connection:
            job = connection.execute(
                select(PhotoJob.status, PhotoJob.last_error_code).where(PhotoJob.photo_id == photo_id)
            ).one_or_none()
        if job is None:
            # SPEC 19: a photo deleted before its sender's last look pages nobody; only one deleted
            # while the letter was being sent may reach the queue (the sweep then removes it).
            assert photo_id in self.deleted_in_send, "a dead letter for a photo deleted before it was sent"
            return
        assert (job.status, job.last_error_code) == ("failed", code.value), (
            f"a dead letter ({code.value}) for a photo whose job is {job.status} ({job.last_error_code})"
        )

    @invariant()
    def a_slow_original_is_never_the_files_fault(self) -> None:
        """SPEC 5: the model's originals render in milliseconds; only S3's time could exceed the render's
        limit, and that is never a permanent RENDER_TIME_EXCEEDED."""
        STEPS["run"] += 1
        with self.engine.connect() as connection:
            codes = set(connection.scalars(select(PhotoJob.last_error_code)))
            codes |= set(connection.scalars(select(Photo.error_code)))
        assert ErrorCode.RENDER_TIME_EXCEEDED.value not in codes, "a slow S3 body failed a photo for good"

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
            # One publication a picture: the first upload's, and one for each newer upload of a
            # published photo's original (a new picture, SPEC 19), never one for a repeated delivery.
            assert published <= len(self.announced.get(photo.id, set()) | {1})
            assert photo.entity_version == 1 + published + rerendered.get(photo.id, 0)
            assert not rerendered.get(photo.id) or published >= 1, "a re-render of an unpublished photo"
            assert (
                (photo.processing_state == "ready") == (published >= 1) == (photo.visibility == "published")
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
        # Ten rounds, and one more for each deleted photo: a sweep purges a batch of tombstones a run.
        for _ in range(10 + len(self.deleted)):
            self._a_round()
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
            assert ((photo_id, ErrorCode(code)) in dead) != (ErrorCode(code) in PERMANENT)
        with self.engine.connect() as connection:
            owed = connection.scalar(select(func.count()).where(PhotoJob.dead_letter_owed_at.is_not(None)))
        assert owed == 0, "a dead letter is still owed after the sweeps"
        # Invariant 4 and SPEC 14: a photo marked for a version (a backfill not stopped since) reaches
        # it, or its re-render failed: permanently (the file's fault, which pages nobody: SPEC 5), or
        # finally, paging as one with its letter still waiting in the queue (a redrive that removes
        # it takes the re-render up again). A backfill's failure is never silently dropped.
        if self.backfilling is not None:
            with self.engine.connect() as connection:
                behind = connection.execute(
                    select(Photo.id, PhotoJob.status, PhotoJob.last_error_code)
                    .join(PhotoJob, PhotoJob.photo_id == Photo.id, isouter=True)
                    .where(
                        Photo.processing_state == "ready",
                        func.coalesce(Photo.variant_version, 0) < self.backfilling,
                    )
                ).all()
            letters = self.letters_waiting()
            for photo_id, status, code in behind:
                permanent = code is not None and ErrorCode(code) in PERMANENT
                assert status == "failed" and (permanent or (photo_id, ErrorCode(str(code))) in letters), (
                    f"a photo marked for version {self.backfilling} stays behind with its job {status}"
                    f" ({code}) and no letter waiting"
                )
        # SPEC 19: no letter of a deleted photo is left in the dead-letter queue, and a published
        # photo whose last upload was processed shows the stored original's current upload.
        self._assert_no_letter_of_a_deleted_photo()
        with self.engine.connect() as connection:
            shown = dict(
                connection.execute(
                    select(Photo.original_key, Photo.original_etag)
                    .join(PhotoJob, PhotoJob.photo_id == Photo.id)
                    .where(Photo.processing_state == "ready", PhotoJob.status == "done")
                ).all()
            )
        for index, shot in enumerate(self.photos):
            if shot.key in shown:
                current = self._etag(self.uploads[index])
                assert shown[shot.key] == current, (
                    f"the published picture is upload {shown[shot.key]}, the original's is {current}"
                )
        # A deleted photo's variants, put by a render that raced its deletion, were purged.
        for shot in self.everyone:
            if shot.photo_id in self.deleted:
                assert self._objects_of(shot.photo_id, shot.album_id) == [], (
                    "a deleted photo's objects stayed"
                )

    def _assert_no_letter_of_a_deleted_photo(self) -> None:
        waiting = {photo_id for photo_id, _ in self.letters_waiting()}
        assert not waiting & self.deleted, "a deleted photo's letter stays in the dead-letter queue"

    def dead_letters(self) -> list[tuple[uuid.UUID, ErrorCode]]:
        """Every letter ever sent."""
        return self.queue.dead

    def letters_waiting(self) -> list[tuple[uuid.UUID, ErrorCode]]:
        """The letters the dead-letter queue holds now (a redrive removes those it takes up)."""
        return self.queue.letters()


@pytest.fixture
def skewed_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The render's deadline and the original's stream on the model's clock (a slow body moves it),
    the senders' last look behind LAST_LOOK; the steps run printed at the end (a failure's report
    shows it)."""
    monkeypatch.setattr(pipeline, "time", CLOCK)
    monkeypatch.setattr(storage, "time", CLOCK)
    monkeypatch.setattr(machine, "still_owed", LAST_LOOK.around(machine.still_owed))
    STEPS["run"] = 0
    started = time.monotonic()
    yield
    print(f"state machine: {STEPS['run']} checks run in {time.monotonic() - started:.0f} s")


@pytest.mark.slow
@pytest.mark.usefixtures("skewed_clock")
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
            self._put_original(shot)
        while messages := self.sqs.receive_message(
            QueueUrl=self.queues.dead_letter_url, MaxNumberOfMessages=10
        ).get("Messages", []):
            for message in messages:
                self.sqs.delete_message(
                    QueueUrl=self.queues.dead_letter_url, ReceiptHandle=message["ReceiptHandle"]
                )

    def _deliver(
        self, index: int | uploads.Upload, fault: ErrorCode | str | None, *, upload: int | None = None
    ) -> Outcome:
        shot = self.photos[index] if isinstance(index, int) else index
        if upload is not None:
            self.announced.setdefault(shot.photo_id, set()).add(upload)
        body = (
            json.dumps({"photoId": str(shot.photo_id)})
            if upload is None
            else notification(shot.key, upload, self._sequencer(index, upload))
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
    def _fault(self, shot: uploads.Upload, fault: ErrorCode | str | None) -> Iterator[list[float]]:
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

    def _etag(self, upload: int) -> str:
        return hashlib.md5(ORIGINAL, usedforsecurity=False).hexdigest()  # every upload writes ORIGINAL

    def _assert_no_letter_of_a_deleted_photo(self) -> None:
        """Not here: the model reads moto's dead-letter queue itself (hiding what it read), so the
        sweep's removal is the first machine's to check."""

    def _put_original(self, shot: uploads.Upload) -> None:
        uploads.put_original(self.s3, REAL_BUCKET, shot.key, ORIGINAL)

    def _deliver_body(self, body: str) -> Outcome:
        """A handed-on upload record, through the real handler. (The outage before it is the first
        machine's: the delivery with a database that refuses, its hand-on recorded.)"""
        self.sqs.send_message(QueueUrl=self.queues.url, MessageBody=body)
        (message,) = self.sqs.receive_message(
            QueueUrl=self.queues.url, MaxNumberOfMessages=1, AttributeNames=["All"]
        )["Messages"]
        answer = process.lambda_handler(sqs_event([message], self.queues.arn), LambdaContext())
        self.sqs.delete_message(QueueUrl=self.queues.url, ReceiptHandle=message["ReceiptHandle"])
        if answer["batchItemFailures"]:
            for request in from_sqs_body(body, bucket=REAL_BUCKET, stage=STAGE):
                self.queue.inflight.append(request.photo_id)
            return Outcome.RETRY
        return Outcome.PUBLISHED

    def _redrive(self) -> None:
        """The real redrive of the real dead-letter queue (the workers' letters), its job messages
        taken into the model's flight; then the sweep's letters, which the recording queue holds."""
        operator.redrive(self.engine, self.sqs, self.settings)
        while messages := self.sqs.receive_message(QueueUrl=self.queues.url, MaxNumberOfMessages=10).get(
            "Messages", []
        ):
            for message in messages:
                self.queue.inflight.append(uuid.UUID(json.loads(message["Body"])["photoId"]))
                self.sqs.delete_message(QueueUrl=self.queues.url, ReceiptHandle=message["ReceiptHandle"])
        super()._redrive()

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

    def letters_waiting(self) -> list[tuple[uuid.UUID, ErrorCode]]:
        return self._real_letters(self.queue.letters())

    def dead_letters(self) -> list[tuple[uuid.UUID, ErrorCode]]:
        return self._real_letters(self.queue.dead)

    def _real_letters(self, recorded: list[tuple[uuid.UUID, ErrorCode]]) -> list[tuple[uuid.UUID, ErrorCode]]:
        """The recorded letters (the sweep's: it is given the recording queue) and moto's."""
        dead = list(recorded)
        self._seen_letters = getattr(self, "_seen_letters", [])
        dead += self._seen_letters
        while messages := self.sqs.receive_message(
            QueueUrl=self.queues.dead_letter_url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=60,
            MessageAttributeNames=["All"],
        ).get("Messages", []):
            for message in messages:
                attributes = message["MessageAttributes"]
                letter = (
                    uuid.UUID(attributes["photoId"]["StringValue"]),
                    ErrorCode(attributes["errorCode"]["StringValue"]),
                )
                self._seen_letters.append(letter)  # invisible for a minute once read
                dead.append(letter)
        return dead


def notification(
    key: str, upload: int, sequencer: str, *, bucket: str = REAL_BUCKET, etag: str | None = None
) -> str:
    """The S3 event notification of the `upload`-th upload of `key` (its body as SQS carries it),
    with S3's sequencer and the eTag of the bytes every upload here writes (ORIGINAL's: the process
    function reads the upload its event names, by eTag in this unversioned bucket)."""
    record = json.loads(load_event("sqs_s3_notification")["Records"][0]["body"])["Records"][0]
    record["s3"]["bucket"]["name"] = bucket
    # Sent as it happens (a reopening compares the event's time with the failed attempt's start).
    record["eventTime"] = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    etag = etag or hashlib.md5(ORIGINAL, usedforsecurity=False).hexdigest()
    record["s3"]["object"] |= {"key": key, "sequencer": sequencer, "eTag": etag}
    return json.dumps({"Records": [record]})


@pytest.mark.slow
@pytest.mark.usefixtures("skewed_clock")
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
            RealHandlerMachine, settings=settings.get_profile("ci-handler" if PROFILE == "ci" else PROFILE)
        )
    finally:
        bootstrap.reset()
