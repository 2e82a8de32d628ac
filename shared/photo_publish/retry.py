"""The retry policy (SPEC 5), in one place: how long a transient failure waits, which codes are
never retried, when a delivery that fails before its claim gives up, and from which receive a
record that must come back is handed on to a fresh message.

The settings feed it their numbers (MAX_ATTEMPTS, MAX_RECEIVE_COUNT, RETRY_BASE_SECONDS) and refuse
at a cold start numbers it cannot keep.
"""

from __future__ import annotations

from dataclasses import dataclass

from photo_publish.errors import ErrorCode

# The user's bad input: retrying cannot help, and nobody is paged. Every other code is an
# operational fault that the next attempt may get past (WORKER_LOST is only ever recorded for a job
# with no attempt left, so it is final).
PERMANENT = frozenset(
    {
        ErrorCode.ORIGINAL_NOT_FOUND,
        ErrorCode.ORIGINAL_TOO_LARGE,
        ErrorCode.UNSUPPORTED_FORMAT,
        ErrorCode.DECODE_FAILED,
        ErrorCode.DIMENSIONS_EXCEEDED,
        ErrorCode.ENCODE_FAILED,
        # Past the render's own deadline: the file's fault, no attempt renders it faster.
        ErrorCode.RENDER_TIME_EXCEEDED,
    }
)

# Receives before the redrive's limit from which a record that must come back is handed on to a
# fresh message instead. Two, so that a lost acknowledgement, a run that dies, or a hand-on whose
# send fails still leaves a receive to hand it on from: the soak saw a healthy photo's notification
# dead-lettered when the hand-on came on the last receive, and again when a run died on the one
# before it and the next one's send met an SQS error.
HAND_ON_SLACK = 2


class ContradictoryRetry(ValueError):
    """Numbers the policy cannot keep; the message names the variables."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """What becomes of a failure, given a deployment's numbers; numbers it cannot keep are refused."""

    max_attempts: int
    # The redrive's maxReceiveCount: a message received more often is dead-lettered by the queue.
    max_receive_count: int
    retry_base_seconds: int
    hand_on_slack: int = HAND_ON_SLACK

    def __post_init__(self) -> None:
        if self.max_attempts > self.first_hand_on:
            # A message is handed on (its receive count starts again) before it is received
            # MAX_ATTEMPTS times: an upload whose photo row never appears would go round for ever.
            raise ContradictoryRetry(
                f"MAX_ATTEMPTS ({self.max_attempts}) must not exceed MAX_RECEIVE_COUNT "
                f"({self.max_receive_count}) less the {self.hand_on_slack} receives kept for handing a "
                "message on: an upload whose photo row never appears is given up at its "
                "MAX_ATTEMPTS-th receive, which would never come"
            )

    @property
    def first_hand_on(self) -> int:
        """The first receive on which a record that must come back is handed on."""
        return self.max_receive_count - self.hand_on_slack

    def backoff(self, attempt: int) -> int:
        """BullMQ's exponential backoff: base * 2^(attempt-1), attempt counted from 1."""
        return int(self.retry_base_seconds * 2 ** max(attempt - 1, 0))

    @staticmethod
    def permanent(code: ErrorCode) -> bool:
        """A failure with this code is recorded for good at once, whatever attempts are left."""
        return code in PERMANENT

    def last(self, attempt: int) -> bool:
        """No attempt follows this one: its transient failure is final."""
        return attempt >= self.max_attempts

    def gives_up_before_claim(self, code: ErrorCode, receive_count: int) -> bool:
        """A delivery that failed before it could claim its job is dead-lettered: only an upload
        whose photo row has not appeared, once received as often as a job is attempted. The others
        (the database unreachable) are no fault of the photo: they come back until they succeed."""
        return code is ErrorCode.PHOTO_NOT_FOUND and receive_count >= self.max_attempts

    def before_claim_backoff(self, code: ErrorCode, receive_count: int) -> int:
        """How long a delivery that failed before its claim waits: the backoff of its receive count,
        or nothing where the invocation ran out of time (the next one can take it at once)."""
        return 0 if code is ErrorCode.TIME_BUDGET_EXCEEDED else self.backoff(receive_count)

    def hands_on(self, receive_count: int) -> bool:
        """A record that must come back is acknowledged and sent again as a fresh message on this
        receive, rather than left for the redrive to dead-letter with the job's attempts left."""
        return receive_count >= self.first_hand_on
