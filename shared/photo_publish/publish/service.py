"""Processing one photo: claim, render, store, publish; every failure ends in a recorded state."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol, TypeGuard
from uuid import UUID

from sqlalchemy import Connection, Engine

from photo_publish.adapters.storage import UNNAMED, OriginalReplaced, Pin
from photo_publish.adapters.unit_of_work import unit_of_work
from photo_publish.budget import Remaining, forever
from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.events import PhotoRequest
from photo_publish.image import slots
from photo_publish.image.pipeline import Readable, RenderAlone, RenderOptions, render
from photo_publish.image.recipes import Recipe
from photo_publish.jobs import machine
from photo_publish.keys import variant_key
from photo_publish.observability import logger
from photo_publish.outbox.relay import Waiting
from photo_publish.publish import repository, transaction
from photo_publish.publish.failures import EventHandOff, Failures
from photo_publish.publish.outcomes import Outcome, Result, Steps
from photo_publish.publish.repository import Claimed, ClaimResult, Exhausted, Holding, NotClaimable, PhotoRow
from photo_publish.publish.transaction import PublishResult, Rendition, StoredVariant
from photo_publish.settings import Settings


def render_options(settings: Settings, budget: slots.DecodeBudget | None = None) -> RenderOptions:
    """The pipeline's options for a render beside the others, in a slot of `budget` (by default the
    settings' own for the function's nominal resident set; the service measures its own)."""
    return RenderOptions(
        thumb_size=settings.thumb_size,
        browse_size=settings.browse_size,
        quality=settings.webp_quality,
        effort=settings.webp_effort,
        variant_widths=settings.variant_widths,
        variant_formats=settings.variant_formats,
        avif_quality=settings.avif_quality,
        avif_effort=settings.avif_effort,
        max_input_pixels=settings.max_input_pixels,
        max_input_dimension=settings.max_input_dimension,
        max_input_row_bytes=settings.max_input_row_bytes,
        render_timeout_seconds=settings.render_timeout_seconds,
    ).sharing(budget or slots.decode_budget(settings))


class OriginalStream(Readable, Protocol):
    # What was read (SPEC 19): the object's ETag and version id, where the store names them.
    etag: str | None
    version: str | None

    def close(self) -> None: ...


class ObjectStore(Protocol):
    def open_original(self, key: str, max_bytes: int, pin: Pin | None = None) -> OriginalStream: ...
    def put_variant(self, key: str, data: bytes, content_type: str) -> None: ...


class JobQueue(Protocol):
    def retry_later(self, receipt_handle: str, seconds: float) -> None: ...
    def send_job(self, photo_id: UUID, delay_seconds: float = 0) -> None: ...
    def send(self, body: str, delay_seconds: float = 0) -> None: ...
    def send_dead_letter(
        self, photo_id: UUID, attempt: int, code: ErrorCode, detail: str = "", *, kind: str = "photo"
    ) -> bool: ...


@dataclass(frozen=True, slots=True)
class Work:
    """A claimed attempt: the photo, the attempt (the worker's fencing token), and the upload it
    reads pinned (None: what is there)."""

    photo: PhotoRow
    attempt: int
    pin: Pin | None


class RenderGate:
    """Records of a container work side by side, except one that must work alone.

    `alone()` waits until no record is inside and lets none in until it leaves; records waiting to
    go in alone go first. Two kinds of record go in alone: one whose last worker died (it may be what
    killed it), and one whose decoder needs more memory than a shared slot (it has first left the
    records it was among: a record never waits to be alone while it is inside, so two such records
    cannot wait for each other).
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._inside = 0
        self._alone = False
        self._waiting_alone = 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: not self._alone and not self._waiting_alone)
            self._inside += 1
        try:
            yield
        finally:
            with self._changed:
                self._inside -= 1
                self._changed.notify_all()

    @contextmanager
    def alone(self) -> Iterator[None]:
        with self._changed:
            self._waiting_alone += 1
            self._changed.wait_for(lambda: not self._alone and not self._inside)
            self._waiting_alone -= 1
            self._alone = True
        try:
            yield
        finally:
            with self._changed:
                self._alone = False
                self._changed.notify_all()


class PhotoService:
    def __init__(
        self,
        engine: Engine,
        store: ObjectStore,
        queue: JobQueue,
        settings: Settings,
        *,
        events: EventHandOff | None = None,
    ) -> None:
        """`events` hands each committed event to the bus at once; without it (no bus configured)
        the scheduled relay alone publishes them."""
        self._engine = engine
        self._store = store
        self._queue = queue
        self._settings = settings
        self._events = events
        # What a render may hold follows the function's memory, less what this process holds now
        # (its cold start: the interpreter, libvips, the clients): a shared slot, or the whole alone.
        budget = slots.decode_budget(settings, slots.resident_bytes())
        logger.info(
            "decode budget", slot_bytes=budget.slot, whole_bytes=budget.whole, source=budget.describe()
        )
        self._options = render_options(settings, budget)
        self._alone = self._options.alone()
        self._gate = RenderGate()
        # Renders at once, whatever the records in flight (the others wait here holding nothing but
        # their original's open stream): as many as asked, or as the memory holds, if fewer.
        self._renders = threading.BoundedSemaphore(budget.renders)
        # A record's variants are put at once: one in its own thread, the others here.
        self._puts = ThreadPoolExecutor(settings.record_concurrency, thread_name_prefix="put")
        self._recipe_checked = False
        self._failures = Failures(engine, queue, settings, events)

    def ensure_recipe(self) -> None:
        """Record this function's recipe for its VARIANT_VERSION, or raise RecipeMismatch if the
        version was recorded as another recipe (SPEC 14); once per container once it succeeds."""
        if not self._recipe_checked:
            settings = self._settings
            with unit_of_work(self._engine) as connection:
                repository.ensure_recipe(connection, settings.variant_version, Recipe.from_settings(settings))
            self._recipe_checked = True

    def process(
        self, request: PhotoRequest, *, receive_count: int = 1, remaining: Remaining = forever
    ) -> Result:
        """Work on one photo; the result says whether its message is done or must come back."""
        try:
            self._budget(remaining, self._settings.record_budget_seconds)
            return self._process(request, remaining)
        except PhotoError as error:
            # Failed before any attempt was claimed: the message's receive count is all that counts.
            return self._failures.before_claim(request.photo_id, error, receive_count)

    def _process(self, request: PhotoRequest, remaining: Remaining) -> Result:
        started = time.perf_counter()
        # Before anything is rendered: never other bytes under an existing version's keys.
        self.ensure_recipe()
        # Found and claimed among the other records: no claim is taken while one renders alone.
        with self._gate.shared():
            found = self._find(request)
            if isinstance(found, PhotoRow) and not found.worker_lost:
                found = self._claim(found, request)
            if isinstance(found, Result):
                return found
            if isinstance(found, Work):
                try:
                    return self._attempt(found, remaining, started, alone=False)
                except RenderAlone as over:
                    # Its header says more than a shared slot: it leaves the records it is among,
                    # keeping its claim, and renders once none is left (SPEC 3: only what no slot
                    # of this function could hold is refused).
                    logger.info("rendering alone", decode_bytes=over.needs, slot_bytes=over.slot)
        # A photo whose last worker died may be what killed it (a decoder's crash ends the whole
        # container): it is claimed and rendered alone, so that if it crashes again no neighbour of
        # its batch dies holding an attempt of its own (tests/integration/test_worker_crash.py).
        with self._gate.alone():
            work = found if isinstance(found, Work) else self._claim(found, request)
            if isinstance(work, Result):
                return work
            return self._attempt(work, remaining, started, alone=True)

    def _find(self, request: PhotoRequest) -> Work | PhotoRow | Result:
        """The photo and, in the same transaction, the attempt this delivery claims when it is one to
        render among the others; else the photo to claim (alone, or as a new picture), or the answer
        when there is nothing to render (before any claim or S3 read)."""
        settings = self._settings
        with unit_of_work(self._engine) as connection:
            photo = repository.get_photo(
                connection, request.photo_id, stale_after=settings.stale_after_seconds
            )
            claim = self._claim_in(connection, photo, request) if self._claimable(photo, request) else None
        if photo is None:
            return self._missing(request)
        logger.thread_safe_append_keys(photo_id=str(photo.id), album_id=str(photo.album_id))
        if not self._claimable(photo, request):
            return self._unclaimable(photo, request)
        return self._claimed(photo, request, claim)

    def _claimable(self, photo: PhotoRow | None, request: PhotoRequest) -> TypeGuard[PhotoRow]:
        """Claimed as it is read: the event's original is the photo's, a render is owed (it is not
        published, or a backfill's mark or a new picture is due), and its last worker is not lost."""
        return (
            photo is not None
            and not photo.worker_lost
            and (request.original is None or request.original.key == photo.original_key)
            and not self._owed_nothing(photo)
        )

    def _owed_nothing(self, photo: PhotoRow) -> bool:
        """Published, with nothing owed: no backfill's mark below this recipe, no new picture."""
        return photo.processing_state == "ready" and not self._rerender(photo) and not photo.picture_owed

    def _missing(self, request: PhotoRequest) -> Result:
        """No such photo: deleted (its upload arrived after the deletion), or not registered yet."""
        if request.original is not None:
            with unit_of_work(self._engine) as connection:
                deleted = repository.uploaded_after_deletion(
                    connection, request.photo_id, self._settings.purge_delay
                )
            if not deleted:
                # The upload raced the API's insert of the photo row: it may exist soon.
                raise PhotoError(ErrorCode.PHOTO_NOT_FOUND, request.original.key)
        return Result(Outcome.SKIPPED, request.photo_id)

    def _unclaimable(self, photo: PhotoRow, request: PhotoRequest) -> PhotoRow | Result:
        """A photo not claimed as it was read: the photo to claim (its last worker died, or a new
        upload of a published photo's original reopened its job), or the answer."""
        if request.original is not None and request.original.key != photo.original_key:
            logger.warning("event key is not the photo's original", key=request.original.key)
            return Result(Outcome.IGNORED, photo.id)
        if self._owed_nothing(photo) and not self._new_picture(photo, request):
            if request.upload is not None and photo.job_status == "failed":
                # Its re-render failed for good and the letter may be on its way: the upload reopens
                # the job once no sender holds it (the record comes back for that), as for any
                # failed photo; meanwhile an owed letter is sent.
                owed = self._failures.owed_letter(photo.id)
                if owed.outcome is Outcome.RETRY:
                    return owed
            # Nothing is owed for the published photo: its pending job is done.
            with unit_of_work(self._engine) as connection:
                machine.settle_published(connection, photo.id)
            return Result(Outcome.ALREADY, photo.id)
        return photo

    def _attempt(self, work: Work, remaining: Remaining, started: float, *, alone: bool) -> Result:
        """Render and publish the claimed attempt; a failure is recorded, RenderAlone passed on."""
        photo, attempt, pin = work.photo, work.attempt, work.pin
        try:
            return self._render_and_publish(
                photo, attempt, pin, remaining, time.perf_counter() - started, alone=alone
            )
        except RenderAlone:
            raise
        except OriginalReplaced as replaced:
            return self._replaced(photo, attempt, pin, str(replaced))
        except PhotoError as error:
            return self._failures.attempt_failed(photo.id, attempt, error)
        except Exception as error:
            logger.exception("unexpected error")
            return self._failures.attempt_failed(
                photo.id, attempt, PhotoError(ErrorCode.UNEXPECTED_ERROR, repr(error))
            )

    def _new_picture(self, photo: PhotoRow, request: PhotoRequest) -> bool:
        """The event announces an upload newer than, and other than, the published picture's
        original (a form posted again, SPEC 19): the job is reopened, and the upload processed as
        the newest, a new picture. A duplicate or an older upload's event is not."""
        if request.upload is None:
            return False
        with unit_of_work(self._engine) as connection:
            reopened = repository.ensure_job(
                connection,
                photo.id,
                upload=request.upload,
                lease_seconds=self._settings.stale_after_seconds,
                exists=photo.job_status is not None,
            )
        if reopened:
            logger.info("published photo's original written again: a new picture")
        return reopened

    def _replaced(self, photo: PhotoRow, attempt: int, pin: Pin | None, code: str) -> Result:
        """The upload the attempt pinned was written over (S3 answered `code`): not a failure. The job
        goes back to pending for the newer write, whose own event follows (and the sweep's message,
        which reads the current object, if it does not)."""
        logger.info(
            "original written over since its upload",
            code=code,
            etag=None if pin is None else pin.etag,
            version=None if pin is None else pin.version,
        )
        with unit_of_work(self._engine) as connection:
            machine.step_aside(connection, photo.id, attempt)
        return Result(Outcome.REPLACED, photo.id, attempt=attempt)

    def _rerender(self, photo: PhotoRow) -> bool:
        """A published photo a backfill marked, whose variants are on an older recipe than this
        function's (one published meanwhile at this version is left alone)."""
        version = self._settings.variant_version
        return photo.rerender_to is not None and (photo.variant_version or 0) < version

    def _claim(self, photo: PhotoRow, request: PhotoRequest) -> Work | Result:
        """The attempt this delivery now owns (its fencing token), in a transaction of its own."""
        with unit_of_work(self._engine) as connection:
            claim = self._claim_in(connection, photo, request)
        return self._claimed(photo, request, claim)

    def _claim_in(self, connection: Connection, photo: PhotoRow, request: PhotoRequest) -> ClaimResult:
        """The photo's job, told of the request's upload, claimed: in the caller's transaction."""
        settings = self._settings
        repository.ensure_job(
            connection,
            photo.id,
            upload=request.upload,
            lease_seconds=settings.stale_after_seconds,
            exists=photo.job_status is not None,
        )
        return repository.claim(
            connection, photo.id, stale_after=settings.stale_after_seconds, max_attempts=settings.max_attempts
        )

    def _claimed(self, photo: PhotoRow, request: PhotoRequest, claim: ClaimResult) -> Work | Result:
        """The claim's answer, once committed: the work this delivery now owns, or why it owns none."""
        match claim:
            case Claimed(attempt=attempt, pin=pin):
                logger.thread_safe_append_keys(attempt=attempt)
                # An upload's delivery reads the upload the attempt works from, pinned (SPEC 19): the
                # newest the job has seen, its own or one newer. A job message reads what is there.
                return Work(photo, attempt, pin if request.upload is not None else None)
            case NotClaimable(status="failed"):
                return self._failures.owed_letter(photo.id)
            case NotClaimable(retry_in=None):
                return Result(Outcome.DUPLICATE, photo.id)
            case NotClaimable(retry_in=retry_in):
                return Result(Outcome.RETRY, photo.id, retry_in=retry_in)
            case Exhausted(attempt=attempt):
                return self._worker_lost(photo, request, attempt)
        return Result(Outcome.SKIPPED, photo.id)

    def _worker_lost(self, photo: PhotoRow, request: PhotoRequest, attempt: int) -> Work | Result:
        """The job's last attempt lay with a dead worker: it fails for good (WORKER_LOST, a page).

        The record may carry an upload newer than the attempts lost (a new file arrived while the
        worker lay dead): now that the job is failed, that upload reopens it as it reopens any
        failed one, or the record comes back while the loss's letter is held; else the new file
        would never be processed. The same upload reopens nothing (answered as a duplicate)."""
        lost = self._failures.final_failure(photo.id, attempt, PhotoError(ErrorCode.WORKER_LOST))
        if request.upload is None:
            return lost
        again = self._claim(photo, request)
        return lost if isinstance(again, Result) and again.outcome is Outcome.DUPLICATE else again

    def _render_and_publish(
        self,
        photo: PhotoRow,
        attempt: int,
        pin: Pin | None,
        remaining: Remaining,
        claim_seconds: float,
        *,
        alone: bool,
    ) -> Result:
        settings = self._settings
        started = time.perf_counter()
        # Opened before a render slot is free: S3's first byte arrives while other records render.
        stream = (
            self._store.open_original(photo.original_key, settings.max_original_bytes, pin)
            if pin is not None
            else self._store.open_original(photo.original_key, settings.max_original_bytes)
        )
        # What these bytes are (SPEC 19): as S3 named them, else as the pin did.
        named = pin or UNNAMED
        read = Pin(stream.etag or named.etag, stream.version or named.version)
        try:
            opened = time.perf_counter()
            with self._renders:
                slotted = time.perf_counter()
                # libvips is stopped inside its evaluation if the invocation's time runs out first
                # (TIME_BUDGET_EXCEEDED), or the render's own limit does (RENDER_TIME_EXCEEDED).
                rendered = render(
                    stream,
                    self._alone if alone else self._options,
                    time_budget=remaining() - settings.commit_budget_seconds,
                    location=photo.keep_location,
                )
        finally:
            stream.close()
        rendered_at = time.perf_counter()
        if rendered.capture_problem is not None:
            # The photo publishes all the same, without what its EXIF did not say clearly.
            logger.warning("capture metadata left empty", problem=rendered.capture_problem)

        with unit_of_work(self._engine) as connection:
            holding = repository.holds(connection, photo.id, attempt, settings.variant_version, read)
        if holding is None:
            # Taken over: its variants are not this worker's to write.
            return Result(Outcome.SUPERSEDED, photo.id, attempt=attempt)
        if holding.commit == "nothing":
            # The published picture is the one read, at this recipe: its objects are never rewritten;
            # the claimed attempt's job is done, nothing written.
            with unit_of_work(self._engine) as connection:
                machine.publish(connection, photo.id, attempt)
            return Result(Outcome.ALREADY, photo.id, attempt=attempt)
        self._budget(remaining, settings.commit_budget_seconds)
        stored = [
            StoredVariant(
                variant.kind,
                variant_key(
                    settings.stage,
                    photo.album_id,
                    photo.id,
                    version=settings.variant_version,
                    kind=variant.same_as or variant.kind,
                    ext=variant.extension,
                    picture=holding.tag,
                ),
                variant.width,
                variant.height,
                len(variant.data),
                variant.content_type,
            )
            for variant in rendered.variants
        ]
        # A variant that is another's object (the ladder's step at the browse's size) is put once.
        self._put_variants(
            [
                (put.key, variant.data, put.content_type)
                for put, variant in zip(stored, rendered.variants, strict=True)
                if variant.same_as is None
            ]
        )

        self._budget(remaining, settings.commit_budget_seconds)
        stored_at = time.perf_counter()
        rendition = Rendition(
            rendered.width,
            rendered.height,
            stored,
            settings.variant_version,
            rendered.placeholder,
            rendered.capture,
            original=read,
        )
        published, leased = self._commit(photo.id, attempt, rendition, holding)
        waited = slotted - opened
        steps = Steps(
            claim_seconds,
            rendered_at - started - waited,
            stored_at - rendered_at,
            time.perf_counter() - stored_at,
            waited,
        )
        # Its event on the bus right after the commit (SPEC 12), where the commit leased it.
        handoff = None if self._events is None or leased is None else self._events.hand_off(photo.id, leased)
        return Result(
            Outcome(published.outcome),
            photo.id,
            attempt=attempt,
            steps=steps,
            variant_bytes=sum({v.key: v.size for v in stored}.values()),
            handoff=handoff,
        )

    def _commit(
        self, photo_id: UUID, attempt: int, rendition: Rendition, holding: Holding
    ) -> tuple[PublishResult, list[Waiting] | None]:
        """The render's one transaction: a photo's first picture published; a published photo
        re-rendered, or given its new picture (its variants replaced). With it, where an event was
        written and a bus is configured, the photo's event leased for the hand-off after it."""
        with unit_of_work(self._engine) as connection:
            if holding.commit == "publish":
                published = transaction.publish(connection, photo_id, attempt, rendition)
            else:
                published = transaction.replace_variants(
                    connection,
                    photo_id,
                    attempt,
                    rendition,
                    retire_after=timedelta(seconds=self._settings.variant_grace_seconds),
                    new_picture=holding.commit == "picture",
                )
            wrote_event = published.outcome in ("published", "rerendered")
            leased = (
                self._events.lease(connection, photo_id) if self._events is not None and wrote_event else None
            )
        return published, leased

    def _put_variants(self, puts: Sequence[tuple[str, bytes, str]]) -> None:
        """Every variant at once; returns once each put has finished, raising the first failure (in
        the variants' order, as when they were put one after the other) only then."""
        first, *others = puts
        pending = [self._puts.submit(self._store.put_variant, *put) for put in others]
        failures: list[BaseException] = []
        try:
            self._store.put_variant(*first)
        except Exception as error:
            failures.append(error)
        failures += [failed for put in pending if (failed := put.exception()) is not None]
        if failures:
            raise failures[0]

    @staticmethod
    def _budget(remaining: Remaining, needed: float) -> None:
        if remaining() < needed:
            raise PhotoError(ErrorCode.TIME_BUDGET_EXCEEDED, f"less than {needed:.0f}s left")
