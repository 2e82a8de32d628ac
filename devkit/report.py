"""The demo's report: each photo's variants side by side with its database state, as one HTML page."""

from __future__ import annotations

import base64
import collections
import html
from pathlib import Path
from typing import Any
from uuid import UUID

from sqlalchemy import Engine, select

from photo_publish.adapters.models import OutboxEvent, Photo, PhotoJob, PhotoVariant
from photo_publish.image.thumbhash import thumbhash_to_png

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2rem; background: #f6f6f4; color: #222; }
h1 { font-size: 1.4rem; } .summary { margin-bottom: 1.5rem; }
.photo { display: grid; grid-template-columns: 200px 420px 1fr 320px; gap: 1rem; align-items: start;
         background: #fff; border-radius: 8px; padding: 1rem; margin-bottom: 1rem; }
.photo img { max-width: 100%; background: repeating-conic-gradient(#ddd 0 25%, #fff 0 50%) 0 0 / 16px 16px; }
.browse img { max-height: 360px; } .thumb img { width: auto; } .failed { border-left: 6px solid #c0392b; }
.ready { border-left: 6px solid #27ae60; } table { border-collapse: collapse; }
td { padding: 2px 8px; vertical-align: top; } td:first-child { color: #777; }
.missing { color: #c0392b; font-weight: 600; }
.placeholder img { width: 200px; } .swatch { display: inline-block; width: 1em; height: 1em;
         vertical-align: middle; border: 1px solid #0002; }
table.events { background: #fff; margin-bottom: 1.5rem; } .events th { text-align: left; padding: 2px 8px; }
.events td:first-child { color: inherit; }
"""


def failures(engine: Engine) -> dict[str, int]:
    with engine.connect() as connection:
        codes = connection.scalars(
            select(Photo.error_code).where(Photo.processing_state == "processing_failed")
        )
        return dict(collections.Counter(codes))


def events_table(received: list[dict[str, Any]], names: dict[UUID, str]) -> str:
    """The events a subscriber of the bus received, as it received them."""
    rows = []
    for envelope in received:
        data = envelope["detail"]["data"]
        name = names.get(UUID(data["photoId"]), data["photoId"])
        cells = [
            envelope["detail-type"],
            name,
            data.get("entityVersion"),
            data.get("errorCode", "-"),
            envelope["detail"]["eventId"],
        ]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return (
        f"<h2>Events a subscriber of the bus received ({len(received)})</h2>"
        "<p>A rule on the bus (source <code>photo-publish</code>) to the subscriber's queue: each event's "
        "<code>detail</code> is <code>{eventId, data}</code>; consumers deduplicate on eventId and order a "
        "photo's events by entityVersion.</p>"
        "<table class=events><tr><th>detail-type</th><th>photo</th><th>entityVersion</th><th>errorCode</th>"
        "<th>eventId</th></tr>" + "".join(rows) + "</table>"
    )


def write(
    output: Path,
    engine: Engine,
    s3: Any,
    bucket: str,
    names: dict[UUID, str],
    *,
    received: list[dict[str, Any]] | None = None,
) -> Path:
    images = output / "variants"
    images.mkdir(parents=True, exist_ok=True)
    with engine.connect() as connection:
        photos = {p.id: p for p in connection.execute(select(Photo).where(Photo.id.in_(names))).all()}
        jobs = {
            j.photo_id: j for j in connection.execute(select(PhotoJob).where(PhotoJob.photo_id.in_(names)))
        }
        variants = collections.defaultdict(dict)
        for v in connection.execute(select(PhotoVariant).where(PhotoVariant.photo_id.in_(names))):
            variants[v.photo_id][v.kind] = v
        events = collections.Counter(
            connection.scalars(select(OutboxEvent.aggregate_id).where(OutboxEvent.aggregate_id.in_(names)))
        )
    on_bus = collections.Counter(UUID(e["detail"]["data"]["photoId"]) for e in received or [])

    sections = []
    for photo_id, name in names.items():
        photo, job = photos[photo_id], jobs.get(photo_id)
        cells = {}
        for kind in ("thumb", "browse"):
            variant = variants[photo_id].get(kind)
            if variant is None:
                cells[kind] = '<p class="missing">no variant</p>'
                continue
            local = images / f"{photo_id}-{kind}.webp"
            local.write_bytes(s3.get_object(Bucket=bucket, Key=variant.storage_key)["Body"].read())
            cells[kind] = (
                f'<img src="variants/{local.name}" alt="{kind}"><br>{kind} {variant.width}x{variant.height}, '
                f"{variant.bytes / 1024:.0f} KiB"
            )
        cells["placeholder"] = '<p class="missing">no placeholder</p>'
        if photo.thumbhash:
            # What a client shows first: the ThumbHash decoded by our own decoder, stretched.
            local = images / f"{photo_id}-placeholder.png"
            local.write_bytes(thumbhash_to_png(base64.b64decode(photo.thumbhash)))
            cells["placeholder"] = (
                f'<img src="variants/{local.name}" alt="placeholder"><br>placeholder '
                f'<span class="swatch" style="background:{photo.average_color}"></span> {photo.average_color}'
            )
        facts = {
            "file": name,
            "state": f"{photo.processing_state}, {photo.visibility}",
            "size": f"{photo.width}x{photo.height}" if photo.width else "-",
            "entity_version": photo.entity_version,
            "error_code": photo.error_code or "-",
            "job": f"{job.status}, attempt {job.attempt}" if job else "-",
            "outbox events": events[photo_id],
            "events on the bus": on_bus[photo_id],
            "photo id": photo_id,
        }
        rows = "".join(f"<tr><td>{k}</td><td>{html.escape(str(v))}</td></tr>" for k, v in facts.items())
        css = "ready" if photo.processing_state == "ready" else "failed"
        sections.append(
            f'<section class="photo {css}"><div class="placeholder">{cells["placeholder"]}</div>'
            f'<div class="browse">{cells["browse"]}</div>'
            f'<div class="thumb">{cells["thumb"]}</div><table>{rows}</table></section>'
        )
    ready = sum(1 for p in photos.values() if p.processing_state == "ready")
    page = output / "report.html"
    page.write_text(
        f"<!doctype html><meta charset=utf-8><title>photo-publish demo</title><style>{STYLE}</style>"
        f"<h1>photo-publish demo</h1><p class=summary>{ready} of {len(names)} photos published, "
        f"{sum(events.values())} outbox events, {sum(on_bus.values())} received from the bus. Variants as "
        "stored in S3 (WebP, metadata stripped).</p>"
        + (events_table(received, names) if received is not None else "")
        + "".join(sections)
    )
    return page
