"""The sweep (SPEC 7): re-send work whose message was lost, and fail jobs whose worker died.

It is a safety net, not a second retry path: a pending row is due only after it waited
SWEEP_AFTER_SECONDS past its own due time, so the queue's retry of a row always comes first.
Rows are taken with FOR UPDATE SKIP LOCKED and stamped (enqueued_at) in the same statement, so two
sweeps at once never send the same row twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol
from uuid import UUID

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    case,
    delete,
    func,
    insert,
    literal_column,
    or_,
    select,
    update,
)

from photo_publish.adapters.tables import outbox_events, photo_jobs, photos, retired_variants
from photo_publish.budget import Remaining, forever
from photo_publish.errors import ErrorCode
from photo_publish.observability import logger
from photo_publish.publish.repository import OwedDeadLetter, failed_event
from photo_publish.settings import Settings


class SweepQueue(Protocol):
    def depth(self) -> int | None: ...
    def send_jobs(self, photo_ids: Sequence[UUID], *, spread_seconds: float = 0) -> list[UUID]: ...
    def send_dead_letter(self, photo_id: UUID, attempt: int, code: ErrorCode, detail: str = "") -> bool: ...


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
            "backlog": self.backlog,
            "batches": self.batches,
            "outOfTime": self.out_of_time,
        }


class VariantStore(Protocol):
    def delete_variants(self, keys: Sequence[str]) -> list[str]: ...


class Sweeper:
    def __init__(
        self,
        engine: Engine,
        queue: SweepQueue,
        settings: Settings,
        *,
        store: VariantStore,
        batch_size: int = 500,
    ) -> None:
        self._engine = engine
        self._queue = queue
        self._settings = settings
        self._store = store
        self._batch_size = batch_size

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
            pending = [] if backlog else self._take_due_pending()
            stale, lost = self._take_stale_active()
            owed = self._take_owed_dead_letters()
            # Every send below is answered, never raised: one refused send must not keep the rest
            # of the stamped rows waiting for another SWEEP_AFTER_SECONDS.
            letters_unsent = self._send_dead_letters(lost + owed)
            unsent = self._send(pending + stale)
            summary.batches += 1
            summary.resent_pending += len(pending) - len(set(unsent) & set(pending))
            summary.resent_stale += len(stale) - len(set(unsent) & set(stale))
            summary.worker_lost += len(lost)
            summary.dead_letters_sent += len(lost) + len(owed) - letters_unsent
            summary.send_failed += len(unsent) + letters_unsent
            if max(len(pending), len(stale) + len(lost), len(owed)) < self._batch_size:
                break
        # The backfill and the tidying come after the lost work, and only with time to spare.
        if remaining() >= reserve_seconds:
            summary.backfill_sent = self._drive_backfill(depth)
            summary.backfill_left = self._backfill_left()
            summary.retired_deleted = self._delete_retired()
        return summary

    def _drive_backfill(self, depth: int | None) -> int:
        """Send a bounded number of a backfill's marked photos, only while the process queue is short.

        A marked job (a published photo's, `rerender_to` set) becomes an ordinary pending job,
        stamped as sent: from then on retries, lost messages and lost workers are handled as for any
        upload. New uploads wait behind BACKFILL_MAX_QUEUE_DEPTH messages at most.
        """
        settings = self._settings
        if depth is None or depth >= settings.backfill_max_queue_depth:
            logger.info("backfill waits for a shorter queue", depth=depth)
            return 0
        now = func.now()
        marked = (
            select(photo_jobs.c.photo_id)
            .where(photo_jobs.c.rerender_to.is_not(None), photo_jobs.c.status == literal_column("'done'"))
            .order_by(photo_jobs.c.photo_id)
            .limit(settings.backfill_batch_size)
            .with_for_update(skip_locked=True)
            .cte("marked")
        )
        with self._engine.begin() as connection:
            taken = list(
                connection.scalars(
                    update(photo_jobs)
                    .where(photo_jobs.c.photo_id == marked.c.photo_id)
                    .values(
                        status="pending",
                        attempt=0,
                        next_retry_at=None,
                        last_error_code=None,
                        enqueued_at=now,
                        updated_at=now,
                    )
                    .returning(photo_jobs.c.photo_id)
                )
            )
        # Spread over the time to the next run: new uploads queue behind a trickle, never a batch.
        unsent = self._send(taken, spread_seconds=settings.backfill_spread_seconds)
        return len(taken) - len(unsent)

    def _backfill_left(self) -> int:
        with self._engine.begin() as connection:
            left = connection.scalar(
                select(func.count())
                .select_from(photo_jobs)
                .where(photo_jobs.c.rerender_to.is_not(None), photo_jobs.c.status == literal_column("'done'"))
            )
        return int(left or 0)

    def _delete_retired(self) -> int:
        """Delete a bounded batch of replaced versions' objects whose grace period has passed."""
        with self._engine.begin() as connection:
            keys = list(
                connection.scalars(
                    select(retired_variants.c.storage_key)
                    .where(retired_variants.c.delete_after < func.now())
                    .order_by(retired_variants.c.delete_after)
                    .limit(self._batch_size)
                    .with_for_update(skip_locked=True)
                )
            )
            deleted = self._store.delete_variants(keys) if keys else []
            if deleted:
                connection.execute(
                    delete(retired_variants).where(retired_variants.c.storage_key.in_(deleted))
                )
        return len(deleted)

    def _take_due_pending(self) -> list[UUID]:
        """Stamp and return pending rows that waited SWEEP_AFTER_SECONDS past their due time."""
        wait = timedelta(seconds=self._settings.sweep_after_seconds)
        now = func.now()
        due_at = func.coalesce(photo_jobs.c.next_retry_at, photo_jobs.c.created_at)
        due = (
            select(photo_jobs.c.photo_id)
            .where(
                # Literal, not a bound parameter: a generic plan must still see the partial index.
                photo_jobs.c.status == literal_column("'pending'"),
                due_at < now - wait,
                or_(photo_jobs.c.enqueued_at.is_(None), photo_jobs.c.enqueued_at < now - wait),
            )
            .order_by(due_at)
            .limit(self._batch_size)
            .with_for_update(skip_locked=True)
            .cte("due")
        )
        with self._engine.begin() as connection:
            return list(
                connection.scalars(
                    update(photo_jobs)
                    .where(photo_jobs.c.photo_id == due.c.photo_id)
                    .values(enqueued_at=now, updated_at=now)
                    .returning(photo_jobs.c.photo_id)
                )
            )

    def _take_stale_active(self) -> tuple[list[UUID], list[OwedDeadLetter]]:
        """Stale active rows: back to pending and stamped, or failed with WORKER_LOST if exhausted."""
        now = func.now()
        exhausted = photo_jobs.c.attempt >= self._settings.max_attempts
        stale = (
            select(photo_jobs.c.photo_id)
            .where(
                photo_jobs.c.status == literal_column("'active'"),
                photo_jobs.c.claimed_at < now - timedelta(seconds=self._settings.stale_after_seconds),
            )
            .order_by(photo_jobs.c.claimed_at)
            .limit(self._batch_size)
            .with_for_update(skip_locked=True)
            .cte("stale")
        )
        with self._engine.begin() as connection:
            rows = connection.execute(
                update(photo_jobs)
                .where(photo_jobs.c.photo_id == stale.c.photo_id)
                .values(
                    status=case((exhausted, "failed"), else_="pending"),
                    last_error_code=ErrorCode.WORKER_LOST.value,
                    enqueued_at=case((exhausted, photo_jobs.c.enqueued_at), else_=now),
                    # A final failure: its dead letter is owed until the queue accepts it.
                    dead_letter_owed_at=case((exhausted, now), else_=photo_jobs.c.dead_letter_owed_at),
                    failed_at=case((exhausted, now), else_=photo_jobs.c.failed_at),
                    next_retry_at=None,
                    updated_at=now,
                )
                .returning(photo_jobs.c.photo_id, photo_jobs.c.status, photo_jobs.c.attempt)
            ).all()
            lost = [
                OwedDeadLetter(row.photo_id, row.attempt, ErrorCode.WORKER_LOST)
                for row in rows
                if row.status == "failed"
            ]
            self._mark_photos_lost(connection, lost)
        return [row.photo_id for row in rows if row.status == "pending"], lost

    def _take_owed_dead_letters(self) -> list[OwedDeadLetter]:
        """Final failures whose dead letter was never accepted, leased to this run (SPEC 5).

        Only letters owed for longer than STALE_AFTER_SECONDS: by then the worker that marked the
        failure has surely finished sending (or died), so a letter is sent twice only after a death.
        """
        now = func.now()
        owed = (
            select(photo_jobs.c.photo_id)
            .where(
                photo_jobs.c.dead_letter_owed_at < now - timedelta(seconds=self._settings.stale_after_seconds)
            )
            .order_by(photo_jobs.c.dead_letter_owed_at)
            .limit(self._batch_size)
            .with_for_update(skip_locked=True)
            .cte("owed")
        )
        with self._engine.begin() as connection:
            rows = connection.execute(
                update(photo_jobs)
                .where(photo_jobs.c.photo_id == owed.c.photo_id)
                .values(dead_letter_owed_at=now)
                .returning(photo_jobs.c.photo_id, photo_jobs.c.attempt, photo_jobs.c.last_error_code)
            ).all()
        return [OwedDeadLetter(row.photo_id, row.attempt, ErrorCode(row.last_error_code)) for row in rows]

    def _send_dead_letters(self, letters: list[OwedDeadLetter]) -> int:
        """Send each letter; the accepted ones are owed no more. The number not accepted (still owed,
        taken again once their lease has passed)."""
        sent = [
            letter.photo_id
            for letter in letters
            if self._queue.send_dead_letter(letter.photo_id, letter.attempt, letter.code, "sent by the sweep")
        ]
        if sent:
            with self._engine.begin() as connection:
                connection.execute(
                    update(photo_jobs).where(photo_jobs.c.photo_id.in_(sent)).values(dead_letter_owed_at=None)
                )
        return len(letters) - len(sent)

    @staticmethod
    def _mark_photos_lost(connection: Connection, lost: list[OwedDeadLetter]) -> None:
        """The photos of final WORKER_LOST failures `processing_failed`, each with its `photo.failed`
        event: only those the UPDATE marked (a published photo is neither downgraded nor told)."""
        if not lost:
            return
        attempts = {letter.photo_id: letter.attempt for letter in lost}
        marked = connection.execute(
            update(photos)
            .where(and_(photos.c.id.in_(attempts), photos.c.processing_state != "ready"))
            .values(
                processing_state="processing_failed",
                error_code=ErrorCode.WORKER_LOST.value,
                updated_at=func.now(),
            )
            .returning(photos.c.id, photos.c.album_id, photos.c.entity_version, photos.c.updated_at)
        ).all()
        events = [
            failed_event(
                row.id,
                album_id=row.album_id,
                entity_version=row.entity_version,
                code=ErrorCode.WORKER_LOST,
                attempt=attempts[row.id],
                failed_at=row.updated_at,
                final=True,
            )
            for row in marked
        ]
        if events:
            connection.execute(insert(outbox_events), events)

    def _send(self, photo_ids: list[UUID], *, spread_seconds: float = 0) -> list[UUID]:
        """Send job messages; the rows whose message failed lose their stamp, for a later run."""
        unsent = self._queue.send_jobs(photo_ids, spread_seconds=spread_seconds) if photo_ids else []
        if unsent:
            logger.warning("sweep could not send job messages", count=len(unsent))
            with self._engine.begin() as connection:
                connection.execute(
                    update(photo_jobs)
                    .where(photo_jobs.c.photo_id.in_(unsent), photo_jobs.c.status == "pending")
                    .values(enqueued_at=None)
                )
        return unsent
