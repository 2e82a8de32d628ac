"""The image pipeline, through real libvips on the project's real photographs (no mocks).

Pixel comparisons use the mean absolute difference over all bands, on 0-255. The noise floor is the
WebP encoding itself: the browse of the sRGB LadyBird.jpg differs from libvips' or Pillow's own
Lanczos downsizing of the same photo by about 1.9, so tolerances sit a little above that.

Malformed files end in a code or in variants: each input `make fuzz` (devkit/fuzz.py) found is kept
in tests/images/fuzz (see its README) and rendered in a child process under a memory cap
(tests/capped.py), so that a crash or a balloon fails its test, not the run.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import pyvips
from PIL import Image, ImageCms

from devkit import fullsize, hostile, samples
from photo_publish.adapters.storage import OriginalStream
from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.image import frames, slots
from photo_publish.image.pipeline import Readable, Rendered, RenderedVariant, RenderOptions, render
from photo_publish.image.slots import DecodeBudget
from photo_publish.image.thumbhash import thumbhash_to_rgba
from photo_publish.retry import PERMANENT
from photo_publish.settings import Settings
from tests import capped
from tests.readers import FailingReader, webp_chunks

UPRIGHT_NAME = "LadyBird.jpg"
UPRIGHT_SIZE = (2560, 1600)
BROWSE_SIZE = (2048, 1280)
# What a WebP at quality 80 costs, measured at about 1.9 (see the module docstring), plus headroom.
TOLERANCE = 2.5
# The only chunks a WebP without metadata has: no EXIF, XMP or ICCP.
PIXEL_CHUNKS = frozenset({b"VP8 ", b"VP8L", b"VP8X", b"ALPH"})
METADATA_FIELDS = ("exif-data", "xmp-data", "icc-profile-data", "iptc-data")
# The fuzzer's findings (`make fuzz`), one reproducer a file (see its README).
FINDINGS = Path(__file__).resolve().parent.parent / "images" / "fuzz"


class CountingReader:
    """A forward-only stream (no seek, no tell) that records every read."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)
        self.sizes: list[int] = []
        self.bytes_read = 0

    def read(self, size: int, /) -> bytes:
        self.sizes.append(size)
        chunk = self._data.read(size)
        self.bytes_read += len(chunk)
        return chunk


class EndlessPixelBomb:
    """The header of `samples.pixel_bomb_png`, then an IDAT chunk of 2 GiB that never runs out.

    Decoding it would read without end, so the bytes read show how far the pipeline went.
    """

    def __init__(self) -> None:
        bomb = samples.pixel_bomb_png()
        signature_and_ihdr = bomb[: 8 + 4 + 4 + 13 + 4]
        assert signature_and_ihdr[12:16] == b"IHDR"
        self._prefix = signature_and_ihdr + struct.pack(">I", 0x7FFF_FFFF) + b"IDAT"
        self.bytes_read = 0

    def read(self, size: int, /) -> bytes:
        if self.bytes_read < len(self._prefix):
            chunk = self._prefix[self.bytes_read : self.bytes_read + size]
        else:
            chunk = bytes(size)
        self.bytes_read += len(chunk)
        return chunk


def render_bytes(data: bytes) -> Rendered:
    return render(io.BytesIO(data), RenderOptions())


def variant(rendered: Rendered, kind: str) -> RenderedVariant:
    (found,) = (v for v in rendered.variants if v.kind == kind)
    return found


def decoded(rendered: Rendered, kind: str) -> pyvips.Image:
    return pyvips.Image.new_from_buffer(variant(rendered, kind).data, "")


def from_pillow(image: Image.Image) -> pyvips.Image:
    return pyvips.Image.new_from_memory(
        image.tobytes(), image.width, image.height, len(image.getbands()), "uchar"
    )


def mean_difference(a: pyvips.Image, b: pyvips.Image) -> float:
    assert (a.width, a.height, a.bands) == (b.width, b.height, b.bands)
    return float((a.cast("float") - b.cast("float")).abs().avg())


def assert_plain_srgb(rendered: Rendered) -> None:
    for v in rendered.variants:
        image = pyvips.Image.new_from_buffer(v.data, "")
        assert image.interpretation == "srgb"
        assert image.format == "uchar"
        assert not set(image.get_fields()) & set(METADATA_FIELDS), v.kind
        assert set(webp_chunks(v.data)) <= PIXEL_CHUNKS, v.kind


def naive_and_managed(data: bytes, size: tuple[int, int]) -> tuple[pyvips.Image, pyvips.Image]:
    """Pillow's reading of a profiled JPEG: its raw pixels, and littlecms' conversion to sRGB.

    Both resized to `size` with Lanczos, as the pipeline does.
    """
    original = Image.open(io.BytesIO(data))
    source = ImageCms.ImageCmsProfile(io.BytesIO(original.info["icc_profile"]))
    managed = ImageCms.profileToProfile(
        original,
        source,
        ImageCms.createProfile("sRGB"),
        renderingIntent=ImageCms.Intent.RELATIVE_COLORIMETRIC,
        outputMode="RGB",
    )
    assert managed is not None
    resample = Image.Resampling.LANCZOS
    return (
        from_pillow(original.convert("RGB").resize(size, resample)),
        from_pillow(managed.resize(size, resample)),
    )


@pytest.fixture(scope="module")
def upright() -> pyvips.Image:
    return samples.photograph(UPRIGHT_NAME)


@pytest.fixture(scope="module")
def upright_jpeg() -> bytes:
    return (samples.IMAGES / UPRIGHT_NAME).read_bytes()


@pytest.fixture(scope="module")
def upright_rendered(upright_jpeg: bytes) -> Rendered:
    return render_bytes(upright_jpeg)


@pytest.fixture(scope="module")
def upright_browse(upright_rendered: Rendered) -> pyvips.Image:
    return decoded(upright_rendered, "browse").copy_memory()


@pytest.fixture(scope="module")
def alpha_png(upright: pyvips.Image) -> bytes:
    return samples.alpha_png(upright)


@pytest.fixture(scope="module")
def animated_gif(upright: pyvips.Image) -> bytes:
    return samples.animated_gif(upright)


@pytest.fixture(scope="module")
def profiled_jpeg(upright: pyvips.Image) -> bytes:
    return samples.profiled_jpeg(upright)


@pytest.fixture(scope="module", params=range(1, 9), ids=lambda o: f"orientation-{o}")
def oriented_rendered(request: pytest.FixtureRequest, upright: pyvips.Image) -> Rendered:
    return render_bytes(samples.oriented_jpeg(upright, request.param))


def test_every_exif_orientation_renders_the_picture_upright(
    oriented_rendered: Rendered, upright_browse: pyvips.Image
) -> None:
    # GIVEN the upright photograph stored turned under one of the 8 EXIF orientations (fixture)
    # WHEN it was rendered
    browse = decoded(oriented_rendered, "browse")

    # THEN the displayed size is the upright one, and the browse is landscape like the upright
    assert (oriented_rendered.width, oriented_rendered.height) == UPRIGHT_SIZE
    assert (browse.width, browse.height) == BROWSE_SIZE
    # AND its pixels are the upright's (a mirrored or turned picture differs by about 60)
    assert mean_difference(browse, upright_browse) < 3


def test_a_display_p3_photo_is_converted_to_srgb_like_littlecms_does(profiled_jpeg: bytes) -> None:
    # GIVEN a JPEG in Display P3 with its ICC profile embedded
    assert len(Image.open(io.BytesIO(profiled_jpeg)).info["icc_profile"]) > 0

    # WHEN it is rendered
    rendered = render_bytes(profiled_jpeg)

    # THEN the browse matches Pillow's independent P3 -> sRGB conversion (measured 1.96) ...
    browse = decoded(rendered, "browse")
    naive, managed = naive_and_managed(profiled_jpeg, (browse.width, browse.height))
    managed_difference = mean_difference(browse, managed)
    assert managed_difference < TOLERANCE
    # ... far closer than the P3 numbers taken as sRGB (measured 5.9), so the check has teeth
    assert mean_difference(browse, naive) > 2 * managed_difference
    # AND the variants are plain sRGB, with no profile left to interpret
    assert_plain_srgb(rendered)


def test_a_cmyk_jpeg_is_converted_to_three_band_srgb_through_its_profile(upright: pyvips.Image) -> None:
    # GIVEN a CMYK JPEG with its ICC profile embedded
    cmyk = samples.cmyk_jpeg(upright)
    assert Image.open(io.BytesIO(cmyk)).mode == "CMYK"

    # WHEN it is rendered
    rendered = render_bytes(cmyk)

    # THEN both variants are 3-band sRGB
    assert_plain_srgb(rendered)
    browse = decoded(rendered, "browse")
    assert browse.bands == 3
    assert decoded(rendered, "thumb").bands == 3
    # AND the browse matches Pillow's relative-colorimetric conversion of the CMYK through the
    # embedded profile: measured 1.6, under the WebP noise floor of the sRGB photo (1.9). The wrong
    # conversions are far off: the perceptual intent 11.8, CMYK channels taken naively 24.8.
    naive, managed = naive_and_managed(cmyk, (browse.width, browse.height))
    assert mean_difference(browse, managed) < TOLERANCE
    assert mean_difference(browse, naive) > 10


def test_a_png_with_alpha_keeps_its_transparency(alpha_png: bytes, upright_browse: pyvips.Image) -> None:
    # GIVEN a PNG opaque on its left half and transparent on its right half (fixture)
    # WHEN it is rendered
    rendered = render_bytes(alpha_png)

    # THEN both variants carry an alpha band, 255 on the left and 0 on the right
    for kind, margin in (("browse", 8), ("thumb", 4)):
        image = decoded(rendered, kind)
        assert image.bands == 4, kind
        half = image.width // 2
        alpha = image[3]
        assert alpha.crop(0, 0, half - margin, image.height).min() == 255, kind
        assert alpha.crop(half + margin, 0, half - margin, image.height).max() == 0, kind
    # AND the opaque half shows the photograph
    browse = decoded(rendered, "browse")
    left = (0, 0, browse.width // 2 - 8, browse.height)
    assert mean_difference(browse[0:3].crop(*left), upright_browse.crop(*left)) < TOLERANCE


def test_an_animated_gif_renders_its_first_frame_only(upright: pyvips.Image, animated_gif: bytes) -> None:
    # GIVEN a 3-frame GIF whose first frame is the photograph and whose later frames are its negative
    gif = animated_gif
    frame = upright.thumbnail_image(320)

    # WHEN it is rendered
    rendered = render_bytes(gif)

    # THEN the size is one frame's, not the strip of all frames
    assert (rendered.width, rendered.height) == (frame.width, frame.height)
    thumb = decoded(rendered, "thumb")
    assert (thumb.width, thumb.height) == (frame.width, frame.height)
    assert (variant(rendered, "browse").width, variant(rendered, "browse").height) == (320, 200)
    # AND it shows the photograph (measured 3.2, a 256-colour palette) and not its negative (108)
    assert mean_difference(thumb, frame) < 8
    assert mean_difference(thumb, frame.invert()) > 50


def test_a_sixteen_bit_png_renders_like_its_eight_bit_original(
    upright: pyvips.Image, upright_browse: pyvips.Image
) -> None:
    # GIVEN the photograph's pixels scaled to 16 bits in a PNG
    sixteen = samples.sixteen_bit_png(upright)

    # WHEN it is rendered
    rendered = render_bytes(sixteen)

    # THEN the variants are 8-bit sRGB with the 8-bit original's pixels (measured 0.0: the same
    # pixels; a plain cast without rescaling would clip nearly everything to white)
    assert_plain_srgb(rendered)
    assert mean_difference(decoded(rendered, "browse"), upright_browse) < 1


@pytest.mark.parametrize("keep", [0.01, 0.5, 0.95])
def test_a_truncated_jpeg_fails_to_decode(upright_jpeg: bytes, keep: float) -> None:
    # GIVEN the photograph's JPEG cut short
    cut = samples.truncated(upright_jpeg, keep)

    # WHEN it is rendered
    with pytest.raises(PhotoError) as raised:
        render_bytes(cut)

    # THEN the failure is a decode failure, a permanent one
    assert raised.value.code is ErrorCode.DECODE_FAILED
    assert raised.value.code in PERMANENT


def test_a_pixel_bomb_is_refused_from_its_header_having_read_almost_nothing() -> None:
    # GIVEN a PNG declaring 100000 x 100000 pixels whose data never ends
    stream = EndlessPixelBomb()

    # WHEN it is rendered
    started = time.monotonic()
    with pytest.raises(PhotoError) as raised:
        render(stream, RenderOptions())
    elapsed = time.monotonic() - started

    # THEN it is refused for its dimensions, quickly, before decoding (measured: 4 KiB read)
    assert raised.value.code is ErrorCode.DIMENSIONS_EXCEEDED
    assert stream.bytes_read < 64 * 1024
    assert elapsed < 1


# A MATLAB 5 header: the format of libvips' untrusted matload (absent from this build).
MAT_FILE = b"MATLAB 5.0 MAT-file, Platform: GLNXA64".ljust(116, b" ") + bytes(8) + b"\x00\x01IM" + bytes(64)
SVG = (
    b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" width="100" height="50">'
    b'<rect width="100" height="50" fill="red"/></svg>'
)
PDF = (
    b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n"
    b"2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>endobj\n"
    b"3 0 obj<</Type/Page/Parent 2 0 R/MediaBox[0 0 100 50]>>endobj\ntrailer<</Root 1 0 R>>\n%%EOF\n"
)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"Not a photograph, just some words.\n" * 20, id="text"),
        pytest.param(b"", id="empty"),
        # svgload exists in this libvips, but is untrusted: blocked, so not recognised.
        pytest.param(SVG, id="svg"),
        pytest.param(PDF, id="pdf"),
        pytest.param(MAT_FILE, id="matlab"),
        # libvips' own text matrix format: recognised by matrixload, then refused by the allowlist.
        pytest.param(b"2 2\n1 2\n3 4\n", id="vips-matrix"),
    ],
)
def test_a_file_that_is_not_an_accepted_image_format_is_unsupported(data: bytes) -> None:
    # GIVEN bytes that are no photograph in an accepted format
    # WHEN they are rendered
    with pytest.raises(PhotoError) as raised:
        render_bytes(data)

    # THEN the format is unsupported
    assert raised.value.code is ErrorCode.UNSUPPORTED_FORMAT


@pytest.mark.parametrize("name", ["small", "GreenMeadow.jpg"])
def test_a_photo_smaller_than_a_variant_is_never_upscaled(upright: pyvips.Image, name: str) -> None:
    # GIVEN a photo smaller than the browse size (300 x 188, or 1280 x 1024)
    if name == "small":
        data = bytes(upright.thumbnail_image(300).jpegsave_buffer(Q=92))
    else:
        data = (samples.IMAGES / name).read_bytes()
    original = pyvips.Image.new_from_buffer(data, "")
    size = (original.width, original.height)

    # WHEN it is rendered
    rendered = render_bytes(data)

    # THEN the browse keeps the photo's own size, and the thumb fits in 400 x 400 without growing
    assert (variant(rendered, "browse").width, variant(rendered, "browse").height) == size
    thumb = variant(rendered, "thumb")
    fitted = original.thumbnail_image(400, height=400, size="down")
    assert (thumb.width, thumb.height) == (fitted.width, fitted.height)
    assert max(thumb.width, thumb.height) == min(max(size), 400)
    assert (rendered.width, rendered.height) == size


def test_a_big_photo_has_a_browse_of_long_edge_2048_and_a_thumb_within_400(
    upright: pyvips.Image, upright_rendered: Rendered
) -> None:
    # GIVEN the landscape photograph, and a portrait one (the photograph turned, no EXIF)
    portrait = render_bytes(bytes(upright.rot90().jpegsave_buffer(Q=92)))

    for rendered, browse_size in ((upright_rendered, (2048, 1280)), (portrait, (1280, 2048))):
        # WHEN it was rendered
        browse, thumb = variant(rendered, "browse"), variant(rendered, "thumb")

        # THEN the browse's long edge is 2048 exactly, and the thumb fits in 400 x 400
        assert (browse.width, browse.height) == browse_size
        image = decoded(rendered, "browse")
        assert (image.width, image.height) == browse_size
        assert max(thumb.width, thumb.height) == 400
        assert min(thumb.width, thumb.height) == 250


def test_camera_metadata_is_stripped_from_the_variants() -> None:
    # GIVEN a camera photograph with EXIF (make, model, exposure, a thumbnail)
    data = (samples.IMAGES / "Wood.jpg").read_bytes()
    assert "exif-data" in pyvips.Image.new_from_buffer(data, "").get_fields()

    # WHEN it is rendered
    rendered = render_bytes(data)

    # THEN neither variant carries EXIF, XMP, IPTC or an ICC profile
    assert_plain_srgb(rendered)
    for v in rendered.variants:
        assert b"Exif" not in v.data, v.kind


@pytest.mark.parametrize("kind", ["jpeg", "png-with-alpha", "p3-jpeg"])
def test_the_original_is_streamed_once_in_small_reads_from_a_forward_only_stream(
    kind: str, upright_jpeg: bytes, alpha_png: bytes, profiled_jpeg: bytes
) -> None:
    # GIVEN an original behind a stream that can only read forwards (no seek, no tell)
    data = {"jpeg": upright_jpeg, "png-with-alpha": alpha_png, "p3-jpeg": profiled_jpeg}[kind]
    stream = CountingReader(data)

    # WHEN it is rendered
    rendered = render(stream, RenderOptions())

    # THEN it rendered, reading in many chunks each much smaller than the file ...
    assert variant(rendered, "browse").width == 2048
    assert len(stream.sizes) > 20
    assert max(stream.sizes) <= len(data) // 20
    # ... and every byte exactly once: a second pass would have found the stream at its end
    assert stream.bytes_read == len(data)


def test_a_photo_with_padding_after_its_image_data_is_never_read_past_its_end() -> None:
    # GIVEN Wood.jpg, whose JPEG ends 21 KiB before the file does (zero padding)
    data = (samples.IMAGES / "Wood.jpg").read_bytes()
    stream = CountingReader(data)

    # WHEN it is rendered
    rendered = render(stream, RenderOptions())

    # THEN it rendered having read no more than the file (libvips stops at the image's end)
    assert (rendered.width, rendered.height) == (2560, 1920)
    assert 0 < stream.bytes_read <= len(data)


READ_FAILURES = [
    pytest.param(
        PhotoError(ErrorCode.STORAGE_READ_FAILED, "reset"), ErrorCode.STORAGE_READ_FAILED, id="storage"
    ),
    pytest.param(
        PhotoError(ErrorCode.ORIGINAL_TOO_LARGE, "limit"), ErrorCode.ORIGINAL_TOO_LARGE, id="too-large"
    ),
    pytest.param(OSError("connection reset"), ErrorCode.STORAGE_READ_FAILED, id="os-error"),
]


@pytest.mark.parametrize("where", [0.0, 0.5])
@pytest.mark.parametrize(("error", "expected"), READ_FAILURES)
def test_a_read_failure_in_a_jpeg_is_reported_as_the_streams_error_not_a_decode_failure(
    upright_jpeg: bytes, where: float, error: Exception, expected: ErrorCode
) -> None:
    # GIVEN a stream of the photograph that fails at its start or half-way through
    stream: Readable = FailingReader(upright_jpeg, int(len(upright_jpeg) * where), error)

    # WHEN it is rendered
    with pytest.raises(PhotoError) as raised:
        render(stream, RenderOptions())

    # THEN the stream's own error is what the caller hears about
    assert raised.value.code is expected


@pytest.mark.parametrize(("error", "expected"), READ_FAILURES)
def test_a_read_failure_after_the_first_frame_of_a_gif_is_reported_as_the_streams_error(
    animated_gif: bytes, error: Exception, expected: ErrorCode
) -> None:
    # GIVEN a stream of the animated GIF that fails three quarters through, inside its second frame
    # (gifsave merged the two identical negatives: frame 1 is the first half, frame 2 the rest)
    stream = FailingReader(animated_gif, len(animated_gif) * 3 // 4, error)

    # WHEN it is rendered
    with pytest.raises(PhotoError) as raised:
        render(stream, RenderOptions())

    # THEN the stream's own error is what the caller hears about
    assert raised.value.code is expected


def test_a_gif_over_the_byte_limit_of_the_original_stream_is_refused(animated_gif: bytes) -> None:
    # GIVEN the animated GIF behind storage's stream, limited to three quarters of its size
    stream = OriginalStream(io.BytesIO(animated_gif), limit=len(animated_gif) * 3 // 4)

    # WHEN it is rendered
    with pytest.raises(PhotoError) as raised:
        render(stream, RenderOptions())

    # THEN it is refused as too large, not published from the bytes that fitted
    assert raised.value.code is ErrorCode.ORIGINAL_TOO_LARGE


def test_the_thumb_is_the_browse_downsized(upright_rendered: Rendered, upright_browse: pyvips.Image) -> None:
    # GIVEN the photograph's variants
    thumb = decoded(upright_rendered, "thumb")

    # WHEN the browse is downsized to the thumb size
    expected = upright_browse.thumbnail_image(400)

    # THEN the thumb has its long edge at 400 and the downsized browse's pixels (measured 2.3)
    assert (thumb.width, thumb.height) == (400, 250)
    assert (expected.width, expected.height) == (400, 250)
    assert mean_difference(thumb, expected) < 3


def test_the_placeholder_is_the_displayed_pictures_thumbhash_and_average_colour(
    upright_rendered: Rendered, upright: pyvips.Image
) -> None:
    # GIVEN the photograph rendered (its browse decoded once, upright, sRGB)
    shown = upright_rendered.placeholder

    # WHEN its ThumbHash is decoded back into a small picture
    small = thumbhash_to_rgba(base64.b64decode(shown.thumbhash))
    picture = pyvips.Image.new_from_memory(small.rgba, small.width, small.height, 4, "uchar")[:3]

    # THEN it is the photograph's shape (as near as a ThumbHash keeps it), and looks like it: in 4 x 4
    # blocks (a placeholder is a blur), 10 of 255 from the photograph, 57 to 110 from the others
    assert small.width / small.height == pytest.approx(upright.width / upright.height, rel=0.15)

    def blocks(image: pyvips.Image) -> pyvips.Image:
        return image.thumbnail_image(4, height=4, size="force")

    assert mean_difference(blocks(picture), blocks(upright)) < 20
    # AND the average colour is the photograph's own mean colour
    mean = [round(upright[band].avg()) for band in range(3)]
    colour = [int(shown.average_color[i : i + 2], 16) for i in (1, 3, 5)]
    assert max(abs(a - b) for a, b in zip(colour, mean, strict=True)) <= 3


def test_a_transparent_png_keeps_its_alpha_in_the_placeholder(alpha_png: bytes) -> None:
    # GIVEN a PNG with transparency
    rendered = render_bytes(alpha_png)

    # WHEN its placeholder is decoded
    small = thumbhash_to_rgba(base64.b64decode(rendered.placeholder.thumbhash))

    # THEN some of it is transparent, as the picture is
    alphas = small.rgba[3::4]
    assert min(alphas) < 128 < max(alphas)


# --- Every shape bounded (SPEC 3): memory and time from what the header declares -----------------
# These inputs are built to cost gigabytes or minutes: each renders in a child process under a
# memory cap (tests/capped.py), so a bomb that is not refused costs the child, not the test run.

SHAPE_BOMBS = {
    # Under the pixel limit, and measured before the per-axis limit: 1.85 GB, 4.3 GB, 13.5 GB and
    # 48 s, 2.07 GB (PNG and TIFF cannot shrink on load: libvips holds whole rows); the tall one
    # 9.5 s, one libpng row at a time.
    "png-1000000x100": lambda: hostile.png(1_000_000, 100),
    "png-4000000x10": lambda: hostile.png(4_000_000, 10),
    "png-10000000x10-16bit": lambda: hostile.png(10_000_000, 10, bits=16),
    "tiff-4000000x10": lambda: hostile.tiff(4_000_000, 10),
    "png-2x50000000-16bit-alpha": lambda: hostile.png(2, 50_000_000, bits=16, bands=4),
}


@pytest.mark.parametrize("name", SHAPE_BOMBS)
def test_a_shape_bomb_under_the_pixel_limit_is_refused_from_its_header(name: str) -> None:
    # GIVEN a file of a few hundred KB whose picture is under 100 MP but extremely long or wide
    data = SHAPE_BOMBS[name]()
    assert len(data) < 1_000_000

    # WHEN it is rendered
    outcome = capped.render(data)

    # THEN it is refused for its dimensions, from its header: little of it was read
    assert outcome.code == "DIMENSIONS_EXCEEDED", outcome
    assert outcome.bytes_read <= max(256 * 1024, len(data) if name.startswith("tiff") else 0)


@pytest.mark.parametrize("size", [(30000, 3000), (3000, 30000)], ids=["wide", "tall"])
def test_a_panorama_within_the_limits_renders(size: tuple[int, int]) -> None:
    # GIVEN a 90 MP panorama, 30000 pixels long (the benchmarks' 30000 x 20000 PNG is as wide)
    data = hostile.png(*size)

    # WHEN it is rendered
    outcome = capped.render(data)

    # THEN it renders at its size
    assert (outcome.code, outcome.size) == (None, size)


@pytest.mark.parametrize(("bands", "code"), [(3, None), (4, "DIMENSIONS_EXCEEDED")], ids=["rgb", "rgba"])
def test_a_row_is_bounded_in_bytes_not_only_in_pixels(bands: int, code: str | None) -> None:
    # GIVEN two 16-bit PNGs 32768 pixels wide (the per-axis limit): RGB, a 192 KiB row, and RGBA,
    # 256 KiB, whose rows libvips holds by the hundred when it cannot shrink on load
    data = hostile.png(32768, 64, bits=16, bands=bands)

    # WHEN they are rendered
    outcome = capped.render(data)

    # THEN the RGB one renders and the RGBA one is refused from its header
    assert outcome.code == code, outcome


BUFFER_BOMBS = {
    # Adam7 interlacing: libvips decodes the whole picture before the first row (measured 893 MB).
    "png-interlaced-10000x10000-16bit-alpha": lambda: hostile.png(
        10000, 10000, bits=16, bands=4, interlaced=True
    ),
    # A progressive JPEG's decoder holds every DCT coefficient (2 bytes a sample) until its last scan
    # (measured: 48 MP at 4:4:4, 367 MB); this header declares 8000 x 6000 over a tiny picture.
    "jpeg-progressive-declaring-8000x6000": lambda: hostile.with_jpeg_size(
        bytes(pyvips.Image.black(64, 64, bands=3).jpegsave_buffer(interlace=True, subsample_mode="off")),
        (8000, 6000),
    ),
    # libvips holds rows of a tiled TIFF's tiles, and a tile may hold 100 MB (measured: 484 MB).
    "tiff-11520x8640-in-tiles-of-5760": lambda: hostile.tiff(11520, 8640, tile=(5760, 5760)),
    # A GIF frame is decoded whole, 4 bytes a pixel, whatever the file holds: here nothing at all.
    "gif-frame-10000x10000": lambda: hostile.gif((10000, 10000), (10000, 10000), coded=False),
}
# The least memory the template allows the process function.
SMALLEST = DecodeBudget.of(memory_mb=512, records=4, renders=2)


@pytest.mark.parametrize("name", BUFFER_BOMBS)
def test_what_a_decoder_holds_at_once_is_bounded_from_the_header(name: str) -> None:
    # GIVEN a file under the pixel limit, of a kind its decoder holds whole in memory (or in big tiles),
    # and the smallest function the template makes (512 MB: a render alone may hold 176 MB)
    data = BUFFER_BOMBS[name]()
    options = RenderOptions().sharing(SMALLEST)

    # WHEN it is rendered
    outcome = capped.render(data, options=dataclasses.asdict(options))

    # THEN it is refused for its dimensions, from its header, the refusal naming the budget and what
    # it comes from
    assert outcome.code == "DIMENSIONS_EXCEEDED", outcome
    assert f"over the {SMALLEST.whole} a render may hold alone (512 MB of function memory" in outcome.detail
    assert outcome.bytes_read <= max(256 * 1024, len(data) if name.startswith(("tiff", "gif")) else 0)


@pytest.mark.parametrize("name", BUFFER_BOMBS)
def test_at_the_templates_memory_what_a_slot_cannot_hold_goes_back_to_render_alone(name: str) -> None:
    # GIVEN the same files and a render beside others in the template's function (1769 MB)
    data = BUFFER_BOMBS[name]()
    options = RenderOptions().sharing(slots.DEFAULT)

    # WHEN it is rendered (a GIF's canvas of 400 MB is decoded: more address space than the usual cap)
    outcome = capped.render(data, options=dataclasses.asdict(options), cap_bytes=3 << 30)

    # THEN those over a shared slot are handed back from the header, with what they would hold, to be
    # rendered alone; those within it are not
    estimate = int(outcome.detail) if outcome.code == "RENDER_ALONE" else None
    assert (outcome.code == "RENDER_ALONE") is (name.startswith(("png", "tiff"))), outcome
    assert estimate is None or slots.DEFAULT.slot < estimate <= slots.DEFAULT.whole


def test_what_no_render_of_the_function_could_hold_is_refused_from_its_header() -> None:
    # GIVEN a 100 MP TIFF in 16-bit RGBA tiles of 3456 (91 MB each; libvips refuses 4096): four
    # rows of them are 2.5 GB, more than a render alone may hold in the template's function
    data = hostile.tiff(24576, 4069, bits=16, bands=4, tile=(3456, 3456))
    options = RenderOptions().sharing(slots.DEFAULT)

    # WHEN it is rendered beside others
    outcome = capped.render(data, options=dataclasses.asdict(options))

    # THEN it is refused (no slot, not the whole, could hold it), the detail naming the budget
    assert outcome.code == "DIMENSIONS_EXCEEDED", outcome
    assert f"over the {slots.DEFAULT.whole} a render may hold alone" in outcome.detail
    assert "1769 MB of function memory" in outcome.detail


def estimate(data: bytes) -> int | None:
    return fullsize.decode_estimate(io.BytesIO(data), RenderOptions())


def pillow_jpeg(upright: pyvips.Image, subsampling: int, *, mode: str = "RGB") -> bytes:
    """The photograph as Pillow's progressive JPEG (subsampling 0: 4:4:4, 1: 4:2:2, 2: 4:2:0)."""
    picture = Image.frombytes("RGB", (upright.width, upright.height), upright.write_to_memory()).convert(mode)
    out = io.BytesIO()
    picture.save(out, "JPEG", progressive=True, subsampling=subsampling, quality=90)
    return out.getvalue()


@pytest.mark.parametrize(
    ("subsampling", "mode", "per_pixel"),
    [(2, "RGB", 3), (1, "RGB", 4), (0, "RGB", 6), (0, "CMYK", 8), (0, "L", 2)],
    ids=["4:2:0", "4:2:2", "4:4:4", "cmyk", "grey"],
)
def test_a_progressive_jpeg_counts_its_coefficients_at_its_own_sampling(
    upright: pyvips.Image, subsampling: int, mode: str, per_pixel: int
) -> None:
    # GIVEN the photograph (2560 x 1600: whole MCUs) as a progressive JPEG, sampled as the writers do
    data = pillow_jpeg(upright, subsampling, mode=mode)

    # THEN what its render counts is its DCT coefficients, 2 bytes each: 64 a block of each component
    # at its sampling (a 4:2:0 chroma block covers four luma ones)
    assert estimate(data) == per_pixel * UPRIGHT_SIZE[0] * UPRIGHT_SIZE[1]


def test_an_animation_whose_first_frame_fills_its_canvas_shrinks_on_load_and_counts_nothing_more() -> None:
    # GIVEN animated WebPs on a 4000 x 3000 canvas: a first frame that fills it, one a pixel short
    canvas = (4000, 3000)
    full = bytes(pyvips.Image.black(*canvas, bands=3).webpsave_buffer(Q=10, effort=0))
    short = bytes(pyvips.Image.black(canvas[0] - 1, canvas[1], bands=3).webpsave_buffer(Q=10, effort=0))
    filling, not_filling = (
        hostile.animated_webp(canvas, full, frames=2),
        hostile.animated_webp(canvas, short, frames=2),
    )

    # THEN the first is counted as the file libvips holds (cut to its first frame), the other as its
    # canvas and the frame beside it (4 bytes a pixel each), and the rows its shrink holds
    pixels = canvas[0] * canvas[1]
    assert estimate(filling) == len(hostile.animated_webp(canvas, full, frames=1))
    short_estimate = estimate(not_filling)
    assert short_estimate is not None
    assert short_estimate >= 4 * pixels + 4 * (canvas[0] - 1) * canvas[1]


def test_an_interlaced_png_within_the_lower_limit_renders(upright: pyvips.Image) -> None:
    # GIVEN the photograph as an interlaced (Adam7) PNG
    data = bytes(upright.pngsave_buffer(interlace=True))
    assert pyvips.Image.new_from_buffer(data, "").get("interlaced") == 1

    # WHEN it is rendered
    rendered = render_bytes(data)

    # THEN it renders like any photo
    assert (rendered.width, rendered.height) == UPRIGHT_SIZE
    assert_plain_srgb(rendered)


MANY_FRAMES = {
    # libwebp's demuxer walks its frame list from the start for every frame: 30,000 frames took
    # 6.6 s, 100,000 frames 51 s, for a 4.6 MB file.
    "webp-100000-frames": lambda: hostile.animated_webp(
        (64, 64), bytes(pyvips.Image.black(1, 1, bands=3).webpsave_buffer(lossless=True)), frames=100_000
    ),
    # libvips reads every page's directory to count them: 100,000 pages took 6.6 s.
    "tiff-100000-pages": lambda: hostile.tiff(64, 64, pages=100_000),
}


@pytest.mark.parametrize("name", MANY_FRAMES)
def test_an_animation_or_multi_page_file_costs_its_first_frame_not_its_frame_count(name: str) -> None:
    # GIVEN a file of 100,000 tiny frames or pages
    data = MANY_FRAMES[name]()

    # WHEN it is rendered
    outcome = capped.render(data, timeout=60)

    # THEN its first frame renders, in about the time of a one-frame file (well under a second here)
    assert (outcome.code, outcome.size) == (None, (64, 64)), outcome
    assert outcome.seconds < 3


def test_a_multi_page_tiff_renders_its_first_page(upright: pyvips.Image) -> None:
    # GIVEN a 3-page TIFF: the photograph, then its negative twice
    small = upright.thumbnail_image(320)
    pages = pyvips.Image.arrayjoin([small, small.invert(), small.invert()], across=1).copy()
    pages.set_type(pyvips.GValue.gint_type, "page-height", small.height)
    data = bytes(pages.tiffsave_buffer())
    assert pyvips.Image.new_from_buffer(data, "").get("n-pages") == 3

    # WHEN it is rendered
    rendered = render_bytes(data)

    # THEN it shows the first page (measured 2.8 at this size), not a strip of all three or another
    # page (the negative: about 110)
    assert (rendered.width, rendered.height) == (small.width, small.height)
    browse = decoded(rendered, "browse")
    assert mean_difference(browse, small) < 4
    assert mean_difference(browse, small.invert()) > 50


def test_an_animated_webp_renders_its_first_frame_only(upright: pyvips.Image) -> None:
    # GIVEN a 3-frame animated WebP with EXIF: the photograph, then its negative twice
    small = upright.thumbnail_image(320)
    strip = pyvips.Image.arrayjoin([small, small.invert(), small.invert()], across=1).copy()
    strip.set_type(pyvips.GValue.gint_type, "page-height", small.height)
    strip.set_type(pyvips.GValue.array_int_type, "delay", [100] * 3)
    strip.set_type(pyvips.GValue.blob_type, "exif-data", samples.photograph("Wood.jpg").get("exif-data"))
    data = bytes(strip.webpsave_buffer(Q=90, keep="exif"))
    # (libwebp merges the two identical negatives into one frame of twice the duration)
    assert pyvips.Image.new_from_buffer(data, "").get("n-pages") == 2
    assert b"EXIF" in data

    # WHEN it is rendered
    rendered = render_bytes(data)

    # THEN it shows the first frame (measured 1.8), not a strip of three or the negative (about 110)
    assert (rendered.width, rendered.height) == (small.width, small.height)
    browse = decoded(rendered, "browse")
    assert mean_difference(browse, small) < 4
    assert mean_difference(browse, small.invert()) > 50


def test_a_gif_cut_to_its_first_frame_loses_its_disposal_restore_previous() -> None:
    # GIVEN the 51-byte GIF whose only frame, 11280 x 4135, is to be disposed of by restoring the
    # canvas (nsgif copied the whole canvas for it: 517 MB, over the bound)
    data = bytearray((FINDINGS / "gif-restore-previous-11280x4135.gif").read_bytes())
    control = data.index(b"\x21\xf9\x04") + 3
    assert (data[control] >> 2) & 7 == 3

    # WHEN it is cut to its first frame
    frames.first_frame("gifload_source", data)

    # THEN its disposal is unspecified, and nothing else of its control block changed
    assert (data[control] >> 2) & 7 == 0
    assert data[control] & ~0x1C == 0x0D & ~0x1C


# --- The render deadline, enforced inside libvips ----------------------------------------------------


@pytest.fixture(scope="module")
def slow_tiff() -> bytes:
    """A 100 MP float TIFF of 1.5 MB: libvips takes about 3 s to shrink it, in many strips."""
    return hostile.tiff(8192, 12207, bits=32, bands=4, sample_format="float")


@pytest.mark.parametrize(
    ("budget", "timeout", "code"),
    [
        pytest.param(0.3, 60.0, ErrorCode.TIME_BUDGET_EXCEEDED, id="the-invocation's-time"),
        pytest.param(60.0, 0.3, ErrorCode.RENDER_TIME_EXCEEDED, id="the-render's-own-limit"),
    ],
)
def test_a_render_past_its_deadline_is_stopped_inside_libvips(
    slow_tiff: bytes, budget: float, timeout: float, code: ErrorCode
) -> None:
    # GIVEN a file whose render takes seconds, and a deadline 0.3 s away: the invocation's
    # remaining time, or the render's own limit (RENDER_TIMEOUT_SECONDS), whichever comes first
    options = RenderOptions(render_timeout_seconds=timeout)

    # WHEN it is rendered
    started = time.monotonic()
    with pytest.raises(PhotoError) as raised:
        render(io.BytesIO(slow_tiff), options, time_budget=budget)
    elapsed = time.monotonic() - started

    # THEN libvips was stopped soon after the deadline, not at the end of its work ...
    assert elapsed < 1.5
    # ... with the code of the deadline that passed: the moment's (transient, retried later) or the
    # file's (permanent: no attempt will be faster)
    assert raised.value.code is code
    assert (raised.value.code in PERMANENT) is (code is ErrorCode.RENDER_TIME_EXCEEDED)


def test_the_render_limits_default_to_the_settings_defaults() -> None:
    # GIVEN the limits a render takes, and the settings the functions read (SPEC 11)
    settings = {spec.name: spec.default for spec in dataclasses.fields(Settings)}
    limits = [spec for spec in dataclasses.fields(RenderOptions) if spec.name in settings]

    # THEN each has the same default in both, so a render built with defaults renders as deployed
    assert {spec.name for spec in limits} >= {
        "max_input_pixels",
        "max_input_dimension",
        "max_input_row_bytes",
        "render_timeout_seconds",
    }
    for spec in limits:
        assert spec.default == settings[spec.name], spec.name


# --- Malformed files: the inputs `make fuzz` found, each kept as a test ------------------------
#
# Each reproducer renders through the real pipeline in a child process under a memory cap
# (tests/capped.py): a crash or a balloon costs the child, and fails the test, not the run.

# Each reproducer and what it must come to now: the code of its refusal, or its rendered size.
EXPECTED: dict[str, str | tuple[int, int]] = {
    "heic-grid-without-ispe.heic": "DECODE_FAILED",
    "heic-no-readable-image.heic": "DECODE_FAILED",
    "heic-property-not-utf8.heic": "DECODE_FAILED",
    "png-text-key-latin1.png": (8, 8),
    "heic-exif-item-type-not-utf8.heic": "DECODE_FAILED",
    "heic-clap-offset-outside.heic": "DECODE_FAILED",
    "heic-clap-offset-negative.heic": "DECODE_FAILED",
    "tiff-grey-4-float-bands.tif": (64, 64),
    "gif-restore-previous-11280x4135.gif": (11280, 4135),
}
# The memory bound every render is held to (benchmarks/hostile.py, make fuzz).
PEAK_MB = 400


def test_every_reproducer_has_its_expectation() -> None:
    assert sorted(path.name for path in FINDINGS.iterdir() if path.suffix != ".md") == sorted(EXPECTED)


@pytest.mark.parametrize("name", EXPECTED)
def test_a_fuzzer_finding_ends_in_a_code_or_in_variants(name: str) -> None:
    # GIVEN an input the fuzzer found breaking the pipeline (an unexpected exception, a crash of the
    # interpreter, variants not the size recorded for the photo)
    data = (FINDINGS / name).read_bytes()

    # WHEN it is rendered, in a child process under a memory cap
    outcome = capped.render(data, timeout=60)

    # THEN the child lived, and the file is refused with a code of the file's fault, or rendered,
    # within the memory bound
    expected = EXPECTED[name]
    if isinstance(expected, str):
        assert outcome.code == expected, outcome
    else:
        assert (outcome.code, outcome.size) == (None, expected), outcome
    assert outcome.seconds < 5
    assert outcome.peak_mb < PEAK_MB, outcome


def test_pi_heif_itself_still_crashes_on_a_metadata_item_type_not_utf8() -> None:
    # GIVEN the HEIC whose EXIF item is typed b"\xe1xif"
    data = (FINDINGS / "heic-exif-item-type-not-utf8.heic").read_bytes()

    # WHEN pi-heif opens it without the pipeline's check, in a child process
    child = subprocess.run(
        [sys.executable, "-c", "import sys, pi_heif; pi_heif.open_heif(sys.stdin.buffer.read())"],
        input=data,
        capture_output=True,
        timeout=60,
        check=False,
    )

    # THEN the interpreter dies of a segmentation fault: what heic.check_names keeps libheif's
    # readers from seeing (if this fails, pi-heif was fixed, and the check may be dropped)
    assert child.returncode == -11, child


def test_a_later_libvips_error_is_still_an_error_after_one_whose_text_is_not_utf8() -> None:
    # GIVEN a file libvips refuses with its bytes quoted in the error's text, not UTF-8
    quoting = (FINDINGS / "heic-property-not-utf8.heic").read_bytes()
    truncated = samples.truncated(bytes(pyvips.Image.black(64, 64).pngsave_buffer()), 0.5)

    # WHEN it is rendered, and then another broken file in the same process
    codes = []
    for data in (quoting, truncated):
        with pytest.raises(PhotoError) as raised:
            render(io.BytesIO(data), RenderOptions())
        codes.append(raised.value.code)

    # THEN both are DECODE_FAILED: the first did not leave libvips' error buffer undecodable
    assert codes == [ErrorCode.DECODE_FAILED, ErrorCode.DECODE_FAILED]
