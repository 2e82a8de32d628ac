"""The image pipeline: a stream of the original in, encoded variants out. No I/O of its own.

Decode once: the original is read once, shrunk on load to browse size and kept in memory; the
thumb is made from that small image, so nothing reads the stream a second time.

HEVC-coded HEIF (phone photos) is the one exception to streaming: libvips reads its header, but
pi-heif decodes its pixels from the whole file in memory (see heic.py); from the decoded picture on,
it is the same pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import pyvips

from photo_publish import heic, thumbhash
from photo_publish.contracts import Placeholder
from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.keys import VariantKind

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
# The one loader whose files may need their bytes again after the header (for pi-heif).
_HEIF = "heifload_source"
_CHUNK = 1 << 20

# Untrusted loaders (matload, magick, ...) are not for user uploads.
pyvips.block_untrusted_set(True)
# Every upload is a new image: the operation cache would only hold memory a warm container needs.
pyvips.cache_set_max(0)


class Readable(Protocol):
    def read(self, size: int, /) -> bytes: ...


@dataclass(frozen=True, slots=True)
class RenderOptions:
    thumb_size: int = 400
    browse_size: int = 2048
    quality: int = 80
    # WebP effort 2, not libvips' 4: the browse's encode is over half the render, and 2 takes 26% off
    # it for +1.7% bytes and -0.004 SSIM (benchmarks/compare.py's corpus).
    effort: int = 2
    max_input_pixels: int = 100_000_000


@dataclass(frozen=True, slots=True)
class RenderedVariant:
    kind: VariantKind
    data: bytes
    width: int
    height: int
    content_type: str = "image/webp"
    extension: str = "webp"


@dataclass(frozen=True, slots=True)
class Rendered:
    """The original's displayed size (orientation applied), its variants and its placeholder."""

    width: int
    height: int
    loader: str
    variants: tuple[RenderedVariant, ...]
    placeholder: Placeholder


class _StreamSource:
    """A libvips source over a stream that keeps the stream's own error.

    libvips sees a failed read only as an early end of file; the error that caused it (a storage
    fault, the byte limit) is what the caller must hear about.

    It also keeps what it reads, until told to keep nothing: an HEVC HEIF is known as one only from
    its header, after libvips has read from the forward-only stream, and pi-heif then needs the
    whole file. Kept bytes plus the rest of the stream are that file, read once. Every other format
    stops keeping after the few bytes that libvips sniffs (an AVIF, after its header).
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

    def read_all(self) -> bytes:
        """The whole original: what libvips has read so far, then the rest of the stream."""
        if self._kept is None:
            raise RuntimeError("the bytes read so far were not kept")
        while self._read(_CHUNK):
            pass
        if self.error is not None:
            raise self.error
        data, self._kept = bytes(self._kept), None
        return data

    def fail(self, code: ErrorCode, error: pyvips.Error) -> PhotoError:
        return self.error or PhotoError(code, f"{error.message} {error.detail}".strip())


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
    return "icc-profile-data" in image.get_fields() or image.interpretation not in _PLAIN


def _fit(options: RenderOptions, convert: bool) -> dict[str, object]:
    """libvips' thumbnail options for the browse: long edge at most browse_size, in sRGB."""
    return {
        "height": options.browse_size,
        "size": "down",
        **({"export_profile": "srgb"} if convert else {}),
    }


def _browse(stream: _StreamSource, options: RenderOptions, convert: bool) -> pyvips.Image:
    """libvips decodes the stream once, shrinking on load to the browse size."""
    try:
        browse = pyvips.Image.thumbnail_source(
            stream.source, options.browse_size, option_string="fail_on=truncated", **_fit(options, convert)
        )
        # Sequential access reads the stream once: materialise the small image before using it twice.
        browse = browse.copy_memory()
    except pyvips.Error as error:
        raise stream.fail(ErrorCode.DECODE_FAILED, error) from None
    if stream.error is not None:
        # Some loaders (GIF after its first frame) take a failed read for the end of the file.
        raise stream.error
    return browse


def _hevc_browse(stream: _StreamSource, options: RenderOptions) -> pyvips.Image:
    """pi-heif decodes the whole picture (HEVC has no shrink-on-load); libvips shrinks it."""
    with heic.decoded(stream.read_all()) as picture:
        try:
            browse = picture.thumbnail_image(options.browse_size, **_fit(options, _converts(picture)))
            return browse.copy_memory()
        except pyvips.Error as error:
            raise PhotoError(ErrorCode.DECODE_FAILED, f"{error.message} {error.detail}".strip()) from None


def render(original: Readable, options: RenderOptions) -> Rendered:
    """Render `thumb` and `browse` WebP variants from a stream of the original."""
    stream = _StreamSource(original)
    loader = _loader(stream)
    if loader != _HEIF:
        stream.keep_nothing()
    try:
        header = pyvips.Image.new_from_source(stream.source, "", access="sequential")
    except pyvips.Error as error:
        raise stream.fail(ErrorCode.DECODE_FAILED, error) from None

    # A decompression bomb is refused on what its header declares, before any pixel is decoded.
    width, height = header.width, header.get_page_height()
    if width * height > options.max_input_pixels:
        raise PhotoError(
            ErrorCode.DIMENSIONS_EXCEEDED, f"{width}x{height} exceeds {options.max_input_pixels} pixels"
        )
    fields = set(header.get_fields())
    # (heifload reports no orientation: libheif applies the file's irot/imir, so its size is upright.)
    if "orientation" in fields and header.get("orientation") in _TRANSPOSING:
        width, height = height, width

    # Routed by the coding libvips' header names, not by the file's brand: HEVC has no decoder in
    # the prebuilt libvips, everything else (AVIF's AV1 included) stays with libvips.
    if heic.COMPRESSION_FIELD in fields and header.get(heic.COMPRESSION_FIELD) == heic.COMPRESSION:
        browse, loader = _hevc_browse(stream, options), heic.DECODER
    else:
        stream.keep_nothing()
        browse = _browse(stream, options, _converts(header))
    if browse.interpretation not in ("srgb", "b-w") or browse.format != "uchar":
        browse = browse.colourspace("srgb").cast("uchar")

    try:
        thumb = browse.thumbnail_image(options.thumb_size, height=options.thumb_size, size="down")
        images: tuple[tuple[VariantKind, pyvips.Image], ...] = (("thumb", thumb), ("browse", browse))
        variants = tuple(
            RenderedVariant(
                kind=kind,
                data=image.webpsave_buffer(Q=options.quality, effort=options.effort, keep="none"),
                width=image.width,
                height=image.height,
            )
            for kind, image in images
        )
        # From the browse already in memory: no second decode, and it is the displayed picture
        # (upright, sRGB, alpha kept).
        shown = thumbhash.placeholder(browse)
    except pyvips.Error as error:
        raise PhotoError(ErrorCode.ENCODE_FAILED, f"{error.message} {error.detail}".strip()) from None
    return Rendered(width=width, height=height, loader=loader, variants=variants, placeholder=shown)
