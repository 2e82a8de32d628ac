"""For the pipeline's tests: a forward-only stream like an S3 body, and a look inside WebP files."""

from __future__ import annotations

import io


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


# libvips' fields for metadata a file carries, and the WebP chunks that are its pixels alone.
METADATA_FIELDS = ("exif-data", "xmp-data", "icc-profile-data", "iptc-data")
WEBP_PIXEL_CHUNKS = frozenset({b"VP8 ", b"VP8L", b"VP8X", b"ALPH"})


def metadata_in(data: bytes) -> set[str]:
    """What a WebP or AVIF variant holds beside its pixels: libvips' metadata fields, WebP chunks
    other than pixels, HEIF items other than AV1 pictures (`Exif`, `mime` for XMP) and colour boxes
    that embed an ICC profile. Empty for a variant with no metadata at all."""
    import pyvips

    found = {
        str(name) for name in set(pyvips.Image.new_from_buffer(data, "").get_fields()) & set(METADATA_FIELDS)
    }
    if b"Exif" in data:
        found.add("Exif bytes")
    if data[:4] == b"RIFF":
        found |= {chunk.decode() for chunk in set(webp_chunks(data)) - WEBP_PIXEL_CHUNKS}
    else:
        held = heif_metadata(data)
        found |= {item.decode(errors="replace") for item in set(held["items"]) - {b"av01"}}
        found |= {colour.decode() for colour in set(held["colours"]) & {b"prof", b"rICC"}}
    return found
