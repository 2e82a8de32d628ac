"""The image pipeline: a stream of the original in, encoded variants out. No I/O of its own.

Decode once: the original is read once, shrunk on load to browse size and kept in memory; the
thumb is made from that small image, so nothing reads the stream a second time.

HEVC-coded HEIF (phone photos) is the one exception to streaming: libvips reads its header (or
pi-heif, where libvips' libheif refuses to), and pi-heif decodes its pixels from the whole file in
memory (see heic.py); from the decoded picture on, it is the same pipeline. GIF, WebP and TIFF are
read whole too, as their loaders would, to be cut to their first frame (frames.py).

Bounded whatever the file declares (SPEC 3): every limit is checked on the header, before a pixel is
decoded, and the render stops at its deadline inside libvips. What the decoder will hold is counted
from the header and judged against the function's memory (slots.py): within a shared slot, beside
the other renders; over it, alone (RenderAlone: the caller's gate); over the whole, refused. Measured
over benchmarks/hostile.py's corpus (each within its share and 10 s) and benchmarks/fullsize.py's
photos at 100 MP in every accepted format (each within its share and the render's deadline).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import pyvips

from photo_publish.contracts import NO_CAPTURE, Capture, Placeholder
from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.image import capture, frames, heic, ladder, slots, thumbhash, tiff, vp8l
from photo_publish.keys import VariantKind, ladder_kind
from photo_publish.settings import AVIF_EFFORT, AVIF_QUALITY

# Loaders an upload may use (by libvips' nickname); everything else is refused from its header.
ALLOWED_LOADERS = frozenset(
    {
        "jpegload_source",
        "pngload_source",
        "webpload_source",
        "tiffload_source",
        "gifload_source",
        "heifload_source",
    }
)
# Interpretations that are sRGB already, or become it by a plain conversion with nothing to manage.
_PLAIN = frozenset({"srgb", "b-w", "rgb16", "grey16"})
# EXIF orientations 5-8 turn the picture a quarter: the displayed size swaps width and height.
_TRANSPOSING = frozenset({5, 6, 7, 8})
_HEIF = "heifload_source"
# Loaders that hold the whole file in memory anyway (they seek in it), so the pipeline reads it whole
# first: to cut an animation or a multi-page file to its first frame (frames.py), and to hand a HEIF
# to pi-heif. JPEG and PNG stream.
_WHOLE_FILE = frozenset({"gifload_source", "tiffload_source", "webpload_source", _HEIF})
_CHUNK = 1 << 20
_SAMPLE_BYTES = {
    "uchar": 1,
    "char": 1,
    "ushort": 2,
    "short": 2,
    "uint": 4,
    "int": 4,
    "float": 4,
    "complex": 8,
    "double": 8,
    "dpcomplex": 16,
}

# Untrusted loaders (matload, magick, ...) are not for user uploads.
pyvips.block_untrusted_set(True)
# Every upload is a new image: the operation cache would only hold memory a warm container needs.
pyvips.cache_set_max(0)


def _error_text(pointer: object) -> str:
    """libvips' error text, as pyvips' own reader gives it, but lenient about bytes not UTF-8.

    libvips quotes a file's bytes in its messages (the type of a HEIF property it does not know):
    pyvips decodes them strictly, and building its Error raised UnicodeDecodeError instead (found
    by the fuzzer), before libvips' error buffer was cleared, so every later error of the warm
    container raised it too.
    """
    if pointer == pyvips.ffi.NULL:
        return "NULL"
    return bytes(pyvips.ffi.string(pointer)).decode("utf-8", "replace")


pyvips.error._to_string = _error_text


class Readable(Protocol):
    def read(self, size: int, /) -> bytes: ...


@runtime_checkable
class WaitCounting(Protocol):
    """A stream that counts the seconds its reads spent waiting for bytes (storage.OriginalStream):
    the network's time, which the render's own deadline does not count."""

    read_wait_seconds: float


@dataclass(frozen=True, slots=True)
class RenderOptions:
    thumb_size: int = 400
    browse_size: int = 2048
    quality: int = 80
    # WebP effort 2, not libvips' 4: the browse's encode is over half the render, and 2 takes 26% off
    # it for +1.7% bytes and -0.004 SSIM (benchmarks/compare.py's corpus).
    effort: int = 2
    # The responsive ladder (SPEC 18): long edges, each resized from the browse in memory, and the
    # formats each is encoded in (settings.py says why these).
    variant_widths: tuple[int, ...] = (640, 1280, 2048)
    variant_formats: tuple[str, ...] = ("webp",)
    avif_quality: int = AVIF_QUALITY
    avif_effort: int = AVIF_EFFORT
    # Limits (SPEC 3), each checked on the header; see benchmarks/hostile.py for what they bound.
    max_input_pixels: int = 100_000_000
    # Per axis. Rows are time (libpng decodes one at a time: 50,000,000 rows took 9.5 s) and columns
    # memory; 30000-wide panoramas pass.
    max_input_dimension: int = 32_768
    # Width x bands x bytes per sample. A format that cannot shrink on load (PNG, TIFF) has libvips
    # hold hundreds of whole rows while it shrinks: a 16-bit RGBA row of 32768 pixels (256 KiB)
    # peaked at 402 MB, a 16-bit RGB one (192 KiB) at 274 MB.
    max_input_row_bytes: int = 196_608
    # What a render may hold beyond its own work, counted from the header (_Header): alone in the
    # container, and beside the other renders; slots.py derives both from the function's memory (the
    # defaults: the template's 1769 MB). Over the first, nothing this function runs could hold it:
    # DIMENSIONS_EXCEEDED, naming `decode_budget`. Over the second, RenderAlone: the caller renders it
    # again, alone. None: this render has the container to itself.
    max_decode_buffer_bytes: int = slots.DEFAULT.whole
    shared_decode_buffer_bytes: int | None = None
    decode_budget: str = slots.DEFAULT.describe()
    # The render's own deadline: past it, the file is at fault (RENDER_TIME_EXCEEDED, permanent).
    # It counts the decoding and encoding, not the seconds the stream spent waiting for bytes.
    render_timeout_seconds: float = 30.0

    def sharing(self, budget: slots.DecodeBudget) -> RenderOptions:
        """These options for a render beside others: in a slot of `budget`, alone over it."""
        return replace(
            self,
            max_decode_buffer_bytes=budget.whole,
            shared_decode_buffer_bytes=budget.slot,
            decode_budget=budget.describe(),
        )

    def alone(self) -> RenderOptions:
        """These options for a render that has the container to itself (no slot to stay within)."""
        return replace(self, shared_decode_buffer_bytes=None)


@dataclass(frozen=True, slots=True)
class RenderedVariant:
    kind: VariantKind
    data: bytes
    width: int
    height: int
    content_type: str = "image/webp"
    extension: str = "webp"
    # The variant whose object this one is (the ladder's WebP step at the browse's size is the
    # browse): stored once, under that variant's key.
    same_as: VariantKind | None = None


@dataclass(frozen=True, slots=True)
class Rendered:
    """The original's displayed size (orientation applied), its variants and its placeholder, and
    what its EXIF says of its taking (`capture_problem`: why some of that stays empty).

    `variants`: thumb, browse, then the ladder's steps smallest first, each in the ladder's formats
    in their configured order."""

    width: int
    height: int
    loader: str
    variants: tuple[RenderedVariant, ...]
    placeholder: Placeholder
    capture: Capture = NO_CAPTURE
    capture_problem: str | None = None


class RenderAlone(Exception):
    """The picture needs more than a shared slot and no more than the whole: render it again, alone.

    Raised from the header, before any pixel is decoded (RenderOptions.shared_decode_buffer_bytes).
    """

    def __init__(self, needs: int, slot: int) -> None:
        super().__init__(f"its decoder would hold {needs} bytes, over a shared slot's {slot}")
        self.needs = needs
        self.slot = slot


class _StreamSource:
    """A libvips source over a stream that keeps the stream's own error.

    libvips sees a failed read only as an early end of file; the error that caused it (a storage
    fault, the byte limit) is what the caller must hear about.

    It also keeps what it reads, until told to keep nothing: whether the file is wanted whole is
    known only from libvips' sniffing of its first bytes, read from the forward-only stream. Kept
    bytes plus the rest of the stream are that file, read once. A JPEG keeps its first bytes until
    its header is read (its frame header says what a progressive decode holds); every other format
    stops keeping after those few bytes.
    """

    def __init__(self, stream: Readable) -> None:
        self._stream = stream
        self._kept: bytearray | None = bytearray()
        self._keep_at_most: int | None = None
        self.error: PhotoError | None = None
        self.source = pyvips.SourceCustom()
        self.source.on_read(self._read)

    def _read(self, size: int) -> bytes:
        if self.error is not None:
            return b""
        try:
            chunk = self._stream.read(size)
        except PhotoError as error:
            self.error = error
        except Exception as error:
            self.error = PhotoError(ErrorCode.STORAGE_READ_FAILED, repr(error))
        else:
            if self._kept is not None and (
                self._keep_at_most is None or len(self._kept) < self._keep_at_most
            ):
                self._kept += chunk
            return chunk
        return b""

    def keep_nothing(self) -> None:
        self._kept = None

    def keep_first(self, limit: int) -> None:
        """Keep reading into the kept bytes only while they are under `limit` (a header's)."""
        self._keep_at_most = limit

    def kept(self) -> bytes:
        """The bytes kept so far, and keep nothing from now on."""
        kept, self._kept = bytes(self._kept or b""), None
        return kept

    def read_all(self) -> bytearray:
        """The whole original: what libvips has read so far, then the rest of the stream."""
        if self._kept is None:
            raise RuntimeError("the bytes read so far were not kept")
        while self._read(_CHUNK):
            pass
        if self.error is not None:
            raise self.error
        data, self._kept = self._kept, None
        return data

    def fail(self, code: ErrorCode, error: pyvips.Error) -> PhotoError:
        return self.error or PhotoError(code, f"{error.message} {error.detail}".strip())


@dataclass(frozen=True, slots=True)
class _Deadline:
    """When the render must stop, and what stopping then means.

    Two deadlines, the earlier one wins: the render's own limit (the file's fault, permanent) and
    the invocation's time left (the moment's, transient: another attempt may have the time). The
    invocation's is wall-clock time; the render's own is moved on by every second the stream spent
    waiting for bytes (SPEC 5: a slow or stalled S3 body is never the file's fault).
    """

    started: float  # time.monotonic()
    timeout: float
    budget_at: float  # time.monotonic()
    waited: Callable[[], float]

    @classmethod
    def starting_now(cls, timeout: float, time_budget: float, waited: Callable[[], float]) -> _Deadline:
        now = time.monotonic()
        return cls(now, timeout, now + time_budget, waited)

    def passed(self) -> ErrorCode | None:
        """The code of the deadline that has passed, if one has."""
        render_at = self.started + self.timeout + self.waited()
        if time.monotonic() < min(render_at, self.budget_at):
            return None
        return (
            ErrorCode.RENDER_TIME_EXCEEDED if render_at < self.budget_at else ErrorCode.TIME_BUDGET_EXCEEDED
        )

    def check(self, step: str) -> None:
        if (code := self.passed()) is not None:
            raise PhotoError(code, f"deadline passed {step}")

    @contextmanager
    def watching(self, image: pyvips.Image, step: str) -> Iterator[None]:
        """Within the block, libvips stops evaluating `image` once the deadline has passed.

        libvips signals an evaluation's progress after each piece of work; the deadline is checked
        there and the evaluation killed. A single piece (one tile of a decoder) is not interrupted.
        """

        def on_eval(evaluated: pyvips.Image, _progress: object) -> None:
            if self.passed() is not None:
                evaluated.set_kill(True)

        image.set_progress(True)
        image.signal_connect("eval", on_eval)
        try:
            yield
        except pyvips.Error:
            # Killed by on_eval, or failed on its own after the deadline: either way, out of time.
            self.check(step)
            raise


@dataclass(frozen=True, slots=True)
class _Header:
    """What a file declares, as read before any pixel: its size and its samples."""

    width: int
    height: int  # of the first page
    bands: int
    sample_bytes: int
    # What its render holds, in bytes, beyond a render's own work (slots.RENDER_WORK) and where that
    # grows with the picture: its decoder's whole picture (or rows of tiles), the rows libvips holds
    # while it shrinks a picture its loader could not, the file where it is held whole. Measured
    # against real peaks for every accepted format at 100 MP (benchmarks/fullsize.py).
    buffer_bytes: int = 0

    @classmethod
    def of(cls, image: pyvips.Image, loader: str, held: bytes | bytearray) -> _Header:
        """`held`: the whole file where the loader is given it whole, else the first bytes kept."""
        interlaced = _has(image, "interlaced") and bool(image.get("interlaced"))
        width, height, bands = image.width, image.get_page_height(), image.bands
        sample_bytes = _SAMPLE_BYTES.get(str(image.format), 8)
        pixels = width * height
        decoder, shrinks_on_load = 0, loader == "jpegload_source"
        if loader == "jpegload_source" and interlaced:
            # Shrunk on load by its DCT (up to 8 times), but a multi-scan (progressive) one keeps
            # every coefficient until its last scan.
            decoder = _jpeg_coefficients(width, height, bands, held)
        elif loader == "pngload_source" and interlaced:
            # Decoded whole (Adam7), a palette's indices beside its colours (measured: +100 MB at
            # 100 MP).
            palette = _has(image, "palette") and bool(image.get("palette"))
            decoder = pixels * (bands * sample_bytes + palette)
        elif loader == "gifload_source":
            decoder = 4 * pixels  # its frame, composed on its whole canvas in RGBA
        elif loader == "webpload_source" and _has(image, "delay"):
            # An animation: its canvas, or where its first frame fills it, that frame as a still one.
            canvas = _webp_canvas(width, height, held)
            decoder, shrinks_on_load = canvas or _webp_still(width, height, held), canvas == 0
        elif loader == "webpload_source":
            decoder, shrinks_on_load = _webp_still(width, height, held), True
        elif loader == _HEIF:
            hevc = (
                _has(image, heic.COMPRESSION_FIELD) and image.get(heic.COMPRESSION_FIELD) == heic.COMPRESSION
            )
            return cls.heif(width, height, bands, sample_bytes, held, hevc=hevc)
        rows = 0 if shrinks_on_load else _shrink_rows(width, bands)
        if loader == "tiffload_source" and _has(image, "tile-height"):
            # libvips holds about four rows of tiles while it shrinks (measured: 228 MB over the
            # imports for 512-pixel tiles of 32768-pixel 8-bit rows), and a tile may hold 100 MB:
            # they are the rows its shrink holds, where they are more.
            tiles = 4 * width * min(int(image.get("tile-height")), height) * bands * sample_bytes
            rows = max(rows, tiles)
        elif loader == "tiffload_source":
            # A strip read whole is held twice, decoded and copied (measured: 655 MB for a 300 MB
            # strip, a 100 MP JPEG-coded YCbCr file written as one strip).
            strip = 2 * width * tiff.rows_read_at_once(held, height) * bands * sample_bytes
            rows = max(rows, strip)
        held_whole = len(held) if loader in _WHOLE_FILE else 0
        alpha = _ALPHA_WORK if image.hasalpha() else 0  # (a CMYK JPEG's fourth band is none)
        return cls(width, height, bands, sample_bytes, decoder + rows + held_whole + alpha)

    @classmethod
    def heif(
        cls,
        width: int,
        height: int,
        bands: int,
        sample_bytes: int,
        data: bytes | bytearray,
        *,
        hevc: bool,
        out_sample_bytes: int | None = None,
    ) -> _Header:
        """A HEIF, decoded whole by libheif (libvips' for AVIF, pi-heif's for HEVC, which copies the
        file it is given), then shrunk by libvips."""
        # The decoder holds what the coded pictures are (their parameter sets), whatever libheif's
        # header says: a deeper picture than declared is decoded deep all the same, and converted
        # (counted as the deep RGB it is converted from), unless asked for at 8 bits on purpose.
        layout = heic.coded(data)
        deep = max(sample_bytes, 2 if layout.bits > 8 else 1)
        out = out_sample_bytes or deep
        decoder = int(width * height * _heif_pixel_bytes(bands, deep, out, chroma=layout.samples))
        held = len(data) * (2 if hevc else 1)
        alpha = _ALPHA_WORK if bands in (2, 4) else 0
        return cls(width, height, bands, sample_bytes, decoder + _shrink_rows(width, bands) + held + alpha)

    def check(self, options: RenderOptions) -> None:
        """Refuse a picture over any limit, from what its header declares (DIMENSIONS_EXCEEDED), or
        hand back one over a shared slot to be rendered alone (RenderAlone)."""
        size = f"{self.width}x{self.height}"
        if self.width < 1 or self.height < 1:
            # Nothing to judge the file by: a HEIF grid with no size of its own decoded to whatever
            # its tiles made (found by the fuzzer).
            raise PhotoError(ErrorCode.DECODE_FAILED, f"{size}: the file declares no size")
        if self.width * self.height > options.max_input_pixels:
            raise _exceeded(f"{size} exceeds {options.max_input_pixels} pixels")
        if max(self.width, self.height) > options.max_input_dimension:
            raise _exceeded(f"{size} exceeds {options.max_input_dimension} pixels a side")
        row = self.width * self.bands * self.sample_bytes
        if row > options.max_input_row_bytes:
            raise _exceeded(f"{size}: a row of {row} bytes exceeds {options.max_input_row_bytes}")
        if self.buffer_bytes > options.max_decode_buffer_bytes:
            raise _exceeded(
                f"{size}: its decoder would hold {self.buffer_bytes} bytes, over the "
                f"{options.max_decode_buffer_bytes} a render may hold alone ({options.decode_budget})"
            )
        shared = options.shared_decode_buffer_bytes
        if shared is not None and self.buffer_bytes > shared:
            raise RenderAlone(self.buffer_bytes, shared)


# What a picture with alpha holds more in its render: its browse premultiplied, in float, up to
# 2048 x 2048 x 4 bands x 4 bytes (measured: a 2048 x 2048 lossy WebP with alpha held 131 MB over a
# count of 4, where an RGB picture's render holds at most 77).
_ALPHA_WORK = 64 << 20
# Rows libvips holds while it shrinks a picture its loader could not shrink, in float samples (the
# colour conversion and an alpha's premultiplication work in float): measured up to 860 of them
# (a 16-bit Display P3 PNG 32768 wide: 337 MB over the imports) and 1,370 of a float TIFF's.
_SHRINK_ROWS = 1024
# A JPEG's frame header (SOF) comes after its APP segments (EXIF, ICC, XMP: 64 KB each at most), and
# libvips' sniffing has read through them already; what its header read reads beyond that is kept up
# to this.
_JPEG_HEADER_BYTES = 256 << 10
# Start-of-frame markers: baseline, extended, progressive and lossless, Huffman or arithmetic coded.
_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_JPEG_SOS = 0xDA


def _shrink_rows(width: int, bands: int) -> int:
    return _SHRINK_ROWS * width * bands * 4


def _jpeg_coefficients(width: int, height: int, bands: int, header: bytes | bytearray) -> int:
    """What libjpeg holds of a multi-scan JPEG until its last scan: every DCT coefficient, 64 of 2
    bytes a block of 8 x 8 samples of each component at its own sampling (4:2:0: a luma block, half a
    chroma one; 3 bytes a pixel, 6 at 4:4:4, 8 for CMYK), padded to whole MCUs. The sampling is the
    frame header's; where the kept bytes do not reach it, every component at full resolution, the
    most it can be."""
    factors = _jpeg_sampling(header) or [(1, 1)] * bands
    across = -(-width // (8 * max(h for h, _ in factors)))
    down = -(-height // (8 * max(v for _, v in factors)))
    return sum(across * h * down * v for h, v in factors) * 64 * 2


def _jpeg_sampling(data: bytes | bytearray) -> list[tuple[int, int]] | None:
    """Each component's sampling factors (horizontal, vertical) from the frame header, or None."""
    if data[:2] != b"\xff\xd8":
        return None
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # a fill byte
            at += 1
            continue
        if marker == _JPEG_SOS:
            return None
        if marker in _JPEG_SOF:
            count = data[at + 9] if at + 9 < len(data) else 0
            components = data[at + 10 : at + 10 + 3 * count]
            factors = [(packed >> 4, packed & 15) for packed in components[1::3]]
            valid = (
                count and len(components) == 3 * count and all(1 <= f <= 4 for pair in factors for f in pair)
            )
            return factors if valid else None
        at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    return None


def _webp_canvas(width: int, height: int, data: bytes | bytearray) -> int:
    """What libvips holds of an animated WebP: nothing more than a still one where its first frame
    fills the canvas (it shrinks on load); else its RGBA canvas at full size and the frame decoded
    beside it (a frame one pixel short of a 100 MP canvas: 800 MB)."""
    frame = frames.webp_first_frame(data)
    if frame == (0, 0, width, height):
        return 0
    area = frame[2] * frame[3] if frame is not None else width * height
    return 4 * width * height + 4 * min(area, width * height)


def _webp_still(width: int, height: int, data: bytes | bytearray) -> int:
    """What libwebp holds of a still WebP (or an animation's first frame) it shrinks on load: a
    lossless one (VP8L) decoded whole in ARGB first (measured at 100 MP: 424 MB), and a lossy one's
    alpha (ALPH) too, which libwebp decodes through its 4-byte path unless colour-indexed, each with
    its lossless stream's prefix-code tables (vp8l.py: up to 1.3 GB for a file of a few hundred KB);
    else its rows only."""
    chunks = frames.webp_chunks(data)
    if b"VP8L" in chunks:
        start, end = chunks[b"VP8L"]
        header = int.from_bytes(data[start + 1 : start + 5], "little")
        frame = ((header & 0x3FFF) + 1, (header >> 14 & 0x3FFF) + 1)
        return 4 * width * height + vp8l.table_bytes(data[start + 5 : end], *frame)
    if b"ALPH" in chunks:
        start, end = chunks[b"ALPH"]
        placed = frames.webp_first_frame(data)
        frame = placed[2:] if placed is not None else (width, height)
        lossless = start < end and data[start] & 3 == 1
        tables = vp8l.table_bytes(data[start + 1 : end], *frame) if lossless else 0
        return 4 * width * height + tables
    return 0


def _heif_pixel_bytes(
    bands: int, sample_bytes: int, out_sample_bytes: int | None = None, *, chroma: float = 1.5
) -> float:
    """What libheif holds a pixel of a HEIF in: its coded planes (`chroma` samples a pixel, as
    heic.coded reads them, and an alpha plane) and the interleaved RGB(A) it converts them
    to, 8-bit or 16-bit. Only 4:2:0 and monochrome convert straight to interleaved RGB; 4:2:2 and
    4:4:4 go through a planar RGB(A) of the whole picture first (measured at 100 MP: 8-bit 4:2:0
    held 480-498 MB, 4:2:2 822 MB, 4:4:4 912-946 MB; 10-bit 4:4:4 1771-1863 MB)."""
    planes = (chroma + (bands in (2, 4))) * sample_bytes
    planar_rgb = bands * sample_bytes if chroma > 1.5 else 0
    return planes + planar_rgb + bands * (out_sample_bytes or sample_bytes)


def _has(image: pyvips.Image, field: str) -> bool:
    # Asked by name, never by listing them all: get_fields() decodes every name as UTF-8, and a
    # file names some of its own (a PNG's text keys are Latin-1: UnicodeDecodeError).
    return bool(image.get_typeof(field))


def _exceeded(detail: str) -> PhotoError:
    return PhotoError(ErrorCode.DIMENSIONS_EXCEEDED, detail)


def _loader(stream: _StreamSource) -> str:
    # libvips' own sniffing, without loading: no loader at all means an unsupported format.
    pointer = pyvips.vips_lib.vips_foreign_find_load_source(stream.source.pointer)
    if pointer == pyvips.ffi.NULL:
        raise stream.error or PhotoError(ErrorCode.UNSUPPORTED_FORMAT, "no loader recognises the file")
    nickname = str(pyvips.nickname_find(pyvips.type_from_name(pyvips.ffi.string(pointer).decode())))
    if nickname not in ALLOWED_LOADERS:
        raise PhotoError(ErrorCode.UNSUPPORTED_FORMAT, f"loader {nickname} is not accepted")
    return nickname


def _converts(image: pyvips.Image) -> bool:
    # Colour-manage only where there is something to convert: export_profile costs about a
    # quarter of the render even for a plain sRGB photo, for identical output.
    return _has(image, "icc-profile-data") or image.interpretation not in _PLAIN


def _fit(options: RenderOptions, convert: bool) -> dict[str, object]:
    """libvips' thumbnail options for the browse: long edge at most browse_size, in sRGB."""
    return {
        "height": options.browse_size,
        "size": "down",
        **({"export_profile": "srgb"} if convert else {}),
    }


def _browse(
    stream: _StreamSource, source: pyvips.Source, options: RenderOptions, convert: bool, deadline: _Deadline
) -> pyvips.Image:
    """libvips decodes the original once, shrinking on load to the browse size."""
    try:
        browse = pyvips.Image.thumbnail_source(
            source, options.browse_size, option_string="fail_on=truncated", **_fit(options, convert)
        )
        # Sequential access reads the stream once: materialise the small image before using it twice.
        with deadline.watching(browse, "decoding"):
            browse = browse.copy_memory()
    except pyvips.Error as error:
        raise stream.fail(ErrorCode.DECODE_FAILED, error) from None
    if stream.error is not None:
        # Some loaders (GIF after its first frame) take a failed read for the end of the file.
        raise stream.error
    return browse


def _hevc_browse(
    data: bytearray, header: _Header, options: RenderOptions, eight_bit: bool, deadline: _Deadline
) -> pyvips.Image:
    """pi-heif decodes the whole picture (HEVC has no shrink-on-load); libvips shrinks it.

    The picture must be the size its header declared: libheif lets a coded picture exceed the
    file's `ispe` by up to 64 pixels a side (a coding unit's padding), and pi-heif hands out the
    larger one, or a smaller one where its header and its decoder disagree on a crop (found by the
    fuzzer: a 64 x 48 HEIC decoded at 64 x 64, its variants not the shape recorded for the photo).
    """
    with heic.decoded(data, eight_bit=eight_bit) as picture:
        decoded = (picture.width, picture.height)
        if decoded != (header.width, header.height):
            raise PhotoError(
                ErrorCode.DECODE_FAILED, f"declared {header.width}x{header.height}, decoded {decoded}"
            )
        deadline.check("after decoding")
        try:
            browse = picture.thumbnail_image(options.browse_size, **_fit(options, _converts(picture)))
            with deadline.watching(browse, "shrinking"):
                return browse.copy_memory()
        except pyvips.Error as error:
            raise PhotoError(ErrorCode.DECODE_FAILED, f"{error.message} {error.detail}".strip()) from None


def _heif_header(data: bytearray, source: pyvips.Source) -> tuple[pyvips.Image | None, _Header]:
    """libvips' header of a HEIF, or pi-heif's where libvips' libheif refuses to read it.

    libvips' libheif refuses files of more than 256 items (its "security limit"), before it says
    what they are: a 200 MP phone HEIC has about 800 (768 tiles), a 48 MP iPhone portrait with its
    gain map and mattes about 284. pi-heif's libheif allows its default of 1000: it reads what such a
    file declares, so that the limits judge it, and decodes it if it is HEVC (an AV1 one it cannot,
    and says so: DECODE_FAILED). Over 1000 items, both refuse (DECODE_FAILED); no phone comes near.

    What it declares is judged by the limits; then, for a grid or an overlay, whether that is the
    canvas it is decoded on (heic.check_canvas, in render()).
    """
    heic.check_names(data)
    try:
        image = pyvips.Image.new_from_source(source, "", access="sequential")
    except pyvips.Error:
        declared = heic.header(data)
        width, height, bands, sample_bytes = (
            declared.width,
            declared.height,
            declared.bands,
            declared.sample_bytes,
        )
        return None, _Header.heif(width, height, bands, sample_bytes, data, hevc=True)
    return image, _Header.of(image, _HEIF, data)


def _displayable(image: pyvips.Image) -> pyvips.Image:
    """The browse as WebP and the placeholder take it: 8-bit sRGB or grey, with at most an alpha.

    A file may carry samples beyond those (a TIFF's extra samples: a grey picture of 4 float bands
    became 6 bands of sRGB, and the placeholder refused them; found by the fuzzer): they are dropped.
    """
    try:
        if image.interpretation not in ("srgb", "b-w") or image.format != "uchar":
            image = image.colourspace("srgb").cast("uchar")
        if image.bands > 4:
            image = image.extract_band(0, n=4)
        return image.copy(interpretation="srgb" if image.bands >= 3 else "b-w")
    except pyvips.Error as error:
        # A space libvips has no route from to sRGB.
        raise PhotoError(ErrorCode.DECODE_FAILED, f"{error.message} {error.detail}".strip()) from None


def _read_header(
    stream: _StreamSource, source: pyvips.Source, loader: str, data: bytearray
) -> tuple[pyvips.Image | None, _Header]:
    if loader == _HEIF:
        return _heif_header(data, source)
    try:
        image = pyvips.Image.new_from_source(source, "", access="sequential")
    except pyvips.Error as error:
        raise stream.fail(ErrorCode.DECODE_FAILED, error) from None
    # A streamed file's first bytes (a JPEG's frame header), kept until now; a whole one's all.
    return image, _Header.of(image, loader, data if loader in _WHOLE_FILE else stream.kept())


def _capture(image: pyvips.Image | None, loader: str, data: bytearray, location: bool) -> capture.Reading:
    """The capture metadata, from the EXIF the header read already holds: libvips' block, a TIFF's
    own directories (libvips keeps no block for those), or pi-heif's for a HEIF whose header libvips
    could not read. No pixel is decoded for it."""
    if loader == "tiffload_source":
        return capture.read(data, location=location, limit=None)
    if image is None:
        return capture.read(heic.exif(data), location=location)
    if not _has(image, "exif-data"):
        return capture.NOTHING
    # Its size first: pyvips' get() copies the block out of libvips, however large the file made it.
    value = pyvips.GValue()
    if pyvips.vips_lib.vips_image_get(image.pointer, b"exif-data", value.pointer) != 0:
        return capture.NOTHING
    size = pyvips.ffi.new("size_t *")
    pyvips.vips_lib.vips_value_get_blob(value.gvalue, size)
    if size[0] > capture.MAX_EXIF_BYTES:
        return capture.too_large(int(size[0]))
    return capture.read(image.get("exif-data"), location=location)


def _waits(stream: Readable) -> Callable[[], float]:
    """The seconds `stream` has waited for bytes so far (none known for a stream that does not count)."""
    if isinstance(stream, WaitCounting):
        counting = stream
        return lambda: counting.read_wait_seconds
    return lambda: 0.0


def _encoded(
    kind: VariantKind, image: pyvips.Image, image_format: str, options: RenderOptions, deadline: _Deadline
) -> RenderedVariant:
    """`image` encoded, with no metadata at all (no EXIF, XMP, IPTC nor ICC profile: the pixels are
    sRGB already), alpha kept."""
    deadline.check(f"before encoding the {kind}")
    if image_format == "avif":
        # libheif's AV1 encoder; 8 bits, chroma 4:2:0 below quality 90 (libvips' "auto").
        data = image.heifsave_buffer(
            Q=options.avif_quality, effort=options.avif_effort, compression="av1", keep="none"
        )
    else:
        data = image.webpsave_buffer(Q=options.quality, effort=options.effort, keep="none")
    content_type, extension = ladder.FORMATS[image_format]
    return RenderedVariant(kind, data, image.width, image.height, content_type, extension)


def _ladder(
    browse: pyvips.Image, browse_webp: RenderedVariant, options: RenderOptions, deadline: _Deadline
) -> list[RenderedVariant]:
    """The ladder's steps, each resized from the browse in memory (never a second decode), smallest
    first; each step in every format, in the configured order.

    A step at the browse's own size is the browse: its WebP is the browse itself (the same pixels
    and settings), neither encoded nor stored twice.
    """
    long_edge = max(browse.width, browse.height)
    variants = []
    for size in ladder.steps(options.variant_widths, long_edge):
        image = browse if size == long_edge else browse.thumbnail_image(size, height=size)
        if image is not browse and len(options.variant_formats) > 1:
            # Materialised once for its formats: each encode would resize it again. With one format
            # the encoder pulls the resize through (a few megabytes less at the peak).
            image = image.copy_memory()
        for image_format in options.variant_formats:
            kind = ladder_kind(size, image_format)
            if image is browse and image_format == "webp":
                variants.append(replace(browse_webp, kind=kind, same_as=browse_webp.kind))
            else:
                variants.append(_encoded(kind, image, image_format, options, deadline))
    return variants


def render(
    original: Readable, options: RenderOptions, *, time_budget: float = math.inf, location: bool = False
) -> Rendered:
    """Render `thumb` and `browse` (WebP) and the responsive ladder from a stream of the original.

    `location`: read the photo's GPS position into its capture metadata (the upload said its user
    agreed); without it, the GPS tags are never read. Variants carry no metadata either way.

    `time_budget`: the seconds the caller can still give (an invocation's time left); the render
    stops at that or at `options.render_timeout_seconds`, whichever comes first, with
    TIME_BUDGET_EXCEEDED (transient) or RENDER_TIME_EXCEEDED (permanent) respectively. A stream
    that counts its waits for bytes (WaitCounting) has them left out of the render's own limit,
    never out of the time budget.
    """
    deadline = _Deadline.starting_now(options.render_timeout_seconds, time_budget, _waits(original))
    stream = _StreamSource(original)
    loader = _loader(stream)
    source: pyvips.Source = stream.source
    data = bytearray()
    if loader in _WHOLE_FILE:
        data = stream.read_all()
        frames.first_frame(loader, data)
        source = pyvips.Source.new_from_memory(data)
    elif loader == "jpegload_source":
        stream.keep_first(_JPEG_HEADER_BYTES)
    else:
        stream.keep_nothing()
    deadline.check("after reading")

    header_image, header = _read_header(stream, source, loader, data)

    # Routed by the coding libvips' header names, not by the file's brand: HEVC has no decoder in
    # the prebuilt libvips, everything else (AVIF's AV1 included) stays with libvips. A HEIF that
    # libvips could not read at all goes to pi-heif, which decodes HEVC or says why not.
    hevc = loader == _HEIF and (
        header_image is None
        or (
            _has(header_image, heic.COMPRESSION_FIELD)
            and header_image.get(heic.COMPRESSION_FIELD) == heic.COMPRESSION
        )
    )
    # A deep (10 or 12-bit) HEVC picture more than a render may hold alone at 16 bits is decoded at 8
    # by libheif where that fits, a little darker (libheif truncates): at the template's memory no
    # picture within the pixel limit needs it; in 1280 MB, a 100 MP 10-bit one does.
    eight_bit = hevc and header.sample_bytes > 1 and header.buffer_bytes > options.max_decode_buffer_bytes
    if eight_bit:
        header = _Header.heif(
            header.width,
            header.height,
            header.bands,
            header.sample_bytes,
            data,
            hevc=True,
            out_sample_bytes=1,
        )
    # Bombs of every shape are refused on what the header declares, before any pixel is decoded; a
    # picture over a shared slot goes back to the caller, to be rendered alone (RenderAlone).
    header.check(options)
    if loader == _HEIF:
        heic.check_canvas(data)
    taken = _capture(header_image, loader, data, location)

    width, height = header.width, header.height
    # (heifload reports no orientation: libheif applies the file's irot/imir, so its size is upright.)
    if (
        header_image is not None
        and _has(header_image, "orientation")
        and header_image.get("orientation") in _TRANSPOSING
    ):
        width, height = height, width

    if hevc:
        browse, loader = _hevc_browse(data, header, options, eight_bit, deadline), heic.DECODER
    else:
        assert header_image is not None  # only a HEIF goes without libvips' header, and to pi-heif
        browse = _browse(stream, source, options, _converts(header_image), deadline)
    browse = _displayable(browse)

    try:
        thumb = browse.thumbnail_image(options.thumb_size, height=options.thumb_size, size="down")
        variants = [
            _encoded(kind, image, "webp", options, deadline)
            for kind, image in (("thumb", thumb), ("browse", browse))
        ]
        variants += _ladder(browse, variants[-1], options, deadline)
        # From the browse already in memory: no second decode, and it is the displayed picture
        # (upright, sRGB, alpha kept).
        shown = thumbhash.placeholder(browse)
    except pyvips.Error as error:
        raise PhotoError(ErrorCode.ENCODE_FAILED, f"{error.message} {error.detail}".strip()) from None
    return Rendered(
        width=width,
        height=height,
        loader=loader,
        variants=tuple(variants),
        placeholder=shown,
        capture=taken.capture,
        capture_problem=taken.problem,
    )
