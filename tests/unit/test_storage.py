"""The original's stream: libvips' small reads served from large reads of the HTTP body."""

from __future__ import annotations

import io

import pytest

from photo_publish.adapters.storage import READ_AHEAD, OriginalStream
from photo_publish.errors import ErrorCode, PhotoError


class CountingBody(io.BytesIO):
    """An S3 body that records the size of each read asked of it."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.sizes: list[int] = []

    def read(self, size: int | None = -1, /) -> bytes:
        self.sizes.append(-1 if size is None else size)
        return super().read(size)


DATA = bytes(range(256)) * (3 * READ_AHEAD // 256 + 17)


def test_small_reads_are_served_from_read_ahead_pieces_in_order() -> None:
    # GIVEN an original a little over three read-ahead pieces long
    body = CountingBody(DATA)
    stream = OriginalStream(body, limit=len(DATA))

    # WHEN it is read 4 KiB at a time, as libvips asks, to its end
    chunks = list(iter(lambda: stream.read(4096), b""))

    # THEN every byte arrives once, in order, in pieces of at most 4 KiB ...
    assert b"".join(chunks) == DATA
    assert max(map(len, chunks)) == 4096
    # ... from five reads of the body: four pieces and the one that finds its end
    assert body.sizes == [READ_AHEAD] * 5
    assert stream.bytes_read == len(DATA)


def test_a_read_larger_than_the_read_ahead_is_passed_through_whole() -> None:
    # GIVEN an original
    body = CountingBody(DATA)
    stream = OriginalStream(body, limit=len(DATA))

    # WHEN a reader asks for more than a read-ahead piece at once
    chunk = stream.read(2 * READ_AHEAD)

    # THEN it gets that much, from one read of the body
    assert chunk == DATA[: 2 * READ_AHEAD]
    assert body.sizes == [2 * READ_AHEAD]


def test_the_byte_limit_counts_what_was_read_from_the_body() -> None:
    # GIVEN an original one byte over the limit
    stream = OriginalStream(CountingBody(DATA), limit=len(DATA) - 1)

    # WHEN it is read to its end
    # THEN it is refused as too large once the body yields the byte past the limit
    with pytest.raises(PhotoError) as raised:
        while stream.read(4096):
            pass
    assert raised.value.code is ErrorCode.ORIGINAL_TOO_LARGE
