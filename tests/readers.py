"""For the pipeline's tests: a forward-only stream like an S3 body, and a look inside WebP files."""

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


def webp_chunks(data: bytes) -> list[bytes]:
    """The four-letter names of a WebP file's chunks (VP8, VP8L, VP8X, ALPH, EXIF, ICCP, XMP)."""
    assert data[:4] == b"RIFF"
    assert data[8:12] == b"WEBP"
    chunks, offset = [], 12
    while offset + 8 <= len(data):
        size = int.from_bytes(data[offset + 4 : offset + 8], "little")
        chunks.append(data[offset : offset + 4])
        offset += 8 + size + (size & 1)
    return chunks
