"""The fuzzer's seed corpus: small files of every shape the pipeline must survive.

A coverage-guided fuzzer wants many fast executions, so every seed is small (a few KB): the
project's photographs shrunk to about 96 pixels, the real-world oddities made from them (truncated,
CMYK, 16-bit, Display P3, rotated, alpha, animated, multi-page, HEIC, AVIF), and small versions of
the hostile corpus (devkit/hostile.py): the same structures and lies (a header declaring 65500 x
65500, a canvas of 65535 x 65535 around one pixel, frames by the hundred, tiles, grids, deep and float
samples), built by the same writers at sizes that decode in milliseconds.

    python -m devkit.fuzzseeds <folder>    write every seed (and remove stale ones)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pyvips

from devkit import hostile, samples


@cache
def _small(name: str = "LadyBird.jpg", size: int = 96) -> pyvips.Image:
    return samples.photograph(name).thumbnail_image(size).copy_memory()


@cache
def _tile(kind: str) -> hostile.CodedPicture:
    """One real coded picture of 64 x 64: HEVC (8 or 10-bit) or AV1."""
    crop = samples.photograph().thumbnail_image(256).crop(64, 64, 64, 64).copy_memory()
    if kind == "av1":
        return hostile.coded_picture(bytes(crop.heifsave_buffer(compression="av1", Q=30, effort=0)))
    return hostile.coded_picture(
        samples.heic(crop, tile_size=0, bits=10 if kind == "hevc-10" else 8, quality=30)
    )


def _grid(kind: str, columns: int, rows: int, size: tuple[int, int], **extra: object) -> bytes:
    brand = b"avif" if kind == "av1" else b"heic"
    return hostile.heif(hostile.Grid(_tile(kind), columns, rows, size), brand=brand, **extra)  # type: ignore[arg-type]


def _jpeg(image: pyvips.Image, **options: object) -> bytes:
    return bytes(image.jpegsave_buffer(Q=75, keep="none", **options))


def _photographs() -> dict[str, Callable[[], bytes]]:
    return {
        f"photo-{path.stem.lower()}.jpg": (lambda name=path.name: _jpeg(_small(name)))
        for path in samples.photographs()
    }


def _oddities() -> dict[str, Callable[[], bytes]]:
    """Real-world oddities, each from the small photograph."""
    small = _small()
    grey = small.colourspace("b-w")
    # PNG and TIFF do not compress a photograph well: their seeds are smaller still.
    tiny = small.crop(0, 0, 48, 30)

    def frames(count: int) -> pyvips.Image:
        strip = pyvips.Image.arrayjoin([small.crop(0, 0, 32, 32)] * count, across=1).copy()
        strip.set_type(pyvips.GValue.gint_type, "page-height", 32)
        return strip

    def tiff_pages(count: int) -> bytes:
        return bytes(frames(count).tiffsave_buffer(compression="deflate"))

    def animated(count: int) -> pyvips.Image:
        strip = frames(count)
        strip.set_type(pyvips.GValue.array_int_type, "delay", [100] * count)
        return strip

    return {
        "jpeg-orientation-6.jpg": lambda: samples.oriented_jpeg(small, 6),
        "jpeg-orientation-5.jpg": lambda: samples.oriented_jpeg(small, 5),
        "jpeg-p3.jpg": lambda: samples.profiled_jpeg(small),
        # libvips' CMYK profile is 950 KB: the seed goes without it (and one small one with it, below).
        "jpeg-cmyk.jpg": lambda: _jpeg(small.icc_transform("cmyk", input_profile="srgb")),
        "jpeg-grey.jpg": lambda: _jpeg(grey),
        "jpeg-progressive.jpg": lambda: _jpeg(small, interlace=True),
        "jpeg-444.jpg": lambda: _jpeg(small, subsample_mode="off"),
        "jpeg-truncated.jpg": lambda: samples.truncated(_jpeg(small)),
        "jpeg-progressive-truncated.jpg": lambda: samples.truncated(_jpeg(small, interlace=True), 0.6),
        "png-alpha.png": lambda: samples.alpha_png(tiny),
        "png-16bit.png": lambda: samples.sixteen_bit_png(tiny),
        "png-grey-alpha.png": lambda: bytes(tiny.colourspace("b-w").bandjoin_const(128).pngsave_buffer()),
        "png-palette.png": lambda: bytes(tiny.pngsave_buffer(palette=True, colours=16)),
        "png-interlaced.png": lambda: bytes(tiny.pngsave_buffer(interlace=True)),
        "png-p3.png": lambda: bytes(tiny.icc_transform("p3", input_profile="srgb").pngsave_buffer()),
        "png-truncated.png": lambda: samples.truncated(bytes(tiny.pngsave_buffer())),
        "gif-animated.gif": lambda: bytes(animated(3).gifsave_buffer()),
        "gif-truncated.gif": lambda: samples.truncated(bytes(animated(3).gifsave_buffer()), 0.7),
        "webp-lossy.webp": lambda: bytes(small.webpsave_buffer(Q=50)),
        "webp-lossless-alpha.webp": lambda: bytes(
            small.crop(0, 0, 48, 48).bandjoin_const(200).webpsave_buffer(lossless=True)
        ),
        "webp-animated.webp": lambda: bytes(animated(3).webpsave_buffer(Q=50)),
        "tiff-pages.tif": lambda: tiff_pages(3),
        "tiff-16bit.tif": lambda: bytes(
            (tiny.cast("ushort") * 257).copy(interpretation="rgb16").tiffsave_buffer(compression="deflate")
        ),
        "tiff-float.tif": lambda: bytes(
            (tiny.cast("float") / 255).copy(interpretation="scrgb").tiffsave_buffer(compression="deflate")
        ),
        "tiff-cmyk.tif": lambda: bytes(
            tiny.icc_transform("cmyk", input_profile="srgb").tiffsave_buffer(
                keep="none", compression="deflate"
            )
        ),
        "tiff-tiled-jpeg.tif": lambda: bytes(
            tiny.tiffsave_buffer(tile=True, tile_width=32, tile_height=32, compression="jpeg")
        ),
        "heic.heic": lambda: samples.heic(small, tile_size=0, quality=30),
        "heic-orientation-6-p3.heic": lambda: samples.heic(small, 6, profile="p3", tile_size=0, quality=30),
        "heic-10bit.heic": lambda: samples.heic(small, tile_size=0, bits=10, quality=30),
        "heic-grid.heic": lambda: samples.heic(small.crop(0, 0, 96, 60), tile_size=32, quality=30),
        "heic-companion.heic": lambda: samples.heic(
            small.crop(0, 0, 64, 48), tile_size=0, companions=1, quality=30
        ),
        "heic-truncated.heic": lambda: samples.truncated(samples.heic(small, tile_size=0, quality=30), 0.8),
        "avif.avif": lambda: bytes(small.heifsave_buffer(compression="av1", Q=30, effort=0)),
        "avif-alpha.avif": lambda: bytes(
            small.crop(0, 0, 48, 48).bandjoin_const(128).heifsave_buffer(compression="av1", Q=30, effort=0)
        ),
    }


def _hostile() -> dict[str, Callable[[], bytes]]:
    """The hostile corpus' structures at small sizes (and its tiny bombs as they are)."""
    one_pixel = bytes(pyvips.Image.black(1, 1, bands=3).webpsave_buffer(lossless=True))
    black = pyvips.Image.black(64, 64, bands=3)
    progressive = _jpeg(black, interlace=True, subsample_mode="off")
    return {
        "hostile-png-4000x2.png": lambda: hostile.png(4000, 2),
        "hostile-png-2x4000.png": lambda: hostile.png(2, 4000),
        "hostile-png-300x3-16bit-alpha.png": lambda: hostile.png(300, 3, bits=16, bands=4),
        "hostile-png-64x64-interlaced-16bit-alpha.png": lambda: hostile.png(
            64, 64, bits=16, bands=4, interlaced=True
        ),
        "hostile-png-100000x100000.png": samples.pixel_bomb_png,
        "hostile-tiff-3000x2.tif": lambda: hostile.tiff(3000, 2),
        "hostile-tiff-64x64-float-alpha.tif": lambda: hostile.tiff(
            64, 64, bits=32, bands=4, sample_format="float"
        ),
        "hostile-tiff-128x128-tiles-64.tif": lambda: hostile.tiff(128, 128, tile=(64, 64)),
        "hostile-tiff-16x16-50-pages.tif": lambda: hostile.tiff(16, 16, pages=50),
        "hostile-tiff-64x64-strips-8.tif": lambda: hostile.tiff(64, 64, rows_per_strip=8, bits=16, bands=2),
        "hostile-jpeg-declaring-65500x65500.jpg": lambda: hostile.with_jpeg_size(
            _jpeg(black), (65500, 65500)
        ),
        "hostile-jpeg-progressive-declaring-6325x6325.jpg": lambda: hostile.with_jpeg_size(
            progressive, (6325, 6325)
        ),
        "hostile-jpeg-progressive-50-scans.jpg": lambda: hostile.repeated_scans(progressive, 50),
        "hostile-gif-canvas-65535x65535.gif": lambda: hostile.gif((65535, 65535)),
        "hostile-gif-frame-10000x10000-empty.gif": lambda: hostile.gif(
            (10_000, 10_000), (10_000, 10_000), coded=False
        ),
        "hostile-gif-100-frames.gif": lambda: hostile.gif((8, 8), (8, 8), frames=100),
        "hostile-gif-500-comments.gif": lambda: hostile.gif((8, 8), (8, 8), comments=500),
        "hostile-webp-animated-canvas-16383x16383.webp": lambda: hostile.animated_webp(
            (16383, 16383), one_pixel
        ),
        "hostile-webp-100-frames.webp": lambda: hostile.animated_webp((8, 8), one_pixel, frames=100),
        "hostile-heic-grid-2x2.heic": lambda: _grid("hevc-8", 2, 2, (120, 100)),
        "hostile-heic-grid-declaring-7304x7304.heic": lambda: _grid("hevc-8", 2, 2, (7304, 7304)),
        "hostile-heic-grid-10bit.heic": lambda: _grid("hevc-10", 2, 1, (128, 64)),
        "hostile-heic-phone-layout.heic": lambda: hostile.heif(
            hostile.Grid(_tile("hevc-8"), 2, 2, (128, 128)),
            auxiliary=(hostile.Grid(_tile("hevc-8"), 1, 1, (64, 64)),),
            thumbnail=_tile("hevc-8"),
            metadata_items=2,
        ),
        "hostile-avif-grid-2x2.avif": lambda: _grid("av1", 2, 2, (128, 128)),
    }


SEEDS: dict[str, Callable[[], bytes]] = {**_photographs(), **_oddities(), **_hostile()}


def write(folder: Path) -> list[Path]:
    """Every seed in `folder`, and nothing else there."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in set(folder.iterdir()) - {folder / name for name in SEEDS}:
        stale.unlink()
    paths = []
    for name, make in SEEDS.items():
        path = folder / name
        if not path.exists():
            path.write_bytes(make())
        paths.append(path)
    return paths


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("python -m devkit.fuzzseeds <folder>")
    paths = write(Path(argv[0]))
    total = sum(path.stat().st_size for path in paths)
    print(f"{len(paths)} seeds, {total} bytes, the largest {max(p.stat().st_size for p in paths)} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
