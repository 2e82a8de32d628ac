"""Every failure of a delivery ends in a recorded state (SPEC 5): permanent, retried after its
backoff, or final with its dead letter, which the job owes until the queue accepts it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol
from uuid import UUID

from sqlalchemy import Connection, Engine

from photo_publish.adapters.unit_of_work import unit_of_work
from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.jobs import machine
from photo_publish.jobs.machine import OwedLetter
from photo_publish.observability import logger
from photo_publish.outbox import writer
from photo_publish.outbox.relay import HandOff, Waiting
from photo_publish.publish import repository
from photo_publish.publish.outcomes import Outcome, Result
from photo_publish.settings import Settings


class DeadLetters(Protocol):
    def send_dead_letter(
        self, photo_id: UUID, attempt: int, code: ErrorCode, detail: str = "", *, kind: str = "photo"
    ) -> bool: ...


class EventHandOff(Protocol):
    def lease(self, connection: Connection, photo_id: UUID) -> list[Waiting]: ...
    def hand_off(self, photo_id: UUID, leased: Sequence[Waiting] | None = None) -> HandOff: ...


class Failures:
    def __init__(
        self,
        engine: Engine,
        queue: DeadLetters,
        settings: Settings,
        events: EventHandOff | None,
    ) -> None:
        """`events` puts the event a failure's commit wrote on the bus at once (best effort)."""
        self._engine = engine
        self._queue = queue
        self._settings = settings
        self._events = events

    def _hand_off(self, photo_id: UUID) -> HandOff | None:
        return None if self._events is None else self._events.hand_off(photo_id)

    def _fail(
        self, photo_id: UUID, attempt: int, code: ErrorCode, *, final: bool = False
    ) -> machine.Failed | None:
        """Job `failed` (owing its dead letter if `final`), photo `processing_failed` (never a
        published one) with its `photo.failed` event, in one transaction. The failure (its time
        names its letter; a published photo's is its re-render's), or None if fenced out."""
        with unit_of_work(self._engine) as connection:
            failed = machine.fail(connection, photo_id, attempt, code, final=final)
            if failed is None:
                return None
            # A published photo is not downgraded, and gets no event: only a photo marked failed does.
            writer.append_failed(connection, failed.marked)
        return failed

    def attempt_failed(self, photo_id: UUID, attempt: int, error: PhotoError) -> Result:
        """Record a claimed attempt's failure: permanent, retried after its backoff, or final."""
        retry = self._settings.retry
        permanent = retry.permanent(error.code)
        logger.warning("attempt failed", error_code=error.code, detail=error.detail, permanent=permanent)
        try:
            if permanent:
                if self._fail(photo_id, attempt, error.code) is None:
                    return Result(Outcome.SUPERSEDED, photo_id, error.code, attempt)
                return Result(Outcome.FAILED, photo_id, error.code, attempt, handoff=self._hand_off(photo_id))
            if retry.last(attempt):
                return self.final_failure(photo_id, attempt, error)
            backoff = retry.backoff(attempt)
            with unit_of_work(self._engine) as connection:
                released = machine.release(connection, photo_id, attempt, error.code, backoff)
            if not released:
                return Result(Outcome.SUPERSEDED, photo_id, error.code, attempt)
            return Result(Outcome.RETRY, photo_id, error.code, attempt, retry_in=backoff)
        except PhotoError as recording:
            # Nothing could be recorded: the job stays active under this attempt and is taken over
            # once stale; the message comes back after the backoff to find it so.
            logger.warning("failure not recorded", error_code=recording.code)
            return Result(Outcome.RETRY, photo_id, error.code, attempt, retry.backoff(attempt))

    def final_failure(self, photo_id: UUID, attempt: int, error: PhotoError) -> Result:
        failed = self._fail(photo_id, attempt, error.code, final=True)
        if failed is None:
            return Result(Outcome.SUPERSEDED, photo_id, error.code, attempt)
        handoff = self._hand_off(photo_id)
        # A published photo is not marked failed: what failed is its re-render, and it pages so.
        letter = OwedLetter(photo_id, attempt, error.code, failed.failed_at, rerender=not failed.marked)
        return replace(self._send_dead_letter(letter, error.detail), handoff=handoff)

    def owed_letter(self, photo_id: UUID) -> Result:
        """A delivery for a failed job: a duplicate, unless the job still owes its dead letter."""
        with unit_of_work(self._engine) as connection:
            owed = repository.take_owed_letter(
                connection, photo_id, lease_seconds=self._settings.stale_after_seconds
            )
        if owed is None:
            return Result(Outcome.DUPLICATE, photo_id)
        if isinstance(owed, OwedLetter):
            return self._send_dead_letter(owed, "sent again by a later delivery")
        # Its first sender may still be sending: come back when the letter is free to take.
        return Result(Outcome.RETRY, photo_id, retry_in=owed)

    def _send_dead_letter(self, owed: OwedLetter, detail: str) -> Result:
        """Send a final failure's dead letter; until the queue accepts it, the job owes it and the
        message comes back for it (the sweep sends it if no message does). A photo deleted since
        its failure was recorded pages nobody: a last look first (a deletion that commits during
        the send leaves the letter in the queue, for the sweep to remove)."""
        try:
            with unit_of_work(self._engine) as connection:
                standing = bool(machine.still_owed(connection, [owed]))
        except PhotoError as error:
            logger.warning("letter not looked at before its send", error_code=error.code)
            standing = True
        if not standing:
            logger.info("dead letter withdrawn: its photo was deleted", photo_id=str(owed.photo_id))
            return Result(Outcome.FAILED, owed.photo_id, owed.code, owed.attempt)
        if not self._queue.send_dead_letter(owed.photo_id, owed.attempt, owed.code, detail, kind=owed.kind):
            try:
                # Refused, not in flight: the sweep's next run may send it, a retry take it back.
                with unit_of_work(self._engine) as connection:
                    machine.release_letters(
                        connection, [owed], lease_seconds=self._settings.stale_after_seconds
                    )
            except PhotoError as error:
                logger.warning("refused dead letter not released", error_code=error.code)
            return Result(
                Outcome.RETRY,
                owed.photo_id,
                owed.code,
                owed.attempt,
                retry_in=self._settings.stale_after_seconds,
            )
        try:
            with unit_of_work(self._engine) as connection:
                machine.settle_letters(connection, [owed])
        except PhotoError as error:
            # Sent, but still recorded as owed: the sweep sends it once more (a duplicate, never a loss).
            logger.warning("dead letter sent but not recorded", error_code=error.code)
        return Result(Outcome.DEAD_LETTERED, owed.photo_id, owed.code, owed.attempt)

    def before_claim(self, photo_id: UUID, error: PhotoError, receive_count: int) -> Result:
        logger.warning("delivery failed before a claim", error_code=error.code, detail=error.detail)
        retry = self._settings.retry
        if (
            retry.gives_up_before_claim(error.code, receive_count)
            # Not accepted: the message comes back after its backoff and tries again.
            and self._queue.send_dead_letter(photo_id, receive_count, error.code, error.detail)
        ):
            return Result(Outcome.DEAD_LETTERED, photo_id, error.code, receive_count)
        retry_in = retry.before_claim_backoff(error.code, receive_count)
        return Result(Outcome.RETRY, photo_id, error.code, retry_in=retry_in)
