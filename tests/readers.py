"""For the pipeline's tests: a forward-only stream like an S3 body, and a look inside WebP files."""

from __future__ import annotations

import io

import pyvips

# What libvips reads of a file's metadata, whatever its format.
METADATA_FIELDS = ("exif-data", "xmp-data", "icc-profile-data", "iptc-data")
# A WebP's chunks of pixels: anything else is metadata (EXIF, XMP, ICCP) or unknown.
WEBP_PIXEL_CHUNKS = {b"VP8 ", b"VP8L", b"VP8X", b"ALPH"}


class FailingReader:
    """Serves `data` up to byte `fail_at`, then raises `error` on every read."""

    def __init__(self, data: bytes, fail_at: int, error: Exception) -> None:
        self._data = io.BytesIO(data)
        self._fail_at = fail_at
        self._error = error
        self._position = 0

    def read(self, size: int, /) -> bytes:
        if self._position >= self._fail_at:
            raise self._error
        chunk = self._data.read(min(size, self._fail_at - self._position))
        self._position += len(chunk)
        return chunk


def webp_chunks(data: bytes) -> list[bytes]:
    """The four-letter names of a WebP file's chunks (VP8, VP8L, VP8X, ALPH, EXIF, ICCP, XMP)."""
    assert data[:4] == b"RIFF"
    assert data[8:12] == b"WEBP"
    chunks, offset = [], 12
    while offset + 8 <= len(data):
        size = int.from_bytes(data[offset + 4 : offset + 8], "little")
        chunks.append(data[offset : offset + 4])
        offset += 8 + size + (size & 1)
    return chunks


# ISO-BMFF boxes that hold other boxes, on the way to a HEIF's item types and colour boxes.
_HEIF_CONTAINERS = {b"meta": 4, b"iinf": None, b"iprp": 0, b"ipco": 0}


def heif_metadata(data: bytes) -> dict[str, list[bytes]]:
    """What an AVIF (HEIF) file holds beside its pixels: its items' types (`av01` is a picture;
    `Exif`, and `mime` for XMP, are metadata) and its colour boxes' types (`nclx` names the colour
    space; `prof` and `rICC` embed an ICC profile)."""
    found: dict[str, list[bytes]] = {"items": [], "colours": []}

    def walk(start: int, end: int) -> None:
        offset = start
        while offset + 8 <= end:
            size, kind = int.from_bytes(data[offset : offset + 4], "big"), data[offset + 4 : offset + 8]
            header = 8
            if size == 1:
                size, header = int.from_bytes(data[offset + 8 : offset + 16], "big"), 16
            size = size or end - offset
            body = offset + header
            if kind == b"iinf":
                version = data[body]
                walk(body + 4 + (2 if version == 0 else 4), offset + size)
            elif kind == b"infe":
                version = data[body]
                if version >= 2:  # full box, item id (2 or 4 bytes), protection index, then the type
                    id_bytes = 2 if version == 2 else 4
                    found["items"].append(data[body + 4 + id_bytes + 2 : body + 4 + id_bytes + 6])
            elif kind == b"colr":
                found["colours"].append(data[body : body + 4])
            elif kind in _HEIF_CONTAINERS:
                walk(body + (_HEIF_CONTAINERS[kind] or 0), offset + size)
            offset += size

    walk(0, len(data))
    return found


def metadata_in(data: bytes, *, markers: tuple[bytes, ...] = ()) -> list[str]:
    """What a WebP or AVIF variant carries beyond its pixels: the metadata libvips finds in it, a
    WebP's chunks other than pixels and its VP8X flags for ICC, EXIF and XMP, an AVIF's items other
    than AV1 pictures (`Exif`, `mime` for XMP) and colour boxes that embed an ICC profile, and any of
    `markers` (strings the original's metadata held) anywhere in its bytes. Empty for a clean file."""
    found = [field for field in METADATA_FIELDS if pyvips.Image.new_from_buffer(data, "").get_typeof(field)]
    if data[:4] == b"RIFF":
        found += [f"chunk {c!r}" for c in webp_chunks(data) if c not in WEBP_PIXEL_CHUNKS]
        if webp_chunks(data)[0] == b"VP8X" and data[20] & 0b101100:
            found.append(f"VP8X flags {data[20]:#04x}")
    else:
        held = heif_metadata(data)
        found += [f"item {item!r}" for item in held["items"] if item != b"av01"]
        found += [f"colour {colour!r}" for colour in held["colours"] if colour in (b"prof", b"rICC")]
    found += [f"marker {m!r}" for m in markers if m in data]
    return found
