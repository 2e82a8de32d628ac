"""Streams for the pipeline's tests: forward-only, like an S3 body."""

from __future__ import annotations

import io


class FailingReader:
    """Serves `data` up to byte `fail_at`, then raises `error` on every read."""

    def __init__(self, data: bytes, fail_at: int, error: Exception) -> None:
        self._data = io.BytesIO(data)
        self._fail_at = fail_at
        self._error = error
        self._position = 0

    def read(self, size: int, /) -> bytes:
        if self._position >= self._fail_at:
            raise self._error
        chunk = self._data.read(min(size, self._fail_at - self._position))
        self._position += len(chunk)
        return chunk
