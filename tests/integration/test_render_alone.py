"""A photo whose decoder needs more than a shared slot renders alone; only what no render of the
function could hold is refused (SPEC 3, amended; issue 24, item 4).

The real service, PostgreSQL and moto's S3, four records in flight and two renders at once (as the
batch processor runs them), in a function whose memory makes a 4 MP progressive JPEG's coefficients
(24.6 MB at 4:4:4) more than a shared slot holds (10 MB) and less than the whole (100 MB).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import pytest
from sqlalchemy import Engine

from devkit import samples, uploads
from photo_publish.adapters.queue import SqsQueue
from photo_publish.adapters.storage import S3Store
from photo_publish.events import PhotoRequest
from photo_publish.image import pipeline, slots
from photo_publish.publish import service as service_module
from photo_publish.publish.outcomes import Outcome
from photo_publish.publish.service import PhotoService
from tests.conftest import BUCKET, STAGE, Infra
from tests.rows import photo

# With 128 MB resident: a slot of (436 - 128 - 64 - 2 x 16) / 2 - 96 = 10 MB, the whole 100 MB.
MEMORY_MB, RESIDENT = 436, 128 * slots.MIB
SHARED = ("Aqua.jpg", "Garden.jpg", "Storm.jpg", "Wood.jpg", "LadyBird.jpg", "GreenMeadow.jpg")


@dataclass
class Render:
    alone: bool
    started: float
    ended: float = 0.0
    handed_back: bool = False  # RenderAlone: over its slot


@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> list[Render]:
    """Every render the service starts, timed (each held 0.3 s, so that overlaps show)."""
    done: list[Render] = []
    lock = threading.Lock()
    real = pipeline.render

    def timed(original: Any, options: pipeline.RenderOptions, **kwargs: Any) -> Any:
        render = Render(alone=options.shared_decode_buffer_bytes is None, started=time.monotonic())
        try:
            time.sleep(0.3)
            return real(original, options, **kwargs)
        except pipeline.RenderAlone:
            render.handed_back = True
            raise
        finally:
            render.ended = time.monotonic()
            with lock:
                done.append(render)

    monkeypatch.setattr(service_module, "render", timed)
    monkeypatch.setattr(slots, "resident_bytes", lambda: RESIDENT)
    return done


def overlapping(one: Render, other: Render) -> bool:
    return one.started < other.ended and other.started < one.ended


@pytest.mark.parametrize("over_slot", [1, 2], ids=["one-over-its-slot", "two-over-their-slots"])
def test_a_photo_over_its_slot_waits_for_the_shared_renders_then_renders_alone(
    infra: Infra, db: Engine, renders: list[Render], over_slot: int
) -> None:
    # GIVEN four records in flight, two renders at once, and a slot of 10 MB in a whole of 100 MB
    settings = replace(
        infra.settings, record_concurrency=4, render_concurrency=2, aws_lambda_function_memory_size=MEMORY_MB
    )
    budget = slots.decode_budget(settings, RESIDENT)
    assert (budget.slot // slots.MIB, budget.whole // slots.MIB) == (10, 100)
    queue = SqsQueue(infra.sqs, settings.process_queue_url, settings.dead_letter_queue_url)
    service = PhotoService(db, S3Store(infra.s3, BUCKET), queue, settings)
    # AND first in the batch, photos whose decoders hold 24.6 MB (progressive 4:4:4 JPEGs), then six
    # ordinary ones (baseline JPEGs, which shrink on load)
    progressive = bytes(samples.photograph().jpegsave_buffer(interlace=True, subsample_mode="off"))
    big = [
        uploads.upload(db, infra.s3, BUCKET, STAGE, file_name=f"big{n}.jpg", data=progressive)
        for n in range(over_slot)
    ]
    ordinary = [
        uploads.upload(db, infra.s3, BUCKET, STAGE, file_name=name, data=(samples.IMAGES / name).read_bytes())
        for name in SHARED
    ]

    # WHEN the batch is worked on, four records at a time
    with ThreadPoolExecutor(settings.record_concurrency) as pool:
        futures = [pool.submit(service.process, PhotoRequest(shot.photo_id)) for shot in [*big, *ordinary]]
        # (and none waits for another for ever)
        results = [future.result(timeout=120) for future in futures]

    # THEN every photo is published, the big ones too, once each
    assert {result.outcome for result in results} == {Outcome.PUBLISHED}
    assert all(photo(db, shot.photo_id) == ("ready", None, 2) for shot in [*big, *ordinary])
    # AND each big one was handed back from its header by its shared render, then rendered alone
    alone = [render for render in renders if render.alone]
    handed_back = [render for render in renders if render.handed_back]
    assert len(alone) == len(handed_back) == over_slot
    # AND nothing else rendered while one rendered alone; never more than two renders at once
    for render in alone:
        assert not any(overlapping(render, other) for other in renders if other is not render), renders
    moments = sorted({render.started for render in renders})
    assert max(sum(r.started <= at < r.ended for r in renders) for at in moments) <= 2
    # AND it waited for the renders of the records already in (rendering when it was handed back)
    first_alone = min(render.started for render in alone)
    waited_for = [
        other
        for other in renders
        if not other.alone and not other.handed_back and other.started < max(r.ended for r in handed_back)
    ]
    assert all(other.ended <= first_alone for other in waited_for)
    # (with one over its slot, the other render slot was free: a shared render was surely in; with two,
    # both slots may have been theirs, and nothing else rendering when they were handed back)
    assert waited_for or over_slot == 2
    # AND records that came after waited for it: some rendered once it was done
    last_alone = max(render.ended for render in alone)
    assert any(other.started >= last_alone for other in renders if not other.alone)


def test_what_no_render_of_the_function_could_hold_fails_from_its_header(
    infra: Infra, db: Engine, renders: list[Render]
) -> None:
    # GIVEN the same function, and a progressive 4:4:4 JPEG of 6000 x 4000 (144 MB of coefficients,
    # more than the whole 100 MB)
    settings = replace(infra.settings, aws_lambda_function_memory_size=MEMORY_MB)
    queue = SqsQueue(infra.sqs, settings.process_queue_url, settings.dead_letter_queue_url)
    service = PhotoService(db, S3Store(infra.s3, BUCKET), queue, settings)
    large = samples.photograph().resize(6000 / 2560, vscale=4000 / 1600)
    data = bytes(large.jpegsave_buffer(interlace=True, subsample_mode="off"))
    shot = uploads.upload(db, infra.s3, BUCKET, STAGE, file_name="large.jpg", data=data)

    # WHEN it is processed
    result = service.process(PhotoRequest(shot.photo_id))

    # THEN it failed for good with DIMENSIONS_EXCEEDED from its header (its shared render was not
    # handed back to render alone, and nothing rendered alone)
    assert (result.outcome, result.code) == (Outcome.FAILED, "DIMENSIONS_EXCEEDED")
    assert photo(db, shot.photo_id)[:2] == ("processing_failed", "DIMENSIONS_EXCEEDED")
    assert [(render.alone, render.handed_back) for render in renders] == [(False, False)]
