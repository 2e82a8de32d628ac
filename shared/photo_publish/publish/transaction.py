"""The publish transaction (SPEC 4.1) and a re-render's (SPEC 14), each readable top to bottom.

One transaction, all or nothing: the job's transition out of `active` (fenced by the attempt its
worker claimed), the photo's conditional UPDATE (only one worker publishes it), the variant rows,
and the outbox event. The caller opens and commits it (`adapters.unit_of_work`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal
from uuid import UUID

from sqlalchemy import Connection, delete, func, select, true, update
from sqlalchemy.dialects.postgresql import insert

from photo_publish.adapters.storage import UNNAMED, Pin
from photo_publish.adapters.tables import photo_variants, photos, retired_variants
from photo_publish.contracts import (
    NO_CAPTURE,
    PHOTO_PUBLISHED,
    PHOTO_VARIANTS_UPDATED,
    Capture,
    Location,
    PhotoPublishedPayload,
    Placeholder,
    PublishedVariants,
    VariantRef,
)
from photo_publish.jobs import machine
from photo_publish.keys import FIXED_KINDS, VariantKind
from photo_publish.outbox import writer


@dataclass(frozen=True, slots=True)
class StoredVariant:
    # "thumb", "browse", or a ladder step ("w640-webp", keys.py)
    kind: VariantKind
    key: str
    width: int
    height: int
    size: int
    content_type: str


@dataclass(frozen=True, slots=True)
class Rendition:
    """What a render commits, publishing or replacing: the photo's displayed size, its variants
    (stored under `variant_version`'s keys), its placeholder and capture metadata, and the original
    they were rendered from (SPEC 19), recorded with them."""

    width: int
    height: int
    variants: Sequence[StoredVariant]
    variant_version: int
    placeholder: Placeholder
    capture: Capture = NO_CAPTURE
    original: Pin = UNNAMED


@dataclass(frozen=True, slots=True)
class PublishResult:
    outcome: Literal["published", "rerendered", "already", "skipped", "superseded"]
    payload: PhotoPublishedPayload | None = None


def publish(connection: Connection, photo_id: UUID, attempt: int, rendition: Rendition) -> PublishResult:
    """SPEC 4.1: variants, publication and outbox event in one transaction, all or nothing.

    Fenced first: only the worker that holds the job's claimed attempt may publish, so a worker
    whose job was taken over changes nothing (its job row is locked before the photo's, the
    order every transaction here takes them in).
    """
    if not machine.publish(connection, photo_id, attempt):
        return PublishResult(_superseded_or_skipped(connection, photo_id))
    published = machine.publish_photo(connection, photo_id, _columns(rendition))
    if published is None:
        # Zero rows: published already (by a worker of an earlier claim), or deleted.
        exists = connection.scalar(select(photos.c.id).where(photos.c.id == photo_id)) is not None
        return PublishResult("already" if exists else "skipped")
    _store_variants(connection, photo_id, rendition)
    payload, _ = _append_event(connection, PHOTO_PUBLISHED, photo_id, published, rendition)
    return PublishResult("published", payload)


def replace_variants(
    connection: Connection,
    photo_id: UUID,
    attempt: int,
    rendition: Rendition,
    *,
    retire_after: timedelta,
    new_picture: bool = False,
) -> PublishResult:
    """SPEC 14: a published photo's variants re-rendered at a newer recipe, in one transaction.

    The photo's new rows, its version bump and photo.variants_updated, or nothing. The objects
    of the version it replaces are retired, to be deleted after `retire_after`: clients and
    caches may still hold their keys.

    With `new_picture`, the variants are of another original than the published picture's (its key
    written again, SPEC 19): the same replacement, told as what it is, `photo.published` with the
    new entity version (a new picture, as a first upload's), whatever the recipe versions.
    """
    if not machine.publish(connection, photo_id, attempt):
        return PublishResult(_superseded_or_skipped(connection, photo_id))
    # Published at this version meanwhile (a new upload's own render): nothing to re-render.
    due = true() if new_picture else func.coalesce(photos.c.variant_version, 0) < rendition.variant_version
    replaced = connection.execute(
        update(photos)
        .where(photos.c.id == photo_id, photos.c.processing_state == "ready", due)
        .values(**_columns(rendition))
        .returning(photos.c.album_id, photos.c.entity_version, photos.c.published_at)
    ).one_or_none()
    if replaced is None:
        exists = connection.scalar(select(photos.c.id).where(photos.c.id == photo_id)) is not None
        return PublishResult("already" if exists else "skipped")
    old_keys = connection.scalars(
        select(photo_variants.c.storage_key)
        .where(
            photo_variants.c.photo_id == photo_id,
            photo_variants.c.storage_key.not_in([v.key for v in rendition.variants]),
        )
        # two rows may name one object (the ladder's step at the browse's size)
        .distinct()
    ).all()
    _store_variants(connection, photo_id, rendition)
    payload, event_id = _append_event(
        connection, PHOTO_PUBLISHED if new_picture else PHOTO_VARIANTS_UPDATED, photo_id, replaced, rendition
    )
    if old_keys:
        # Deleted once `retire_after` has passed and the event telling consumers of the new
        # keys has been out of the outbox as long (the sweep): the old ones may be cached.
        connection.execute(
            insert(retired_variants)
            .values(
                [
                    {
                        "storage_key": key,
                        "photo_id": photo_id,
                        "delete_after": func.now() + retire_after,
                        "event_id": event_id,
                    }
                    for key in old_keys
                ]
            )
            .on_conflict_do_nothing(index_elements=[retired_variants.c.storage_key])
        )
    return PublishResult("published" if new_picture else "rerendered", payload)


def _superseded_or_skipped(connection: Connection, photo_id: UUID) -> Literal["superseded", "skipped"]:
    """A fenced-out transition: another claim owns the job, or the photo (and its job) is gone."""
    exists = connection.scalar(select(photos.c.id).where(photos.c.id == photo_id)) is not None
    return "superseded" if exists else "skipped"


def _store_variants(connection: Connection, photo_id: UUID, rendition: Rendition) -> None:
    """The photo's rows become exactly the rendition's variants: a kind of an older recipe that this
    one does not render (a ladder step it dropped) goes with it."""
    variants, variant_version = rendition.variants, rendition.variant_version
    connection.execute(
        delete(photo_variants).where(
            photo_variants.c.photo_id == photo_id, photo_variants.c.kind.not_in([v.kind for v in variants])
        )
    )
    stmt = insert(photo_variants).values(
        [
            {
                "photo_id": photo_id,
                "kind": v.kind,
                "storage_key": v.key,
                "width": v.width,
                "height": v.height,
                "bytes": v.size,
                "content_type": v.content_type,
                "variant_version": variant_version,
            }
            for v in variants
        ]
    )
    connection.execute(
        stmt.on_conflict_do_update(
            index_elements=[photo_variants.c.photo_id, photo_variants.c.kind],
            set_={
                "storage_key": stmt.excluded.storage_key,
                "width": stmt.excluded.width,
                "height": stmt.excluded.height,
                "bytes": stmt.excluded.bytes,
                "content_type": stmt.excluded.content_type,
                "variant_version": stmt.excluded.variant_version,
                "updated_at": func.now(),
            },
        )
    )


def _append_event(
    connection: Connection, event_type: str, photo_id: UUID, photo: Any, rendition: Rendition
) -> tuple[PhotoPublishedPayload, UUID]:
    """The outbox row of a publication or a re-render (the same payload, SPEC 14), and its id."""
    album_id, entity_version, published_at = photo
    assert published_at is not None  # set when the photo was published
    refs = {
        v.kind: VariantRef(
            key=v.key, width=v.width, height=v.height, size=v.size, content_type=v.content_type
        )
        for v in rendition.variants
    }
    fixed = {kind: refs.pop(kind) for kind in FIXED_KINDS}
    payload = PhotoPublishedPayload(
        photo_id=photo_id,
        album_id=album_id,
        entity_version=entity_version,
        published_at=published_at,
        width=rendition.width,
        height=rendition.height,
        variants=PublishedVariants(**fixed),
        placeholder=rendition.placeholder,
        # In the render's order: by width, a step's formats in the configured order.
        ladder=tuple(refs.values()),
        capture=rendition.capture,
    )
    return payload, writer.append_published(connection, event_type, payload)


def _columns(rendition: Rendition) -> dict[str, Any]:
    """The photo's columns a render sets, publishing or re-rendering: its displayed size, its
    variants' version, its placeholder, its capture metadata, the original it was read from, and one
    version bump."""
    original = rendition.original
    # Nothing read to record (an object store that names nothing): the recorded original stays.
    read = (
        {} if original == UNNAMED else {"original_etag": original.etag, "original_version": original.version}
    )
    return {
        **read,
        "width": rendition.width,
        "height": rendition.height,
        "variant_version": rendition.variant_version,
        "thumbhash": rendition.placeholder.thumbhash,
        "average_color": rendition.placeholder.average_color,
        **capture_columns(rendition.capture),
        "entity_version": photos.c.entity_version + 1,
        "updated_at": func.now(),
    }


def capture_columns(capture: Capture) -> dict[str, Any]:
    """The photo's capture columns, each set (to null where the photo says nothing: a new upload's
    render leaves nothing of the last one's)."""
    location = capture.location
    return {
        "taken_at": capture.taken_at,
        "taken_at_local": capture.taken_at_local,
        "camera_make": capture.make,
        "camera_model": capture.model,
        "lens_model": capture.lens,
        "f_number": capture.f_number,
        "exposure_time": capture.exposure_time,
        "iso": capture.iso,
        "focal_length": capture.focal_length,
        "latitude": location.latitude if location else None,
        "longitude": location.longitude if location else None,
        "altitude": location.altitude if location else None,
    }


def capture_of(photo: Any) -> Capture:
    """A photos row's capture columns, as the payload carries them (`capture_columns` read back)."""
    return Capture(
        taken_at=photo.taken_at,
        taken_at_local=photo.taken_at_local,
        make=photo.camera_make,
        model=photo.camera_model,
        lens=photo.lens_model,
        f_number=photo.f_number,
        exposure_time=photo.exposure_time,
        iso=photo.iso,
        focal_length=photo.focal_length,
        location=(
            None
            if photo.latitude is None
            else Location(latitude=photo.latitude, longitude=photo.longitude, altitude=photo.altitude)
        ),
    )
