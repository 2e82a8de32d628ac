"""The payload other services read from the outbox (SPEC 4.2): typed, validated on write and on read.

Schema version 2 (SPEC 13) adds the placeholder; version 3 (SPEC 18) the responsive ladder. The
reader accepts 1 to 3, each with exactly its own keys.
"""

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Self
from uuid import UUID

from photo_publish.errors import ErrorCode

PHOTO_PUBLISHED = "photo.published"
# A published photo's variants re-rendered at a newer recipe (SPEC 14): the same payload.
PHOTO_VARIANTS_UPDATED = "photo.variants_updated"


class InvalidPayload(ValueError):
    """A photo.published payload that breaks SPEC 4.2; the message names the JSON key and the rule."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VariantRef:
    key: str
    width: int
    height: int
    size: int
    content_type: str

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise InvalidPayload(f"key must be a non-empty string, got {self.key!r}")
        _at_least(1, width=self.width, height=self.height, bytes=self.size)
        if not isinstance(self.content_type, str):
            raise InvalidPayload(f"contentType must be a string, got {self.content_type!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishedVariants:
    thumb: VariantRef
    browse: VariantRef

    def __post_init__(self) -> None:
        for kind, ref in (("thumb", self.thumb), ("browse", self.browse)):
            if not isinstance(ref, VariantRef):
                raise InvalidPayload(f"{kind} must be a VariantRef, got {ref!r}")


@dataclass(frozen=True, slots=True)
class Placeholder:
    """What a client shows before the browse image arrives: a ThumbHash (evanw/thumbhash, base64)
    and the picture's average colour."""

    thumbhash: str
    average_color: str

    def __post_init__(self) -> None:
        try:
            hashed = (
                base64.b64decode(self.thumbhash, validate=True) if isinstance(self.thumbhash, str) else b""
            )
        except binascii.Error:
            hashed = b""
        # 5 header bytes (6 with alpha, or for a landscape) and at least one AC nibble pair.
        if not 5 <= len(hashed) <= 25:
            raise InvalidPayload(f"placeholder.thumbhash must be a base64 ThumbHash, got {self.thumbhash!r}")
        if not isinstance(self.average_color, str) or not _COLOUR.fullmatch(self.average_color):
            raise InvalidPayload(f"placeholder.averageColor must be #rrggbb, got {self.average_color!r}")


_COLOUR = re.compile(r"#[0-9a-f]{6}")
SCHEMA_VERSION: Literal[3] = 3
SCHEMA_VERSIONS = (1, 2, 3)


@dataclass(frozen=True, slots=True, kw_only=True)
class PhotoPublishedPayload:
    schema_version: Literal[1, 2, 3] = SCHEMA_VERSION
    photo_id: UUID
    album_id: UUID
    # Post-increment: a photo starts at 1, so a published one is at least 2.
    entity_version: int
    published_at: datetime
    width: int
    height: int
    variants: PublishedVariants
    # Version 2 on: what to show before the browse arrives (version 1 has none).
    placeholder: Placeholder | None = None
    # Version 3 on: the responsive ladder, every step in every format, ordered by width (a step's
    # formats in the configured order): what a srcset lists, without another request. Empty where
    # the recipe has no ladder.
    ladder: tuple[VariantRef, ...] | None = None

    def __post_init__(self) -> None:
        # type(): True == 1 and 1.0 == 1, neither of which is a schema version.
        if type(self.schema_version) is not int or self.schema_version not in SCHEMA_VERSIONS:
            raise InvalidPayload(f"schemaVersion must be 1, 2 or 3, got {self.schema_version!r}")
        if (self.schema_version >= 2) != isinstance(self.placeholder, Placeholder):
            raise InvalidPayload(
                f"placeholder must be a Placeholder from schema 2 on and absent in 1, got {self.placeholder!r}"
            )
        if (self.schema_version >= 3) != isinstance(self.ladder, tuple):
            raise InvalidPayload(
                f"ladder must be a list from schema 3 on and absent before, got {self.ladder!r}"
            )
        _check_ladder(self.ladder or ())
        for key, value in (("photoId", self.photo_id), ("albumId", self.album_id)):
            if not isinstance(value, UUID):
                raise InvalidPayload(f"{key} must be a UUID, got {value!r}")
        _at_least(2, entityVersion=self.entity_version)
        if not isinstance(self.published_at, datetime) or self.published_at.utcoffset() is None:
            raise InvalidPayload(f"publishedAt must carry a time zone, got {self.published_at!r}")
        # One spelling of an instant for every consumer: UTC.
        object.__setattr__(self, "published_at", self.published_at.astimezone(UTC))
        _at_least(1, width=self.width, height=self.height)
        if not isinstance(self.variants, PublishedVariants):
            raise InvalidPayload(f"variants must be PublishedVariants, got {self.variants!r}")

    def to_json(self) -> dict[str, object]:
        """The outbox's document: camelCase keys, ids as strings, publishedAt in ISO-8601 UTC ("Z")."""
        return (
            {
                "schemaVersion": self.schema_version,
                "photoId": str(self.photo_id),
                "albumId": str(self.album_id),
                "entityVersion": self.entity_version,
                "publishedAt": self.published_at.isoformat().removesuffix("+00:00") + "Z",
                "width": self.width,
                "height": self.height,
                "variants": {
                    "thumb": _variant_json(self.variants.thumb),
                    "browse": _variant_json(self.variants.browse),
                },
            }
            | (
                {}
                if self.placeholder is None
                else {
                    "placeholder": {
                        "thumbhash": self.placeholder.thumbhash,
                        "averageColor": self.placeholder.average_color,
                    }
                }
            )
            | ({} if self.ladder is None else {"ladder": [_variant_json(step) for step in self.ladder]})
        )

    @classmethod
    def from_json(cls, document: object) -> Self:
        """A consumer's reading of `to_json`'s document, schema 1, 2 or 3: every key of its version
        present, no other, each valid."""
        version = document.get("schemaVersion") if isinstance(document, Mapping) else None
        if isinstance(document, Mapping) and "schemaVersion" in document and version not in SCHEMA_VERSIONS:
            raise InvalidPayload(f"schemaVersion must be 1, 2 or 3, got {version!r}")
        since = version if type(version) is int else 0
        keys = _PAYLOAD_KEYS + (("placeholder",) if since >= 2 else ()) + (("ladder",) if since >= 3 else ())
        members = _members(document, keys, "payload")
        variants = _members(members["variants"], ("thumb", "browse"), "variants")
        placeholder = None
        if since >= 2:
            shown = _members(members["placeholder"], ("thumbhash", "averageColor"), "placeholder")
            placeholder = Placeholder(shown["thumbhash"], shown["averageColor"])
        ladder = None
        if since >= 3:
            if not isinstance(members["ladder"], list):
                raise InvalidPayload(f"ladder must be a list, got {members['ladder']!r}")
            ladder = tuple(_variant(step, f"ladder[{i}]") for i, step in enumerate(members["ladder"]))
        return cls(
            schema_version=members["schemaVersion"],
            photo_id=_uuid("photoId", members["photoId"]),
            album_id=_uuid("albumId", members["albumId"]),
            entity_version=members["entityVersion"],
            published_at=_instant("publishedAt", members["publishedAt"]),
            width=members["width"],
            height=members["height"],
            variants=PublishedVariants(
                thumb=_variant(variants["thumb"], "variants.thumb"),
                browse=_variant(variants["browse"], "variants.browse"),
            ),
            placeholder=placeholder,
            ladder=ladder,
        )


_PAYLOAD_KEYS = (
    "schemaVersion",
    "photoId",
    "albumId",
    "entityVersion",
    "publishedAt",
    "width",
    "height",
    "variants",
)
_VARIANT_KEYS = ("key", "width", "height", "bytes", "contentType")


def _check_ladder(ladder: tuple[VariantRef, ...]) -> None:
    if not all(isinstance(step, VariantRef) for step in ladder):
        raise InvalidPayload(f"ladder must hold VariantRefs, got {ladder!r}")
    widths = [step.width for step in ladder]
    if widths != sorted(widths):
        raise InvalidPayload(f"ladder must be ordered by width, got widths {widths}")


def _at_least(low: int, **values: object) -> None:
    for key, value in values.items():
        # True is an int to Python, never a width or a version to a consumer.
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise InvalidPayload(f"{key} must be an integer of at least {low}, got {value!r}")


def _variant_json(ref: VariantRef) -> dict[str, object]:
    return {
        "key": ref.key,
        "width": ref.width,
        "height": ref.height,
        "bytes": ref.size,
        "contentType": ref.content_type,
    }


def _variant(document: object, where: str) -> VariantRef:
    members = _members(document, _VARIANT_KEYS, where)
    try:
        return VariantRef(
            key=members["key"],
            width=members["width"],
            height=members["height"],
            size=members["bytes"],
            content_type=members["contentType"],
        )
    except InvalidPayload as error:
        raise InvalidPayload(f"{where}.{error}") from None


def _members(document: object, keys: tuple[str, ...], where: str) -> Mapping[str, Any]:
    """`document` as an object with exactly `keys`: a missing key or an unknown one is refused."""
    if not isinstance(document, Mapping):
        raise InvalidPayload(f"{where} must be an object, got {document!r}")
    if missing := [key for key in keys if key not in document]:
        raise InvalidPayload(f"{where} lacks {', '.join(missing)}")
    if unknown := [repr(key) for key in document if key not in keys]:
        raise InvalidPayload(f"{where} has unknown keys {', '.join(unknown)}")
    return document


def _uuid(key: str, value: object) -> UUID:
    if isinstance(value, str):
        try:
            return UUID(value)
        except ValueError:
            pass
    raise InvalidPayload(f"{key} must be a UUID, got {value!r}")


def _instant(key: str, value: object) -> datetime:
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            pass
    raise InvalidPayload(f"{key} must be an ISO-8601 date and time, got {value!r}")


# --- photo.failed (SPEC 12) ---------------------------------------------------------------------

PHOTO_FAILED = "photo.failed"


@dataclass(frozen=True, slots=True, kw_only=True)
class PhotoFailedPayload:
    """SPEC 12: written in the transaction that marks a permanent or final failure of a photo that
    is not published. `kind` is "permanent" (the user's file: uploading it again is the way out) or
    "final" (attempts spent or the worker lost: an operator may retry it)."""

    schema_version: Literal[1] = 1
    photo_id: UUID
    album_id: UUID
    # Unchanged by a failure (only a publication bumps it): consumers order a photo's events by it.
    entity_version: int
    error_code: ErrorCode
    kind: Literal["permanent", "final"]
    attempt: int
    failed_at: datetime

    def __post_init__(self) -> None:
        if type(self.schema_version) is not int or self.schema_version != 1:
            raise InvalidPayload(f"schemaVersion must be 1, got {self.schema_version!r}")
        for key, value in (("photoId", self.photo_id), ("albumId", self.album_id)):
            if not isinstance(value, UUID):
                raise InvalidPayload(f"{key} must be a UUID, got {value!r}")
        _at_least(1, entityVersion=self.entity_version, attempt=self.attempt)
        if not isinstance(self.error_code, ErrorCode):
            raise InvalidPayload(f"errorCode must be one of the error codes, got {self.error_code!r}")
        if self.kind not in ("permanent", "final"):
            raise InvalidPayload(f"kind must be permanent or final, got {self.kind!r}")
        if not isinstance(self.failed_at, datetime) or self.failed_at.utcoffset() is None:
            raise InvalidPayload(f"failedAt must carry a time zone, got {self.failed_at!r}")
        object.__setattr__(self, "failed_at", self.failed_at.astimezone(UTC))

    def to_json(self) -> dict[str, object]:
        return {
            "schemaVersion": self.schema_version,
            "photoId": str(self.photo_id),
            "albumId": str(self.album_id),
            "entityVersion": self.entity_version,
            "errorCode": self.error_code.value,
            "kind": self.kind,
            "attempt": self.attempt,
            "failedAt": _utc_text(self.failed_at),
        }

    @classmethod
    def from_json(cls, document: object) -> Self:
        """A consumer's reading of `to_json`'s document: every key present, no other, each valid."""
        members = _members(document, _FAILED_KEYS, "payload")
        try:
            code = ErrorCode(members["errorCode"])
        except ValueError:
            raise InvalidPayload(
                f"errorCode must be one of the error codes, got {members['errorCode']!r}"
            ) from None
        return cls(
            schema_version=members["schemaVersion"],
            photo_id=_uuid("photoId", members["photoId"]),
            album_id=_uuid("albumId", members["albumId"]),
            entity_version=members["entityVersion"],
            error_code=code,
            kind=members["kind"],
            attempt=members["attempt"],
            failed_at=_instant("failedAt", members["failedAt"]),
        )


_FAILED_KEYS = (
    "schemaVersion",
    "photoId",
    "albumId",
    "entityVersion",
    "errorCode",
    "kind",
    "attempt",
    "failedAt",
)


def _utc_text(instant: datetime) -> str:
    """ISO-8601 in UTC, spelt with "Z"."""
    return instant.isoformat().removesuffix("+00:00") + "Z"


# --- photo.deleted (SPEC 17) --------------------------------------------------------------------

PHOTO_DELETED = "photo.deleted"


@dataclass(frozen=True, slots=True, kw_only=True)
class PhotoDeletedPayload:
    """SPEC 17: written in the transaction that deletes a photo; the photo's last event. Its
    entityVersion is one past the photo's last, so that a consumer ordering by it puts it last."""

    schema_version: Literal[1] = 1
    photo_id: UUID
    album_id: UUID
    entity_version: int
    deleted_at: datetime

    def __post_init__(self) -> None:
        if type(self.schema_version) is not int or self.schema_version != 1:
            raise InvalidPayload(f"schemaVersion must be 1, got {self.schema_version!r}")
        for key, value in (("photoId", self.photo_id), ("albumId", self.album_id)):
            if not isinstance(value, UUID):
                raise InvalidPayload(f"{key} must be a UUID, got {value!r}")
        _at_least(1, entityVersion=self.entity_version)
        if not isinstance(self.deleted_at, datetime) or self.deleted_at.utcoffset() is None:
            raise InvalidPayload(f"deletedAt must carry a time zone, got {self.deleted_at!r}")
        object.__setattr__(self, "deleted_at", self.deleted_at.astimezone(UTC))

    def to_json(self) -> dict[str, object]:
        return {
            "schemaVersion": self.schema_version,
            "photoId": str(self.photo_id),
            "albumId": str(self.album_id),
            "entityVersion": self.entity_version,
            "deletedAt": _utc_text(self.deleted_at),
        }

    @classmethod
    def from_json(cls, document: object) -> Self:
        """A consumer's reading of `to_json`'s document: every key present, no other, each valid."""
        members = _members(document, _DELETED_KEYS, "payload")
        return cls(
            schema_version=members["schemaVersion"],
            photo_id=_uuid("photoId", members["photoId"]),
            album_id=_uuid("albumId", members["albumId"]),
            entity_version=members["entityVersion"],
            deleted_at=_instant("deletedAt", members["deletedAt"]),
        )


_DELETED_KEYS = ("schemaVersion", "photoId", "albumId", "entityVersion", "deletedAt")
