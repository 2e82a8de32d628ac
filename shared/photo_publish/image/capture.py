"""Capture metadata (SPEC 18) from a photo's EXIF block: when it was taken, with what, and where.

A small reader of its own over the block a loader already holds (libvips' `exif-data`, pi-heif's
for a HEIC libvips cannot read, a TIFF's own directories), not libvips' `exif-ifd*` strings: those
are libexif's display forms ("1/2 sec." for an exposure of 4/10 s, "Internal error (unknown value
2)"), and libexif adds the tags its reading of the standard requires (a ColorSpace of 65535, an
ExifVersion of 2.1) to a block that has none. Pure: bytes in, values out, no pixel touched.

Bounded whatever the block says: three directories at most (IFD0 and the Exif and GPS directories
it points to; no chain of directories is followed, so none can loop), at most MAX_ENTRIES entries
each, a value read only if all of it lies inside the block, text cut to MAX_CAPTURE_TEXT
characters, and a block over MAX_EXIF_BYTES not read at all. It never raises: a block it cannot
read leaves every field empty, a value it cannot read leaves its own field empty, and the Reading
says why, for one log line. A value the standard uses for "unknown" (an all-zero date, a 0/0
rational, a GPS position of 0/0 or with no hemisphere) is not a problem: it is nothing.

GPS is read only when asked for (`location=True`: the upload said its user agreed); otherwise its
directory is never opened.
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

from photo_publish.contracts import MAX_CAPTURE_TEXT, NO_CAPTURE, Capture, Location

# Five times the largest block seen on a phone (a Xiaomi HEIC's, 192 KB: EXIF with its thumbnail);
# a JPEG's cannot pass 64 KB. Larger is not read, so never copied either (pipeline._capture).
MAX_EXIF_BYTES = 1 << 20
# Real directories hold a few dozen entries (a camera's Exif directory about 70).
MAX_ENTRIES = 1000
# One log line, however broken the block.
_MAX_PROBLEMS = 4

# IFD0
_MAKE, _MODEL, _EXIF_IFD, _GPS_IFD = 0x010F, 0x0110, 0x8769, 0x8825
# The Exif directory
_EXPOSURE_TIME, _F_NUMBER, _ISO, _ISO_SPEED = 0x829A, 0x829D, 0x8827, 0x8833
_DATE_TIME_ORIGINAL, _OFFSET_TIME_ORIGINAL, _SUBSEC_TIME_ORIGINAL = 0x9003, 0x9011, 0x9291
_FOCAL_LENGTH, _LENS_MODEL = 0x920A, 0xA434
# The GPS directory
_LATITUDE_REF, _LATITUDE, _LONGITUDE_REF, _LONGITUDE, _ALTITUDE_REF, _ALTITUDE = 1, 2, 3, 4, 5, 6
# The entries each directory is read for (the rest, a maker note among them, are passed over).
_IFD0_TAGS = frozenset({_MAKE, _MODEL, _EXIF_IFD, _GPS_IFD})
_EXIF_TAGS = frozenset(
    {
        _EXPOSURE_TIME,
        _F_NUMBER,
        _ISO,
        _ISO_SPEED,
        _DATE_TIME_ORIGINAL,
        _OFFSET_TIME_ORIGINAL,
        _SUBSEC_TIME_ORIGINAL,
        _FOCAL_LENGTH,
        _LENS_MODEL,
    }
)
_GPS_TAGS = frozenset({_LATITUDE_REF, _LATITUDE, _LONGITUDE_REF, _LONGITUDE, _ALTITUDE_REF, _ALTITUDE})

_NAMES = {
    _MAKE: "Make",
    _MODEL: "Model",
    _EXIF_IFD: "ExifIFD",
    _GPS_IFD: "GPSIFD",
    _EXPOSURE_TIME: "ExposureTime",
    _F_NUMBER: "FNumber",
    _ISO: "PhotographicSensitivity",
    _ISO_SPEED: "ISOSpeed",
    _DATE_TIME_ORIGINAL: "DateTimeOriginal",
    _OFFSET_TIME_ORIGINAL: "OffsetTimeOriginal",
    _SUBSEC_TIME_ORIGINAL: "SubSecTimeOriginal",
    _FOCAL_LENGTH: "FocalLength",
    _LENS_MODEL: "LensModel",
}

# TIFF field types: their sizes, and the groups the reader accepts for a kind of value.
_BYTE, _ASCII, _SHORT, _LONG, _RATIONAL, _UNDEFINED, _SRATIONAL, _IFD, _UTF8 = 1, 2, 3, 4, 5, 7, 10, 13, 129
_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4, 129: 1}
_TEXT_TYPES = frozenset({_ASCII, _UTF8, _UNDEFINED, _BYTE})
_NUMBER_FORMATS = {
    _SHORT: "H",
    _LONG: "I",
    _RATIONAL: "II",
    _SRATIONAL: "ii",
    8: "h",
    9: "i",
    11: "f",
    12: "d",
}
_POINTER_TYPES = frozenset({_LONG, _IFD})
# An ISO over 65534 does not fit PhotographicSensitivity (a SHORT): the camera writes 65535 there
# and the value in ISOSpeed.
_ISO_OVERFLOW = 65535
# Hemispheres: the sign of a GPS coordinate.
_SIGNS = {_LATITUDE_REF: {"N": 1, "S": -1}, _LONGITUDE_REF: {"E": 1, "W": -1}}
# UTC offsets in use run from -12:00 to +14:00.
_MAX_OFFSET = timedelta(hours=14)

_DATE = re.compile(r"(\d{4})[:-](\d{2})[:-](\d{2})[ T](\d{2}):(\d{2}):(\d{2})", re.ASCII)
_OFFSET = re.compile(r"([+-])(\d{2}):(\d{2})", re.ASCII)
# What cameras write for a date they do not know (zeros or blanks and separators), and for an
# offset (blanks and a colon).
_UNKNOWN_DATE = re.compile(r"[0 :-]*")
_UNKNOWN_OFFSET = re.compile(r"[ :]*")


@dataclass(frozen=True, slots=True)
class Reading:
    """What a block says (`capture`), and why some or all of it stays empty (`problem`, for one
    log line; None where nothing was wrong)."""

    capture: Capture
    problem: str | None = None


NOTHING = Reading(NO_CAPTURE)


def too_large(size: int, limit: int = MAX_EXIF_BYTES) -> Reading:
    """A block over the limit: not read."""
    return Reading(NO_CAPTURE, f"an EXIF block of {size} bytes, over {limit}")


def read(
    block: bytes | bytearray | memoryview | None,
    *,
    location: bool = False,
    limit: int | None = MAX_EXIF_BYTES,
) -> Reading:
    """The capture metadata in an EXIF block: a TIFF structure, bare or after "Exif\\0\\0" (a JPEG's
    APP1 marker before it, as some phones leave in a HEIC, is skipped). `location`: read GPS too.
    `limit`: None for a TIFF file's own directories, which the file's size bounds."""
    if not block:
        return NOTHING
    if limit is not None and len(block) > limit:
        return too_large(len(block), limit)
    data = memoryview(block).cast("B")
    start = _tiff_start(data)
    if start is None:
        return Reading(NO_CAPTURE, "no TIFF header")
    reader = _Reader(data[start:])
    try:
        capture = reader.capture(location=location)
    except _Unreadable as error:
        reader.problems.insert(0, str(error))
        capture = NO_CAPTURE
    problems = reader.problems
    if not problems:
        return Reading(capture)
    more = f" (and {len(problems) - _MAX_PROBLEMS} more)" if len(problems) > _MAX_PROBLEMS else ""
    return Reading(capture, "; ".join(problems[:_MAX_PROBLEMS]) + more)


class _Unreadable(Exception):
    """The block's structure is broken: nothing in it can be trusted."""


@dataclass(frozen=True, slots=True)
class _Entry:
    tag: int
    type: int
    count: int
    at: int  # where its value starts in the TIFF structure


class _Reader:
    def __init__(self, tiff: memoryview) -> None:
        self.problems: list[str] = []
        self._data = tiff
        self._order = "<" if bytes(tiff[:2]) == b"II" else ">"

    def capture(self, *, location: bool) -> Capture:
        ifd0 = self._directory(int(self._unpack("I", 4)[0]), "IFD0", _IFD0_TAGS)
        exif = self._pointed(ifd0, _EXIF_IFD, _EXIF_TAGS)
        taken_at, local = self._taken(exif)
        return Capture(
            taken_at=taken_at,
            taken_at_local=local,
            make=self._text(ifd0, _MAKE),
            model=self._text(ifd0, _MODEL),
            lens=self._text(exif, _LENS_MODEL),
            f_number=self._positive(exif, _F_NUMBER),
            exposure_time=self._positive(exif, _EXPOSURE_TIME),
            iso=self._iso(exif),
            focal_length=self._positive(exif, _FOCAL_LENGTH),
            location=self._location(self._pointed(ifd0, _GPS_IFD, _GPS_TAGS)) if location else None,
        )

    # -- structure ---------------------------------------------------------------------------------

    def _unpack(self, fmt: str, at: int) -> tuple[int | float, ...]:
        size = struct.calcsize(self._order + fmt)
        if at < 0 or at + size > len(self._data):
            raise _Unreadable(f"an offset ({at}) outside the block")
        return struct.unpack_from(self._order + fmt, self._data, at)

    def _directory(self, offset: int, name: str, wanted: frozenset[int]) -> dict[int, _Entry]:
        """A directory's `wanted` entries by tag (the first of a repeated one); its link to a next
        directory is never followed."""
        if not 8 <= offset < len(self._data):
            raise _Unreadable(f"{name} at an offset ({offset}) outside the block")
        count = int(self._unpack("H", offset)[0])
        if count > MAX_ENTRIES:
            raise _Unreadable(f"{name} declares {count} entries, over {MAX_ENTRIES}")
        fits = min(count, (len(self._data) - offset - 2) // 12)
        if fits < count:
            self.problems.append(f"{name} runs past the end of the block")
        entries: dict[int, _Entry] = {}
        for index in range(fits):
            at = offset + 2 + 12 * index
            tag, kind, number = (int(v) for v in self._unpack("HHI", at))
            if tag not in wanted:
                continue
            size = _SIZES.get(kind, 0) * number
            value_at = at + 8 if size <= 4 else int(self._unpack("I", at + 8)[0])
            entries.setdefault(tag, _Entry(tag, kind, number, value_at))
        return entries

    def _pointed(self, directory: dict[int, _Entry], tag: int, wanted: frozenset[int]) -> dict[int, _Entry]:
        """The directory an entry points to; empty where there is none, or it cannot be read."""
        entry = directory.get(tag)
        if entry is None:
            return {}
        if entry.type not in _POINTER_TYPES or entry.count != 1:
            self.problems.append(f"{_NAMES[tag]}: type {entry.type} x {entry.count}, not a pointer")
            return {}
        try:
            return self._directory(int(self._unpack("I", entry.at)[0]), _NAMES[tag], wanted)
        except _Unreadable as error:
            self.problems.append(str(error))
            return {}

    def _bytes(self, entry: _Entry, name: str) -> memoryview | None:
        """All of an entry's value, or None (and why) if it does not lie inside the block."""
        size = _SIZES.get(entry.type, 0) * entry.count
        if entry.at + size > len(self._data):
            self.problems.append(f"{name}: its {size} bytes run past the end of the block")
            return None
        return self._data[entry.at : entry.at + size]

    # -- values ------------------------------------------------------------------------------------

    def _text(self, directory: dict[int, _Entry], tag: int) -> str | None:
        value = self._text_bytes(directory, tag, _NAMES[tag])
        return None if value is None else _clean(bytes(value[: 4 * MAX_CAPTURE_TEXT]))

    def _text_bytes(self, directory: dict[int, _Entry], tag: int, name: str) -> memoryview | None:
        """A text entry's bytes; None (and why) where it is of another type or runs past the end."""
        entry = directory.get(tag)
        if entry is None:
            return None
        if entry.type not in _TEXT_TYPES:
            self.problems.append(f"{name}: type {entry.type}, not text")
            return None
        return self._bytes(entry, name)

    def _numbers(
        self, directory: dict[int, _Entry], tag: int, name: str, count: int = 1
    ) -> list[float] | None:
        """The entry's first `count` numbers; None (and why) where it has not that many, or one is
        no number (x/0 with x not 0, NaN). A 0/0 rational is NaN: unknown."""
        entry = directory.get(tag)
        if entry is None:
            return None
        fmt = _NUMBER_FORMATS.get(entry.type)
        if fmt is None or entry.count < count:
            self.problems.append(f"{name}: type {entry.type} x {entry.count}, not {count} number(s)")
            return None
        if self._bytes(entry, name) is None:
            return None
        step = struct.calcsize(self._order + fmt)
        numbers = []
        for index in range(count):
            parts = self._unpack(fmt, entry.at + index * step)
            if len(parts) == 1:
                value = float(parts[0])
            elif parts[1] == 0:
                if parts[0] != 0:
                    self.problems.append(f"{name}: a rational over zero")
                    return None
                value = math.nan
            else:
                value = parts[0] / parts[1]
            if math.isinf(value) or (math.isnan(value) and len(parts) == 1):
                self.problems.append(f"{name}: not a finite number")
                return None
            numbers.append(value)
        return numbers

    def _positive(self, directory: dict[int, _Entry], tag: int) -> float | None:
        """A positive quantity (an f-number, a time, a length); 0 and 0/0 are unknown."""
        numbers = self._numbers(directory, tag, _NAMES[tag])
        if numbers is None or math.isnan(numbers[0]) or numbers[0] == 0:
            return None
        if numbers[0] < 0:
            self.problems.append(f"{_NAMES[tag]}: negative")
            return None
        return numbers[0]

    def _iso(self, exif: dict[int, _Entry]) -> int | None:
        for tag in (_ISO, _ISO_SPEED):
            entry = exif.get(tag)
            if entry is not None and entry.type not in (_SHORT, _LONG):
                self.problems.append(f"{_NAMES[tag]}: type {entry.type}, not an integer")
                continue
            numbers = self._numbers(exif, tag, _NAMES[tag])
            if numbers is None or numbers[0] in (0, _ISO_OVERFLOW):
                continue
            if numbers[0] > 2**31 - 1:
                self.problems.append(f"{_NAMES[tag]}: {numbers[0]:.0f}, out of range")
                continue
            return int(numbers[0])
        return None

    def _taken(self, exif: dict[int, _Entry]) -> tuple[datetime | None, datetime | None]:
        """(the instant, where the offset is known; the camera's clock)."""
        text = self._text(exif, _DATE_TIME_ORIGINAL)
        if text is None or _UNKNOWN_DATE.fullmatch(text):
            return None, None
        match = _DATE.fullmatch(text)
        try:
            if match is None:
                raise ValueError("not a date and time")
            year, month, day, hour, minute, second = (int(part) for part in match.groups())
            local = datetime(year, month, day, hour, minute, second)
        except ValueError as error:
            self.problems.append(f"DateTimeOriginal: {error}")
            return None, None
        subsec = self._text(exif, _SUBSEC_TIME_ORIGINAL)
        if subsec is not None:
            if subsec.isdigit() and subsec.isascii():
                local = local.replace(microsecond=int(subsec[:6].ljust(6, "0")))
            else:
                self.problems.append("SubSecTimeOriginal: not digits")
        zone = self._zone(exif)
        if zone is None:
            return None, local
        try:
            return local.replace(tzinfo=zone).astimezone(UTC), local
        except OverflowError:
            self.problems.append("DateTimeOriginal: out of range in UTC")
            return None, local

    def _zone(self, exif: dict[int, _Entry]) -> timezone | None:
        text = self._text(exif, _OFFSET_TIME_ORIGINAL)
        if text is None or _UNKNOWN_OFFSET.fullmatch(text):
            return None
        match = _OFFSET.fullmatch(text)
        if match is not None:
            sign, hours, minutes = match.groups()
            offset = timedelta(hours=int(hours), minutes=int(minutes))
            if int(minutes) < 60 and offset <= _MAX_OFFSET:
                return timezone(-offset if sign == "-" else offset)
        self.problems.append("OffsetTimeOriginal: not an offset from UTC")
        return None

    def _location(self, gps: dict[int, _Entry]) -> Location | None:
        """Signed decimal degrees, and metres; None where the position is unknown or unreadable.

        0/0 and 0/0 is no position: phones without a fix write it (an Apple Vision Pro's photos,
        a Samsung's 0/0 rationals with no hemisphere).
        """
        latitude = self._coordinate(gps, _LATITUDE_REF, _LATITUDE, "GPSLatitude", 90)
        longitude = self._coordinate(gps, _LONGITUDE_REF, _LONGITUDE, "GPSLongitude", 180)
        if latitude is None or longitude is None or (latitude == 0 and longitude == 0):
            return None
        return Location(latitude=latitude, longitude=longitude, altitude=self._altitude(gps))

    def _coordinate(
        self, gps: dict[int, _Entry], ref_tag: int, tag: int, name: str, bound: int
    ) -> float | None:
        ref = self._ref(gps, ref_tag, f"{name}Ref")
        parts = self._numbers(gps, tag, name, 3)
        if ref is None or parts is None or any(math.isnan(part) for part in parts):
            return None
        degrees, minutes, seconds = parts
        value = degrees + minutes / 60 + seconds / 3600
        if min(parts) < 0 or minutes >= 60 or seconds >= 60 or value > bound:
            self.problems.append(f"{name}: out of range")
            return None
        return ref * value

    def _ref(self, gps: dict[int, _Entry], tag: int, name: str) -> int | None:
        """+1 or -1 by the hemisphere; None where there is none (a NUL: no fix) or it is no letter."""
        value = self._text_bytes(gps, tag, name)
        letter = bytes(value[:1]).decode("latin-1").upper() if value is not None else ""
        if letter in ("", "\0"):
            return None
        sign = _SIGNS[tag].get(letter)
        if sign is None:
            self.problems.append(f"{name}: not a hemisphere")
        return sign

    def _altitude(self, gps: dict[int, _Entry]) -> float | None:
        numbers = self._numbers(gps, _ALTITUDE, "GPSAltitude")
        if numbers is None or math.isnan(numbers[0]):
            return None
        below = gps.get(_ALTITUDE_REF)
        value = self._bytes(below, "GPSAltitudeRef") if below is not None else None
        # 1: below sea level; a negative SRATIONAL says so itself.
        return -abs(numbers[0]) if value is not None and bytes(value[:1]) == b"\x01" else numbers[0]


def _tiff_start(block: memoryview) -> int | None:
    """Where the TIFF structure starts: at once, or after "Exif\\0\\0" within the first bytes."""
    head = bytes(block[:16])
    if head[:4] in (b"II*\0", b"MM\0*"):
        return 0
    at = head.find(b"Exif\0\0")
    if at < 0 or bytes(block[at + 6 : at + 10]) not in (b"II*\0", b"MM\0*"):
        return None
    return at + 6


def _clean(raw: bytes) -> str | None:
    """Text as a person reads it: up to its first NUL, UTF-8 (or Latin-1, each byte a character,
    where it is not), without control characters, spaces collapsed, at most MAX_CAPTURE_TEXT."""
    raw = raw.split(b"\0", 1)[0]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return text[:MAX_CAPTURE_TEXT].rstrip() or None
