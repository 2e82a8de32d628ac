"""What an upload API does, and all it must do (SPEC 11): two rows, then the original in S3."""

from __future__ import annotations

import mimetypes
import uuid
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from sqlalchemy import Engine

from photo_publish.jobs import machine
from photo_publish.keys import original_key


@dataclass(frozen=True)
class Upload:
    album_id: UUID
    photo_id: UUID
    key: str


def register(
    engine: Engine,
    stage: str,
    file_name: str,
    album_id: UUID | None = None,
    photo_id: UUID | None = None,
    *,
    keep_location: bool = False,
) -> Upload:
    """The API's insert: a photo row and its job row, every other column left to its default (but
    the user's agreement to keep its location, where given)."""
    upload_ = Upload(album_id or uuid.uuid4(), photo_id or uuid.uuid4(), "")
    key = original_key(stage, upload_.album_id, upload_.photo_id, file_name)
    with engine.begin() as connection:
        machine.register(connection, upload_.photo_id, upload_.album_id, key, keep_location=keep_location)
    return Upload(upload_.album_id, upload_.photo_id, key)


def put_original(s3: Any, bucket: str, key: str, data: bytes) -> None:
    content_type = mimetypes.guess_type(key)[0] or "application/octet-stream"
    s3.put_object(Bucket=bucket, Key=key, Body=data, ContentType=content_type)


def upload(
    engine: Engine,
    s3: Any,
    bucket: str,
    stage: str,
    *,
    file_name: str,
    data: bytes,
    album_id: UUID | None = None,
    keep_location: bool = False,
) -> Upload:
    registered = register(engine, stage, file_name, album_id, keep_location=keep_location)
    put_original(s3, bucket, registered.key, data)
    return registered
