"""The image pipeline: a stream of the original in, encoded variants out. No I/O of its own.

Decode once: the original is read once, shrunk on load to browse size and kept in memory; the
thumb is made from that small image, so nothing reads the stream a second time.

HEVC-coded HEIF (phone photos) is the one exception to streaming: libvips reads its header (or
pi-heif, where libvips' libheif refuses to), and pi-heif decodes its pixels from the whole file in
memory (see heic.py); from the decoded picture on, it is the same pipeline. GIF, WebP and TIFF are
read whole too, as their loaders would, to be cut to their first frame (frames.py).

Bounded whatever the file declares (SPEC 3): every limit is checked on the header, before a pixel is
decoded, and the render stops at its deadline inside libvips. Measured over benchmarks/hostile.py's
corpus, the limits' defaults hold every input under 400 MB and 10 s.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import pyvips

from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.image import frames, heic, ladder, thumbhash
from photo_publish.keys import VariantKind, ladder_kind
from photo_publish.outbox.contracts import Placeholder
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
    # What a decoder may hold at once, in bytes, where it holds more than a few rows: a HEIF's coded
    # planes and RGB (4.5 bytes a pixel at 8 bits, 9 at 16), a GIF's or an animated WebP's RGBA
    # canvas (4), a progressive JPEG's DCT coefficients (2 a sample), an interlaced PNG's pixels,
    # a tiled TIFF's rows of tiles. 48 and 50 MP 8-bit phone HEICs (220 and 225 MB) pass.
    max_decode_buffer_bytes: int = 240_000_000
    # The render's own deadline: past it, the file is at fault (RENDER_TIME_EXCEEDED, permanent).
    # It counts the decoding and encoding, not the seconds the stream spent waiting for bytes.
    render_timeout_seconds: float = 30.0


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
    """The original's displayed size (orientation applied), its variants and its placeholder.

    `variants`: thumb, browse, then the ladder's steps smallest first, each in the ladder's formats
    in their configured order."""

    width: int
    height: int
    loader: str
    variants: tuple[RenderedVariant, ...]
    placeholder: Placeholder


class _StreamSource:
    """A libvips source over a stream that keeps the stream's own error.

    libvips sees a failed read only as an early end of file; the error that caused it (a storage
    fault, the byte limit) is what the caller must hear about.

    It also keeps what it reads, until told to keep nothing: whether the file is wanted whole is
    known only from libvips' sniffing of its first bytes, read from the forward-only stream. Kept
    bytes plus the rest of the stream are that file, read once. Every other format stops keeping
    after those few bytes.
    """

    def __init__(self, stream: Readable) -> None:
        self._stream = stream
        self._kept: bytearray | None = bytearray()
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
            if self._kept is not None:
                self._kept += chunk
            return chunk
        return b""

    def keep_nothing(self) -> None:
        self._kept = None

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
    # What its decoder holds at once, in bytes, where that is more than a few rows: the whole
    # picture, or rows of tiles.
    buffer_bytes: int = 0

    @classmethod
    def of(cls, image: pyvips.Image, loader: str) -> _Header:
        interlaced = _has(image, "interlaced") and bool(image.get("interlaced"))
        width, height, bands = image.width, image.get_page_height(), image.bands
        sample_bytes = _SAMPLE_BYTES.get(str(image.format), 8)
        pixel_bytes: float = 0
        if loader == "jpegload_source" and interlaced:
            pixel_bytes = 2 * bands  # a progressive JPEG's DCT coefficients, kept until its last scan
        elif loader == "gifload_source" or (loader == "webpload_source" and _has(image, "delay")):
            pixel_bytes = 4  # an animation's frame, composed on its whole canvas in RGBA
        elif loader == _HEIF:
            pixel_bytes = _heif_pixel_bytes(bands, sample_bytes)
        elif loader == "pngload_source" and interlaced:
            pixel_bytes = bands * sample_bytes
        buffer = int(width * height * pixel_bytes)
        if loader == "tiffload_source" and _has(image, "tile-height"):
            # libvips holds about four rows of tiles while it shrinks (measured: 228 MB over the
            # imports for 512-pixel tiles of 32768-pixel 8-bit rows), and a tile may hold 100 MB.
            buffer = 4 * width * min(int(image.get("tile-height")), height) * bands * sample_bytes
        return cls(width, height, bands, sample_bytes, buffer)

    def check(self, options: RenderOptions) -> None:
        """Refuse a picture over any limit, from what its header declares (DIMENSIONS_EXCEEDED)."""
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
                f"{size}: its decoder would hold {self.buffer_bytes} bytes, over {options.max_decode_buffer_bytes}"
            )


def _heif_pixel_bytes(bands: int, sample_bytes: int, out_sample_bytes: int | None = None) -> float:
    """What libheif holds a pixel of a HEIF in: its coded planes (4:2:0, as phones code them, 1.5
    samples a pixel) and the interleaved RGB(A) it converts them to, 8-bit or 16-bit."""
    return 1.5 * sample_bytes + bands * (out_sample_bytes or sample_bytes)


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
        held = width * height * _heif_pixel_bytes(bands, sample_bytes)
        return None, _Header(width, height, bands, sample_bytes, int(held))
    return image, _Header.of(image, _HEIF)


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
    return image, _Header.of(image, loader)


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


def render(original: Readable, options: RenderOptions, *, time_budget: float = math.inf) -> Rendered:
    """Render `thumb` and `browse` (WebP) and the responsive ladder from a stream of the original.

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
    # A deep (10 or 12-bit) HEVC picture over the decode buffer limit is decoded at 8 bits by libheif
    # where that fits: a phone's 48 MP HDR photo renders, a little darker (libheif truncates).
    eight_bit = hevc and header.sample_bytes > 1 and header.buffer_bytes > options.max_decode_buffer_bytes
    if eight_bit:
        held = header.width * header.height * _heif_pixel_bytes(header.bands, header.sample_bytes, 1)
        header = replace(header, buffer_bytes=int(held))
    # Bombs of every shape are refused on what the header declares, before any pixel is decoded.
    header.check(options)
    if loader == _HEIF:
        heic.check_canvas(data)

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
    return Rendered(width=width, height=height, loader=loader, variants=tuple(variants), placeholder=shown)
