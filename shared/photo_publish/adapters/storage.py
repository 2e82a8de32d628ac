"""S3, the object store: originals streamed in, variants written out."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from photo_publish.errors import ErrorCode, PhotoError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# Published variants are never rewritten under the same key (a pipeline change bumps the version).
IMMUTABLE = "public, max-age=31536000, immutable"
# S3 answers a missing key with 404 when the caller may list the prefix, else with 403.
_MISSING = frozenset({"NoSuchKey", "404", "NotFound"})
# The pinned upload is no longer there: its ETag's bytes were written over (If-Match), or its
# version was removed. A newer write took its place, and that write's own event follows.
_REPLACED = frozenset({"PreconditionFailed", "412", "NoSuchVersion"})


@dataclass(frozen=True, slots=True)
class Pin:
    """The upload a read must return (SPEC 19): its version where the bucket keeps versions, else
    its ETag's bytes."""

    etag: str | None = None
    version: str | None = None


# A read that names nothing (an object store that does not say what it returned).
UNNAMED = Pin()


class OriginalReplaced(Exception):
    """The pinned upload of an original was written over: not a failure, the newer write's event
    (or a job message, which reads the current object) processes the photo."""


# libvips asks for 4 KiB at a time; each read of the HTTP body costs tens of microseconds of Python
# under the interpreter lock, which the other record's render then waits for. Reading ahead in
# 256 KiB halves the time a 16 MB original takes to stream in, memory staying bounded.
READ_AHEAD = 256 * 1024


class OriginalStream:
    """The body of an original, read ahead in READ_AHEAD pieces, never past the byte limit.

    It counts the seconds its reads spent blocked on the body (`read_wait_seconds`): the network's
    time, which a render deadline must not hold against the file (SPEC 5). A body that stalls is
    ended by the S3 client's read timeout (bootstrap), a transient STORAGE_READ_FAILED.
    """

    def __init__(self, body: Any, limit: int, *, etag: str | None = None, version: str | None = None) -> None:
        self._body = body
        self._limit = limit
        # What was read (SPEC 19): recorded with the rendition made from these bytes.
        self.etag = etag
        self.version = version
        self._ahead = b""
        self._offset = 0
        self.bytes_read = 0
        self.read_wait_seconds = 0.0

    def read(self, size: int, /) -> bytes:
        if self._offset >= len(self._ahead):
            self._ahead, self._offset = self._read_body(max(size, READ_AHEAD)), 0
        chunk = self._ahead[self._offset : self._offset + size]
        self._offset += len(chunk)
        return chunk

    def _read_body(self, size: int) -> bytes:
        started = time.monotonic()
        try:
            chunk: bytes = self._body.read(size)
        except (BotoCoreError, OSError) as error:
            raise PhotoError(ErrorCode.STORAGE_READ_FAILED, repr(error)) from error
        finally:
            self.read_wait_seconds += time.monotonic() - started
        self.bytes_read += len(chunk)
        if self.bytes_read > self._limit:
            raise PhotoError(ErrorCode.ORIGINAL_TOO_LARGE, f"more than {self._limit} bytes")
        return chunk

    def close(self) -> None:
        self._body.close()


class S3Store:
    def __init__(self, client: S3Client, bucket: str) -> None:
        self._client = client
        self._bucket = bucket

    def open_original(self, key: str, max_bytes: int, pin: Pin | None = None) -> OriginalStream:
        """The original's body; with a `pin`, the pinned upload's or OriginalReplaced."""
        pinned = pin is not None and bool(pin.version or pin.etag)
        try:
            if pin is not None and pin.version:
                response = self._client.get_object(Bucket=self._bucket, Key=key, VersionId=pin.version)
            elif pin is not None and pin.etag:
                response = self._client.get_object(Bucket=self._bucket, Key=key, IfMatch=f'"{pin.etag}"')
            else:
                response = self._client.get_object(Bucket=self._bucket, Key=key)
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if pinned and code in _REPLACED:
                raise OriginalReplaced(code) from error
            if code in _MISSING:
                raise PhotoError(ErrorCode.ORIGINAL_NOT_FOUND, key) from error
            raise PhotoError(ErrorCode.STORAGE_READ_FAILED, code) from error
        except BotoCoreError as error:
            raise PhotoError(ErrorCode.STORAGE_READ_FAILED, repr(error)) from error
        body = response["Body"]
        if response.get("ContentLength", 0) > max_bytes:
            body.close()
            raise PhotoError(ErrorCode.ORIGINAL_TOO_LARGE, f"{response['ContentLength']} > {max_bytes} bytes")
        version = response.get("VersionId")
        return OriginalStream(
            body,
            max_bytes,
            etag=response.get("ETag", "").strip('"') or None,
            version=version if version and version != "null" else None,
        )

    def delete_variants(self, keys: Sequence[str]) -> list[str]:
        """Delete variant objects, a thousand a call; the keys S3 deleted (or had no object for)."""
        deleted: list[str] = []
        for start in range(0, len(keys), 1000):
            chunk = keys[start : start + 1000]
            try:
                response = self._client.delete_objects(
                    Bucket=self._bucket, Delete={"Objects": [{"Key": key} for key in chunk], "Quiet": True}
                )
            except (ClientError, BotoCoreError):
                continue  # kept, for a later run
            failed = {error["Key"] for error in response.get("Errors", [])}
            deleted += [key for key in chunk if key not in failed]
        return deleted

    def delete_under(self, prefixes: Sequence[str]) -> bool:
        """Delete every object under each prefix (a deleted photo's original and all its variants);
        False if any could not be listed or deleted (left for a later purge)."""
        complete = True
        for prefix in prefixes:
            keys: list[str] = []
            token = ""
            try:
                while True:
                    page = (
                        self._client.list_objects_v2(
                            Bucket=self._bucket, Prefix=prefix, ContinuationToken=token
                        )
                        if token
                        else self._client.list_objects_v2(Bucket=self._bucket, Prefix=prefix)
                    )
                    keys += [item["Key"] for item in page.get("Contents", [])]
                    if not page.get("IsTruncated"):
                        break
                    token = page["NextContinuationToken"]
            except (ClientError, BotoCoreError):
                complete = False
            complete &= len(self.delete_variants(keys)) == len(keys)
        return complete

    def put_variant(self, key: str, data: bytes, content_type: str) -> None:
        try:
            self._client.put_object(
                Bucket=self._bucket, Key=key, Body=data, ContentType=content_type, CacheControl=IMMUTABLE
            )
        except (ClientError, BotoCoreError) as error:
            raise PhotoError(ErrorCode.STORAGE_WRITE_FAILED, repr(error)) from error
