"""Real photos at the pixel limit (100 MP) in every format the pipeline accepts, as their writers make them.

Where devkit/hostile.py builds files to cost a decoder what it can, these are what a person uploads
at the top of MAX_INPUT_PIXELS: the project's photograph enlarged and written by the encoder of its
format (libvips' mozjpeg-like progressive JPEG, interlaced PNG, tiled TIFF, animated WebP, Pillow's
GIF, x265's 10-bit HEVC), each within MAX_ORIGINAL_BYTES. The decoders that hold the whole picture
(a progressive JPEG's coefficients, an interlaced PNG, a HEIF, an animation's canvas) are the point;
streaming ones (baseline JPEG, plain PNG, still WebP) are there to compare.

Two files stand for pictures real encoders would make too large to upload: their pixels are zeros,
their decoders' memory the same (a 16-bit RGBA interlaced PNG, hostile.png's writer; a progressive
CMYK JPEG). HEIF and AVIF pictures are grids of one real coded 512 x 512 tile, repeated, as
hostile.py makes them: every tile is decoded for real, and encoding 100 MP with x265 or aom would take
minutes.

    python -m devkit.fullsize <folder>    write every case of CASES not there yet (about a minute)

Making them holds 100 MP pictures (up to 1.6 GB): benchmarks and tests run this module in a child
process, and keep its files (under .local/fullsize/<what made them>).
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyvips

from devkit import hostile, samples
from photo_publish.errors import PhotoError
from photo_publish.image import slots
from photo_publish.image.pipeline import Readable, RenderAlone, RenderOptions, render

ROOT = Path(__file__).resolve().parent.parent


def _made_by() -> str:
    """What makes the files: their makers' source and libvips' version. A change to either is a new
    folder, so a kept corpus is never one an older maker wrote."""
    digest = hashlib.sha256(".".join(str(pyvips.version(part)) for part in range(3)).encode())
    for maker in (Path(__file__), Path(hostile.__file__), Path(samples.__file__)):
        digest.update(maker.read_bytes())
    return digest.hexdigest()[:12]


FOLDER = ROOT / ".local" / "fullsize" / _made_by()
PIXELS = 100_000_000
# Shapes of 100 MP: a 3:2 camera's, a square one's; the 48 MP camera (8000 x 6000).
WIDE, SQUARE, CAMERA_48MP = (12_500, 8_000), (10_000, 10_000), (8_000, 6_000)


def _picture(size: tuple[int, int]) -> pyvips.Image:
    """The project's photograph enlarged to `size`: a lazy image, made as the encoder asks for it."""
    photo = samples.photograph()
    return photo.resize(size[0] / photo.width, vscale=size[1] / photo.height)


def _jpeg(size: tuple[int, int], **options: object) -> Callable[[], bytes]:
    return lambda: bytes(_picture(size).jpegsave_buffer(**options))


def _progressive_cmyk(size: tuple[int, int]) -> bytes:
    # A print shop's file: 4 components, none subsampled (8 bytes a pixel of coefficients).
    black = pyvips.Image.black(*size, bands=4).copy(interpretation="cmyk")
    return bytes(black.jpegsave_buffer(interlace=True))


def _interlaced_png(size: tuple[int, int]) -> bytes:
    # The palette keeps the enlarged photograph under MAX_ORIGINAL_BYTES (RGB would be 150 MB); an
    # interlaced file's decoder holds it whole all the same, as RGB (libvips expands the palette).
    return bytes(_picture(size).pngsave_buffer(interlace=True, palette=True, effort=1, compression=1))


def _tiled_tiff(size: tuple[int, int]) -> bytes:
    return bytes(
        _picture(size).tiffsave_buffer(tile=True, tile_width=512, tile_height=512, compression="jpeg")
    )


def _animated_gif(size: tuple[int, int]) -> bytes:
    """Two frames: the photograph, then a small change in its corner (Pillow stores only that)."""
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = None
    picture = _picture(size).colourspace("b-w").copy_memory()
    first = Image.frombytes("L", size, picture.write_to_memory()).convert("P")
    second = first.copy()
    second.paste(0, (0, 0, 64, 64))
    out = io.BytesIO()
    first.save(out, "GIF", save_all=True, append_images=[second], duration=100, loop=0)
    return out.getvalue()


def _animated_webp(size: tuple[int, int]) -> bytes:
    """Two frames of the canvas' size: the photograph and its negative (libvips' animated WebP)."""
    picture = _picture(size).copy_memory()
    pages = pyvips.Image.arrayjoin([picture, picture.invert()], across=1).copy()
    pages.set_type(pyvips.GValue.gint_type, "page-height", size[1])
    pages.set_type(pyvips.GValue.array_int_type, "delay", [100, 100])
    return bytes(pages.webpsave_buffer(Q=60, effort=0))


def _heif_grid(kind: str, size: tuple[int, int]) -> Callable[[], bytes]:
    def make() -> bytes:
        tile = _tile(kind)
        across, down = -(-size[0] // tile.size[0]), -(-size[1] // tile.size[1])
        brand = b"avif" if kind.startswith("av1") else b"heic"
        return hostile.heif(
            hostile.Grid(tile, across, down, size), thumbnail=tile, metadata_items=2, brand=brand
        )

    return make


def _tile(kind: str) -> hostile.CodedPicture:
    """HEVC in phones' 512 x 512 tiles (hostile.py's); AV1 in tiles of 2048, as libavif grids big
    pictures (in 512s, a 100 MP AVIF would be over the 256 items libvips' libheif reads)."""
    if not kind.startswith("av1"):
        return hostile._tile(kind)
    crop = _picture(SQUARE).crop(0, 0, 2048, 2048).copy_memory()
    if kind == "av1-10":
        crop = (crop.cast("ushort") * 257).cast("ushort").copy(interpretation="rgb16")
    coded = crop.heifsave_buffer(compression="av1", Q=50, effort=0, bitdepth=10 if kind == "av1-10" else 8)
    return hostile.coded_picture(bytes(coded))


def _heif_444(kind: str, bits: int, size: tuple[int, int] = SQUARE) -> Callable[[], bytes]:
    """A grid whose tiles are coded without chroma subsampling (4:4:4, 4:2:2 for "hevc-422"), as
    cameras' and editors' high-quality exports are: libheif converts them through a planar RGB of the
    whole picture."""

    def make() -> bytes:
        if kind == "av1":
            crop = _picture(SQUARE).crop(0, 0, 2048, 2048).copy_memory()
            if bits > 8:
                crop = (crop.cast("ushort") * 257).cast("ushort").copy(interpretation="rgb16")
            coded = crop.heifsave_buffer(
                compression="av1", Q=50, effort=0, bitdepth=bits, subsample_mode="off"
            )
            tile, brand = hostile.coded_picture(bytes(coded)), b"avif"
        else:
            crop = samples.photograph().crop(0, 0, 512, 512)
            chroma = 422 if kind == "hevc-422" else 444
            tile = hostile.coded_picture(samples.heic(crop, tile_size=0, bits=bits, chroma=chroma))
            brand = b"heic"
        across, down = -(-size[0] // tile.size[0]), -(-size[1] // tile.size[1])
        return hostile.heif(
            hostile.Grid(tile, across, down, size), thumbnail=tile, metadata_items=2, brand=brand
        )

    return make


def _one_strip_ycbcr_tiff(size: tuple[int, int]) -> bytes:
    """JPEG-coded YCbCr in a single strip, as Pillow and scanners write TIFFs: read a strip at a time."""
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = None
    picture = Image.frombytes("RGB", size, _picture(size).copy_memory().write_to_memory())
    out = io.BytesIO()
    picture.convert("YCbCr").save(out, "TIFF", compression="jpeg", quality=85, strip_size=2**40)
    return out.getvalue()


def _with_alpha(image: pyvips.Image) -> pyvips.Image:
    """A cut-out: the picture with an alpha of its bright parts, as a sticker or a product shot."""
    return image.bandjoin((image.extract_band(1) > 60).ifthenelse(255, 0).cast("uchar"))


@dataclass(frozen=True)
class Case:
    name: str  # also the file's name
    make: Callable[[], bytes]
    note: str
    size: tuple[int, int] = SQUARE
    # How the process function renders it at the template's memory: in a shared slot, alone, or
    # refused (DIMENSIONS_EXCEEDED: more than the whole of its memory could hold).
    route: str = "shared"
    formats: tuple[str, ...] = ("webp",)  # VARIANT_FORMATS it is rendered with


CASES = [
    Case(
        "jpeg-progressive-8000x6000.jpg",
        _jpeg(CAMERA_48MP, Q=85, interlace=True, optimize_coding=True),
        "the issue's: a 48 MP camera's, as mozjpeg writes it (4:2:0)",
        size=CAMERA_48MP,
    ),
    Case(
        "jpeg-progressive-12500x8000.jpg",
        _jpeg(WIDE, Q=85, interlace=True, optimize_coding=True),
        "progressive, 4:2:0",
        size=WIDE,
    ),
    Case("jpeg-progressive-444-10000x10000.jpg", _jpeg(SQUARE, Q=95, interlace=True), "progressive, 4:4:4"),
    Case(
        "jpeg-progressive-cmyk-10000x10000.jpg",
        lambda: _progressive_cmyk(SQUARE),
        "progressive CMYK: the most a JPEG's coefficients hold",
        route="alone",
    ),
    Case("jpeg-baseline-12500x8000.jpg", _jpeg(WIDE, Q=85), "baseline: shrinks on load, streams", size=WIDE),
    Case("png-interlaced-10000x10000.png", lambda: _interlaced_png(SQUARE), "interlaced (Adam7), 8-bit"),
    Case(
        "png-interlaced-10000x10000-16bit-alpha.png",
        lambda: hostile.png(*SQUARE, bits=16, bands=4, interlaced=True),
        "interlaced 16-bit RGBA: the most a PNG holds",
        route="alone",
    ),
    Case(
        "png-12500x8000.png",
        lambda: bytes(_picture(WIDE).pngsave_buffer(palette=True, effort=1)),
        "not interlaced: streams",
        size=WIDE,
    ),
    Case("tiff-tiled-10000x10000.tif", lambda: _tiled_tiff(SQUARE), "512-pixel tiles, JPEG-coded"),
    Case(
        "heic-10bit-10000x10000.heic", _heif_grid("hevc-10", SQUARE), "10-bit HEVC, 400 tiles", route="alone"
    ),
    Case("heic-10000x10000.heic", _heif_grid("hevc-8", SQUARE), "8-bit HEVC, 400 tiles"),
    Case("avif-10000x10000.avif", _heif_grid("av1", SQUARE), "8-bit AV1 (libvips' libheif)"),
    Case(
        "avif-10bit-10000x10000.avif",
        _heif_grid("av1-10", SQUARE),
        "10-bit AV1 (libvips' libheif)",
        route="alone",
    ),
    Case("gif-animated-10000x10000.gif", lambda: _animated_gif(SQUARE), "two frames; the first is rendered"),
    Case(
        "webp-animated-12500x8000.webp",
        lambda: _animated_webp(WIDE),
        "two frames; the first is rendered",
        size=WIDE,
    ),
    Case(
        "webp-12500x8000.webp",
        lambda: bytes(_picture(WIDE).webpsave_buffer(Q=75, effort=0)),
        "still: shrinks on load",
        size=WIDE,
    ),
    Case("heic-444-10000x10000.heic", _heif_444("hevc", 8), "8-bit HEVC 4:4:4", route="alone"),
    Case("heic-422-10000x10000.heic", _heif_444("hevc-422", 8), "8-bit HEVC 4:2:2", route="alone"),
    Case("avif-444-10000x10000.avif", _heif_444("av1", 8), "8-bit AV1 4:4:4", route="alone"),
    Case(
        "avif-444-10bit-10000x10000.avif",
        _heif_444("av1", 10),
        "10-bit AV1 4:4:4: 1.8 GB decoded, more than 1769 MB hold",
        route="refused",
    ),
    Case(
        "heic-444-10bit-10000x10000.heic",
        _heif_444("hevc", 10),
        "10-bit HEVC 4:4:4: as the AV1 one",
        route="refused",
    ),
    Case(
        "tiff-one-strip-ycbcr-10000x10000.tif",
        lambda: _one_strip_ycbcr_tiff(SQUARE),
        "JPEG-coded YCbCr in one strip: read whole",
    ),
    Case(
        "webp-lossless-12500x8000.webp",
        lambda: bytes(_picture(WIDE).webpsave_buffer(lossless=True, effort=0)),
        "lossless: decoded whole before its shrink",
        size=WIDE,
    ),
    Case(
        "webp-alpha-12500x8000.webp",
        lambda: bytes(_with_alpha(_picture(WIDE)).webpsave_buffer(Q=75, effort=0)),
        "lossy with alpha: its alpha plane whole",
        size=WIDE,
    ),
    Case(
        "webp-alpha-2048x2048-avif.webp",
        lambda: bytes(_with_alpha(_picture((2048, 2048))).webpsave_buffer(Q=75)),
        "the browse's own size with alpha, its ladder in AVIF too: the most a render's work holds",
        size=(2048, 2048),
        formats=("webp", "avif"),
    ),
    Case(
        "png-16bit-alpha-2048x2048-avif.png",
        lambda: bytes(
            (_with_alpha(_picture((2048, 2048))).cast("ushort") * 257)
            .cast("ushort")
            .copy(interpretation="rgb16")
            .pngsave_buffer(compression=1)
        ),
        "16-bit RGBA at the browse's size, AVIF too",
        size=(2048, 2048),
        formats=("webp", "avif"),
    ),
]


def render_as_the_function(
    path: str | Path, budget: slots.DecodeBudget = slots.DEFAULT, *, formats: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """render() of the file (read as a stream) as the process function runs it: in a shared slot of
    `budget`, or, where its header says more than a slot holds, read again and rendered alone
    (PhotoService's gate); its ladder in `formats` (VARIANT_FORMATS) where given. The route it ended
    on (shared, alone: the share of the memory it had), and its size or its refusal's code (from its
    header, or from its decoder)."""
    defaults = RenderOptions() if formats is None else replace(RenderOptions(), variant_formats=formats)
    budget = budget.encoding(defaults.variant_formats)  # AVIF's encoder holds more (slots.AVIF_WORK)
    options, route = defaults.sharing(budget), "shared"
    while True:
        with open(path, "rb") as stream:  # noqa: PTH123
            try:
                rendered = render(stream, options)
            except RenderAlone:
                options, route = options.alone(), "alone"
                continue
            except PhotoError as error:
                return {"route": route, "code": str(error.code), "detail": error.detail}
        return {
            "route": route,
            "code": None,
            "size": [rendered.width, rendered.height],
            "loader": rendered.loader,
        }


def decode_estimate(original: Readable, options: RenderOptions | None = None) -> int | None:
    """What a render with `options` (the function's, by default) counts against its budget for the
    file (its header's figure), or None where it is refused first: told that a slot holds nothing,
    render() stops right after the header with it."""
    nothing = replace(options or RenderOptions().sharing(slots.DEFAULT), shared_decode_buffer_bytes=-1)
    try:
        render(original, nothing)
    except RenderAlone as alone:
        return alone.needs
    except PhotoError:
        return None
    raise AssertionError("render() went past a slot of -1 bytes")


def made(folder: Path = FOLDER) -> bool:
    return all((folder / case.name).exists() for case in CASES)


@contextmanager
def _one_maker(folder: Path) -> Iterator[None]:
    """One maker at a time (test workers, a run's maker in the background): another waits for it,
    then finds its files made."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with (folder.parent / f"{folder.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def write(folder: Path = FOLDER) -> list[Path]:
    """Each case's file in `folder` (made if missing), in the order of CASES."""
    with _one_maker(folder):
        return hostile.write(folder, CASES)


if __name__ == "__main__":
    with _one_maker(Path(sys.argv[1]) if len(sys.argv) == 2 else FOLDER):
        hostile.main(sys.argv[1:], CASES, "devkit.fullsize")
