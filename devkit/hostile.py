"""Hostile inputs: files made to cost a decoder memory or time, in every accepted format.

Each is built for its shape, not its pixels: a PNG of 10,000,000 x 10 pixels is a 300 KB file of
zero rows, a HEIC of 12240 x 16320 pixels repeats one coded 512 x 512 tile 768 times. The writers
stream what they write (a PNG's rows through one zlib stream, a TIFF's strips one at a time), so
making a bomb never costs what decoding it would. Where a real encoder is the point (a real HEVC
tile, a real AV1 picture, a progressive JPEG), libvips or pillow-heif encodes a small picture and
the writer repeats or re-labels it.

    python -m devkit.hostile <folder>    write every case of CASES not there yet

CASES is the hostile corpus: every accepted format, extreme shapes both ways, deep samples, many
frames and pages, tiny files with huge canvases, each limit's default met and just passed, and the
phones' HEIC layouts. Each case names what it should come to under the default limits and the
template's memory (`rendered`, or the code it is refused with); benchmarks/hostile.py renders each
in a fresh process, as the process function would (in a shared slot, or alone). The tests
build their bombs from the same writers, and a fuzzer or a soak test can.
"""

from __future__ import annotations

import os
import struct
import sys
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Protocol

from devkit import samples
from photo_publish.image.heic import walk_boxes

# --- PNG -------------------------------------------------------------------------------------------

_PNG_COLOUR = {1: 0, 2: 4, 3: 2, 4: 6}  # bands -> colour type (grey, grey+alpha, RGB, RGBA)


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png(
    width: int,
    height: int,
    *,
    bits: int = 8,
    bands: int = 3,
    interlaced: bool = False,
    profile: bytes | None = None,
    rows: Callable[[int], bytes] | None = None,
) -> bytes:
    """A PNG of that shape; `rows(y)` gives row y's samples (default: zeros, which compress to nothing).

    Interlaced (Adam7) files carry the same rows in the seven passes' order; for zero rows that is
    the same bytes per pass, so only the pass sizes are computed.
    """
    header = struct.pack(">IIBBBBB", width, height, bits, _PNG_COLOUR[bands], 0, 0, int(interlaced))
    stride = bands * bits // 8
    compressor = zlib.compressobj(9)
    body = bytearray()
    if interlaced:
        # Adam7: (x start, y start, x step, y step) of the seven passes.
        for x0, y0, dx, dy in (
            (0, 0, 8, 8),
            (4, 0, 8, 8),
            (0, 4, 4, 8),
            (2, 0, 4, 4),
            (0, 2, 2, 4),
            (1, 0, 2, 2),
            (0, 1, 1, 2),
        ):
            pass_width, pass_height = -(-(width - x0) // dx), -(-(height - y0) // dy)
            if pass_width <= 0 or pass_height <= 0:
                continue
            row = b"\0" + bytes(pass_width * stride)
            for _ in range(pass_height):
                body += compressor.compress(row)
    elif rows is None:
        # Zero rows in batches of about 16 MB: a tall picture is millions of rows.
        zero = b"\0" + bytes(width * stride)
        batch = max(1, (16 << 20) // len(zero))
        for top in range(0, height, batch):
            body += compressor.compress(zero * min(batch, height - top))
    else:
        for y in range(height):
            body += compressor.compress(b"\0" + rows(y))
    body += compressor.flush()
    chunks = [_png_chunk(b"IHDR", header)]
    if profile is not None:
        chunks.append(_png_chunk(b"iCCP", b"icc\0\0" + zlib.compress(profile)))
    chunks += [_png_chunk(b"IDAT", bytes(body)), _png_chunk(b"IEND", b"")]
    return b"\x89PNG\r\n\x1a\n" + b"".join(chunks)


# --- TIFF ------------------------------------------------------------------------------------------

_SAMPLE_FORMAT = {"uint": 1, "int": 2, "float": 3}


class _Tiff:
    """A little-endian TIFF being written: pieces appended, each at an even offset."""

    def __init__(self) -> None:
        self.out = bytearray(b"II*\0\0\0\0\0")

    def put(self, data: bytes) -> int:
        if len(self.out) % 2:
            self.out.extend(b"\0")
        at = len(self.out)
        self.out.extend(data)
        return at

    def strips(self, row: bytes, height: int, rows_per_strip: int) -> tuple[list[int], list[int]]:
        """Zero rows, deflate-compressed strip by strip (batches of about 16 MB); offsets and sizes."""
        offsets, counts = [], []
        batch = max(1, (16 << 20) // max(1, len(row)))
        for top in range(0, height, rows_per_strip):
            compressor, data = zlib.compressobj(9), bytearray()
            left = min(rows_per_strip, height - top)
            while left:
                data += compressor.compress(row * min(batch, left))
                left -= min(batch, left)
            data += compressor.flush()
            offsets.append(self.put(bytes(data)))
            counts.append(len(data))
        return offsets, counts

    def value(self, values: list[int], kind: int) -> int:
        """An entry's value: itself if it fits in the entry's 4 bytes, else where it was put."""
        if len(values) == 1:
            return values[0]
        if kind == 3 and len(values) == 2:
            return values[0] | values[1] << 16
        return self.put(struct.pack(f"<{len(values)}{'H' if kind == 3 else 'I'}", *values))

    def directory(self, entries: list[tuple[int, int, list[int]]]) -> int:
        """An IFD of (tag, type, values) entries, linked to nothing yet; its offset."""
        table = struct.pack("<H", len(entries))
        for tag, kind, values in sorted(entries):
            value = self.value(values, kind)
            packed = (
                struct.pack("<HH", value, 0) if kind == 3 and len(values) == 1 else struct.pack("<I", value)
            )
            table += struct.pack("<HHI", tag, kind, len(values)) + packed
        return self.put(table + b"\0\0\0\0")

    def link(self, directory: int, to: int) -> None:
        entries = struct.unpack_from("<H", self.out, directory)[0]
        struct.pack_into("<I", self.out, directory + 2 + 12 * entries, to)


def tiff(
    width: int,
    height: int,
    *,
    bits: int = 8,
    bands: int = 3,
    sample_format: str = "uint",
    rows_per_strip: int | None = None,
    tile: tuple[int, int] | None = None,
    pages: int = 1,
) -> bytes:
    """A little-endian TIFF of zero samples, deflate-compressed in strips of `rows_per_strip` rows
    (default: the whole picture in one strip), or in tiles of `tile` pixels (every tile the same
    bytes, stored once); `pages` - 1 more pages (one row each) chain after the first, as a scanner's
    multi-page file does."""
    writer = _Tiff()
    row = bytes(width * bands * bits // 8)

    def entries(picture_height: int, pieces: tuple[list[int], list[int]]) -> list[tuple[int, int, list[int]]]:
        offsets, counts = pieces
        listed = [
            (256, 4, [width]),
            (257, 4, [picture_height]),
            (258, 3, [bits] * bands),
            (259, 3, [8]),  # deflate
            (262, 3, [2 if bands >= 3 else 1]),
            (277, 3, [bands]),
            (284, 3, [1]),
            (339, 3, [_SAMPLE_FORMAT[sample_format]] * bands),
        ]
        if tile is None:
            listed += [
                (273, 4, offsets),
                (278, 4, [min(rows_per_strip or height, picture_height)]),
                (279, 4, counts),
            ]
        else:
            listed += [(322, 4, [tile[0]]), (323, 4, [tile[1]]), (324, 4, offsets), (325, 4, counts)]
        if bands in (2, 4):
            listed.append((338, 3, [2]))  # the last band is unassociated alpha
        return listed

    if tile is None:
        pieces = writer.strips(row, height, rows_per_strip or height)
    else:
        (offset,), (count,) = writer.strips(bytes(tile[0] * bands * bits // 8), tile[1], tile[1])
        tiles = -(-width // tile[0]) * -(-height // tile[1])
        pieces = ([offset] * tiles, [count] * tiles)
    first = writer.directory(entries(height, pieces))
    writer.out[4:8] = struct.pack("<I", first)
    if pages > 1:
        page = entries(1, writer.strips(row, 1, 1))
        previous = first
        for _ in range(pages - 1):
            current = writer.directory(page)
            writer.link(previous, current)
            previous = current
    return bytes(writer.out)


# --- GIF -------------------------------------------------------------------------------------------


def _gif_lzw_zeros(pixels: int) -> bytes:
    """LZW data of `pixels` zero indices at minimum code size 2, without compression: a clear code
    before every two indices keeps every code 3 bits wide. Small frames only."""
    codes = []
    for at in range(0, pixels, 2):
        codes += [4] + [0] * min(2, pixels - at)
    codes.append(5)
    bits = 0
    value = 0
    data = bytearray()
    for code in codes:
        value |= code << bits
        bits += 3
        while bits >= 8:
            data.append(value & 0xFF)
            value >>= 8
            bits -= 8
    if bits:
        data.append(value)
    blocks = b"".join(bytes([len(data[i : i + 255])]) + data[i : i + 255] for i in range(0, len(data), 255))
    return b"\x02" + blocks + b"\0"


def gif(
    canvas: tuple[int, int],
    frame: tuple[int, int] = (1, 1),
    *,
    frames: int = 1,
    coded: bool = True,
    comments: int = 0,
) -> bytes:
    """A GIF whose logical screen is `canvas` and whose `frames` frames are `frame`-sized, at (0, 0).

    With `coded`, each frame's pixels are there (zeros, one code per pixel: small frames only);
    without, a frame declares its size and holds no pixel at all, as a bomb does. `comments`
    one-byte comment extensions come before the first frame."""
    screen = struct.pack("<HHBBB", *canvas, 0x80, 0, 0)  # a global table of 2 colours
    parts = [b"GIF89a", screen, b"\0\0\0\xff\xff\xff", b"\x21\xfe\x01X\0" * comments]
    if frames > 1:
        parts.append(b"\x21\xff\x0bNETSCAPE2.0\x03\x01\0\0\0")
    lzw = _gif_lzw_zeros(frame[0] * frame[1] if coded else 0)
    for _ in range(frames):
        parts.append(b"\x21\xf9\x04\x04\x01\x00\x00\x00")  # 1/100 s, keep the frame
        parts.append(b"\x2c" + struct.pack("<HHHHB", 0, 0, *frame, 0) + lzw)
    parts.append(b"\x3b")
    return b"".join(parts)


# --- WebP ------------------------------------------------------------------------------------------


def _riff_chunk(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack("<I", len(payload)) + payload + (b"\0" if len(payload) % 2 else b"")


def _webp_chunks(data: bytes) -> Iterator[tuple[bytes, bytes]]:
    offset = 12
    while offset + 8 <= len(data):
        kind, size = data[offset : offset + 4], struct.unpack_from("<I", data, offset + 4)[0]
        yield kind, data[offset + 8 : offset + 8 + size]
        offset += 8 + size + size % 2


def animated_webp(canvas: tuple[int, int], frame: bytes, *, frames: int = 1) -> bytes:
    """An animated WebP: `frames` copies of the still WebP `frame` on a `canvas` (at most 16384 a side)."""
    (bitstream,) = [(kind, payload) for kind, payload in _webp_chunks(frame) if kind in (b"VP8 ", b"VP8L")]
    width, height = _webp_size(frame)
    vp8x = (
        struct.pack("<B3x", 0x02)
        + (canvas[0] - 1).to_bytes(3, "little")
        + (canvas[1] - 1).to_bytes(3, "little")
    )
    anim = struct.pack("<IH", 0, 0)
    anmf = (
        bytes(6)  # x, y offsets (/2)
        + (width - 1).to_bytes(3, "little")
        + (height - 1).to_bytes(3, "little")
        + (10).to_bytes(3, "little")  # duration, ms
        + b"\0"
        + _riff_chunk(*bitstream)
    )
    body = (
        b"WEBP"
        + _riff_chunk(b"VP8X", vp8x)
        + _riff_chunk(b"ANIM", anim)
        + _riff_chunk(b"ANMF", anmf) * frames
    )
    return b"RIFF" + struct.pack("<I", len(body)) + body


def _webp_size(data: bytes) -> tuple[int, int]:
    for kind, payload in _webp_chunks(data):
        if kind == b"VP8L":
            bits = int.from_bytes(payload[1:5], "little")
            return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
        if kind == b"VP8 ":
            return struct.unpack_from("<H", payload, 6)[0] & 0x3FFF, struct.unpack_from("<H", payload, 8)[
                0
            ] & 0x3FFF
    raise ValueError("no VP8/VP8L chunk")


# --- HEIF (HEIC and AVIF) ----------------------------------------------------------------------------


def _box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def _full_box(kind: bytes, version: int, flags: int, payload: bytes) -> bytes:
    return _box(kind, bytes([version]) + flags.to_bytes(3, "big") + payload)


@dataclass(frozen=True)
class CodedPicture:
    """One coded picture of a HEIF file: its item type, its decoder configuration box, its size and data."""

    item_type: bytes  # b"hvc1" or b"av01"
    config: bytes  # the whole hvcC / av1C box
    size: tuple[int, int]
    data: bytes


def coded_picture(heif: bytes) -> CodedPicture:
    """The primary picture of a single-picture HEIF (no grid), as an encoder wrote it."""
    (meta_start, meta_end) = next((s, e) for kind, s, e in walk_boxes(heif, 0, len(heif)) if kind == b"meta")
    children = {kind: (s, e) for kind, s, e in walk_boxes(heif, meta_start + 4, meta_end)}
    primary = struct.unpack_from(">H", heif, children[b"pitm"][0] + 4)[0]
    item_type = b""
    start, end = children[b"iinf"]
    version = heif[start]
    first = start + 4 + (2 if version == 0 else 4)
    for kind, s, _ in walk_boxes(heif, first, end):
        if kind == b"infe" and struct.unpack_from(">H", heif, s + 4)[0] == primary:
            item_type = heif[s + 8 : s + 12]
    data = _iloc_data(heif, *children[b"iloc"], primary)
    properties = [
        (kind, s - 8, e) for kind, s, e in walk_boxes(heif, *_child(heif, *children[b"iprp"], b"ipco"))
    ]
    config = next(heif[s:e] for kind, s, e in properties if kind in (b"hvcC", b"av1C"))
    ispe = next(heif[s + 12 : e] for kind, s, e in properties if kind == b"ispe")
    return CodedPicture(item_type, config, struct.unpack(">II", ispe), data)


def _child(data: bytes, start: int, end: int, kind: bytes) -> tuple[int, int]:
    return next((s, e) for k, s, e in walk_boxes(data, start, end) if k == kind)


def _iloc_data(data: bytes, start: int, end: int, item: int) -> bytes:
    version = data[start]
    at = start + 4
    sizes = data[at] << 8 | data[at + 1]
    offset_size, length_size, base_size, index_size = (
        sizes >> 12,
        (sizes >> 8) & 15,
        (sizes >> 4) & 15,
        sizes & 15,
    )
    at += 2
    count_size = 4 if version == 2 else 2
    count = int.from_bytes(data[at : at + count_size], "big")
    at += count_size

    def number(size: int) -> int:
        nonlocal at
        value = int.from_bytes(data[at : at + size], "big")
        at += size
        return value

    for _ in range(count):
        item_id = number(4 if version == 2 else 2)
        if version in (1, 2):
            number(2)  # construction method 0: offsets in the file
        number(2)
        base = number(base_size)
        extents = number(2)
        pieces = []
        for _ in range(extents):
            if version in (1, 2) and index_size:
                number(index_size)
            offset, length = number(offset_size), number(length_size)
            pieces.append(data[base + offset : base + offset + length])
        if item_id == item:
            return b"".join(pieces)
    raise ValueError(f"item {item} not in iloc")


@dataclass(frozen=True)
class Grid:
    """A grid image of one picture repeated: `columns` x `rows` tiles, shown cropped to `size`."""

    tile: CodedPicture
    columns: int
    rows: int
    size: tuple[int, int]
    aux_type: str | None = None  # an auxiliary image (e.g. Apple's HDR gain map) of the primary


class _Heif:
    """The items of a HEIF being built: their types, data, references and properties."""

    def __init__(self) -> None:
        self.items: list[tuple[int, bytes, int]] = []  # (id, type, hidden flag)
        self.locations: list[tuple[int, int]] = []  # (id, index into payloads)
        self.payloads: list[bytes] = []
        self.references: list[tuple[bytes, int, list[int]]] = []
        self.associations: dict[int, list[int]] = {}
        self.properties: list[bytes] = []

    def property(self, box: bytes, essential: bool = False) -> int:
        if box not in self.properties:
            self.properties.append(box)
        return (0x80 if essential else 0) | (self.properties.index(box) + 1)

    def item(self, kind: bytes, payload: bytes | None, *properties: int, hidden: bool = False) -> int:
        item = len(self.items) + 1
        self.items.append((item, kind, int(hidden)))
        if payload is not None:
            if payload not in self.payloads:
                self.payloads.append(payload)
            self.locations.append((item, self.payloads.index(payload)))
        self.associations[item] = list(properties)
        return item

    def picture(self, picture: CodedPicture, hidden: bool = False) -> int:
        config = self.property(picture.config, essential=True)
        return self.item(
            picture.item_type, picture.data, config, self.property(_ispe(picture.size)), hidden=hidden
        )

    def grid(self, grid: Grid) -> int:
        wide = max(grid.size) > 0xFFFF
        descriptor = bytes([0, int(wide), grid.rows - 1, grid.columns - 1]) + struct.pack(
            ">II" if wide else ">HH", *grid.size
        )
        grid_id = self.item(b"grid", descriptor, self.property(_ispe(grid.size)))
        tiles = [self.picture(grid.tile, hidden=True) for _ in range(grid.columns * grid.rows)]
        self.references.append((b"dimg", grid_id, tiles))
        return grid_id

    def meta(self, primary: int, offsets: list[int]) -> bytes:
        hdlr = _full_box(b"hdlr", 0, 0, bytes(4) + b"pict" + bytes(12) + b"\0")
        pitm = _full_box(b"pitm", 0, 0, struct.pack(">H", primary))
        locations = b"".join(
            struct.pack(">HHHHII", item, 0, 0, 1, offsets[payload], len(self.payloads[payload]))
            for item, payload in self.locations
        )
        iloc = _full_box(
            b"iloc", 1, 0, bytes([0x44, 0x00]) + struct.pack(">H", len(self.locations)) + locations
        )
        infes = b"".join(
            _full_box(b"infe", 2, hidden, struct.pack(">HH", item, 0) + kind + b"\0")
            for item, kind, hidden in self.items
        )
        iinf = _full_box(b"iinf", 0, 0, struct.pack(">H", len(self.items)) + infes)
        references = b"".join(
            _box(kind, struct.pack(f">HH{len(to)}H", source, len(to), *to))
            for kind, source, to in self.references
        )
        associations = b"".join(
            struct.pack(">HB", item, len(indices)) + bytes(indices)
            for item, indices in sorted(self.associations.items())
        )
        ipma = _full_box(b"ipma", 0, 0, struct.pack(">I", len(self.associations)) + associations)
        iprp = _box(b"iprp", _box(b"ipco", b"".join(self.properties)) + ipma)
        return _full_box(
            b"meta", 0, 0, hdlr + pitm + iloc + iinf + _full_box(b"iref", 0, 0, references) + iprp
        )


def _ispe(size: tuple[int, int]) -> bytes:
    return _full_box(b"ispe", 0, 0, struct.pack(">II", *size))


# A minimal big-endian EXIF block, behind the 4-byte offset HEIF puts before it.
_EXIF = b"\0\0\0\x06Exif\0\0MM\0*\0\0\0\x08\0\0\0\0\0\0"


def heif(
    primary: Grid,
    *,
    auxiliary: tuple[Grid, ...] = (),
    thumbnail: CodedPicture | None = None,
    metadata_items: int = 0,
    brand: bytes = b"heic",
) -> bytes:
    """A HEIF as a phone lays one out: the primary a grid of tiles, with auxiliary grids (gain maps,
    mattes), a thumbnail and metadata items (EXIF, XMP), every tile of a grid repeating the grid's
    one coded picture. What the file declares (its size, its item count) is what a case is about."""
    built = _Heif()
    primary_id = built.grid(primary)
    for grid in auxiliary:
        aux = built.grid(grid)
        urn = (grid.aux_type or "urn:com:apple:photo:2020:aux:hdrgainmap").encode() + b"\0"
        built.associations[aux].append(built.property(_full_box(b"auxC", 0, 0, urn), essential=True))
        built.references.append((b"auxl", aux, [primary_id]))
    if thumbnail is not None:
        built.references.append((b"thmb", built.picture(thumbnail), [primary_id]))
    for _ in range(metadata_items):
        built.references.append((b"cdsc", built.item(b"Exif", _EXIF, hidden=True), [primary_id]))

    ftyp = _box(b"ftyp", brand + bytes(4) + b"mif1" + brand + (b"miaf" if brand == b"avif" else b""))
    # Item locations are file offsets: the meta box's size does not depend on them.
    offset = len(ftyp) + len(built.meta(primary_id, [0] * len(built.payloads))) + 8
    offsets = []
    for payload in built.payloads:
        offsets.append(offset)
        offset += len(payload)
    return ftyp + built.meta(primary_id, offsets) + _box(b"mdat", b"".join(built.payloads))


# --- JPEG ------------------------------------------------------------------------------------------


def with_jpeg_size(jpeg: bytes, size: tuple[int, int]) -> bytes:
    """The JPEG with the size in its frame header (SOF) replaced: a header that lies."""
    out = bytearray(jpeg)
    at = 2
    while at + 4 <= len(out):
        marker, length = out[at + 1], struct.unpack_from(">H", out, at + 2)[0]
        if marker in (0xC0, 0xC1, 0xC2):
            struct.pack_into(">HH", out, at + 5, size[1], size[0])
            return bytes(out)
        at += 2 + length
    raise ValueError("no SOF marker")


def repeated_scans(jpeg: bytes, times: int) -> bytes:
    """A progressive JPEG with its smallest scan repeated `times` more before its end: each scan is a
    pass over every DCT coefficient of the picture for the decoder, and a few bytes of file."""
    end = jpeg.rindex(b"\xff\xd9")
    starts = [at for at in range(len(jpeg) - 1) if jpeg[at] == 0xFF and jpeg[at + 1] == 0xDA]
    scans = zip(starts, [*starts[1:], end], strict=True)
    start, stop = min(scans, key=lambda scan: scan[1] - scan[0])
    return jpeg[:end] + jpeg[start:stop] * times + jpeg[end:]


# --- The corpus ----------------------------------------------------------------------------------


@cache
def _tile(kind: str) -> CodedPicture:
    """One real coded picture, from the project's photograph: HEVC 512 x 512 (8 or 10-bit), AV1 512 x 512."""

    crop = samples.photograph().crop(0, 0, 512, 512)
    if kind == "av1":
        return coded_picture(bytes(crop.heifsave_buffer(compression="av1", Q=50, effort=0)))
    return coded_picture(samples.heic(crop, tile_size=0, bits=10 if kind == "hevc-10" else 8))


def _grid(kind: str, size: tuple[int, int], *, thumbnail: bool = False, metadata_items: int = 0) -> bytes:
    """A picture of `size` in tiles of one, with a thumbnail (the tile) and metadata items if asked."""
    tile = _tile(kind)
    across, down = -(-size[0] // tile.size[0]), -(-size[1] // tile.size[1])
    brand = b"avif" if kind == "av1" else b"heic"
    return heif(
        Grid(tile, across, down, size),
        thumbnail=tile if thumbnail else None,
        metadata_items=metadata_items,
        brand=brand,
    )


def _iphone_48mp(mattes: int, kind: str = "hevc-8") -> bytes:
    """A 48 MP iPhone HEIC item for item: 16 x 12 tiles, an HDR gain map of 8 x 6, portrait mattes
    of 4 x 3 each, a thumbnail, EXIF and XMP: 245 items, and 13 more a matte."""
    tile = _tile(kind)
    mattes_grids = (
        Grid(tile, 4, 3, (2016, 1512), "urn:com:apple:photo:2019:aux:semanticskinmatte"),
    ) * mattes
    return heif(
        Grid(tile, 16, 12, (8064, 6048)),
        auxiliary=(Grid(tile, 8, 6, (4032, 3024)), *mattes_grids),
        thumbnail=tile,
        metadata_items=2,
    )


def _vips(make: Callable[[Any], bytes]) -> Callable[[], bytes]:
    """A file libvips encodes (a real progressive JPEG, a real WebP) from a black picture."""

    def run() -> bytes:
        import pyvips

        return make(pyvips.Image)

    return run


def _pillow_gif(size: tuple[int, int]) -> bytes:
    """A real GIF (LZW-coded by Pillow) of one colour."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("P", size).save(out, "GIF")
    return out.getvalue()


def _one_pixel_webp() -> bytes:
    import pyvips

    return bytes(pyvips.Image.black(1, 1, bands=3).webpsave_buffer(lossless=True))


@dataclass(frozen=True)
class Case:
    name: str  # also the file's name
    make: Callable[[], bytes]
    # What it comes to under the default limits: "rendered", or the code it is refused with.
    expect: str
    note: str = ""


REFUSED = "DIMENSIONS_EXCEEDED"
RENDERED = "rendered"
# The default limits (RenderOptions, Settings) the cases sit at, or just over. What a decoder may
# hold follows the function's memory (image/slots.py): at the template's, about 700 MB in a shared
# slot and 1.5 GB alone; the cases that sat at the 240 MB it replaced now render, in a slot.
PIXELS, SIDE, ROW = 100_000_000, 32_768, 196_608

CASES = [
    # PNG: cannot shrink on load; libvips holds whole rows, by the hundred while it shrinks.
    Case("png-1000000x100.png", lambda: png(1_000_000, 100), REFUSED, "the issue's 390 KB PNG: 1.85 GB"),
    Case("png-10000000x10-16bit.png", lambda: png(10_000_000, 10, bits=16), REFUSED, "13.5 GB, 48 s"),
    Case("png-10x10000000.png", lambda: png(10, 10_000_000), REFUSED, "ten million rows"),
    Case("png-100000x100000.png", samples.pixel_bomb_png, REFUSED, "a pixel bomb: 10 GP, 4 KB"),
    Case("png-10000x10000.png", lambda: png(10_000, 10_000), RENDERED, "at the pixel limit"),
    Case("png-10000x10001.png", lambda: png(10_000, 10_001), REFUSED, "one row over the pixel limit"),
    Case("png-32768x3051.png", lambda: png(SIDE, PIXELS // SIDE), RENDERED, "at the side limit"),
    Case("png-3051x32768.png", lambda: png(PIXELS // SIDE, SIDE), RENDERED, "at the side limit, tall"),
    Case("png-32769x100.png", lambda: png(SIDE + 1, 100), REFUSED, "one column over the side limit"),
    Case(
        "png-32768x3051-16bit.png", lambda: png(SIDE, PIXELS // SIDE, bits=16), RENDERED, "row at its limit"
    ),
    Case(
        "png-24576x4069-16bit-alpha.png",
        lambda: png(ROW // 8, PIXELS // (ROW // 8), bits=16, bands=4),
        RENDERED,
        "row at its limit, alpha",
    ),
    Case(
        "png-24577x100-16bit-alpha.png", lambda: png(ROW // 8 + 1, 100, bits=16, bands=4), REFUSED, "row over"
    ),
    Case(
        "png-32768x3051-16bit-p3.png",
        lambda: png(SIDE, PIXELS // SIDE, bits=16, profile=_p3_profile()),
        RENDERED,
        "row at its limit, colour-managed",
    ),
    Case(
        "png-interlaced-8944x8944.png",
        lambda: png(8944, 8944, interlaced=True),
        RENDERED,
        "decoded whole: at the old 240 MB limit",
    ),
    Case(
        "png-interlaced-8945x8945.png",
        lambda: png(8945, 8945, interlaced=True),
        RENDERED,
        "decoded whole: over the old limit, in a slot",
    ),
    Case(
        "png-interlaced-5477x5477-16bit-alpha.png",
        lambda: png(5477, 5477, bits=16, bands=4, interlaced=True),
        RENDERED,
        "decoded whole, 16-bit RGBA",
    ),
    Case(
        "png-interlaced-10000x10000-16bit-alpha.png",
        lambda: png(10_000, 10_000, bits=16, bands=4, interlaced=True),
        RENDERED,
        "decoded whole, 964 MB counted: alone",
    ),
    # TIFF: one strip or many, deep samples, many pages.
    Case("tiff-4000000x10.tif", lambda: tiff(4_000_000, 10), REFUSED, "the issue's TIFF: 2.07 GB"),
    Case("tiff-32768x3051.tif", lambda: tiff(SIDE, PIXELS // SIDE), RENDERED, "at the side limit, one strip"),
    Case(
        "tiff-24576x4069-16bit-alpha.tif",
        lambda: tiff(ROW // 8, PIXELS // (ROW // 8), bits=16, bands=4),
        RENDERED,
        "row at its limit",
    ),
    Case(
        "tiff-12288x8138-float-alpha.tif",
        lambda: tiff(ROW // 16, PIXELS // (ROW // 16), bits=32, bands=4, sample_format="float"),
        RENDERED,
        "float samples, row at its limit",
    ),
    Case(
        "tiff-16384x6103-float-alpha.tif",
        lambda: tiff(16384, PIXELS // 16384, bits=32, bands=4, sample_format="float"),
        REFUSED,
        "float samples, row over",
    ),
    Case(
        "tiff-11520x8640-tiles-5760.tif",
        lambda: tiff(11520, 8640, tile=(5760, 5760)),
        RENDERED,
        "tiles of 100 MB, 796 MB counted: alone",
    ),
    Case(
        "tiff-24576x4069-16bit-alpha-tiles-3456.tif",
        lambda: tiff(ROW // 8, PIXELS // (ROW // 8), bits=16, bands=4, tile=(3456, 3456)),
        REFUSED,
        "tiles of 91 MB: four rows 2.5 GB, more than a render alone may hold",
    ),
    Case(
        "tiff-24576x4069-16bit-alpha-tiles-304.tif",
        lambda: tiff(ROW // 8, PIXELS // (ROW // 8), bits=16, bands=4, tile=(304, 304)),
        RENDERED,
        "rows of tiles",
    ),
    Case(
        "tiff-32768x3051-tiles-512.tif",
        lambda: tiff(SIDE, PIXELS // SIDE, tile=(512, 512)),
        RENDERED,
        "tiled",
    ),
    Case("tiff-100000-pages.tif", lambda: tiff(64, 64, pages=100_000), RENDERED, "6.6 s before"),
    # JPEG: shrinks on load, except what a progressive one keeps (2 bytes a DCT coefficient).
    Case(
        "jpeg-declaring-65500x65500.jpg",
        _vips(lambda vips: with_jpeg_size(bytes(vips.black(64, 64).jpegsave_buffer()), (65500, 65500))),
        REFUSED,
        "a header that lies",
    ),
    Case(
        "jpeg-32768x3051.jpg",
        _vips(lambda vips: bytes(vips.black(SIDE, PIXELS // SIDE, bands=3).jpegsave_buffer())),
        RENDERED,
        "at the side limit",
    ),
    Case(
        "jpeg-progressive-6324x6324-444.jpg",
        _vips(
            lambda vips: bytes(
                vips.black(6324, 6324, bands=3).jpegsave_buffer(interlace=True, subsample_mode="off")
            )
        ),
        RENDERED,
        "progressive 4:4:4: 240 MB of coefficients",
    ),
    Case(
        "jpeg-progressive-declaring-6325x6325.jpg",
        _vips(
            lambda vips: with_jpeg_size(
                bytes(vips.black(64, 64, bands=3).jpegsave_buffer(interlace=True, subsample_mode="off")),
                (6325, 6325),
            )
        ),
        RENDERED,
        "progressive, a header that lies: held as declared",
    ),
    Case(
        "jpeg-progressive-cmyk-5477x5477.jpg",
        _vips(
            lambda vips: bytes(
                vips.black(5477, 5477, bands=4).copy(interpretation="cmyk").jpegsave_buffer(interlace=True)
            )
        ),
        RENDERED,
        "progressive CMYK: 240 MB of coefficients",
    ),
    Case(
        "jpeg-progressive-100000-scans.jpg",
        _vips(
            lambda vips: repeated_scans(
                bytes(vips.black(2048, 2048, bands=3).jpegsave_buffer(interlace=True)), 100_000
            )
        ),
        "DECODE_FAILED",
        "a scan bomb: libjpeg's progression check stops it",
    ),
    # GIF: its frame is decoded whole, in RGBA.
    Case(
        "gif-canvas-65535x65535.gif", lambda: gif((65535, 65535)), RENDERED, "a 43-byte file, 17 GB of canvas"
    ),
    Case(
        "gif-frame-10000x10000-empty.gif",
        lambda: gif((10_000, 10_000), (10_000, 10_000), coded=False),
        "DECODE_FAILED",
        "a frame with no pixels, on its whole canvas",
    ),
    Case("gif-7745x7745.gif", lambda: _pillow_gif((7745, 7745)), RENDERED, "decoded whole"),
    Case(
        "gif-4000000-extensions.gif",
        lambda: gif((64, 64), comments=4_000_000),
        RENDERED,
        "4,000,000 comments before its frame",
    ),
    Case("gif-1000000-frames.gif", lambda: gif((64, 64), frames=1_000_000), RENDERED, "190 MB before"),
    # WebP: shrinks on load, 16383 pixels a side at most.
    Case(
        "webp-16383x6103.webp",
        _vips(
            lambda vips: bytes(vips.black(16383, PIXELS // 16383, bands=3).webpsave_buffer(Q=10, effort=0))
        ),
        RENDERED,
        "WebP's largest side, 100 MP",
    ),
    Case(
        "webp-animated-canvas-16383x16383.webp",
        lambda: animated_webp((16383, 16383), _one_pixel_webp()),
        REFUSED,
        "a 90-byte file, 268 MP of canvas",
    ),
    Case(
        "webp-animated-canvas-10000x10000.webp",
        lambda: animated_webp((10_000, 10_000), _one_pixel_webp()),
        RENDERED,
        "a 90-byte file, 100 MP of canvas, in a slot",
    ),
    Case(
        "webp-animated-canvas-7745x7745.webp",
        lambda: animated_webp((7745, 7745), _one_pixel_webp()),
        RENDERED,
        "a canvas decoded whole",
    ),
    Case(
        "webp-100000-frames.webp",
        lambda: animated_webp((64, 64), _one_pixel_webp(), frames=100_000),
        RENDERED,
        "51 s before",
    ),
    # AVIF (libvips decodes it whole, through libheif).
    Case("avif-7302x7302.avif", lambda: _grid("av1", (7302, 7302)), RENDERED, "at the old 240 MB limit"),
    Case("avif-7304x7304.avif", lambda: _grid("av1", (7304, 7304)), RENDERED, "over it, in a slot"),
    # HEIC (pi-heif decodes it whole), in phones' layouts.
    Case("heic-7302x7302.heic", lambda: _grid("hevc-8", (7302, 7302)), RENDERED, "at the old 240 MB limit"),
    Case("heic-7304x7304.heic", lambda: _grid("hevc-8", (7304, 7304)), RENDERED, "over it, in a slot"),
    Case("heic-iphone-48mp.heic", lambda: _iphone_48mp(0), RENDERED, "245 items"),
    Case(
        "heic-iphone-48mp-portrait.heic", lambda: _iphone_48mp(3), RENDERED, "284 items: libvips refuses them"
    ),
    Case(
        "heic-7302x5477-10bit.heic",
        lambda: _grid("hevc-10", (7302, 5477)),
        RENDERED,
        "deep, decoded at 16 bits",
    ),
    Case(
        "heic-iphone-48mp-10bit.heic",
        lambda: _iphone_48mp(0, "hevc-10"),
        RENDERED,
        "deep, at 16 bits in a slot",
    ),
    Case(
        "heic-200mp.heic",
        lambda: _grid("hevc-8", (12240, 16320), thumbnail=True, metadata_items=2),
        REFUSED,
        "772 items: DECODE_FAILED before",
    ),
    Case(
        "heic-declaring-65535x65535.heic",
        lambda: _grid("hevc-8", (65535, 65535)),
        "DECODE_FAILED",
        "16,385 items: over what any libheif here reads",
    ),
]


@cache
def _p3_profile() -> bytes:
    import pyvips

    return bytes(
        pyvips.Image.black(1, 1, bands=3).icc_transform("p3", input_profile="srgb").get("icc-profile-data")
    )


class Made(Protocol):
    """A file a corpus makes: its name, and how (this module's Case, devkit/fullsize.py's)."""

    @property
    def name(self) -> str: ...
    @property
    def make(self) -> Callable[[], bytes]: ...


def write(folder: Path, cases: Sequence[Made] = CASES) -> list[Path]:
    """Each case's file in `folder` (made if missing), in the order of `cases`."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for case in cases:
        path = folder / case.name
        if not path.exists():
            # Its own partial file: two test workers may make the same case at once.
            partial = path.with_name(f"{path.name}.{os.getpid()}.part")
            partial.write_bytes(case.make())
            partial.rename(path)
        paths.append(path)
    return paths


def main(argv: list[str], cases: Sequence[Made] = CASES, module: str = "devkit.hostile") -> None:
    if len(argv) != 1:
        raise SystemExit(f"python -m {module} <folder>: write every case of CASES not there yet")
    for path in write(Path(argv[0]), cases):
        print(f"{path.stat().st_size:>12} {path.name}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
