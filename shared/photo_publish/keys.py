"""The S3 key layout of SPEC 2: originals in, variants out."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

# "thumb", "browse", or a step of the responsive ladder (SPEC 18): `w{long edge}-{format}`, as
# `w640-webp` and `w640-avif`. The format is part of the kind because a photo has one row a kind
# (photo_variants' unique (photo_id, kind)) and the ladder is rendered in each format; the number is
# the step's long edge in pixels, as VARIANT_WIDTHS lists it (a portrait's width is smaller).
VariantKind = str
FIXED_KINDS = ("thumb", "browse")
# The migration's CHECK on photo_variants.kind says the same (0011).
LADDER_KIND = re.compile(r"w([1-9][0-9]{0,4})-(webp|avif)")


def ladder_kind(long_edge: int, image_format: str) -> VariantKind:
    kind = f"w{long_edge}-{image_format}"
    if not LADDER_KIND.fullmatch(kind):
        raise ValueError(f"not a ladder step: {long_edge} pixels in {image_format!r}")
    return kind


def is_ladder_kind(kind: str) -> bool:
    return LADDER_KIND.fullmatch(kind) is not None


class MalformedKey(ValueError):
    """A key under the originals prefix that does not follow the layout."""


@dataclass(frozen=True, slots=True)
class OriginalKey:
    key: str
    album_id: UUID
    photo_id: UUID
    file_name: str


@dataclass(frozen=True, slots=True)
class Upload:
    """Which upload of a key an event announces: S3's sequencer orders the uploads of one key; the
    eTag tells two uploads apart where an emulator sends no sequencer (moto's notifications); the
    event's time places it before or after a failure when the job has seen no upload yet; the
    version id (a versioned bucket's) names the very object written, which the process function
    reads (SPEC 19), else it reads the eTag's bytes (If-Match)."""

    sequencer: str | None = None
    etag: str | None = None
    at: datetime | None = None
    version: str | None = None


def sequencer_order(a: str, b: str) -> int:
    """Which of two uploads of one key came later, by their S3 sequencers: negative if `a` came
    before `b`, positive if after, 0 for the same upload.

    AWS's rule: "The sequencers can be of different lengths. So, to compare these values, first
    right pad the shorter value with zeros, and then do a lexicographical comparison." A sequencer
    is not a number: its leading zeros are significant ("FF" is after "0100"). Hex digits are
    compared in one case (AWS's examples write them in both).

    In SQL, the same order is `rpad(upper(a), w, '0') COLLATE "C"` against the same of `b`, where
    `w = greatest(length(a), length(b))`.
    """
    width = max(len(a), len(b))
    left, right = a.upper().ljust(width, "0"), b.upper().ljust(width, "0")
    return (left > right) - (left < right)


def parse_uuid(value: object) -> UUID:
    if not isinstance(value, str):
        raise MalformedKey(f"not a UUID: {value!r}")
    try:
        parsed = UUID(value)
    except ValueError:
        raise MalformedKey(f"not a UUID: {value!r}") from None
    # UUID() also takes braces, URNs and undashed hex: a key's text must be the id it names.
    if str(parsed) != value.lower():
        raise MalformedKey(f"not a UUID in canonical form: {value!r}")
    return parsed


def parse_original_key(key: str, stage: str) -> OriginalKey | None:
    """The ids in an originals key; None for a key outside the originals prefix (not ours)."""
    prefix = f"{stage}/originals/"
    if not key.startswith(prefix):
        return None
    parts = key[len(prefix) :].split("/")
    if len(parts) != 4 or parts[0] != "albums" or not parts[3]:
        raise MalformedKey(f"not {prefix}albums/{{albumId}}/{{photoId}}/{{fileName}}: {key!r}")
    return OriginalKey(
        key=key, album_id=parse_uuid(parts[1]), photo_id=parse_uuid(parts[2]), file_name=parts[3]
    )


def original_key(stage: str, album_id: UUID, photo_id: UUID, file_name: str) -> str:
    return f"{stage}/originals/albums/{album_id}/{photo_id}/{file_name}"


def variant_key(
    stage: str,
    album_id: UUID,
    photo_id: UUID,
    *,
    version: int,
    kind: VariantKind,
    ext: str,
    picture: int | None = None,
) -> str:
    """A variant's key. A published photo's later picture (its original written again, SPEC 19) is
    rendered under keys of its own, `{version}-v{picture}` (the entity version it publishes), never
    under those of the picture it replaces: variant objects are immutable and cached as such."""
    folder = str(version) if picture is None else f"{version}-v{picture}"
    return f"{stage}/albums/{album_id}/variants/{photo_id}/{folder}/{kind}.{ext}"


def photo_prefixes(stage: str, album_id: UUID, photo_id: UUID) -> tuple[str, str]:
    """Everything the product stores for a photo: its originals' folder, and every version of its
    variants."""
    return (
        f"{stage}/originals/albums/{album_id}/{photo_id}/",
        f"{stage}/albums/{album_id}/variants/{photo_id}/",
    )


# What a registered file name may not hold (SPEC 17): the key's separator, and control characters.
_UNSAFE = re.compile(r"[/\\\x00-\x1f\x7f-\x9f]")
# Unicode's control, format, surrogate, line and paragraph separator categories.
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
MAX_FILE_NAME_BYTES = 255


def clean_file_name(name: str) -> str:
    """The file name as an original key ends with it: no `/` (nor `\\`), no control or format
    characters (a right-to-left override would show `gpj.exe` as `exe.jpg`), no lone surrogates,
    no `${` (S3 substitutes `${filename}` in a POST form's key with the name of the file posted, and
    botocore's policy for such a key admits any key under its prefix: the key must be the server's),
    surrounding blanks and dots trimmed, at most 255 bytes of UTF-8 (cut before the extension, on
    a character boundary). Empty if nothing is left."""
    visible = "".join(c for c in unicodedata.normalize("NFC", name) if unicodedata.category(c) not in _HIDDEN)
    cleaned = _no_substitution(_UNSAFE.sub("", visible)).strip(" .")
    if len(cleaned.encode()) <= MAX_FILE_NAME_BYTES:
        return cleaned
    stem, dot, ext = cleaned.rpartition(".")
    if not dot or len(ext.encode()) > 16:
        stem, ext = cleaned, ""
    room = MAX_FILE_NAME_BYTES - len(ext.encode()) - (1 if ext else 0)
    stem = stem.encode()[:room].decode(errors="ignore").rstrip(" .")
    return f"{stem}.{ext}" if ext else stem


def _no_substitution(name: str) -> str:
    """`name` with each `$` that opens a `${` dropped, until none is left (`$${` is `${` again)."""
    while "${" in name:
        name = name.replace("${", "{")
    return name
