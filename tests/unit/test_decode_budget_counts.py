"""The decode budget counts what decoders hold, not what headers say (pipeline._Header).

The promise under attack (SPEC 3 amended, SPEC 18, docs/formats-and-limits.md "The decode budget"):
nothing the function admits to render holds more than its header's figure and a render's work, so
that the renders at once fit in the function's memory. Each file below is admitted on a figure its
decoder does not keep to:

1. an animated WebP whose first frame fills its canvas is counted at nothing (it "shrinks on load"),
   but a lossless (VP8L) frame is decoded whole in ARGB by libwebp, 4 bytes a pixel, like a still
   lossless one (the count looks for VP8L among the top-level chunks only; an animation's are ANMF);
2. a still lossy WebP's alpha (ALPH) is counted at 1 byte a pixel, but libwebp decodes an alpha
   whose lossless stream does not start with a colour-indexing transform (libvips' own webpsave at
   its defaults, of a gradient alpha: a predictor transform) through its 32-bit path, 4 a pixel;
3. a HEIF's chroma (and bit depth) is read from its hvcC / av1C box, which the decoders do not use:
   libde265 and dav1d/aom decode what the SPS / sequence header says. A 4:4:4 picture whose box
   says 4:2:0 is counted at 4:2:0 and rendered in a shared slot at the 4:4:4 cost;
4. tiff.py reads PlanarConfiguration only where it is typed SHORT/LONG/LONG8; libtiff reads it typed
   BYTE too. A planar-separate TIFF whose tag is a BYTE is read by libvips a whole strip (here, the
   whole picture) at a time, and counted as if read a scanline at a time.

5. a lossless WebP is counted at its ARGB picture (4 bytes a pixel), but libwebp also builds lookup
   tables for each prefix-code group its entropy image names (up to 65536, about 5 KB each): a
   1024 x 1024 file of 512 KB holds some 370 MB, counted at 4 MB and its file; with a colour cache
   and 11-bit green codes, a 1024 x 1024 file of 21 MB holds some 900 MB, counted at 24 MB.

The fast tests check the header's count on small files (no pixel decoded); the slow ones measure the
peak of a render at 100 MP in a fresh process, as test_fullsize.py does.
"""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
import pyvips

from benchmarks import child
from devkit import fullsize, samples
from photo_publish.image import heic, slots

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / ".local" / "hostile24b"
CAP = ("prlimit", f"--as={6 << 30}")
SQUARE = (10_000, 10_000)


# --- makers ---------------------------------------------------------------------------------------


def animated_lossless_webp(size: tuple[int, int]) -> bytes:
    """Two lossless frames of the canvas' size (libvips' webpsave, lossless): the photograph, then a
    small change in its corner. The first frame fills the canvas."""
    picture = fullsize._picture(size).copy_memory()
    second = picture.draw_rect([0, 0, 0], 0, 0, 64, 64, fill=True)
    pages = pyvips.Image.arrayjoin([picture, second], across=1).copy()
    pages.set_type(pyvips.GValue.gint_type, "page-height", size[1])
    pages.set_type(pyvips.GValue.array_int_type, "delay", [100, 100])
    return bytes(pages.webpsave_buffer(lossless=True, effort=0))


def gradient_alpha_webp(size: tuple[int, int]) -> bytes:
    """A still lossy WebP with a diagonal gradient alpha (a vignette, a soft edge), written by
    libvips' webpsave at Q=75 and its default effort: its ALPH is coded with a predictor transform."""
    width, height = size
    xy = pyvips.Image.xyz(width, height)
    alpha = ((xy[0] + xy[1]) * (255 / (width + height - 2))).cast("uchar")
    return bytes(fullsize._picture(size).bandjoin(alpha).webpsave_buffer(Q=75))


class _Bits:
    """A VP8L bit writer, as a string of bits in the order read: numbers LSB-first (as VP8LReadBits),
    prefix codes their first bit first."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def put(self, value: int, count: int) -> None:
        self.parts.append(format(value & ((1 << count) - 1), f"0{count}b")[::-1])

    def code(self, code: int, length: int) -> None:
        self.parts.append(format(code, f"0{length}b"))

    def text(self) -> str:
        return "".join(self.parts)


def _to_bytes(text: str) -> bytes:
    text += "0" * (-len(text) % 8)
    return int(text[::-1], 2).to_bytes(len(text) // 8, "little")


def _one_symbol(bits: _Bits, symbol: int) -> None:
    bits.put(1, 1)  # a simple code
    bits.put(0, 1)  # of one symbol: read in no bits at all
    bits.put(1, 1)  # of 8 bits
    bits.put(symbol, 8)


_CODE_LENGTH_ORDER = (17, 18, 0, 1, 2, 3, 4, 5, 16, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)


def _lengths(bits: _Bits, alphabet: int, coded: int, length: int) -> None:
    """A normal prefix code giving symbols 0 to `coded` - 1 `length` bits each, the rest none."""
    bits.put(0, 1)
    listed = _CODE_LENGTH_ORDER.index(length) + 1
    bits.put(listed - 4, 4)
    for symbol in _CODE_LENGTH_ORDER[:listed]:
        bits.put(1 if symbol in (0, length) else 0, 3)  # lengths 0 and `length`, one bit each
    bits.put(0, 1)  # every symbol of the alphabet
    bits.code(int("1" * coded + "0" * (alphabet - coded), 2), alphabet)


def many_prefix_groups_webp(size: tuple[int, int] = (1024, 1024), *, wide: bool = False) -> bytes:
    """A valid lossless WebP (one VP8L chunk, no alpha) whose entropy image, one pixel for each 4 x 4
    block, names 65536 prefix-code groups (the most VP8L allows: 1024 x 1024 pixels are enough).
    libwebp builds each group's five lookup tables: of one symbol each (the pixels cost no bits),
    256 entries of 4 bytes a table, about 5 KB a group, some 330 MB for a file of half a megabyte;
    `wide`: with a colour cache of 2048 and a green code of 2048 symbols of 11 bits (every pixel a
    literal 0 in 11 bits), its table 2304 entries more, some 900 MB for a file of 21 MB."""
    width, height = size
    cache_bits = 11 if wide else 0
    bits = _Bits()
    bits.put(0x2F, 8)
    bits.put(width - 1, 14)
    bits.put(height - 1, 14)
    bits.put(0, 1)  # no alpha
    bits.put(0, 3)  # version 0
    bits.put(0, 1)  # no transform
    bits.put(1 if wide else 0, 1)  # a colour cache,
    if wide:
        bits.put(cache_bits, 4)  # of 2048
    bits.put(1, 1)  # meta prefix codes,
    bits.put(0, 3)  # one group for each 4 x 4 block
    blocks = -(-width // 4) * -(-height // 4)
    groups = min(blocks, 65536)
    bits.put(0, 1)  # the entropy image: no colour cache; its green and red any byte, in 8 bits
    _lengths(bits, 256 + 24, 256, 8)
    _lengths(bits, 256, 256, 8)
    for _ in range(3):  # blue, alpha, distance
        _one_symbol(bits, 0)
    for block in range(blocks):  # the group's number: green its low byte, red its high one
        group = block % groups
        bits.code(group & 255, 8)
        bits.code(group >> 8, 8)
    group_bits = _Bits()  # every group alike: green, red, blue, alpha, distance
    if wide:
        _lengths(group_bits, 256 + 24 + (1 << cache_bits), 2048, 11)
    else:
        _one_symbol(group_bits, 128)
    for symbol in (64, 32, 255, 0):
        _one_symbol(group_bits, symbol)
    pixels = "0" * (11 * width * height) if wide else ""  # literal 0, code 0 of 11 bits
    data = _to_bytes(bits.text() + group_bits.text() * groups + pixels)
    chunk = b"VP8L" + struct.pack("<I", len(data)) + data + b"\0" * (len(data) & 1)
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk


def _first_alpha_transform(data: bytes) -> int | None:
    """The first transform of a WebP's ALPH lossless stream (3: colour indexing), or None."""
    at = 12
    while at + 8 <= len(data):
        kind, length = data[at : at + 4], struct.unpack_from("<I", data, at + 4)[0]
        if kind == b"ALPH":
            bits = int.from_bytes(data[at + 9 : at + 17], "little")
            return (bits >> 1) & 3 if bits & 1 else None
        at += 8 + length + (length & 1)
    return None


def separate_planes_tiff(size: tuple[int, int], *, bits: int = 8, planar_type: int = 1) -> bytes:
    """An RGB TIFF in separate planes, one deflate strip per plane (RowsPerStrip = the height), its
    PlanarConfiguration (2) typed `planar_type` (1: BYTE, which libtiff reads; 3: SHORT)."""
    import numpy as np

    width, height = size
    picture = fullsize._picture(size).cast("uchar").copy_memory()
    pixels = np.ndarray(buffer=picture.write_to_memory(), dtype=np.uint8, shape=(height, width, 3))
    if bits == 16:
        pixels = pixels.astype("<u2") * 257
    strips = [zlib.compress(np.ascontiguousarray(pixels[:, :, band]).tobytes(), 6) for band in range(3)]
    out = bytearray(b"II*\x00\x00\x00\x00\x00")
    offsets = []
    for strip in strips:
        offsets.append(len(out))
        out += strip + b"\x00" * (len(strip) & 1)
    bits_at = len(out)
    out += struct.pack("<3H", bits, bits, bits)
    offsets_at = len(out)
    out += struct.pack("<3I", *offsets)
    counts_at = len(out)
    out += struct.pack("<3I", *map(len, strips))
    planar = bytes([2, 0, 0, 0]) if planar_type == 1 else struct.pack("<HH", 2, 0)
    entries = [
        (256, 4, 1, struct.pack("<I", width)),
        (257, 4, 1, struct.pack("<I", height)),
        (258, 3, 3, struct.pack("<I", bits_at)),
        (259, 3, 1, struct.pack("<HH", 8, 0)),  # deflate
        (262, 3, 1, struct.pack("<HH", 2, 0)),  # RGB
        (273, 4, 3, struct.pack("<I", offsets_at)),
        (277, 3, 1, struct.pack("<HH", 3, 0)),
        (278, 4, 1, struct.pack("<I", height)),
        (279, 4, 3, struct.pack("<I", counts_at)),
        (284, planar_type, 1, planar),
    ]
    directory = len(out)
    out += struct.pack("<H", len(entries))
    for tag, kind, count, value in entries:
        out += struct.pack("<HHI", tag, kind, count) + value
    out += b"\x00" * 4
    struct.pack_into("<I", out, 4, directory)
    return bytes(out)


def _configs_edited(data: bytes, kind: bytes, edit: Callable[[bytearray, int], None]) -> bytes:
    """The HEIF with `edit(file, payload start)` applied to each of its `kind` configuration boxes."""
    edited = bytearray(data)
    iprp = heic._children(edited, *heic._meta(edited)[b"iprp"])
    for found, start, _end in heic.walk_boxes(edited, *iprp[b"ipco"]):
        if found == kind:
            edit(edited, start)
    return bytes(edited)


def says_420(data: bytes) -> bytes:
    """The HEIF with every hvcC / av1C box saying 4:2:0 (one byte each), its coded pictures unchanged."""

    def hevc(edited: bytearray, start: int) -> None:
        edited[start + 16] = (edited[start + 16] & ~3) | 1  # chroma_format_idc 1

    def av1(edited: bytearray, start: int) -> None:
        edited[start + 2] = (edited[start + 2] & ~0x1C) | 0x0C  # not mono, subsampled x and y

    return _configs_edited(_configs_edited(data, b"hvcC", hevc), b"av1C", av1)


def says_8_bits(data: bytes) -> bytes:
    """The HEIF with its hvcC boxes saying 8-bit luma and chroma, its coded pictures unchanged."""

    def hevc(edited: bytearray, start: int) -> None:
        edited[start + 17] &= ~7
        edited[start + 18] &= ~7

    return _configs_edited(data, b"hvcC", hevc)


def says_8_bits_av1(data: bytes) -> bytes:
    """The AVIF with its av1C boxes saying 8 bits (high_bitdepth and twelve_bit cleared)."""

    def av1(edited: bytearray, start: int) -> None:
        edited[start + 2] &= ~0x60

    return _configs_edited(data, b"av1C", av1)


def retyped(data: bytes, tag: int, kind: int) -> bytes:
    """The classic little-endian TIFF with its first IFD's `tag` entry retyped `kind` (its value, a
    small number held in the entry, unchanged: a SHORT's low byte is the BYTE's)."""
    edited = bytearray(data)
    assert edited[:4] == b"II*\x00"
    at = struct.unpack_from("<I", edited, 4)[0]
    for index in range(struct.unpack_from("<H", edited, at)[0]):
        entry = at + 2 + 12 * index
        if struct.unpack_from("<H", edited, entry)[0] == tag:
            struct.pack_into("<H", edited, entry + 2, kind)
            return bytes(edited)
    raise AssertionError(f"no tag {tag}")


def one_strip_ycbcr_tiff(size: tuple[int, int]) -> bytes:
    """Pillow's JPEG-coded YCbCr TIFF in one strip (devkit/fullsize.py's maker)."""
    return fullsize._one_strip_ycbcr_tiff(size)


def _count(data: bytes) -> int:
    """What the render counts for the file against its budget (its header's figure)."""
    count = fullsize.decode_estimate(io.BytesIO(data))
    assert count is not None
    return count


# --- the header's count, on small files -------------------------------------------------------------


def test_an_animated_webps_lossless_frame_is_counted_as_libwebp_decodes_it() -> None:
    # GIVEN an animated lossless WebP whose first frame fills its 1024 x 1024 canvas
    data = animated_lossless_webp((1024, 1024))

    # THEN its count holds its first frame decoded whole in ARGB, as a still lossless one's does
    assert _count(data) >= 4 * 1024 * 1024


def test_a_lossy_webps_alpha_decoded_in_32_bits_is_counted_so() -> None:
    # GIVEN a lossy WebP with a gradient alpha, whose ALPH is not colour-indexed (libwebp's 32-bit path)
    data = gradient_alpha_webp((1024, 1024))
    assert _first_alpha_transform(data) != 3

    # THEN its count holds the alpha decoded at 4 bytes a pixel
    assert _count(data) >= 4 * 1024 * 1024 + (64 << 20)


def test_a_separate_planes_tiffs_planar_configuration_typed_byte_counts_as_libtiff_reads_it() -> None:
    # GIVEN the same planar-separate TIFF (one strip a plane, taller than the rows a shrink holds), its
    # PlanarConfiguration typed SHORT and typed BYTE
    short, byte = (separate_planes_tiff((1024, 4096), planar_type=kind) for kind in (3, 1))
    assert pyvips.Image.new_from_buffer(byte, "").avg() == pyvips.Image.new_from_buffer(short, "").avg()

    # THEN both count the strip libvips reads whole (libtiff reads both as separate planes)
    assert _count(byte) >= _count(short)


def test_a_ycbcr_tiffs_photometric_typed_byte_counts_as_libtiff_reads_it() -> None:
    # GIVEN Pillow's one-strip JPEG-coded YCbCr TIFF, and the same file whose PhotometricInterpretation
    # (6, YCbCr) is typed BYTE: libtiff reads it all the same, and libvips reads the strip whole
    real = one_strip_ycbcr_tiff((512, 4096))
    byte = retyped(real, 262, 1)
    assert pyvips.Image.new_from_buffer(byte, "").avg() == pyvips.Image.new_from_buffer(real, "").avg()

    # THEN both count the whole strip
    assert _count(byte) >= _count(real)


def test_an_avifs_bit_depth_is_counted_from_what_its_decoder_decodes() -> None:
    # GIVEN a 10-bit AVIF, and the same file whose av1C box says 8 bits (the sequence header, which
    # the decoder reads, still says 10)
    tile = samples.photograph().crop(0, 0, 256, 256)
    deep = (tile.cast("ushort") * 257).cast("ushort").copy(interpretation="rgb16")
    real = bytes(deep.heifsave_buffer(compression="av1", Q=50, effort=0, bitdepth=10))
    lying = says_8_bits_av1(real)

    # THEN the count is no less than the truthful file's
    assert _count(lying) >= _count(real)


@pytest.mark.parametrize("coding", ["hevc", "av1"])
def test_a_heifs_chroma_is_counted_from_what_its_decoder_decodes(coding: str) -> None:
    # GIVEN a 4:4:4 HEIF, and the same file whose configuration box says 4:2:0
    tile = samples.photograph().crop(0, 0, 256, 256)
    if coding == "hevc":
        real = samples.heic(tile, tile_size=0, chroma=444)
    else:
        real = bytes(tile.heifsave_buffer(compression="av1", Q=50, effort=0, subsample_mode="off"))
    lying = says_420(real)

    # THEN the decoder holds the same for both (it decodes the coded picture, 4:4:4) and so must the count
    assert _count(lying) >= _count(real)


# --- measured at the pixel limit ------------------------------------------------------------------

_MAKERS = {
    "webp-lossless-65536-groups-1024x1024.webp": many_prefix_groups_webp,
    "webp-lossless-65536-wide-groups-1024x1024.webp": lambda: many_prefix_groups_webp(wide=True),
    "webp-animated-lossless-10000x10000.webp": lambda: animated_lossless_webp(SQUARE),
    "webp-gradient-alpha-10000x10000.webp": lambda: gradient_alpha_webp(SQUARE),
    "tiff16-separate-planar-byte-10000x10000.tif": lambda: separate_planes_tiff(SQUARE, bits=16),
}
_EDITS = {
    "avif-444-says-420-10000x10000.avif": ("avif-444-10000x10000.avif", says_420),
    "heic-444-says-420-10000x10000.heic": ("heic-444-10000x10000.heic", says_420),
    "heic-10bit-says-8bit-10000x10000.heic": ("heic-10bit-10000x10000.heic", says_8_bits),
    "avif-10bit-says-8bit-10000x10000.avif": ("avif-10bit-10000x10000.avif", says_8_bits_av1),
    "tiff-one-strip-ycbcr-photometric-byte-10000x10000.tif": (
        "tiff-one-strip-ycbcr-10000x10000.tif",
        lambda data: retyped(data, 262, 1),
    ),
}


def _make(name: str, path: str) -> None:
    """Write one of _MAKERS' files (in a child process: making holds 100 MP pictures)."""
    Path(path).write_bytes(_MAKERS[name]())


def _file(name: str, corpus: Path) -> Path:
    FOLDER.mkdir(parents=True, exist_ok=True)
    path = FOLDER / name
    if path.exists():
        return path
    if name in _EDITS:
        original, edit = _EDITS[name]
        path.write_bytes(edit((corpus / original).read_bytes()))
        return path
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"from tests.unit.test_decode_budget_counts import _make; _make({name!r}, {str(path)!r})",
        ],
        check=True,
        cwd=ROOT,
        env={**child.env(), "PYTHONPATH": f"{ROOT}/shared:{ROOT}"},
    )
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "memory_mb", "formats"),
    [
        ("webp-lossless-65536-groups-1024x1024.webp", 1769, ("webp",)),
        ("webp-lossless-65536-groups-1024x1024.webp", 512, ("webp", "avif")),
        ("webp-lossless-65536-wide-groups-1024x1024.webp", 1769, ("webp",)),
        ("webp-lossless-65536-wide-groups-1024x1024.webp", 512, ("webp", "avif")),
        ("webp-animated-lossless-10000x10000.webp", 1769, ("webp",)),
        ("webp-animated-lossless-10000x10000.webp", 512, ("webp", "avif")),
        ("webp-gradient-alpha-10000x10000.webp", 1769, ("webp",)),
        ("tiff16-separate-planar-byte-10000x10000.tif", 1769, ("webp",)),
        ("avif-444-says-420-10000x10000.avif", 1769, ("webp",)),
        ("heic-444-says-420-10000x10000.heic", 1769, ("webp",)),
        ("heic-10bit-says-8bit-10000x10000.heic", 1769, ("webp",)),
        ("avif-10bit-says-8bit-10000x10000.avif", 1769, ("webp",)),
        ("tiff-one-strip-ycbcr-photometric-byte-10000x10000.tif", 1769, ("webp",)),
    ],
)
def test_what_the_function_admits_holds_no_more_than_its_count_and_its_share(
    fullsize_corpus: Path, name: str, memory_mb: int, formats: tuple[str, ...]
) -> None:
    # GIVEN a hostile file within every limit, and the function at `memory_mb` with its ladder in `formats`
    path = _file(name, fullsize_corpus)
    budget = slots.DEFAULT.encoding(formats).with_memory(memory_mb)

    # WHEN it is rendered as the process function renders it
    result = child.measure(
        "photo-publish",
        path,
        "--stream",
        "--as-function",
        "--formats",
        ",".join(formats),
        "--memory-mb",
        str(memory_mb),
        prefix=CAP,
    )

    # THEN, admitted, it held no more than its header's figure and a render's work, nor than its share
    if result["code"] == "DIMENSIONS_EXCEEDED":
        return  # refused from its header: nothing admitted
    held = (result["peak_mb"] - result["floor_mb"]) * slots.MIB
    assert held <= result["decode_bytes"] + budget.work, result
    share = budget.whole if result["route"] == "alone" else budget.slot
    assert held <= share + budget.work, result
