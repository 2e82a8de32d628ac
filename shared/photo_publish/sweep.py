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

from sqlalchemy import Engine, and_, case, func, literal_column, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from photo_publish.budget import Remaining, forever
from photo_publish.errors import ErrorCode
from photo_publish.models import Photo, PhotoJob
from photo_publish.observability import logger
from photo_publish.repository import OwedDeadLetter, failed_event
from photo_publish.settings import Settings


class SweepQueue(Protocol):
    def send_jobs(self, photo_ids: Sequence[UUID]) -> list[UUID]: ...
    def send_dead_letter(self, photo_id: UUID, attempt: int, code: ErrorCode, detail: str = "") -> bool: ...


@dataclass
class SweepSummary:
    resent_pending: int = 0
    resent_stale: int = 0
    worker_lost: int = 0
    dead_letters_sent: int = 0
    send_failed: int = 0
    batches: int = 0
    out_of_time: bool = False

    def as_dict(self) -> dict[str, int | bool]:
        return {
            "resentPending": self.resent_pending,
            "resentStale": self.resent_stale,
            "workerLost": self.worker_lost,
            "deadLettersSent": self.dead_letters_sent,
            "sendFailed": self.send_failed,
            "batches": self.batches,
            "outOfTime": self.out_of_time,
        }


class Sweeper:
    def __init__(
        self, engine: Engine, queue: SweepQueue, settings: Settings, *, batch_size: int = 500
    ) -> None:
        self._sessions = sessionmaker(engine)
        self._queue = queue
        self._settings = settings
        self._batch_size = batch_size

    def run(self, remaining: Remaining = forever, *, reserve_seconds: float = 10.0) -> SweepSummary:
        """Sweep in bounded batches until nothing is due or the time budget is spent."""
        summary = SweepSummary()
        while True:
            if remaining() < reserve_seconds:
                summary.out_of_time = True
                break
            pending = self._take_due_pending()
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
        return summary

    def _take_due_pending(self) -> list[UUID]:
        """Stamp and return pending rows that waited SWEEP_AFTER_SECONDS past their due time."""
        wait = timedelta(seconds=self._settings.sweep_after_seconds)
        now = func.now()
        due_at = func.coalesce(PhotoJob.next_retry_at, PhotoJob.created_at)
        due = (
            select(PhotoJob.photo_id)
            .where(
                # Literal, not a bound parameter: a generic plan must still see the partial index.
                PhotoJob.status == literal_column("'pending'"),
                due_at < now - wait,
                or_(PhotoJob.enqueued_at.is_(None), PhotoJob.enqueued_at < now - wait),
            )
            .order_by(due_at)
            .limit(self._batch_size)
            .with_for_update(skip_locked=True)
            .cte("due")
        )
        with self._sessions.begin() as session:
            return list(
                session.scalars(
                    update(PhotoJob)
                    .where(PhotoJob.photo_id == due.c.photo_id)
                    .values(enqueued_at=now, updated_at=now)
                    .returning(PhotoJob.photo_id)
                )
            )

    def _take_stale_active(self) -> tuple[list[UUID], list[OwedDeadLetter]]:
        """Stale active rows: back to pending and stamped, or failed with WORKER_LOST if exhausted."""
        now = func.now()
        exhausted = PhotoJob.attempt >= self._settings.max_attempts
        stale = (
            select(PhotoJob.photo_id)
            .where(
                PhotoJob.status == literal_column("'active'"),
                PhotoJob.claimed_at < now - timedelta(seconds=self._settings.stale_after_seconds),
            )
            .order_by(PhotoJob.claimed_at)
            .limit(self._batch_size)
            .with_for_update(skip_locked=True)
            .cte("stale")
        )
        with self._sessions.begin() as session:
            rows = session.execute(
                update(PhotoJob)
                .where(PhotoJob.photo_id == stale.c.photo_id)
                .values(
                    status=case((exhausted, "failed"), else_="pending"),
                    last_error_code=ErrorCode.WORKER_LOST.value,
                    enqueued_at=case((exhausted, PhotoJob.enqueued_at), else_=now),
                    # A final failure: its dead letter is owed until the queue accepts it.
                    dead_letter_owed_at=case((exhausted, now), else_=PhotoJob.dead_letter_owed_at),
                    next_retry_at=None,
                    updated_at=now,
                )
                .returning(PhotoJob.photo_id, PhotoJob.status, PhotoJob.attempt)
            ).all()
            lost = [
                OwedDeadLetter(row.photo_id, row.attempt, ErrorCode.WORKER_LOST)
                for row in rows
                if row.status == "failed"
            ]
            self._mark_photos_lost(session, lost)
        return [row.photo_id for row in rows if row.status == "pending"], lost

    def _take_owed_dead_letters(self) -> list[OwedDeadLetter]:
        """Final failures whose dead letter was never accepted, leased to this run (SPEC 5).

        Only letters owed for longer than STALE_AFTER_SECONDS: by then the worker that marked the
        failure has surely finished sending (or died), so a letter is sent twice only after a death.
        """
        now = func.now()
        owed = (
            select(PhotoJob.photo_id)
            .where(PhotoJob.dead_letter_owed_at < now - timedelta(seconds=self._settings.stale_after_seconds))
            .order_by(PhotoJob.dead_letter_owed_at)
            .limit(self._batch_size)
            .with_for_update(skip_locked=True)
            .cte("owed")
        )
        with self._sessions.begin() as session:
            rows = session.execute(
                update(PhotoJob)
                .where(PhotoJob.photo_id == owed.c.photo_id)
                .values(dead_letter_owed_at=now)
                .returning(PhotoJob.photo_id, PhotoJob.attempt, PhotoJob.last_error_code)
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
            with self._sessions.begin() as session:
                session.execute(
                    update(PhotoJob).where(PhotoJob.photo_id.in_(sent)).values(dead_letter_owed_at=None)
                )
        return len(letters) - len(sent)

    @staticmethod
    def _mark_photos_lost(session: Session, lost: list[OwedDeadLetter]) -> None:
        """The photos of final WORKER_LOST failures `processing_failed`, each with its `photo.failed`
        event: only those the UPDATE marked (a published photo is neither downgraded nor told)."""
        if not lost:
            return
        attempts = {letter.photo_id: letter.attempt for letter in lost}
        marked = session.execute(
            update(Photo)
            .where(and_(Photo.id.in_(attempts), Photo.processing_state != "ready"))
            .values(
                processing_state="processing_failed",
                error_code=ErrorCode.WORKER_LOST.value,
                updated_at=func.now(),
            )
            .returning(Photo.id, Photo.album_id, Photo.entity_version, Photo.updated_at)
            .execution_options(synchronize_session=False)
        ).all()
        session.add_all(
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
        )

    def _send(self, photo_ids: list[UUID]) -> list[UUID]:
        """Send job messages; the rows whose message failed lose their stamp, for a later run."""
        unsent = self._queue.send_jobs(photo_ids) if photo_ids else []
        if unsent:
            logger.warning("sweep could not send job messages", count=len(unsent))
            with self._sessions.begin() as session:
                session.execute(
                    update(PhotoJob)
                    .where(PhotoJob.photo_id.in_(unsent), PhotoJob.status == "pending")
                    .values(enqueued_at=None)
                )
        return unsent
