"""How many rows of a strip TIFF libvips' reader decodes at once, read from the file's first IFD.

libvips reads a strip image either a scanline at a time (strips of more than 128 rows, interleaved,
not YCbCr) or a whole strip at a time (TIFFReadEncodedStrip) otherwise: a JPEG-coded YCbCr file
written as one strip, as Pillow and scanners write them, is decoded whole (measured at 100 MP: 655
MB held, where a scanline reader holds 110). No header field of libvips says which, so the tags are
read here: RowsPerStrip, PhotometricInterpretation, PlanarConfiguration.
"""

from __future__ import annotations

import struct

_ROWS_PER_STRIP, _PHOTOMETRIC, _PLANAR = 278, 262, 284
_YCBCR, _SEPARATE = 6, 2
# libvips' own threshold: strips of more rows than this are read a scanline at a time, where they can be.
_SCANLINE_ABOVE = 128
# Field types whose value is an unsigned number held in the entry itself: BYTE, SHORT, LONG, LONG8
# (libtiff reads a tag of any of them, whatever the specification types it as).
_NUMBER = {1: "B", 3: "H", 4: "I", 16: "Q"}


def rows_read_at_once(data: bytes | bytearray, height: int) -> int:
    """Rows of the first page decoded at once: 1 where libvips reads scanlines, else a strip's rows
    (at most the height); the whole height where the tags cannot be read, the most it can be."""
    tags = _first_ifd(data)
    if tags is None:
        return height
    strip = min(max(tags.get(_ROWS_PER_STRIP, height), 1), height)
    whole_strips = (
        strip <= _SCANLINE_ABOVE or tags.get(_PLANAR) == _SEPARATE or tags.get(_PHOTOMETRIC) == _YCBCR
    )
    return strip if whole_strips else 1


def _first_ifd(data: bytes | bytearray) -> dict[int, int] | None:
    """The first IFD's numeric tags of one value (classic TIFF or BigTIFF), or None if unreadable."""
    order = {b"II": "<", b"MM": ">"}.get(bytes(data[:2]))
    if order is None:
        return None
    try:
        magic = struct.unpack_from(order + "H", data, 2)[0]
        if magic == 42:
            (at,), count_format, entry_size, value_at = struct.unpack_from(order + "I", data, 4), "H", 12, 8
        elif magic == 43:
            (at,), count_format, entry_size, value_at = struct.unpack_from(order + "Q", data, 8), "Q", 20, 12
        else:
            return None
        (count,) = struct.unpack_from(order + count_format, data, at)
        at += struct.calcsize(count_format)
        tags = {}
        for _ in range(min(count, 4096)):
            tag, kind, number = struct.unpack_from(order + "HH" + ("I" if magic == 42 else "Q"), data, at)
            if kind in _NUMBER and number == 1:
                tags[tag] = struct.unpack_from(order + _NUMBER[kind], data, at + value_at)[0]
            at += entry_size
    except (struct.error, OverflowError):  # an offset past the file, or past any file
        return None
    return tags
