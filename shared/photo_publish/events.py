"""Every event shape of SPEC 6, turned into the photos it asks the process function to work on."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote_plus
from uuid import UUID

from photo_publish.keys import MalformedKey, OriginalKey, Upload, parse_original_key, parse_uuid


class MalformedMessage(ValueError):
    """A record no producer of ours would send: acknowledged, logged and counted, never retried."""


@dataclass(frozen=True, slots=True)
class PhotoRequest:
    photo_id: UUID
    # Set when an upload of this original caused the request: the key must be the photo's own.
    original: OriginalKey | None = None
    upload: Upload | None = None


def is_s3_event(event: Mapping[str, Any]) -> bool:
    """S3 invoking the function itself (as `sam local invoke` with a generated event does)."""
    records = event.get("Records")
    return (
        isinstance(records, list)
        and bool(records)
        and isinstance(records[0], dict)
        and records[0].get("eventSource") == "aws:s3"
    )


def from_s3_records(records: Iterable[Mapping[str, Any]], *, bucket: str, stage: str) -> list[PhotoRequest]:
    # The fields Powertools' S3Event data class reads, read as it reads them (its package, about
    # 20 ms of a cold start for the 40 event types it imports, is not loaded for these few keys).
    try:
        uploads = [
            (
                record["s3"]["bucket"]["name"],
                unquote_plus(_s3_object(record)["key"]),
                _upload(_s3_object(record), record.get("eventTime")),
            )
            for record in records
            if record["eventSource"] == "aws:s3" and record["eventName"].startswith("ObjectCreated:")
        ]
        requests = [_object_created(name, key, upload, bucket, stage) for name, key, upload in uploads]
    except (KeyError, TypeError, AttributeError) as error:
        raise MalformedMessage(f"not an S3 event notification: {error!r}") from None
    return [request for request in requests if request is not None]


def from_sqs_body(body: str, *, bucket: str, stage: str) -> list[PhotoRequest]:
    """The photos an SQS record's body asks for; empty for records that are not ours to act on."""
    try:
        message = json.loads(body)
    except RecursionError:
        # Nested deeper than the parser's stack (a few KB of "[[[[..."): nobody's event.
        raise MalformedMessage("the body nests too deeply") from None
    except ValueError:
        raise MalformedMessage("the body is not JSON") from None
    if not isinstance(message, dict):
        raise MalformedMessage("the body is not a JSON object")

    if "Records" in message:
        if not isinstance(message["Records"], list):
            raise MalformedMessage("Records is not a list")
        return from_s3_records(message["Records"], bucket=bucket, stage=stage)
    if message.get("Event") == "s3:TestEvent":
        return []
    if message.get("source") == "aws.s3" and "detail" in message:
        return _from_eventbridge(message, bucket=bucket, stage=stage)
    if "photoId" in message:
        try:
            return [PhotoRequest(parse_uuid(message["photoId"]))]
        except MalformedKey as error:
            raise MalformedMessage(str(error)) from None
    raise MalformedMessage("no known message shape")


def _s3_object(record: Mapping[str, Any]) -> Mapping[str, Any]:
    """A notification record's object (Intelligent-Tiering events name it `get_object`)."""
    # Not named `s3`: test_template reads `s3.<method>(` as a call of the S3 client.
    entity: Mapping[str, Any] = record["s3"]
    s3_object: Mapping[str, Any] = entity.get("get_object") or entity["object"]
    return s3_object


def _from_eventbridge(message: dict[str, Any], *, bucket: str, stage: str) -> list[PhotoRequest]:
    try:
        if message["detail-type"] != "Object Created":
            return []
        detail = message["detail"]
        s3_object = detail["object"]
        request = _object_created(
            detail["bucket"]["name"],
            unquote_plus(s3_object["key"]),
            _upload(s3_object, message.get("time")),
            bucket,
            stage,
        )
    except (KeyError, TypeError, AttributeError) as error:
        raise MalformedMessage(f"not an S3 Object Created event: {error!r}") from None
    return [] if request is None else [request]


def _upload(s3_object: Mapping[str, Any], event_time: object) -> Upload:
    # S3's notifications spell them eTag and versionId, its EventBridge events etag and version-id.
    etag = s3_object.get("eTag", s3_object.get("etag"))
    sequencer = s3_object.get("sequencer")
    version = s3_object.get("versionId", s3_object.get("version-id"))
    return Upload(
        sequencer=sequencer if isinstance(sequencer, str) and sequencer else None,
        etag=etag.strip('"') or None if isinstance(etag, str) else None,
        at=_instant(event_time),
        # "null" is the version of an object written while versioning was off or suspended: a later
        # such write replaces it under the same id, so it pins nothing (the eTag does).
        version=version if isinstance(version, str) and version and version != "null" else None,
    )


def _instant(text: object) -> datetime | None:
    """An event's ISO-8601 time ("2026-11-29T10:15:30.123Z"); None if it has none that reads."""
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.utcoffset() is not None else moment.replace(tzinfo=UTC)


def _object_created(
    event_bucket: str, key: str, upload: Upload, bucket: str, stage: str
) -> PhotoRequest | None:
    if event_bucket != bucket:
        return None
    try:
        original = parse_original_key(key, stage)
    except MalformedKey as error:
        raise MalformedMessage(str(error)) from None
    return None if original is None else PhotoRequest(original.photo_id, original, upload)
