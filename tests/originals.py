"""Originals as the tests upload them: the project's photographs made small, so they render fast."""

from __future__ import annotations

from sqlalchemy import Engine

from devkit import samples, uploads
from tests.conftest import BUCKET, STAGE, Infra


def small(name: str) -> bytes:
    """One of the project's photographs as a small JPEG (fast to render)."""
    return bytes(samples.photograph(name).thumbnail_image(160).jpegsave_buffer(Q=85))


def upload(infra: Infra, db: Engine, name: str, data: bytes | None = None) -> uploads.Upload:
    """The photograph `name` registered and uploaded, small unless `data` is given."""
    return uploads.upload(
        db, infra.s3, BUCKET, STAGE, file_name=name, data=small(name) if data is None else data
    )
