"""The render's own deadline judges the file, not the network (SPEC 5): the seconds the original's
stream spent waiting for S3's bytes are left out of RENDER_TIMEOUT_SECONDS, never out of the
invocation's time budget. The real stream (storage.OriginalStream) and the real render, over a body
that makes its reader wait as a slow S3 connection would."""

from __future__ import annotations

import io
import time

import pytest

from devkit import hostile, samples
from photo_publish.adapters.storage import OriginalStream
from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.image.pipeline import RenderOptions, render
from photo_publish.retry import PERMANENT

PAUSE = 1.0
# A real photo, small enough that its decoding and encoding take a few tens of milliseconds.
PHOTO = bytes(samples.photograph("Garden.jpg").thumbnail_image(640).jpegsave_buffer(Q=85))


class SlowBody(io.BytesIO):
    """An S3 body whose first read blocks `pause` seconds before its bytes arrive."""

    def __init__(self, data: bytes, pause: float) -> None:
        super().__init__(data)
        self._pause = pause

    def read(self, size: int | None = -1, /) -> bytes:
        if self._pause:
            time.sleep(self._pause)
            self._pause = 0.0
        return super().read(size)


def slow_stream(data: bytes, pause: float = PAUSE) -> OriginalStream:
    return OriginalStream(SlowBody(data, pause), limit=len(data))


def test_the_stream_counts_the_seconds_its_reads_waited_for_the_body() -> None:
    # GIVEN an original whose body makes its first read wait
    stream = slow_stream(PHOTO)

    # WHEN it is read to its end
    while stream.read(4096):
        pass

    # THEN the stream knows how long its reads waited
    assert PAUSE <= stream.read_wait_seconds < PAUSE + 0.5


def test_seconds_waiting_for_the_body_do_not_count_against_the_renders_own_limit() -> None:
    # GIVEN a render limit shorter than the wait for the body, and a photo that renders well within it
    options = RenderOptions(render_timeout_seconds=PAUSE / 2)

    # WHEN it is rendered from the slow stream
    rendered = render(slow_stream(PHOTO), options)

    # THEN it renders: waiting for S3 is not the file's fault (no RENDER_TIME_EXCEEDED)
    assert {variant.kind for variant in rendered.variants} >= {"thumb", "browse"}


def test_seconds_waiting_for_the_body_count_against_the_invocations_time_budget() -> None:
    # GIVEN an invocation with less time left than the wait for the body
    # WHEN the photo is rendered from the slow stream
    with pytest.raises(PhotoError) as raised:
        render(slow_stream(PHOTO), RenderOptions(), time_budget=PAUSE / 2)

    # THEN the invocation's time ran out: a transient failure, for an attempt with time to finish
    assert raised.value.code is ErrorCode.TIME_BUDGET_EXCEEDED
    assert raised.value.code not in PERMANENT


def test_a_file_that_is_slow_to_render_still_exceeds_the_limit_after_a_wait() -> None:
    # GIVEN a file whose render takes seconds (a 100 MP float TIFF), behind a slow body, and a
    # render limit of 0.3 s
    slow_tiff = hostile.tiff(8192, 12207, bits=32, bands=4, sample_format="float")
    options = RenderOptions(render_timeout_seconds=0.3)

    # WHEN it is rendered
    started = time.monotonic()
    with pytest.raises(PhotoError) as raised:
        render(slow_stream(slow_tiff), options)

    # THEN its own work ran past the limit: stopped inside libvips soon after the wait plus the
    # limit, as the file's fault
    assert raised.value.code is ErrorCode.RENDER_TIME_EXCEEDED
    assert time.monotonic() - started < PAUSE + 1.5
