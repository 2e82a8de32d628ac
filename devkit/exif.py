"""EXIF blocks for the tests and the demo: a camera's, and hostile ones, laid out byte by byte.

A block is a TIFF structure after "Exif\\0\\0" (as a JPEG's APP1 segment and a HEIC's EXIF item
hold it): IFD0, and the Exif and GPS directories it points to. `block()` lays out whatever entries
it is given, true or not (a count, a type or an offset that lies is an entry like any other), so a
test says exactly which lie it tells; `camera()` is what a phone writes. `jpeg_with()` puts
blocks (and XMP) into a JPEG as its APP1 segments, byte for byte: libvips' own writer would
re-encode a block through libexif, and tidy the lies away.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from photo_publish.contracts import Capture, Location

# TIFF field types.
BYTE, ASCII, SHORT, LONG, RATIONAL, UNDEFINED, SSHORT, SLONG, SRATIONAL, DOUBLE = (
    1,
    2,
    3,
    4,
    5,
    7,
    8,
    9,
    10,
    12,
)
_FORMATS = {
    BYTE: "B",
    SHORT: "H",
    LONG: "I",
    RATIONAL: "II",
    SSHORT: "h",
    SLONG: "i",
    SRATIONAL: "ii",
    DOUBLE: "d",
}
_SIZES = {
    BYTE: 1,
    ASCII: 1,
    SHORT: 2,
    LONG: 4,
    RATIONAL: 8,
    UNDEFINED: 1,
    SSHORT: 2,
    SLONG: 4,
    SRATIONAL: 8,
    DOUBLE: 8,
}

EXIF_POINTER, GPS_POINTER = 0x8769, 0x8825
MAKE, MODEL, ORIENTATION = 0x010F, 0x0110, 0x0112
EXPOSURE_TIME, F_NUMBER, ISO, ISO_SPEED = 0x829A, 0x829D, 0x8827, 0x8833
DATE_TIME_ORIGINAL, OFFSET_TIME_ORIGINAL, SUBSEC_TIME_ORIGINAL = 0x9003, 0x9011, 0x9291
FOCAL_LENGTH, LENS_MODEL = 0x920A, 0xA434
LATITUDE_REF, LATITUDE, LONGITUDE_REF, LONGITUDE, ALTITUDE_REF, ALTITUDE = 1, 2, 3, 4, 5, 6


@dataclass(frozen=True)
class Entry:
    """One directory entry: `values` are raw bytes (ASCII, UNDEFINED) or numbers (two a RATIONAL);
    `count` and `offset` declare other than the truth where given."""

    tag: int
    type: int
    values: bytes | tuple[float, ...]
    count: int | None = None
    offset: int | None = None

    def raw(self, order: str) -> bytes:
        if isinstance(self.values, bytes):
            return self.values
        fmt = _FORMATS[self.type]
        return struct.pack(order + fmt[0] * len(self.values), *self.values)

    def declared_count(self, order: str) -> int:
        return self.count if self.count is not None else len(self.raw(order)) // _SIZES.get(self.type, 1)


def text(tag: int, value: str | bytes) -> Entry:
    return Entry(tag, ASCII, (value.encode() if isinstance(value, str) else value) + b"\0")


def short(tag: int, *values: int) -> Entry:
    return Entry(tag, SHORT, values)


def long(tag: int, *values: int) -> Entry:
    return Entry(tag, LONG, values)


def rational(tag: int, *fractions: tuple[int, int], signed: bool = False) -> Entry:
    return Entry(tag, SRATIONAL if signed else RATIONAL, tuple(n for pair in fractions for n in pair))


def byte(tag: int, *values: int) -> Entry:
    return Entry(tag, BYTE, bytes(values))


def block(
    ifd0: Sequence[Entry],
    exif: Sequence[Entry] = (),
    gps: Sequence[Entry] = (),
    *,
    order: str = "<",
    prefix: bytes = b"Exif\0\0",
) -> bytes:
    """The block: `prefix`, the TIFF header, IFD0, then the Exif and GPS directories (pointed to
    from IFD0, unless IFD0 already has its own pointer entry), each followed by its long values."""
    pointers = [(EXIF_POINTER, exif), (GPS_POINTER, gps)]
    tags = {entry.tag for entry in ifd0}
    first = list(ifd0) + [long(tag, 0) for tag, entries in pointers if entries and tag not in tags]
    sizes = [_directory_size(first, order), _directory_size(exif, order), _directory_size(gps, order)]
    at = [8, 8 + sizes[0], 8 + sizes[0] + sizes[1]]
    where = {EXIF_POINTER: at[1], GPS_POINTER: at[2]}
    first = [long(e.tag, where[e.tag]) if e.tag in where and e.tag not in tags else e for e in first]
    body = b"".join(
        _directory(entries, start, order)
        for entries, start in zip((first, exif, gps), at, strict=True)
        if entries
    )
    magic = b"II*\0" if order == "<" else b"MM\0*"
    return prefix + magic + struct.pack(order + "I", 8) + body


def _directory_size(entries: Sequence[Entry], order: str) -> int:
    if not entries:
        return 0
    values = sum(_even(len(e.raw(order))) for e in entries if len(e.raw(order)) > 4)
    return 2 + 12 * len(entries) + 4 + values


def _even(size: int) -> int:
    return size + (size & 1)


def _directory(entries: Sequence[Entry], start: int, order: str) -> bytes:
    """Its entries (sorted by tag, as the standard asks), no next directory, then the long values."""
    ordered = sorted(entries, key=lambda e: e.tag)
    values_at = start + 2 + 12 * len(ordered) + 4
    head, tail = struct.pack(order + "H", len(ordered)), b""
    for entry in ordered:
        raw = entry.raw(order)
        count = entry.declared_count(order)
        if len(raw) <= 4:
            field = raw.ljust(4, b"\0")
        else:
            field = struct.pack(order + "I", values_at + len(tail))
            tail += raw + b"\0" * (len(raw) & 1)
        if entry.offset is not None:
            field = struct.pack(order + "I", entry.offset)
        head += struct.pack(order + "HHI", entry.tag, entry.type, count) + field
    return head + struct.pack(order + "I", 0) + tail


# --- a phone's ------------------------------------------------------------------------------------

# What camera() says, for assertions: Paris, on the first of June 2024 at 18:42:07.123 (UTC+2).
MAKE_TEXT, MODEL_TEXT = "Apple", "iPhone 15 Pro"
LENS_TEXT = "iPhone 15 Pro back triple camera 6.765mm f/1.78"
TAKEN_LOCAL, TAKEN_OFFSET = "2024:06:01 18:42:07", "+02:00"
LATITUDE_DMS = ((48, 1), (51, 1), (2400, 100))  # 48.856666... N
LONGITUDE_DMS = ((2, 1), (21, 1), (720, 100))  # 2.352 E
ALTITUDE_M = (3500, 100)
# The same, as the standard defines the tags: what a reader must find in camera().
CAMERA = Capture(
    taken_at=datetime(2024, 6, 1, 16, 42, 7, 123000, tzinfo=UTC),
    taken_at_local=datetime(2024, 6, 1, 18, 42, 7, 123000),
    make=MAKE_TEXT,
    model=MODEL_TEXT,
    lens=LENS_TEXT,
    f_number=1.78,
    exposure_time=1 / 250,
    iso=64,
    focal_length=6.765,
)
PARIS = Location(latitude=48 + 51 / 60 + 24 / 3600, longitude=2 + 21 / 60 + 7.2 / 3600, altitude=35.0)
CAMERA_WITH_POSITION = replace(CAMERA, location=PARIS)


def camera(*, order: str = ">", offset: bool = True, orientation: int = 1) -> bytes:
    """What an iPhone writes (big-endian, as Apple does): make, model, the time with its offset and
    milliseconds, the exposure, the lens, and a GPS position with its altitude."""
    exif = [
        text(DATE_TIME_ORIGINAL, TAKEN_LOCAL),
        text(SUBSEC_TIME_ORIGINAL, "123"),
        rational(F_NUMBER, (178, 100)),
        rational(EXPOSURE_TIME, (1, 250)),
        short(ISO, 64),
        rational(FOCAL_LENGTH, (6765, 1000)),
        text(LENS_MODEL, LENS_TEXT),
    ]
    if offset:
        exif.append(text(OFFSET_TIME_ORIGINAL, TAKEN_OFFSET))
    gps = [
        text(LATITUDE_REF, "N"),
        rational(LATITUDE, *LATITUDE_DMS),
        text(LONGITUDE_REF, "E"),
        rational(LONGITUDE, *LONGITUDE_DMS),
        byte(ALTITUDE_REF, 0),
        rational(ALTITUDE, ALTITUDE_M),
    ]
    ifd0 = [text(MAKE, MAKE_TEXT), text(MODEL, MODEL_TEXT), short(ORIENTATION, orientation)]
    return block(ifd0, exif, gps, order=order)


# --- into a JPEG ----------------------------------------------------------------------------------

XMP_NAMESPACE = b"http://ns.adobe.com/xap/1.0/\0"


def xmp(marker: str) -> bytes:
    """An XMP packet naming `marker` (as a creator tool), for a test that looks for it."""
    return (
        '<?xpacket begin="" id="W5M0MpCehiHzreSzNTczkc9d"?><x:xmpmeta xmlns:x="adobe:ns:meta/">'
        '<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"><rdf:Description '
        f'xmlns:xmp="http://ns.adobe.com/xap/1.0/" xmp:CreatorTool="{marker}"/></rdf:RDF></x:xmpmeta>'
        '<?xpacket end="w"?>'
    ).encode()


def jpeg_with(jpeg: bytes, *, exif: bytes | None = None, xmp_packet: bytes | None = None) -> bytes:
    """The JPEG with `exif` (a block, "Exif\\0\\0" first) and an XMP packet as APP1 segments right
    after its start, byte for byte."""
    assert jpeg[:2] == b"\xff\xd8", "not a JPEG"
    segments = b""
    for payload in (exif, None if xmp_packet is None else XMP_NAMESPACE + xmp_packet):
        if payload is not None:
            assert len(payload) <= 65533, "an APP1 segment holds at most 65533 bytes"
            segments += b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload
    return jpeg[:2] + segments + jpeg[2:]
