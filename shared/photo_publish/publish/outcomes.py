"""What processing one photo came to: its outcome, and the numbers its log line and metrics carry."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from uuid import UUID

from photo_publish.errors import ErrorCode
from photo_publish.outbox.relay import HandOff


class Outcome(StrEnum):
    PUBLISHED = "published"
    # A published photo's variants replaced by a newer recipe's (a backfill, SPEC 14).
    RERENDERED = "rerendered"
    ALREADY = "already"
    SKIPPED = "skipped"
    # Not ours to work on: the job is finished, or the event names another original.
    DUPLICATE = "duplicate"
    IGNORED = "ignored"
    # A newer claim owns the job: this worker's result is not recorded.
    SUPERSEDED = "superseded"
    # The upload the attempt pinned was written over (SPEC 19): the newer write is processed instead.
    REPLACED = "replaced"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"
    RETRY = "retry"


@dataclass(frozen=True, slots=True)
class Steps:
    claim: float
    render: float
    store: float
    commit: float
    # Of the time between claim and render: waiting for a render slot (RENDER_CONCURRENCY).
    wait: float = 0.0

    def milliseconds(self) -> dict[str, int]:
        return {step: round(seconds * 1000) for step, seconds in asdict(self).items()}


@dataclass(frozen=True, slots=True)
class Result:
    outcome: Outcome
    photo_id: UUID
    code: ErrorCode | None = None
    attempt: int | None = None
    retry_in: float | None = None
    variant_bytes: int = 0
    # Seconds per step of a rendered attempt: find and claim the photo, stream its original in and
    # render, store the variants, commit; and the wait for a render slot, apart.
    steps: Steps | None = None
    # The hand-off of the event its commit wrote (SPEC 12), where one was tried.
    handoff: HandOff | None = None
