"""Animated and multi-page files cut to their first frame before libvips reads them.

Only the first frame is rendered (SPEC 3), but libvips' header read walks them all, at a cost the
file chooses: libwebp's demuxer walks its frame list from the start for every frame (100,000
frames of a 4.6 MB WebP: 51 s), tiffload reads every page's directory to count pages (100,000 pages:
6.6 s), nsgif keeps about 190 bytes for every frame it scans (1,000,000 frames: 190 MB). Each cut
below is a few structural steps from the start of the file, the same for one frame or millions; a
file too broken to walk is left as it is, for libvips to refuse.
"""

from __future__ import annotations

import struct
from contextlib import suppress

# libvips' loaders (by nickname) whose files this module knows how to cut.
_GIF, _TIFF, _WEBP = "gifload_source", "tiffload_source", "webpload_source"
# A GIF frame's disposal method: restore the canvas to what it was before the frame.
_RESTORE_PREVIOUS = 3


def first_frame(loader: str, data: bytearray) -> None:
    """Cut `data` (the whole file, in place) to its first frame or page, if it has more."""
    cut = {_GIF: _gif, _TIFF: _tiff, _WEBP: _webp}.get(loader)
    # A file shorter than its own structure says is left as it is: libvips reports the damage.
    if cut is not None:
        with suppress(IndexError, struct.error):
            cut(data)


def _tiff(data: bytearray) -> None:
    """Zero the first directory's link to the next: the chain of pages ends at page one."""
    order = {b"II": "<", b"MM": ">"}.get(bytes(data[:2]))
    if order is None:
        return
    # Classic TIFF (42): 4-byte offsets, 2-byte entry counts, 12-byte entries; BigTIFF (43): 8, 8, 20.
    offset, count, entry, first_at = {42: ("I", "H", 12, 4), 43: ("Q", "Q", 20, 8)}.get(
        struct.unpack_from(order + "H", data, 2)[0], (None, None, 0, 0)
    )
    if offset is None or count is None:
        return
    directory = struct.unpack_from(order + offset, data, first_at)[0]
    entries = struct.unpack_from(order + count, data, directory)[0]
    struct.pack_into(order + offset, data, directory + struct.calcsize(count) + entries * entry, 0)


def _gif(data: bytearray) -> None:
    """End the file (with its trailer) right after the first image's data.

    The first frame's disposal "restore to previous" goes too: what follows the frame (here,
    nothing) is all it decides, but nsgif keeps a copy of the whole canvas for it, 4 bytes a pixel
    more than the header's count (found by the fuzzer: a 51-byte GIF of 11280 x 4135 peaked at
    517 MB, 339 MB without it).
    """
    if data[:3] != b"GIF":
        return
    at = 13 + _colour_table(data[10])  # signature and screen descriptor, then the global table
    while True:
        if data[at] == 0x21:  # an extension: its label, then data sub-blocks
            if data[at + 1] == 0xF9 and (data[at + 3] >> 2) & 7 == _RESTORE_PREVIOUS:
                data[at + 3] &= ~0x1C  # a graphic control extension: its disposal, unspecified
            at = _after_sub_blocks(data, at + 2)
        elif data[at] == 0x2C:  # an image: descriptor, local table, LZW code size, data sub-blocks
            at = _after_sub_blocks(data, at + 10 + _colour_table(data[at + 9]) + 1)
            del data[at:]
            data.append(0x3B)
            return
        else:
            return


def _colour_table(packed: int) -> int:
    return 3 << ((packed & 7) + 1) if packed & 0x80 else 0


def _after_sub_blocks(data: bytearray, at: int) -> int:
    while data[at]:
        at += data[at] + 1
    return at + 1


def _webp(data: bytearray) -> None:
    """End the file after the first animation frame (ANMF chunk), its RIFF size made to match.

    Chunks after the frames (EXIF, XMP) go with them, and the extended header (VP8X) stops
    announcing them: the variants carry no metadata anyway.
    """
    if data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        return
    at, frames = 12, 0
    while at + 8 <= len(data):
        kind, size = bytes(data[at : at + 4]), struct.unpack_from("<I", data, at + 4)[0]
        if kind == b"ANMF":
            frames += 1
            if frames == 2:
                del data[at:]
                struct.pack_into("<I", data, 4, len(data) - 8)
                if data[12:16] == b"VP8X":
                    data[20] &= ~0x0C  # the EXIF and XMP flags
                return
        at += 8 + size + (size & 1)


def webp_first_frame(data: bytes | bytearray) -> tuple[int, int, int, int] | None:
    """An animated WebP's first frame (ANMF): its offset and size on the canvas, or None without one.

    libvips shrinks an animation on load only where every frame fills the canvas; else it composes
    each frame, decoded whole, on the whole canvas (pipeline._webp_canvas counts that).
    """
    if data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        return None
    at = 12
    with suppress(IndexError, struct.error):
        while at + 8 <= len(data):
            kind, size = bytes(data[at : at + 4]), struct.unpack_from("<I", data, at + 4)[0]
            if kind == b"ANMF":
                if at + 20 > len(data):
                    return None
                x, y, width, height = (
                    int.from_bytes(data[at + 8 + 3 * i : at + 11 + 3 * i], "little") for i in range(4)
                )
                return 2 * x, 2 * y, width + 1, height + 1
            at += 8 + size + (size & 1)
    return None


def webp_chunks(data: bytes | bytearray) -> dict[bytes, tuple[int, int]]:
    """Where each kind of a WebP's chunks first is (its payload's start and end): VP8, VP8L, ALPH,
    ANMF..., those of its first animation frame among them (an ANMF holds its frame's ALPH and VP8
    or VP8L); none if not a WebP."""
    if data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        return {}
    found: dict[bytes, tuple[int, int]] = {}
    at, end, framed = 12, len(data), False
    with suppress(IndexError, struct.error):
        while at + 8 <= end:
            kind, size = bytes(data[at : at + 4]), struct.unpack_from("<I", data, at + 4)[0]
            found.setdefault(kind, (at + 8, min(at + 8 + size, end)))
            if kind == b"ANMF" and not framed:
                # Into the first frame's own chunks, after its 16 bytes of placement and timing.
                at, end, framed = at + 24, min(at + 8 + size, end), True
                continue
            at += 8 + size + (size & 1)
    return found
