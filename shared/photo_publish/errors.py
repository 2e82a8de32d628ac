"""The project's one error type and its closed set of codes."""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    # Which codes are permanent, and what becomes of the others, is the retry policy's (retry.py).
    # The user's bad input: retrying cannot help.
    ORIGINAL_NOT_FOUND = "ORIGINAL_NOT_FOUND"
    ORIGINAL_TOO_LARGE = "ORIGINAL_TOO_LARGE"
    UNSUPPORTED_FORMAT = "UNSUPPORTED_FORMAT"
    DECODE_FAILED = "DECODE_FAILED"
    DIMENSIONS_EXCEEDED = "DIMENSIONS_EXCEEDED"
    ENCODE_FAILED = "ENCODE_FAILED"
    # The render ran past its own time limit (RENDER_TIMEOUT_SECONDS): the file, not the moment.
    RENDER_TIME_EXCEEDED = "RENDER_TIME_EXCEEDED"
    # Operational faults: the next attempt may succeed.
    STORAGE_READ_FAILED = "STORAGE_READ_FAILED"
    STORAGE_WRITE_FAILED = "STORAGE_WRITE_FAILED"
    DATABASE_UNAVAILABLE = "DATABASE_UNAVAILABLE"
    TIME_BUDGET_EXCEEDED = "TIME_BUDGET_EXCEEDED"
    PHOTO_NOT_FOUND = "PHOTO_NOT_FOUND"
    UNEXPECTED_ERROR = "UNEXPECTED_ERROR"
    # Final by definition: a worker died holding the job's last attempt.
    WORKER_LOST = "WORKER_LOST"


class PhotoError(Exception):
    """A failure with a code from the closed set; `detail` is for logs, never for decisions."""

    def __init__(self, code: ErrorCode, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else str(code))
        self.code = code
        self.detail = detail
