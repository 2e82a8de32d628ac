"""The payload other services read from the outbox (SPEC 4.2): typed, validated on write and on read.

Schema version 2 (SPEC 13) adds the placeholder; version 3 (SPEC 18) the responsive ladder and
the capture metadata. The reader accepts 1 to 3, each with exactly its own keys.

Below the image code and the outbox alike: the pipeline makes the placeholder and the capture that
the outbox's writer and relay carry.
"""

import base64
import binascii
import math
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

# The longest text a capture field keeps (a lens's name runs to about 50 characters).
MAX_CAPTURE_TEXT = 128


@dataclass(frozen=True, slots=True, kw_only=True)
class Location:
    """Where the photo was taken, from its GPS tags: decimal degrees (south and west negative) and
    metres above sea level (below it negative). Present only where the upload said its user agreed."""

    latitude: float
    longitude: float
    altitude: float | None = None

    def __post_init__(self) -> None:
        for key, value, bound in (("latitude", self.latitude, 90), ("longitude", self.longitude, 180)):
            number = _number(f"location.{key}", value)
            if number is None or abs(number) > bound:
                raise InvalidPayload(f"location.{key} must be a number within +-{bound}, got {value!r}")
            object.__setattr__(self, key, number)
        object.__setattr__(self, "altitude", _number("location.altitude", self.altitude))

    def to_json(self) -> dict[str, object]:
        return {"latitude": self.latitude, "longitude": self.longitude, "altitude": self.altitude}

    @classmethod
    def from_json(cls, document: object) -> Self:
        members = _members(document, ("latitude", "longitude", "altitude"), "capture.location")
        return cls(latitude=members["latitude"], longitude=members["longitude"], altitude=members["altitude"])


@dataclass(frozen=True, slots=True, kw_only=True)
class Capture:
    """What the photo's EXIF says of its taking (SPEC 18); every field None where it says nothing.

    `taken_at_local` is the camera's clock (naive: the camera's time zone, whatever it was);
    `taken_at` is the same moment as an instant, only where the camera recorded its offset from UTC
    (`OffsetTimeOriginal`). Sort by `taken_at`, falling back to `taken_at_local`; show the local one.
    """

    taken_at: datetime | None = None
    taken_at_local: datetime | None = None
    make: str | None = None
    model: str | None = None
    lens: str | None = None
    f_number: float | None = None
    exposure_time: float | None = None  # seconds
    iso: int | None = None
    focal_length: float | None = None  # millimetres, of the lens itself (not 35 mm equivalent)
    location: Location | None = None

    def __post_init__(self) -> None:
        self._check_times()
        for key in ("make", "model", "lens"):
            text = getattr(self, key)
            if text is not None and (
                not isinstance(text, str)
                or not 0 < len(text) <= MAX_CAPTURE_TEXT
                or not text.isprintable()
                or text != text.strip()
            ):
                raise InvalidPayload(
                    f"capture.{key} must be printable text of 1 to {MAX_CAPTURE_TEXT} characters, got {text!r}"
                )
        for key, name in (
            ("f_number", "fNumber"),
            ("exposure_time", "exposureTime"),
            ("focal_length", "focalLength"),
        ):
            number = _number(f"capture.{name}", getattr(self, key))
            if number is not None and number <= 0:
                raise InvalidPayload(f"capture.{name} must be positive, got {number!r}")
            object.__setattr__(self, key, number)
        if self.iso is not None:
            _at_least(1, **{"capture.iso": self.iso})
            if self.iso > _INT32:
                raise InvalidPayload(f"capture.iso must be at most {_INT32}, got {self.iso!r}")
        if self.location is not None and not isinstance(self.location, Location):
            raise InvalidPayload(f"capture.location must be a Location, got {self.location!r}")

    def _check_times(self) -> None:
        if self.taken_at is not None:
            if not isinstance(self.taken_at, datetime) or self.taken_at.utcoffset() is None:
                raise InvalidPayload(f"capture.takenAt must carry a time zone, got {self.taken_at!r}")
            try:
                object.__setattr__(self, "taken_at", self.taken_at.astimezone(UTC))
            except OverflowError:
                raise InvalidPayload(f"capture.takenAt is out of range, got {self.taken_at!r}") from None
        local = self.taken_at_local
        if local is not None and (not isinstance(local, datetime) or local.utcoffset() is not None):
            raise InvalidPayload(f"capture.takenAtLocal must be a date and time with no zone, got {local!r}")
        if self.taken_at is not None and local is None:
            raise InvalidPayload("capture.takenAtLocal must be given with capture.takenAt")

    def to_json(self) -> dict[str, object]:
        """Every key, null where the photo said nothing; takenAt in UTC ("Z"), takenAtLocal with no
        zone."""
        return {
            "takenAt": None if self.taken_at is None else _utc_text(self.taken_at),
            "takenAtLocal": None if self.taken_at_local is None else self.taken_at_local.isoformat(),
            "make": self.make,
            "model": self.model,
            "lens": self.lens,
            "fNumber": self.f_number,
            "exposureTime": self.exposure_time,
            "iso": self.iso,
            "focalLength": self.focal_length,
            "location": None if self.location is None else self.location.to_json(),
        }

    @classmethod
    def from_json(cls, document: object) -> Self:
        members = _members(document, _CAPTURE_KEYS, "capture")
        taken_at, local = members["takenAt"], members["takenAtLocal"]
        return cls(
            taken_at=None if taken_at is None else _instant("capture.takenAt", taken_at),
            taken_at_local=None if local is None else _instant("capture.takenAtLocal", local),
            make=members["make"],
            model=members["model"],
            lens=members["lens"],
            f_number=members["fNumber"],
            exposure_time=members["exposureTime"],
            iso=members["iso"],
            focal_length=members["focalLength"],
            location=None if members["location"] is None else Location.from_json(members["location"]),
        )


_CAPTURE_KEYS = (
    "takenAt",
    "takenAtLocal",
    "make",
    "model",
    "lens",
    "fNumber",
    "exposureTime",
    "iso",
    "focalLength",
    "location",
)
_INT32 = 2**31 - 1


def _number(key: str, value: object) -> float | None:
    """A finite number as a float (JSON writes 2.0 as 2), or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidPayload(f"{key} must be a finite number, got {value!r}")
    return float(value)


# A photo whose EXIF says nothing (or that has none).
NO_CAPTURE = Capture()

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
    # Version 3 on: when and with what it was taken (its fields None where the photo said nothing).
    capture: Capture | None = None

    def __post_init__(self) -> None:
        # type(): True == 1 and 1.0 == 1, neither of which is a schema version.
        if type(self.schema_version) is not int or self.schema_version not in SCHEMA_VERSIONS:
            raise InvalidPayload(f"schemaVersion must be 1, 2 or 3, got {self.schema_version!r}")
        if (self.schema_version >= 2) != isinstance(self.placeholder, Placeholder):
            raise InvalidPayload(
                f"placeholder must be a Placeholder from schema 2 on and absent in 1, got {self.placeholder!r}"
            )
        if (self.schema_version >= 3) != isinstance(self.capture, Capture):
            raise InvalidPayload(
                f"capture must be a Capture from schema 3 on and absent before, got {self.capture!r}"
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
        document: dict[str, object] = (
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
        if self.capture is not None:
            document["capture"] = self.capture.to_json()
        return document

    @classmethod
    def from_json(cls, document: object) -> Self:
        """A consumer's reading of `to_json`'s document, schema 1, 2 or 3: every key of its version
        present, no other, each valid."""
        version = document.get("schemaVersion") if isinstance(document, Mapping) else None
        if isinstance(document, Mapping) and "schemaVersion" in document and version not in SCHEMA_VERSIONS:
            raise InvalidPayload(f"schemaVersion must be 1, 2 or 3, got {version!r}")
        # True is no version (the constructor refuses it): it reads as none here.
        since = version if type(version) is int else 0
        keys = (
            _PAYLOAD_KEYS
            + (("placeholder",) if since >= 2 else ())
            + (("ladder", "capture") if since >= 3 else ())
        )
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
            capture=Capture.from_json(members["capture"]) if "capture" in keys else None,
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
