"""The sweep (SPEC 7): re-send work whose message was lost, and fail jobs whose worker died.

It is a safety net, not a second retry path: a pending row is due only after it waited
SWEEP_AFTER_SECONDS past its own due time, so the queue's retry of a row always comes first.
Rows are taken with FOR UPDATE SKIP LOCKED and stamped (enqueued_at) in the same statement, so two
sweeps at once never send the same row twice. Each step commits on its own and answers for its own
rows: a step that fails is logged and counted, and never discards what another step stamped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol, TypeVar
from uuid import UUID

from sqlalchemy import Engine, and_, delete, exists, func, or_, select, update

from photo_publish.adapters.queue import DeadLetter
from photo_publish.adapters.tables import deleted_photos, outbox_events, photo_jobs, photos, retired_variants
from photo_publish.adapters.unit_of_work import unit_of_work
from photo_publish.budget import Remaining, forever
from photo_publish.errors import ErrorCode
from photo_publish.jobs import invalidations, machine
from photo_publish.jobs.machine import OwedLetter, UnknownCode
from photo_publish.keys import photo_prefixes
from photo_publish.observability import logger
from photo_publish.outbox import writer
from photo_publish.settings import Settings

T = TypeVar("T")

# A purge's first batch, before its pace is known: a deleted photo costs a listing and a deletion
# per prefix (4 S3 calls; 0.3 s at 70 ms a call), so 10 take a few seconds at worst.
PURGE_FIRST_BATCH = 10
# The dead-letter queue is read ten letters a call, this many calls a run at most.
LETTER_RECEIVES = 10
# How long letters read by the sweep stay hidden if the run dies before it releases them.
LETTER_VISIBILITY_SECONDS = 30


class SweepQueue(Protocol):
    def depth(self) -> int | None: ...
    def send_jobs(self, photo_ids: Sequence[UUID], *, spread_seconds: float = 0) -> list[UUID]: ...
    def send_dead_letter(
        self, photo_id: UUID, attempt: int, code: ErrorCode, detail: str = "", *, kind: str = "photo"
    ) -> bool: ...


@dataclass
class SweepSummary:
    resent_pending: int = 0
    resent_stale: int = 0
    worker_lost: int = 0
    dead_letters_sent: int = 0
    send_failed: int = 0
    backfill_sent: int = 0
    backfill_left: int = 0
    retired_deleted: int = 0
    # Deleted photos whose objects were purged once more (a render may have raced the deletion).
    deleted_purged: int = 0
    # Deleted photos' CDN paths CloudFront accepted, and those it refused (left for a later run).
    invalidated: int = 0
    invalidation_failed: int = 0
    # Letters not sent because their photo was deleted (or its failure taken back) meanwhile.
    letters_withdrawn: int = 0
    # Letters of deleted photos removed from the dead-letter queue.
    letters_removed: int = 0
    # Rows or steps that could not be handled this run (logged): a bad row never stops the run.
    errors: int = 0
    # The queue held a backlog: due pending rows were left to it.
    backlog: bool = False
    batches: int = 0
    out_of_time: bool = False

    def as_dict(self) -> dict[str, int | bool]:
        return {
            "resentPending": self.resent_pending,
            "resentStale": self.resent_stale,
            "workerLost": self.worker_lost,
            "deadLettersSent": self.dead_letters_sent,
            "sendFailed": self.send_failed,
            "backfillSent": self.backfill_sent,
            "backfillLeft": self.backfill_left,
            "retiredDeleted": self.retired_deleted,
            "deletedPurged": self.deleted_purged,
            "invalidated": self.invalidated,
            "invalidationFailed": self.invalidation_failed,
            "lettersWithdrawn": self.letters_withdrawn,
            "lettersRemoved": self.letters_removed,
            "errors": self.errors,
            "backlog": self.backlog,
            "batches": self.batches,
            "outOfTime": self.out_of_time,
        }


class VariantStore(Protocol):
    def delete_variants(self, keys: Sequence[str]) -> list[str]: ...
    def delete_under(self, prefixes: Sequence[str]) -> bool: ...


class DeadLetterReader(Protocol):
    def receive_letters(self, visibility_seconds: int) -> list[DeadLetter]: ...
    def remove_letters(self, letters: Sequence[DeadLetter]) -> int: ...
    def show_letters(self, letters: Sequence[DeadLetter]) -> None: ...


@dataclass
class Clock:
    """A run's time: what Lambda says is left, less the reserve kept to finish and report."""

    remaining: Remaining
    reserve_seconds: float
    summary: SweepSummary

    def left(self) -> float:
        return self.remaining() - self.reserve_seconds

    def batches(self, first: int, most: int, batch: Callable[[int], int]) -> None:
        """`batch(limit)` (the number of rows it took, each batch committed by it) until one takes
        fewer than its limit or the time is spent: the first batch takes `first`, each later one as
        many as the pace measured so far fits in half the time left, `most` at most. So a batch
        ends well inside the time, however slow the calls it makes."""
        seconds_each: float | None = None
        while True:
            left = self.left()
            if seconds_each is None:
                limit = first
            else:  # a run with no deadline (the operator's, a test's) has an infinite share to fit
                limit = most if math.isinf(left) else min(most, int(left / 2 / seconds_each))
            if left <= 0 or limit < 1:
                self.summary.out_of_time = True
                return
            started = time.monotonic()
            taken = batch(limit)
            if taken:
                seconds_each = (time.monotonic() - started) / taken
            if taken < limit:
                return


class Sweeper:
    def __init__(
        self,
        engine: Engine,
        queue: SweepQueue,
        settings: Settings,
        *,
        store: VariantStore,
        dead_letters: DeadLetterReader | None = None,
        batch_size: int = 500,
        cdn: invalidations.Invalidator | None = None,
    ) -> None:
        """`dead_letters`: the dead-letter queue, from which the letters of deleted photos are
        removed (none: left to the operator's redrive)."""
        self._engine = engine
        self._queue = queue
        self._settings = settings
        self._store = store
        self._dlq = dead_letters
        self._batch_size = batch_size
        self._cdn = cdn

    def run(self, remaining: Remaining = forever, *, reserve_seconds: float = 10.0) -> SweepSummary:
        """Sweep in bounded batches until nothing is due or the time budget is spent."""
        summary = SweepSummary()
        # A backlog in the queue may still hold the pending rows' own messages, however long they
        # have waited: the sweep leaves them to it (SPEC 7) rather than send every waiting photo
        # again each SWEEP_AFTER_SECONDS. An unknown depth is no reason to leave lost work lost.
        depth = self._queue.depth()
        backlog = depth is not None and depth >= self._settings.sweep_max_backlog
        summary.backlog = bool(backlog)
        while True:
            if remaining() < reserve_seconds:
                summary.out_of_time = True
                break
            # Each step's rows are committed by that step and sent below, whatever a later step does.
            pending = [] if backlog else self._step(summary, "stamp due", self._take_due_pending) or []
            stale = self._step(summary, "requeue lost", self._requeue_lost) or []
            lost = self._step(summary, "fail lost", self._fail_lost) or []
            owed = self._step(summary, "lease letters", lambda: self._lease_letters(summary)) or []
            # Every send below is answered, never raised: one refused send must not keep the rest
            # of the stamped rows waiting for another SWEEP_AFTER_SECONDS.
            letters_unsent = self._send_dead_letters(summary, lost + owed)
            unsent = self._send(summary, pending + stale)
            summary.batches += 1
            summary.resent_pending += len(pending) - len(set(unsent) & set(pending))
            summary.resent_stale += len(stale) - len(set(unsent) & set(stale))
            summary.worker_lost += len(lost)
            summary.send_failed += len(unsent) + letters_unsent
            if max(len(pending), len(stale), len(lost), len(owed)) < self._batch_size:
                break
        # The backfill and the tidying come after the lost work, each only with time to spare and in
        # batches it commits as it goes: a run that ends mid-way keeps what it did, and the next run
        # goes on from there (an album erasure of thousands of photos is purged over several runs).
        clock = Clock(remaining, reserve_seconds, summary)
        if clock.left() > 0:
            summary.backfill_sent = (
                self._step(summary, "backfill", lambda: self._drive_backfill(summary, depth)) or 0
            )
            summary.backfill_left = self._step(summary, "backfill left", self._backfill_left) or 0
        self._step(summary, "retired", lambda: self._delete_retired(clock))
        self._step(summary, "purge deleted", lambda: self._purge_deleted(clock))
        self._step(summary, "remove letters", lambda: self._remove_deleted_letters(clock))
        if clock.left() > 0:
            self._step(summary, "invalidate cdn", lambda: self._invalidate_cdn(summary))
        return summary

    @staticmethod
    def _step(summary: SweepSummary, name: str, step: Callable[[], T]) -> T | None:
        """One step of a run; None if it failed (its own transaction rolled back), logged and counted."""
        try:
            return step()
        except Exception:
            logger.exception("sweep step failed", step=name)
            summary.errors += 1
            return None

    def _drive_backfill(self, summary: SweepSummary, depth: int | None) -> int:
        """Send a bounded number of a backfill's marked photos, only while the process queue is short.

        A marked job (a published photo's, `rerender_to` set) becomes an ordinary pending job,
        stamped as sent: from then on retries, lost messages and lost workers are handled as for any
        upload. New uploads wait behind BACKFILL_MAX_QUEUE_DEPTH messages at most.
        """
        settings = self._settings
        if depth is None or depth >= settings.backfill_max_queue_depth:
            logger.info("backfill waits for a shorter queue", depth=depth)
            return 0
        with unit_of_work(self._engine) as connection:
            taken = machine.start_rerender(connection, limit=settings.backfill_batch_size)
        # Spread over the time to the next run: new uploads queue behind a trickle, never a batch.
        unsent = self._send(summary, taken, spread_seconds=settings.backfill_spread_seconds)
        return len(taken) - len(unsent)

    def _backfill_left(self) -> int:
        with unit_of_work(self._engine) as connection:
            left = connection.scalar(select(func.count()).select_from(photo_jobs).where(machine.MARKED))
        return int(left or 0)

    def _lease(self) -> timedelta:
        """Rows a tidying batch works on are leased this long: longer than any run (the function's
        timeout), so no other run takes them meanwhile; a run killed mid-batch leaves them to a run
        after the lease."""
        return timedelta(seconds=self._settings.stale_after_seconds)

    def _delete_retired(self, clock: Clock) -> None:
        """Replaced versions' objects whose grace period has passed, since the replacing commit and
        since its photo.variants_updated event left the outbox: consumers learn the new keys before
        the old ones go, however long the relay was down. In leased batches, S3 called between them."""
        clock.batches(
            self._batch_size, self._batch_size, lambda limit: self._delete_retired_batch(clock, limit)
        )

    def _delete_retired_batch(self, clock: Clock, limit: int) -> int:
        grace = timedelta(seconds=self._settings.variant_grace_seconds)
        told = ~exists().where(
            outbox_events.c.id == retired_variants.c.event_id,
            or_(outbox_events.c.published_at.is_(None), outbox_events.c.published_at > func.now() - grace),
        )
        due = (
            select(retired_variants.c.storage_key)
            .where(and_(retired_variants.c.delete_after < func.now(), told))
            .order_by(retired_variants.c.delete_after)
            .limit(limit)
            .with_for_update(skip_locked=True)
            .cte("due")
        )
        with unit_of_work(self._engine) as connection:
            keys = list(
                connection.scalars(
                    update(retired_variants)
                    .where(retired_variants.c.storage_key == due.c.storage_key)
                    .values(delete_after=func.now() + self._lease())
                    .returning(retired_variants.c.storage_key)
                )
            )
        # No transaction open: S3 may take its time. Keys it could not delete wait out their lease.
        deleted = self._store.delete_variants(keys) if keys else []
        if deleted:
            with unit_of_work(self._engine) as connection:
                connection.execute(
                    delete(retired_variants).where(retired_variants.c.storage_key.in_(deleted))
                )
        clock.summary.retired_deleted += len(deleted)
        return len(keys)

    def _purge_deleted(self, clock: Clock) -> None:
        """Delete, once more, the objects of photos deleted longer ago than any worker can hold one
        (a render that raced the deletion may have put variants after it), in leased batches sized
        to the time left; tombstones past their retention go."""
        clock.batches(PURGE_FIRST_BATCH, self._batch_size, lambda limit: self._purge_batch(clock, limit))
        retention = timedelta(days=self._settings.tombstone_retention_days)
        with unit_of_work(self._engine) as connection:
            connection.execute(
                delete(deleted_photos).where(deleted_photos.c.purged_at < func.now() - retention)
            )

    def _purge_batch(self, clock: Clock, limit: int) -> int:
        due = (
            select(deleted_photos.c.photo_id)
            .where(deleted_photos.c.purged_at.is_(None), deleted_photos.c.purge_after < func.now())
            .order_by(deleted_photos.c.purge_after)
            .limit(limit)
            .with_for_update(skip_locked=True)
            .cte("due")
        )
        with unit_of_work(self._engine) as connection:
            leased = connection.execute(
                update(deleted_photos)
                .where(deleted_photos.c.photo_id == due.c.photo_id)
                .values(purge_after=func.now() + self._lease())
                .returning(deleted_photos.c.photo_id, deleted_photos.c.album_id)
            ).all()
        # No transaction open: S3 may take its time. A photo not purged whole, or not reached before
        # the time ran out (a call can be far slower than the pace measured), waits out its lease.
        stage = self._settings.stage
        purged = []
        for row in leased:
            if clock.left() <= 0:
                clock.summary.out_of_time = True
                break
            if self._store.delete_under(photo_prefixes(stage, row.album_id, row.photo_id)):
                purged.append(row.photo_id)
        if purged:
            with unit_of_work(self._engine) as connection:
                connection.execute(
                    update(deleted_photos)
                    .where(deleted_photos.c.photo_id.in_(purged))
                    .values(purged_at=func.now())
                )
        clock.summary.deleted_purged += len(purged)
        return len(leased)

    def _remove_deleted_letters(self, clock: Clock) -> None:
        """Letters of deleted photos leave the dead-letter queue (SPEC 19: they page for nothing):
        one whose photo was deleted after it paged, or that was on its way as the deletion
        committed. A few calls a run; the other letters are made visible again at once."""
        if self._dlq is None:
            return
        kept: list[DeadLetter] = []
        try:
            for _ in range(LETTER_RECEIVES):
                if clock.left() <= 0:
                    clock.summary.out_of_time = True
                    break
                letters = self._dlq.receive_letters(LETTER_VISIBILITY_SECONDS)
                if not letters:
                    break
                named = {letter.photo_id for letter in letters if letter.photo_id is not None}
                with unit_of_work(self._engine) as connection:
                    # A tombstone and no row: deleted (a letter naming no photo is a person's to read).
                    gone = set(
                        connection.scalars(
                            select(deleted_photos.c.photo_id).where(
                                deleted_photos.c.photo_id.in_(named),
                                ~exists().where(photos.c.id == deleted_photos.c.photo_id),
                            )
                        )
                    )
                kept += [letter for letter in letters if letter.photo_id not in gone]
                removed = [letter for letter in letters if letter.photo_id in gone]
                if removed:
                    clock.summary.letters_removed += self._dlq.remove_letters(removed)
                    logger.info("dead letters of deleted photos removed", count=len(removed))
        finally:
            if kept:
                self._dlq.show_letters(kept)

    def _invalidate_cdn(self, summary: SweepSummary) -> None:
        """Send the CDN paths deletions left (their own call refused, never made, or waiting for the
        purge): one call a run, since CloudFront holds at most 15 wildcard paths in progress."""
        if self._cdn is None:
            # The template tells the sweep the distribution whenever there is one: without it there
            # is no CDN, and what a deletion recorded (deleters record whatever they know) goes.
            invalidations.discard_invalidations(self._engine)
            return
        sent = invalidations.send_invalidations(self._engine, self._cdn)
        summary.invalidated += sent.invalidated
        summary.invalidation_failed += sent.failed
        if sent.invalidated or sent.failed:
            logger.info("cdn paths sent", invalidated=sent.invalidated, refused=sent.failed)

    def _take_due_pending(self) -> list[UUID]:
        """Stamp and return pending rows that waited SWEEP_AFTER_SECONDS past their due time."""
        with unit_of_work(self._engine) as connection:
            return machine.stamp_due(
                connection, wait=timedelta(seconds=self._settings.sweep_after_seconds), limit=self._batch_size
            )

    def _requeue_lost(self) -> list[UUID]:
        """Stale active rows with attempts left: back to pending, stamped."""
        settings = self._settings
        with unit_of_work(self._engine) as connection:
            return machine.requeue_lost(
                connection,
                stale_after=settings.stale_after_seconds,
                max_attempts=settings.max_attempts,
                limit=self._batch_size,
            )

    def _fail_lost(self) -> list[OwedLetter]:
        """Stale active rows with none left: failed with WORKER_LOST, each photo's photo.failed event
        in the same transaction, and their letters this run's to send."""
        settings = self._settings
        with unit_of_work(self._engine) as connection:
            letters, marked = machine.fail_lost(
                connection,
                stale_after=settings.stale_after_seconds,
                max_attempts=settings.max_attempts,
                limit=self._batch_size,
            )
            writer.append_failed(connection, marked)
        return letters

    def _lease_letters(self, summary: SweepSummary) -> list[OwedLetter]:
        """Final failures whose dead letter was never accepted, leased to this run (SPEC 5).

        Only letters owed for longer than STALE_AFTER_SECONDS: by then the worker that marked the
        failure has surely finished sending (or died), so a letter is sent twice only after a death.
        """
        with unit_of_work(self._engine) as connection:
            leased = machine.lease_letters(
                connection, lease_seconds=self._settings.stale_after_seconds, limit=self._batch_size
            )
        for unknown in (row for row in leased if isinstance(row, UnknownCode)):
            # A newer deploy's code: that deploy's sweep sends it. Not this run's to guess.
            summary.errors += 1
            logger.error(
                "owed dead letter with an unknown code", photo_id=str(unknown.photo_id), code=unknown.code
            )
        return [row for row in leased if isinstance(row, OwedLetter)]

    def _send_dead_letters(self, summary: SweepSummary, letters: list[OwedLetter]) -> int:
        """Send each letter; the accepted ones are owed no more. The number not accepted (still owed,
        taken again once their lease has passed)."""
        sent: list[OwedLetter] = []
        refused: list[OwedLetter] = []
        # A last look, committed before the sends: a photo deleted since its letter was leased pages
        # nobody (its letter went with its job's row).
        standing = self._step(summary, "letters still owed", lambda: self._still_owed(letters))
        if standing is None:
            # Not known: sent all the same (a letter too many is removed later; one lost pages nobody).
            standing = letters
        summary.letters_withdrawn += len(letters) - len(standing)
        for letter in standing:
            accepted = self._queue.send_dead_letter(
                letter.photo_id, letter.attempt, letter.code, "sent by the sweep", kind=letter.kind
            )
            (sent if accepted else refused).append(letter)
        summary.dead_letters_sent += len(sent)
        if sent:
            # Not settled: sent again once their lease passes (a duplicate page, never a lost one).
            self._step(summary, "settle letters", lambda: self._settle(sent))
        if refused:
            # Not in flight any more: the next run sends them, a retry may take them back.
            self._step(summary, "release letters", lambda: self._release(refused))
        return len(refused)

    def _still_owed(self, letters: list[OwedLetter]) -> list[OwedLetter]:
        if not letters:
            return []
        with unit_of_work(self._engine) as connection:
            return machine.still_owed(connection, letters)

    def _release(self, letters: Sequence[OwedLetter]) -> None:
        with unit_of_work(self._engine) as connection:
            machine.release_letters(connection, letters, lease_seconds=self._settings.stale_after_seconds)

    def _settle(self, letters: Sequence[OwedLetter]) -> None:
        with unit_of_work(self._engine) as connection:
            machine.settle_letters(connection, letters)

    def _send(self, summary: SweepSummary, photo_ids: list[UUID], *, spread_seconds: float = 0) -> list[UUID]:
        """Send job messages; the rows whose message failed lose their stamp, for a later run."""
        unsent = self._queue.send_jobs(photo_ids, spread_seconds=spread_seconds) if photo_ids else []
        if unsent:
            logger.warning("sweep could not send job messages", count=len(unsent))
            # Not unstamped: a later run sends them once SWEEP_AFTER_SECONDS has passed again.
            self._step(summary, "unstamp", lambda: self._unstamp(unsent))
        return unsent

    def _unstamp(self, photo_ids: Sequence[UUID]) -> None:
        with unit_of_work(self._engine) as connection:
            machine.unstamp(connection, photo_ids)
