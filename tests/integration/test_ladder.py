"""The responsive ladder and AVIF (SPEC 18) through the real process handler, sweep and operator, on
PostgreSQL and moto's S3 + SQS: rows, objects and payloads agree, and a backfill moves photos to it."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest
import pyvips
from sqlalchemy import Engine, func, select, update

from devkit import samples, uploads
from photo_publish import uploads as api
from photo_publish.adapters.models import OutboxEvent, PhotoVariant, RetiredVariant
from photo_publish.contracts import PhotoPublishedPayload
from photo_publish.image import ladder
from tests.conftest import BUCKET, STAGE, Infra
from tests.integration.test_backfill import objects, rerender, versions
from tests.polling import poll_until, sweep
from tests.readers import metadata_in

BOTH = ("webp", "avif")


def variant_rows(db: Engine, photo_id: UUID) -> list[Any]:
    with db.connect() as c:
        return list(c.execute(select(PhotoVariant).where(PhotoVariant.photo_id == photo_id)).all())


def payloads(db: Engine, photo_id: UUID, event_type: str) -> list[PhotoPublishedPayload]:
    with db.connect() as c:
        documents = c.scalars(
            select(OutboxEvent.payload).where(
                OutboxEvent.aggregate_id == photo_id, OutboxEvent.event_type == event_type
            )
        ).all()
    return [PhotoPublishedPayload.from_json(document) for document in documents]


def assert_agree(
    infra: Infra, rows: list[Any], payload: PhotoPublishedPayload, formats: tuple[str, ...]
) -> None:
    """The rows, the objects and the payload say the same of every variant, and every object is a
    picture of its stated size and type with no metadata at all."""
    by_kind = {row.kind: row for row in rows}
    browse_edge = max(by_kind["browse"].width, by_kind["browse"].height)
    steps = ladder.steps(infra.settings.variant_widths, browse_edge)
    assert set(by_kind) == {"thumb", "browse"} | {f"w{w}-{f}" for w in steps for f in formats}
    # the payload's ladder: every step in every format, by width, each entry its row's
    expected = [by_kind[f"w{w}-{f}"] for w in steps for f in formats]
    assert payload.ladder is not None
    assert [(s.key, s.width, s.height, s.size, s.content_type) for s in payload.ladder] == [
        (r.storage_key, r.width, r.height, r.bytes, r.content_type) for r in expected
    ]
    assert (payload.variants.browse.key, payload.variants.thumb.key) == (
        by_kind["browse"].storage_key,
        by_kind["thumb"].storage_key,
    )
    for row in rows:
        extension = row.content_type.removeprefix("image/")
        # the WebP step at the browse's size is the browse object; every other variant its own
        own = "browse" if row.kind == f"w{browse_edge}-webp" else row.kind
        assert row.storage_key.endswith(f"/{row.variant_version}/{own}.{extension}")
        obj = infra.s3.get_object(Bucket=BUCKET, Key=row.storage_key)
        data = obj["Body"].read()
        assert (obj["ContentType"], len(data)) == (row.content_type, row.bytes)
        assert obj["CacheControl"] == "public, max-age=31536000, immutable"
        image = pyvips.Image.new_from_buffer(data, "")
        assert (image.width, image.height) == (row.width, row.height)
        # every variant object written, of every kind and format: no EXIF, XMP, IPTC nor ICC profile
        assert metadata_in(data) == [], row.kind


def test_a_photo_publishes_its_ladder_in_both_formats_with_rows_objects_and_payload_agreeing(
    infra: Infra, db: Engine
) -> None:
    # GIVEN the ladder in WebP and AVIF, and a camera photograph with EXIF uploaded
    infra.configure(variant_formats=BOTH)
    data = (samples.IMAGES / "Wood.jpg").read_bytes()
    shot = uploads.upload(db, infra.s3, BUCKET, STAGE, file_name="Wood.jpg", data=data)

    # WHEN the queue's messages reach the process function
    poll_until(infra, lambda: versions(db, [shot.photo_id]) == [(2, infra.settings.variant_version)])

    # THEN one photo.published event (schema 3) lists the ladder, and rows, objects and payload agree
    (payload,) = payloads(db, shot.photo_id, "photo.published")
    assert payload.schema_version == 3
    assert_agree(infra, variant_rows(db, shot.photo_id), payload, BOTH)
    # AND the status answer lists the ladder with the URLs under the configured base
    infra.configure(variant_base_url="https://cdn.example.com")
    status = api.status(db, shot.photo_id, base_url=infra.settings.variant_base_url, caller=api.BACKEND)
    assert status is not None
    assert [(s["key"], s["contentType"]) for s in status["ladder"]] == [
        (s.key, s.content_type) for s in payload.ladder or ()
    ]
    assert all(s["url"] == f"https://cdn.example.com/{s['key']}" for s in status["ladder"])
    assert set(status["variants"]) == {"thumb", "browse"}


def test_a_backfill_moves_photos_to_the_ladder_and_retires_the_old_objects(
    infra: Infra, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN two photos published at version 1 (thumb and browse alone: the recipe before the ladder)
    infra.configure(variant_version=1, variant_widths=())
    shots = [
        uploads.upload(db, infra.s3, BUCKET, STAGE, file_name=n, data=(samples.IMAGES / n).read_bytes())
        for n in ("Garden.jpg", "Storm.jpg")
    ]
    photo_ids = [s.photo_id for s in shots]
    poll_until(infra, lambda: versions(db, photo_ids) == [(2, 1)] * 2)
    old = {p: objects(infra, p) for p in photo_ids}
    assert all(len(keys) == 2 for keys in old.values())

    # WHEN a deployment adds the ladder in both formats as version 2 and the operator backfills
    infra.configure(
        variant_version=2,
        variant_widths=(320, 640, 960, 1280),
        variant_formats=BOTH,
        backfill_spread_seconds=0,
    )
    assert rerender(capsys, "--all") == {"version": 2, "marked": 2}
    assert sweep()["backfillSent"] == 2
    poll_until(infra, lambda: versions(db, photo_ids) == [(3, 2)] * 2)

    # THEN each photo has the ladder's rows and objects at version 2, told by photo.variants_updated
    for photo_id in photo_ids:
        rows = variant_rows(db, photo_id)
        assert {r.variant_version for r in rows} == {2}
        (payload,) = payloads(db, photo_id, "photo.variants_updated")
        assert_agree(infra, rows, payload, BOTH)
        assert objects(infra, photo_id) == old[photo_id] | {r.storage_key for r in rows}
    # AND the old version's objects (and only them) are retired, deleted once their grace has passed
    with db.connect() as c:
        retired = set(c.scalars(select(RetiredVariant.storage_key)).all())
    assert retired == old[photo_ids[0]] | old[photo_ids[1]]
    with db.begin() as c:
        c.execute(update(RetiredVariant).values(delete_after=func.now() - func.make_interval(0, 0, 0, 1)))
        c.execute(update(OutboxEvent).values(published_at=func.now() - func.make_interval(0, 0, 0, 8)))
    assert sweep()["retiredDeleted"] == 4
    for photo_id in photo_ids:
        assert objects(infra, photo_id) == {r.storage_key for r in variant_rows(db, photo_id)}


def test_a_backfill_to_a_shorter_ladder_drops_the_steps_it_no_longer_renders(
    infra: Infra, db: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    # GIVEN a photo published with the ladder in both formats
    infra.configure(variant_version=5, variant_formats=BOTH, backfill_spread_seconds=0)
    shot = uploads.upload(
        db, infra.s3, BUCKET, STAGE, file_name="Aqua.jpg", data=(samples.IMAGES / "Aqua.jpg").read_bytes()
    )
    poll_until(infra, lambda: versions(db, [shot.photo_id]) == [(2, 5)])
    before = {r.storage_key for r in variant_rows(db, shot.photo_id)}

    # WHEN a new version renders two steps in WebP alone, and the photo is backfilled to it
    infra.configure(variant_version=6, variant_widths=(640, 1280), variant_formats=("webp",))
    assert rerender(capsys, "--all")["marked"] == 1
    sweep()
    poll_until(infra, lambda: versions(db, [shot.photo_id]) == [(3, 6)])

    # THEN its rows are exactly the new recipe's (no row of a dropped step or format is left), and
    # every old object is retired
    rows = variant_rows(db, shot.photo_id)
    assert sorted(r.kind for r in rows) == ["browse", "thumb", "w1280-webp", "w640-webp"]
    (payload,) = payloads(db, shot.photo_id, "photo.variants_updated")
    assert_agree(infra, rows, payload, ("webp",))
    with db.connect() as c:
        assert set(c.scalars(select(RetiredVariant.storage_key)).all()) == before
