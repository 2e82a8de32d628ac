"""HEIC (HEVC-coded HEIF, phone photos) through the pipeline, on HEIC files made from the project's
real photographs by pillow-heif (samples.heic), decoded for real by pi-heif (no mocks).

Pixel comparisons use the mean absolute difference over all bands, on 0-255, against libvips' own
downsizing of the upright photograph: the WebP of the variant and the HEVC coding together cost
about 1.9 (the same floor as test_pipeline's JPEGs), so the tolerance sits a little above that.

Layouts the phones write, and the fuzzer's malformed ones, are built from real coded pictures by
devkit/hostile.py: a HEIF or AVIF grid whose canvas is not the size it declares is refused from its
boxes before a tile is decoded.
"""

from __future__ import annotations

import dataclasses
import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pillow_heif
import pytest
import pyvips
from PIL import Image

from devkit import fullsize, hostile, samples
from photo_publish.adapters.storage import OriginalStream
from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.image import heic
from photo_publish.image.pipeline import Rendered, RenderedVariant, RenderOptions, render
from photo_publish.image.slots import DecodeBudget
from photo_publish.retry import PERMANENT
from tests import capped
from tests.readers import FailingReader, webp_chunks

UPRIGHT_NAME = "LadyBird.jpg"
UPRIGHT_SIZE = (2560, 1600)
BROWSE_SIZE = (2048, 1280)
THUMB_SIZE = (400, 250)
TOLERANCE = 2.5
# The only chunks a WebP without metadata has: no EXIF, XMP or ICCP.
PIXEL_CHUNKS = frozenset({b"VP8 ", b"VP8L", b"VP8X", b"ALPH"})
METADATA_FIELDS = ("exif-data", "xmp-data", "icc-profile-data", "iptc-data")
EXIF_ORIENTATION = 0x0112


class CountingReader:
    """A forward-only stream (no seek, no tell) that records what it served."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)
        self.bytes_read = 0

    def read(self, size: int, /) -> bytes:
        chunk = self._data.read(size)
        self.bytes_read += len(chunk)
        return chunk


def render_bytes(data: bytes, options: RenderOptions | None = None) -> Rendered:
    return render(io.BytesIO(data), options or RenderOptions())


def variant(rendered: Rendered, kind: str) -> RenderedVariant:
    (found,) = (v for v in rendered.variants if v.kind == kind)
    return found


def decoded(rendered: Rendered, kind: str) -> pyvips.Image:
    return pyvips.Image.new_from_buffer(variant(rendered, kind).data, "")


def difference(a: pyvips.Image, b: pyvips.Image) -> pyvips.Image:
    assert (a.width, a.height, a.bands) == (b.width, b.height, b.bands)
    return a.cast("float") - b.cast("float")


def mean_difference(a: pyvips.Image, b: pyvips.Image) -> float:
    return float(difference(a, b).abs().avg())


def assert_plain_srgb(rendered: Rendered) -> None:
    for v in rendered.variants:
        image = pyvips.Image.new_from_buffer(v.data, "")
        assert image.interpretation == "srgb", v.kind
        assert image.format == "uchar", v.kind
        assert not set(image.get_fields()) & set(METADATA_FIELDS), v.kind
        assert set(webp_chunks(v.data)) <= PIXEL_CHUNKS, v.kind
        assert b"Exif" not in v.data, v.kind


def assert_sizes(rendered: Rendered, size: tuple[int, int], browse: tuple[int, int]) -> None:
    """The stamped size is the displayed one, and the variants have the sizes they declare."""
    assert (rendered.width, rendered.height) == size
    for kind, expected in (("browse", browse), ("thumb", THUMB_SIZE)):
        declared, image = variant(rendered, kind), decoded(rendered, kind)
        assert (declared.width, declared.height) == (image.width, image.height) == expected, kind


def header(data: bytes) -> pyvips.Image:
    """libvips' reading of the header (it cannot decode the HEVC pixels)."""
    return pyvips.Image.new_from_buffer(data, "")


def boxes(data: bytes) -> bytes:
    """The file before its coded pixels: where the item properties (irot, imir, grid) are."""
    return data[: data.index(b"mdat")]


def exif_orientation(data: bytes) -> int:
    exif = Image.Exif()
    exif.load(pillow_heif.open_heif(data).info["exif"])
    return int(exif[EXIF_ORIENTATION])


@pytest.fixture(scope="module")
def upright() -> pyvips.Image:
    return samples.photograph(UPRIGHT_NAME)


@pytest.fixture(scope="module")
def upright_browse(upright: pyvips.Image) -> pyvips.Image:
    """The upright photograph downsized to browse size by libvips, never encoded."""
    return upright.thumbnail_image(BROWSE_SIZE[0], height=BROWSE_SIZE[0]).copy_memory()


@pytest.fixture(scope="module")
def iphone_heic(upright: pyvips.Image) -> bytes:
    """As an iPhone writes it: 512 x 512 HEVC tiles, stored sideways with irot AND EXIF 6, Display P3."""
    return samples.heic(upright, 6, profile="p3")


@pytest.fixture(scope="module")
def iphone_rendered(iphone_heic: bytes) -> Rendered:
    return render_bytes(iphone_heic)


@pytest.fixture
def decoder_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The sizes of the files handed to pi-heif (the real decoder, only counted)."""
    calls: list[int] = []
    real = heic.decoded

    def counting(data: bytes, **options: bool) -> object:
        calls.append(len(data))
        return real(data, **options)

    monkeypatch.setattr(heic, "decoded", counting)
    yield calls


def test_an_iphone_heic_renders_upright_in_srgb_without_metadata(
    iphone_heic: bytes, iphone_rendered: Rendered, upright: pyvips.Image, upright_browse: pyvips.Image
) -> None:
    # GIVEN an iPhone-like HEIC: HEVC, a grid of tiles, stored sideways with both an irot and an
    # EXIF orientation 6, pixels in Display P3 with the profile embedded (fixture)
    assert header(iphone_heic).get("heif-compression") == "hevc"
    assert b"grid" in boxes(iphone_heic)
    assert b"irot" in boxes(iphone_heic)
    assert exif_orientation(iphone_heic) == 6
    assert "icc-profile-data" in header(iphone_heic).get_fields()

    # WHEN it was rendered
    rendered = iphone_rendered

    # THEN pi-heif decoded it, and the stamped size is the displayed, upright one
    assert rendered.loader == "pi_heif"
    assert_sizes(rendered, UPRIGHT_SIZE, BROWSE_SIZE)
    # AND the browse is the upright photograph converted back to sRGB (measured 1.9) ...
    browse = decoded(rendered, "browse")
    assert mean_difference(browse, upright_browse) < TOLERANCE
    # ... not its P3 numbers taken as sRGB (measured 5.8), so the colour check has teeth
    p3_numbers = upright.icc_transform("p3", input_profile="srgb").thumbnail_image(BROWSE_SIZE[0])
    assert mean_difference(browse, p3_numbers) > 2 * mean_difference(browse, upright_browse)
    # AND the variants are plain sRGB with no EXIF, XMP or profile
    assert_plain_srgb(rendered)


@pytest.mark.parametrize("orientation", range(1, 9), ids=lambda o: f"orientation-{o}")
def test_every_orientation_of_a_heic_is_applied_once_not_twice(
    upright: pyvips.Image, orientation: int
) -> None:
    # GIVEN a smaller upright photograph stored turned under each orientation, with the irot/imir
    # that turn it back AND the same EXIF orientation, as Apple writes both
    small = upright.thumbnail_image(640)
    data = samples.heic(small, orientation)
    assert exif_orientation(data) == orientation
    assert (b"irot" in boxes(data) or b"imir" in boxes(data)) == (orientation != 1)

    # WHEN it is rendered
    rendered = render_bytes(data)

    # THEN the stamped size and the browse are the upright's (no upscaling at 640 x 400) ...
    assert (rendered.width, rendered.height) == (640, 400)
    browse = decoded(rendered, "browse")
    assert (browse.width, browse.height) == (640, 400)
    # ... and so are its pixels (measured 2.3 at this size): applying the EXIF orientation after
    # libheif's irot would turn or mirror the picture a second time (portrait, or 57 and more off)
    assert mean_difference(browse, small) < TOLERANCE + 0.5
    assert_plain_srgb(rendered)


def test_a_ten_bit_heic_renders_to_eight_bit_srgb_without_darkening(
    upright: pyvips.Image, upright_browse: pyvips.Image
) -> None:
    # GIVEN a 10-bit HEIC in Display P3 (an HDR capture's base picture)
    data = samples.heic(upright, profile="p3", bits=10)
    assert header(data).get("bits-per-sample") == 10

    # WHEN it is rendered
    rendered = render_bytes(data)

    # THEN the variants are 8-bit sRGB with the photograph's pixels (measured 1.9)
    assert_plain_srgb(rendered)
    browse = decoded(rendered, "browse")
    assert mean_difference(browse, upright_browse) < TOLERANCE
    # AND the 10 bits were reduced to 8 after the colour conversion, by libvips: measured -0.18 on
    # average; libheif's own reduction to 8 bits truncates, measured -0.57
    assert abs(difference(browse, upright_browse).avg()) < 0.4


def test_a_multi_image_heic_renders_its_primary_image_only(
    upright: pyvips.Image, upright_browse: pyvips.Image
) -> None:
    # GIVEN a HEIC of three images (a burst): the photograph is the primary, stored second, between
    # two half-size negatives of it
    data = samples.heic(upright, companions=2)
    assert header(data).get("n-pages") == 3
    assert header(data).get("heif-primary") == 1

    # WHEN it is rendered
    rendered = render_bytes(data)

    # THEN the size is the primary's, and so are the pixels (measured 1.9; the negative's: 108)
    assert_sizes(rendered, UPRIGHT_SIZE, BROWSE_SIZE)
    browse = decoded(rendered, "browse")
    assert mean_difference(browse, upright_browse) < TOLERANCE
    assert mean_difference(browse, upright_browse.invert()) > 50


def test_a_heic_grid_is_decoded_whole_with_every_tile_in_its_place(
    upright: pyvips.Image, upright_browse: pyvips.Image
) -> None:
    # GIVEN a HEIC coded as a grid of 256 x 256 tiles, the last row and column of tiles only partly
    # inside the picture (1600 = 6 x 256 + 64)
    data = samples.heic(upright, tile_size=256)
    assert b"grid" in boxes(data)

    # WHEN it is rendered
    rendered = render_bytes(data)

    # THEN the picture is whole: every band of rows across the browse, each tile row among them,
    # shows the photograph (measured 2.1 at most; a missing tile is black, a row of tiles one
    # place off differs by 45)
    assert_sizes(rendered, UPRIGHT_SIZE, BROWSE_SIZE)
    browse = decoded(rendered, "browse")
    band = 64
    for top in range(0, browse.height, band):
        height = min(band, browse.height - top)
        rows = (0, top, browse.width, height)
        assert mean_difference(browse.crop(*rows), upright_browse.crop(*rows)) < TOLERANCE + 1, top


def test_an_avif_is_still_decoded_by_libvips(upright: pyvips.Image, decoder_calls: list[int]) -> None:
    # GIVEN an AVIF: the same HEIF container, coded with AV1, which libvips decodes itself
    small = upright.thumbnail_image(1280)
    data = bytes(small.heifsave_buffer(compression="av1", Q=80, effort=0))
    assert header(data).get("heif-compression") == "av1"

    # WHEN it is rendered
    rendered = render_bytes(data)

    # THEN libvips decoded it, and pi-heif was never called
    assert rendered.loader == "heifload_source"
    assert decoder_calls == []
    assert (rendered.width, rendered.height) == (1280, 800)
    assert mean_difference(decoded(rendered, "browse"), small) < 4
    assert_plain_srgb(rendered)


def test_a_heic_is_read_once_to_its_end_and_handed_whole_to_pi_heif(
    iphone_heic: bytes, decoder_calls: list[int]
) -> None:
    # GIVEN the HEIC behind a stream that can only read forwards (no seek, no tell)
    stream = CountingReader(iphone_heic)

    # WHEN it is rendered
    rendered = render(stream, RenderOptions())

    # THEN every byte was read exactly once: what libvips read for the header was kept, and with
    # the rest of the stream it made the whole file, decoded once
    assert rendered.loader == "pi_heif"
    assert stream.bytes_read == len(iphone_heic)
    assert decoder_calls == [len(iphone_heic)]


@pytest.mark.parametrize(
    "declared", [pytest.param(None, id="limit-below-the-photo"), pytest.param(20_000, id="edited-ispe")]
)
def test_a_heic_over_the_pixel_limit_is_refused_from_its_header_before_decoding(
    iphone_heic: bytes, decoder_calls: list[int], declared: int | None
) -> None:
    # GIVEN the iPhone HEIC and a pixel limit just below its size, or the HEIC with its image
    # spatial extents (ispe) edited to declare 20000 x 20000 pixels, 400 MP (its data unchanged)
    options = RenderOptions(max_input_pixels=UPRIGHT_SIZE[0] * UPRIGHT_SIZE[1] - 1)
    data = iphone_heic
    if declared is not None:
        options = RenderOptions()
        edited = bytearray(data)
        at = edited.find(b"ispe")
        while at >= 0:
            edited[at + 8 : at + 16] = declared.to_bytes(4, "big") * 2
            at = edited.find(b"ispe", at + 4)
        data = bytes(edited)
        assert (header(data).width, header(data).height) == (declared, declared)

    # WHEN it is rendered
    started = time.monotonic()
    with pytest.raises(PhotoError) as raised:
        render_bytes(data, options)

    # THEN it is refused for its dimensions, quickly, and nothing went to the decoder
    assert raised.value.code is ErrorCode.DIMENSIONS_EXCEEDED
    assert decoder_calls == []
    assert time.monotonic() - started < 1


@pytest.mark.parametrize("damage", ["coded-pixels-zeroed", "truncated"])
def test_a_damaged_heic_fails_to_decode(iphone_heic: bytes, damage: str) -> None:
    # GIVEN the HEIC with its coded pixels zeroed (the header intact: libvips reads it, the HEVC
    # decoder fails), or cut short (libheif finds the file shorter than its boxes declare)
    if damage == "truncated":
        data = samples.truncated(iphone_heic, 0.9)
    else:
        data = samples.heic_without_pixels(iphone_heic)
        assert header(data).get("heif-compression") == "hevc"

    # WHEN it is rendered
    with pytest.raises(PhotoError) as raised:
        render_bytes(data)

    # THEN the failure is a decode failure, a permanent one
    assert raised.value.code is ErrorCode.DECODE_FAILED
    assert raised.value.code in PERMANENT


def test_a_heic_over_the_byte_limit_of_the_original_stream_is_refused(iphone_heic: bytes) -> None:
    # GIVEN the HEIC behind storage's stream, limited to three quarters of its size
    stream = OriginalStream(io.BytesIO(iphone_heic), limit=len(iphone_heic) * 3 // 4)

    # WHEN it is rendered
    with pytest.raises(PhotoError) as raised:
        render(stream, RenderOptions())

    # THEN it is refused as too large
    assert raised.value.code is ErrorCode.ORIGINAL_TOO_LARGE


@pytest.mark.parametrize("where", [0.0, 0.5])
def test_a_read_failure_in_a_heic_is_reported_as_the_streams_error(iphone_heic: bytes, where: float) -> None:
    # GIVEN a stream of the HEIC whose connection resets at its start or half-way through
    stream = FailingReader(iphone_heic, int(len(iphone_heic) * where), OSError("connection reset"))

    # WHEN it is rendered
    with pytest.raises(PhotoError) as raised:
        render(stream, RenderOptions())

    # THEN the storage fault is what the caller hears about (retryable), not a decode failure
    assert raised.value.code is ErrorCode.STORAGE_READ_FAILED
    assert raised.value.code not in PERMANENT


def test_the_heic_thumb_is_its_browse_downsized(iphone_rendered: Rendered) -> None:
    # GIVEN the iPhone HEIC's variants
    thumb, browse = decoded(iphone_rendered, "thumb"), decoded(iphone_rendered, "browse")

    # WHEN the browse is downsized to the thumb size
    expected = browse.thumbnail_image(THUMB_SIZE[0])

    # THEN the thumb has its size and its pixels (measured 2.3, as for a JPEG)
    assert (thumb.width, thumb.height) == THUMB_SIZE
    assert mean_difference(thumb, expected) < 3


def test_the_pipeline_imports_pi_heif_only_when_a_heic_arrives() -> None:
    # GIVEN a fresh interpreter
    code = (
        "import sys, io\n"
        "from photo_publish.image.pipeline import render, RenderOptions\n"
        "from devkit import samples\n"
        "assert 'pi_heif' not in sys.modules, 'imported with the pipeline'\n"
        "render(io.BytesIO((samples.IMAGES / 'Garden.jpg').read_bytes()), RenderOptions())\n"
        "assert 'pi_heif' not in sys.modules, 'imported for a JPEG'\n"
        "render(io.BytesIO(samples.heic(samples.photograph().thumbnail_image(64))), RenderOptions())\n"
        "assert 'pi_heif' in sys.modules\n"
    )

    # WHEN the pipeline is imported, renders a JPEG, then a HEIC
    result = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": "shared:."},
        cwd=samples.IMAGES.parent.parent,
    )

    # THEN pi-heif (25 ms and Pillow) was imported for the HEIC only, not at cold start
    assert result.returncode == 0, result.stderr


# --- Files libvips' libheif refuses to read, and files too large to decode whole (SPEC 3) -------------


@pytest.fixture(scope="module")
def tile() -> hostile.CodedPicture:
    """A real HEVC picture of 128 x 128 (pillow-heif), for the hand-built layouts below to repeat."""
    return hostile.coded_picture(samples.heic(samples.photograph().crop(0, 0, 128, 128), tile_size=0))


@pytest.fixture(scope="module")
def big_tile() -> hostile.CodedPicture:
    """The same at 512 x 512: a phone's tile size."""
    return hostile.coded_picture(samples.heic(samples.photograph().crop(0, 0, 512, 512), tile_size=0))


def libvips_reads(data: bytes) -> bool:
    try:
        header(data)
    except pyvips.Error:
        return False
    return True


def test_a_heic_of_more_items_than_libvips_reads_renders(upright: pyvips.Image) -> None:
    # GIVEN a real HEIC of 1600 x 1200 coded in 64 x 64 tiles by pillow-heif: 475 tiles, so 477 items
    # with its grid and EXIF, over the 256 items that libvips' libheif reads
    picture = upright.crop(0, 0, 1600, 1200)
    data = samples.heic(picture, tile_size=64)
    assert not libvips_reads(data)

    # WHEN it is rendered
    rendered = render_bytes(data)

    # THEN pi-heif read and decoded it: the picture, at its size (measured 2.0)
    assert rendered.loader == "pi_heif"
    assert (rendered.width, rendered.height) == (1600, 1200)
    assert mean_difference(decoded(rendered, "browse"), picture) < TOLERANCE


# Phone layouts, item for item (tiles of 512 x 512 pixels in the phones' files; here 128 x 128, so
# that the pictures stay small while the item counts are the phones'): the primary grid, the HDR
# gain map's grid, portrait mattes' grids, a thumbnail, EXIF and XMP.
GAIN_MAP = "urn:com:apple:photo:2020:aux:hdrgainmap"
MATTE = "urn:com:apple:photo:2019:aux:semanticskinmatte"


@pytest.mark.parametrize(
    ("mattes", "items", "read_by_libvips"),
    [pytest.param(0, 245, True, id="iphone-48mp"), pytest.param(3, 284, False, id="iphone-48mp-portrait")],
)
def test_an_iphone_48mp_layout_renders_whatever_its_item_count(
    tile: hostile.CodedPicture, mattes: int, items: int, read_by_libvips: bool
) -> None:
    # GIVEN the layout of a 48 MP iPhone HEIC (8064 x 6048: 16 x 12 tiles) with its gain map (8 x 6
    # tiles), thumbnail, EXIF and XMP: 245 items; a portrait adds mattes (4 x 3 tiles each): 284
    auxiliary = (hostile.Grid(tile, 8, 6, (1008, 756), GAIN_MAP),) + (
        hostile.Grid(tile, 4, 3, (504, 378), MATTE),
    ) * mattes
    data = hostile.heif(
        hostile.Grid(tile, 16, 12, (2016, 1512)), auxiliary=auxiliary, thumbnail=tile, metadata_items=2
    )
    assert data.count(b"infe") == items
    assert libvips_reads(data) is read_by_libvips

    # WHEN it is rendered
    rendered = render_bytes(data)

    # THEN it renders at its size, whether libvips could read it or not
    assert rendered.loader == "pi_heif"
    assert (rendered.width, rendered.height) == (2016, 1512)
    assert_plain_srgb(rendered)


def test_a_200mp_phone_heic_is_refused_for_its_size_not_reported_as_corrupt(
    big_tile: hostile.CodedPicture, decoder_calls: list[int]
) -> None:
    # GIVEN the layout of a 200 MP phone HEIC: 12240 x 16320 pixels in 24 x 32 tiles of 512 x 512,
    # a thumbnail and metadata, 772 items, which libvips cannot read
    data = hostile.heif(hostile.Grid(big_tile, 24, 32, (12240, 16320)), thumbnail=big_tile, metadata_items=2)
    assert not libvips_reads(data)

    # WHEN it is rendered
    started = time.monotonic()
    with pytest.raises(PhotoError) as raised:
        render_bytes(data)

    # THEN it is refused for its dimensions (over the 100 MP limit), from what it declares, quickly
    # and without decoding a pixel: not DECODE_FAILED, which tells the user the file is broken
    assert raised.value.code is ErrorCode.DIMENSIONS_EXCEEDED
    assert decoder_calls == []
    assert time.monotonic() - started < 1


@pytest.mark.parametrize("tile_size", [1024, 512], ids=["read-by-libvips", "read-by-pi-heif"])
def test_a_heic_too_large_to_decode_whole_is_refused_from_its_header(
    upright: pyvips.Image, tile_size: int
) -> None:
    # GIVEN a HEIC of 9000 x 9000 pixels (81 MP, under the pixel limit), whose decode would hold about
    # 4.5 bytes a pixel at once, 365 MB: in 9 x 9 tiles of 1024 (83 items, read by libvips), or in
    # 18 x 18 tiles of 512 (325 items, over what libvips reads); and the smallest function the
    # template makes (512 MB: a render alone may hold 176 MB)
    one = hostile.coded_picture(samples.heic(upright.crop(0, 0, tile_size, tile_size), tile_size=0))
    across = -(-9000 // tile_size)
    data = hostile.heif(hostile.Grid(one, across, across, (9000, 9000)))
    assert libvips_reads(data) is (tile_size == 1024)
    options = RenderOptions().sharing(DecodeBudget.of(memory_mb=512, records=4, renders=2))

    # WHEN it is rendered (in a child process under a memory cap)
    outcome = capped.render(data, options=dataclasses.asdict(options))

    # THEN it is refused for its dimensions
    assert outcome.code == "DIMENSIONS_EXCEEDED", outcome


# --- Grids whose canvas is not the size they declare (the fuzzer's finding, at full size) ---------


@pytest.mark.parametrize("declared", [(128, 128), None], ids=["declaring-128x128", "declaring-nothing"])
def test_a_grid_whose_canvas_is_not_its_declared_size_is_refused_before_decoding(
    big_tile: hostile.CodedPicture, declared: tuple[int, int] | None
) -> None:
    # GIVEN a 130 KB HEIC of one tile repeated 30 x 30 times on a canvas of 15000 x 15000 (225 MP),
    # declaring 128 x 128, or no size at all (the fuzzer's finding, at full size). Measured before:
    # 448 MB and 10 s before libheif's own DECODE_FAILED; 1.1 GB and rendered
    size = (15000, 15000)
    honest = hostile.heif(hostile.Grid(big_tile, 30, 30, size))
    ispe = hostile._ispe(size)
    assert honest.count(ispe) == 1
    replacement = ispe.replace(b"ispe", b"xspe") if declared is None else hostile._ispe(declared)
    data = honest.replace(ispe, replacement)

    # WHEN it is rendered (in a child process under a memory cap)
    outcome = capped.render(data)

    # THEN it is refused, from its boxes, before any tile is decoded
    assert outcome.code == "DECODE_FAILED", outcome
    assert outcome.seconds < 1
    assert outcome.peak_mb < 150, outcome


def test_every_grid_of_a_heif_is_compared_with_its_declared_size_not_only_the_primary(
    big_tile: hostile.CodedPicture,
) -> None:
    # GIVEN a HEIC whose primary grid is honest, and whose second grid (a gain map, which an
    # identity image could show as well) declares 512 x 512 on a canvas of 4096 x 3072
    aux_size = (4096, 3072)
    honest = hostile.heif(
        hostile.Grid(big_tile, 2, 2, (1000, 1000)), auxiliary=(hostile.Grid(big_tile, 8, 6, aux_size),)
    )
    heic.check_canvas(honest)
    lying = honest.replace(hostile._ispe(aux_size), hostile._ispe((512, 512)))

    # WHEN its boxes are checked
    with pytest.raises(PhotoError) as raised:
        heic.check_canvas(lying)

    # THEN it is refused
    assert raised.value.code is ErrorCode.DECODE_FAILED


def test_an_avif_grid_whose_canvas_is_not_its_declared_size_is_refused_before_libvips_decodes_it() -> None:
    # GIVEN an AVIF (libvips decodes it, through its libheif) of 15 x 15 tiles of 512 on a canvas of
    # 7680 x 7680, declaring 512 x 512 (226 items: libvips reads it). Before: libheif decoded every
    # tile onto the canvas, then refused it
    crop = samples.photograph().crop(0, 0, 512, 512)
    av1 = hostile.coded_picture(bytes(crop.heifsave_buffer(compression="av1", Q=30, effort=0)))
    size = (7680, 7680)
    honest = hostile.heif(hostile.Grid(av1, 15, 15, size), brand=b"avif")
    data = honest.replace(hostile._ispe(size), hostile._ispe((512, 512)))

    # WHEN it is rendered (in a child process under a memory cap)
    outcome = capped.render(data)

    # THEN it is refused before libvips decodes a tile (measured before: 140 MB, 0.6 s; now 65 MB,
    # the imports, and a millisecond)
    assert outcome.code == "DECODE_FAILED", outcome
    assert outcome.peak_mb < 100, outcome


def test_an_honest_grid_still_renders(big_tile: hostile.CodedPicture) -> None:
    # GIVEN a grid whose canvas is the size it declares (tiles overhanging it, as phones write them)
    data = hostile.heif(hostile.Grid(big_tile, 3, 2, (1400, 1000)))

    # WHEN it is rendered
    outcome = capped.render(data)

    # THEN it renders at that size
    assert (outcome.code, outcome.size) == (None, (1400, 1000)), outcome


def estimate(data: bytes, options: RenderOptions) -> int:
    """What render() counts against the budget for `data` (devkit/fullsize.py's decode_estimate)."""
    needs = fullsize.decode_estimate(io.BytesIO(data), options)
    assert needs is not None
    return needs


@pytest.fixture
def decode_options(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, bool]]]:
    """The options each call to pi-heif's decode was given (the real decoder, only watched)."""
    calls: list[dict[str, bool]] = []
    real = heic.decoded

    def watching(data: bytes, **options: bool) -> object:
        calls.append(options)
        return real(data, **options)

    monkeypatch.setattr(heic, "decoded", watching)
    yield calls


def test_a_deep_heic_too_large_for_16_bits_is_decoded_at_8(
    upright: pyvips.Image, decode_options: list[dict[str, bool]]
) -> None:
    # GIVEN a 10-bit HEIC, and what its render would hold decoded at 16 bits and at 8 (libheif's
    # reduction), as a 100 MP one in a 1024 MB function is
    data = samples.heic(upright, profile="p3", bits=10)
    sixteen = estimate(data, RenderOptions())
    eight = estimate(data, RenderOptions(max_decode_buffer_bytes=sixteen - 1))
    # (the planes are the same; the RGB is 3 bytes a pixel narrower)
    assert sixteen - eight == 3 * UPRIGHT_SIZE[0] * UPRIGHT_SIZE[1]

    # WHEN it is rendered where a render may hold less than the first and no less than the second
    rendered = render_bytes(data, RenderOptions(max_decode_buffer_bytes=sixteen - 1))

    # THEN libheif reduced it to 8 bits, and it is the photograph (measured 1.9)
    assert decode_options == [{"eight_bit": True}]
    assert mean_difference(decoded(rendered, "browse"), upright.thumbnail_image(BROWSE_SIZE[0])) < TOLERANCE
    # AND with less than even that, it is refused before decoding
    with pytest.raises(PhotoError) as raised:
        render_bytes(data, RenderOptions(max_decode_buffer_bytes=eight - 1))
    assert raised.value.code is ErrorCode.DIMENSIONS_EXCEEDED
    assert len(decode_options) == 1
    # AND where 16 bits fit, it is decoded at 16
    render_bytes(data, RenderOptions(max_decode_buffer_bytes=sixteen))
    assert decode_options[-1] == {"eight_bit": False}
