"""Capture metadata through the real parts (SPEC 18): a registration with and without the user's
agreement to keep the location, the browser's POST to moto's S3, the process function, PostgreSQL;
the photo's row, its photo.published payload, its status, and every variant object it wrote."""

from __future__ import annotations

import io
import json
import logging
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import pyvips
import requests
from sqlalchemy import Engine, select, update
from sqlalchemy.exc import IntegrityError

from devkit import exif, samples, uploads
from photo_publish.adapters.models import OutboxEvent, Photo, PhotoJob
from photo_publish.contracts import (
    NO_CAPTURE,
    PHOTO_PUBLISHED,
    PHOTO_VARIANTS_UPDATED,
    Capture,
    PhotoPublishedPayload,
)
from photo_publish.keys import photo_prefixes
from photo_publish.observability import logger
from photo_publish.publish import repository, transaction
from photo_publish.publish.transaction import Rendition, capture_of
from tests.conftest import BUCKET, STAGE, Infra
from tests.integration.test_database import PLACEHOLDER, VARIANTS, new_photo, set_job
from tests.integration.test_upload_function import call, register
from tests.polling import poll_until
from tests.readers import metadata_in
from tests.rows import committed, published

# Strings of the original's metadata that no variant may carry, whatever its format.
XMP_MARKER = "photo-publish-xmp-marker"
MARKERS = (*(s.encode() for s in (exif.MAKE_TEXT, exif.MODEL_TEXT, exif.LENS_TEXT, XMP_MARKER)), b"Exif\0\0")
CAMERA, WITH_POSITION = exif.CAMERA, exif.CAMERA_WITH_POSITION


@pytest.fixture(scope="module")
def camera_jpeg() -> bytes:
    """A phone's JPEG: pixels in Display P3 with the profile, a phone's EXIF with GPS, and XMP."""
    upright = samples.photograph().thumbnail_image(1200)
    profiled = upright.icc_transform("p3", input_profile="srgb").jpegsave_buffer(Q=90, keep="icc")
    data = exif.jpeg_with(bytes(profiled), exif=exif.camera(), xmp_packet=exif.xmp(XMP_MARKER))
    # As libvips reads it: every kind of metadata is there to be stripped
    header = pyvips.Image.new_from_buffer(data, "")
    assert all(header.get_typeof(field) for field in ("exif-data", "xmp-data", "icc-profile-data"))
    return data


def photo_row(db: Engine, photo_id: uuid.UUID) -> Any:
    with db.connect() as connection:
        return connection.execute(select(Photo).where(Photo.id == photo_id)).one()


def published_payload(db: Engine, photo_id: uuid.UUID, event_type: str = PHOTO_PUBLISHED) -> dict[str, Any]:
    with db.connect() as connection:
        (payload,) = connection.scalars(
            select(OutboxEvent.payload).where(
                OutboxEvent.aggregate_id == photo_id, OutboxEvent.event_type == event_type
            )
        ).all()
    return dict(payload)


def variant_objects(infra: Infra, album_id: uuid.UUID, photo_id: uuid.UUID) -> dict[str, bytes]:
    variants_prefix = photo_prefixes(STAGE, album_id, photo_id)[-1]
    listed = infra.s3.list_objects_v2(Bucket=BUCKET, Prefix=variants_prefix).get("Contents", [])
    return {o["Key"]: infra.s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for o in listed}


def assert_stripped(objects: dict[str, bytes]) -> None:
    """Every variant object (at least thumb and browse) is free of the original's metadata."""
    assert len(objects) >= 2
    assert {key: metadata_in(data, markers=MARKERS) for key, data in objects.items()} == {
        key: [] for key in objects
    }


@pytest.mark.parametrize(
    ("body", "kept"),
    [({}, False), ({"keepLocation": False}, False), ({"keepLocation": True}, True)],
    ids=["not-said", "declined", "agreed"],
)
def test_a_phones_jpeg_publishes_its_capture_and_its_position_only_where_the_user_agreed(
    infra: Infra, db: Engine, camera_jpeg: bytes, body: dict[str, Any], kept: bool
) -> None:
    # GIVEN a registration through the upload function, saying (or not) that the user agreed
    album = str(uuid.uuid4())
    request = {"fileName": "IMG_0001.JPG", "contentType": "image/jpeg", "size": len(camera_jpeg)} | body
    registered = json.loads(register(album, request)["body"])
    photo_id = uuid.UUID(registered["photoId"])

    # WHEN the browser posts a phone's JPEG (EXIF with GPS, XMP, a P3 profile) and the queue runs
    form = registered["upload"]
    files = {"file": ("IMG_0001.JPG", camera_jpeg)}
    assert requests.post(form["url"], data=form["fields"], files=files, timeout=30).ok
    poll_until(infra, published(db, photo_id))

    # THEN the row has the capture, and the position only where the user agreed
    expected = WITH_POSITION if kept else CAMERA
    row = photo_row(db, photo_id)
    assert row.keep_location is kept
    assert capture_of(row) == expected
    assert (row.latitude is None, row.longitude is None, row.altitude is None) == (not kept,) * 3
    # AND the payload (schema 3) carries the same, as a consumer reads it
    payload = published_payload(db, photo_id)
    assert payload["schemaVersion"] == 3
    assert PhotoPublishedPayload.from_json(payload).capture == expected
    assert (payload["capture"]["location"] is None) is not kept
    # AND so does the status answer
    status = call("GET", f"/photos/{photo_id}", "/photos/{photoId}", photoId=str(photo_id))
    assert json.loads(status["body"])["capture"] == expected.to_json()
    # AND no variant object carries any of the original's metadata: no EXIF (nor its GPS), no XMP,
    # no ICC profile, in any format
    assert_stripped(variant_objects(infra, uuid.UUID(album), photo_id))


def test_the_variant_check_sees_metadata_where_there_is_some(camera_jpeg: bytes) -> None:
    # A control: the check above passes only because it finds nothing, so it must find this
    upright = pyvips.Image.new_from_buffer(camera_jpeg, "")
    webp = bytes(upright.webpsave_buffer(keep="all"))
    assert {"exif-data", "xmp-data", "icc-profile-data"} <= set(metadata_in(webp, markers=MARKERS))
    assert "chunk b'EXIF'" in metadata_in(webp)


def test_a_heic_with_exif_gives_its_capture_time(infra: Infra, db: Engine) -> None:
    # GIVEN an iPhone-like HEIC (HEVC, tiles) carrying a phone's EXIF, its user agreeing to the position
    upright = samples.photograph().thumbnail_image(1024)
    data = samples.heic(upright, tile_size=256, exif=exif.camera(orientation=1))
    upload = uploads.upload(
        db, infra.s3, BUCKET, STAGE, file_name="IMG_0002.HEIC", data=data, keep_location=True
    )

    # WHEN it is processed
    poll_until(infra, published(db, upload.photo_id))

    # THEN it was taken at 16:42:07.123 UTC (18:42:07.123 on the phone's clock, at +02:00), there
    row = photo_row(db, upload.photo_id)
    assert capture_of(row) == WITH_POSITION
    assert PhotoPublishedPayload.from_json(published_payload(db, upload.photo_id)).capture == WITH_POSITION
    # AND its variants carry none of it
    assert_stripped(variant_objects(infra, upload.album_id, upload.photo_id))


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    """The functions' log lines (JSON, as CloudWatch gets them: appended keys included), from now on."""
    handler = logger.registered_handler
    assert isinstance(handler, logging.StreamHandler)
    lines = io.StringIO()
    kept = handler.setStream(lines)
    try:
        yield lines
    finally:
        handler.setStream(kept)


def test_a_photo_with_hostile_exif_publishes_with_one_warning(
    infra: Infra, db: Engine, log_lines: io.StringIO
) -> None:
    # GIVEN a JPEG whose EXIF has a make of four billion characters, a month 13 and an f-number over
    # zero, but a model that can be read
    block = exif.block(
        [exif.Entry(exif.MAKE, exif.ASCII, b"Canon\0", count=2**32 - 1), exif.text(exif.MODEL, "EOS 5D")],
        [exif.text(exif.DATE_TIME_ORIGINAL, "2024:13:01 10:00:00"), exif.rational(exif.F_NUMBER, (28, 0))],
    )
    jpeg = bytes(samples.photograph().thumbnail_image(800).jpegsave_buffer(keep="none"))
    upload = uploads.upload(
        db, infra.s3, BUCKET, STAGE, file_name="hostile.jpg", data=exif.jpeg_with(jpeg, exif=block)
    )

    # WHEN it is processed
    poll_until(infra, published(db, upload.photo_id))

    # THEN it is published, with what could be read
    assert capture_of(photo_row(db, upload.photo_id)) == Capture(model="EOS 5D")
    # AND one warning says why the rest stayed empty, with the photo's keys
    lines = [json.loads(line) for line in log_lines.getvalue().splitlines()]
    [warning] = [line for line in lines if line.get("message") == "capture metadata left empty"]
    assert warning["level"] == "WARNING"
    assert (warning["photo_id"], warning["album_id"], warning["attempt"]) == (
        str(upload.photo_id),
        str(upload.album_id),
        1,
    )
    assert warning["problem"] == (
        "DateTimeOriginal: month must be in 1..12; "
        "Make: its 4294967295 bytes run past the end of the block; FNumber: a rational over zero"
    )


def test_the_table_refuses_a_position_on_a_photo_whose_user_did_not_agree(db: Engine) -> None:
    # GIVEN a photo registered without the agreement, and one with it
    declined = new_photo(db)
    agreed = new_photo(db)
    with db.begin() as connection:
        connection.execute(update(Photo).where(Photo.id == agreed).values(keep_location=True))

    # WHEN / THEN a position is refused on the first, stored on the second
    with pytest.raises(IntegrityError, match="photos_location_check"), db.begin() as connection:
        connection.execute(update(Photo).where(Photo.id == declined).values(latitude=48.9, longitude=2.35))
    with db.begin() as connection:
        connection.execute(update(Photo).where(Photo.id == agreed).values(latitude=48.9, longitude=2.35))
    # AND half a position, or one off the globe, is refused on any photo
    for values in ({"latitude": 48.9}, {"latitude": 91, "longitude": 0}, {"altitude": 35.0}):
        with pytest.raises(IntegrityError, match="photos_location_check"), db.begin() as connection:
            cleared: dict[str, Any] = {"latitude": None, "longitude": None, "altitude": None}
            connection.execute(update(Photo).where(Photo.id == agreed).values(**(cleared | values)))


def test_a_rerender_replaces_the_capture_on_the_row_and_in_its_event(db: Engine) -> None:
    # GIVEN a photo published with a phone's capture
    photo_id = new_photo(db)
    committed(db, repository.claim, photo_id, stale_after=300, max_attempts=3)
    first = committed(
        db, transaction.publish, photo_id, 1, Rendition(10, 10, VARIANTS, 1, PLACEHOLDER, CAMERA)
    )
    assert first.payload is not None and first.payload.capture == CAMERA
    set_job(db, photo_id, status="active", attempt=2)

    # WHEN a re-render (a backfill's) finds no EXIF in it any more (a new original, say)
    result = committed(
        db,
        transaction.replace_variants,
        photo_id,
        2,
        Rendition(10, 10, VARIANTS, 2, PLACEHOLDER, NO_CAPTURE),
        retire_after=timedelta(days=1),
    )

    # THEN nothing of the old capture is left on the row, and photo.variants_updated says so
    assert result.outcome == "rerendered"
    assert capture_of(photo_row(db, photo_id)) == NO_CAPTURE
    updated = published_payload(db, photo_id, PHOTO_VARIANTS_UPDATED)
    assert PhotoPublishedPayload.from_json(updated).capture == NO_CAPTURE
    with db.connect() as connection:
        assert connection.scalar(select(PhotoJob.status).where(PhotoJob.photo_id == photo_id)) == "done"
