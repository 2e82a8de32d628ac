"""Real photographs, and the odd cases made from them (for the tests and the demo).

Every odd case starts from one of the project's real photographs (tests/images, see its LICENSE),
so that a test sees camera-like pixels, not synthetic gradients.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import pyvips

IMAGES = Path(__file__).resolve().parent.parent / "tests" / "images"

Transform = Callable[[pyvips.Image], pyvips.Image]
_DIHEDRAL: dict[str, Transform] = {
    "identity": lambda im: im,
    "fliphor": lambda im: im.fliphor(),
    "rot180": lambda im: im.rot180(),
    "flipver": lambda im: im.flipver(),
    "rot90": lambda im: im.rot90(),
    "rot270": lambda im: im.rot270(),
    "transpose": lambda im: im.rot90().fliphor(),
    "transverse": lambda im: im.rot270().fliphor(),
}


def photographs() -> list[Path]:
    return sorted(IMAGES.glob("*.jpg"))


def photograph(name: str = "LadyBird.jpg") -> pyvips.Image:
    return pyvips.Image.new_from_file(str(IMAGES / name)).copy_memory()


def _storing_transform(orientation: int) -> Transform:
    """The transform a camera applies to store an upright picture under this EXIF orientation.

    Found, not written down: the one whose result libvips' autorot turns upright again, so the
    fixture cannot disagree with the EXIF definition libvips implements.
    """
    probe = (pyvips.Image.xyz(3, 2)[0] * 10 + pyvips.Image.xyz(3, 2)[1]).cast("uchar")
    for transform in _DIHEDRAL.values():
        stored = transform(probe).copy()
        stored.set_type(pyvips.GValue.gint_type, "orientation", orientation)
        upright = stored.autorot()
        if upright.width == probe.width and (upright - probe).abs().max() == 0:
            return transform
    raise AssertionError(f"no transform for orientation {orientation}")


def oriented_jpeg(upright: pyvips.Image, orientation: int) -> bytes:
    """A JPEG whose pixels are stored turned, with the EXIF orientation that turns them back."""
    stored = _storing_transform(orientation)(upright).copy()
    stored.set_type(pyvips.GValue.gint_type, "orientation", orientation)
    return bytes(stored.jpegsave_buffer(Q=92))


def profiled_jpeg(upright: pyvips.Image, profile: str = "p3") -> bytes:
    """Pixels converted into another colour space, its ICC profile embedded (as cameras do)."""
    return bytes(upright.icc_transform(profile, input_profile="srgb").jpegsave_buffer(Q=95))


def cmyk_jpeg(upright: pyvips.Image) -> bytes:
    return bytes(upright.icc_transform("cmyk", input_profile="srgb").jpegsave_buffer(Q=95))


def alpha_png(upright: pyvips.Image) -> bytes:
    """A PNG with a real alpha channel: opaque on the left half, transparent on the right."""
    alpha = (pyvips.Image.xyz(upright.width, upright.height)[0] < upright.width // 2).ifthenelse(255, 0)
    return bytes(upright.bandjoin(alpha.cast("uchar")).pngsave_buffer())


def sixteen_bit_png(upright: pyvips.Image) -> bytes:
    return bytes((upright.cast("ushort") * 257).cast("ushort").copy(interpretation="rgb16").pngsave_buffer())


def animated_gif(upright: pyvips.Image, frames: int = 3) -> bytes:
    """Frame 0 is the photograph; later frames are its negative, so a wrong frame shows."""
    small = upright.thumbnail_image(320)
    pages = [small] + [small.invert()] * (frames - 1)
    strip = pyvips.Image.arrayjoin(pages, across=1).copy()
    strip.set_type(pyvips.GValue.gint_type, "page-height", small.height)
    strip.set_type(pyvips.GValue.array_int_type, "delay", [100] * frames)
    return bytes(strip.gifsave_buffer())


def truncated(data: bytes, keep: float = 0.5) -> bytes:
    return data[: int(len(data) * keep)]


def pixel_bomb_png(width: int = 100_000, height: int = 100_000) -> bytes:
    """A PNG whose header declares a huge picture, and whose body is a few bytes of it."""

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return (
            struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = zlib.compress(b"\0" + b"\0" * 3 * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


def heic(
    upright: pyvips.Image,
    orientation: int = 1,
    *,
    profile: str | None = None,
    bits: int = 8,
    tile_size: int = 512,
    companions: int = 0,
    quality: int = 90,
    exif: bytes | None = None,
    chroma: int = 420,
) -> bytes:
    """An HEVC-coded HEIF as a phone writes one, made with pillow-heif (a test-only dependency).

    - `orientation`: the pixels stored turned, with the `irot`/`imir` that turn them back AND the
      same EXIF Orientation, as Apple writes both (a reader that applies both turns it twice);
    - `profile`: the pixels converted into that colour space ("p3": Display P3, as iPhones shoot),
      its ICC profile embedded;
    - `bits`: 8, or 10 or 12 (HDR captures, many Android phones);
    - `tile_size`: coded as a grid of tiles that size (iPhones: 512), or 0 for one coded picture;
    - `chroma`: its chroma subsampling (phones: 420; 422 and 444 as editors export);
    - `companions`: that many more images in the file (burst frames, a spatial photo's other eye):
      the photograph's negative at half size, so that a wrong pick shows; the first is stored
      before the photograph, which stays the primary image.
    It always carries EXIF, so there is metadata to strip: `exif` (a block, "Exif\\0\\0" first:
    devkit/exif.py), or the camera's make and model and the orientation.
    """
    # pillow-heif's wheel bundles x265 (GPL): it makes fixtures here and never ships in a Lambda.
    import pillow_heif
    from PIL import Image

    def deep(image: pyvips.Image) -> pyvips.Image:
        return (image.cast("ushort") * 257).cast("ushort") if bits > 8 else image

    if profile is not None:
        picture = upright.icc_transform(profile, input_profile="srgb", depth=16 if bits > 8 else 8)
    else:
        picture = deep(upright)
    negative = deep(upright.invert().thumbnail_image(upright.width // 2))
    images = [_storing_transform(orientation)(picture)] + [negative] * companions
    if companions:
        images[0], images[1] = images[1], images[0]

    file = pillow_heif.HeifFile()
    mode = "RGB;16" if bits > 8 else "RGB"  # pillow-heif codes 16-bit pixels at `bit_depth` bits
    for image in images:
        file.add_frombytes(mode, (image.width, image.height), image.write_to_memory())
    if exif is None:
        tags = Image.Exif()
        tags[0x010F], tags[0x0110], tags[0x0112] = "Apple", "iPhone 15 Pro", orientation
        exif = tags.tobytes()
    out = io.BytesIO()
    file.save(
        out,
        primary_index=1 if companions else 0,
        quality=quality,
        exif=exif,
        icc_profile=picture.get("icc-profile-data") if profile is not None else None,
        tile_size=tile_size,
        chroma=chroma,
        enc_params={"preset": "ultrafast"},  # 1 s for 4 MP, against 6 s at x265's default preset
        **({"bit_depth": bits} if bits > 8 else {}),
    )
    return out.getvalue()


def heic_without_pixels(data: bytes) -> bytes:
    """The HEIC with the payload of its `mdat` box (the coded pixels) zeroed: the header is intact."""
    offset = 0
    while offset + 8 <= len(data):
        size, kind = int.from_bytes(data[offset : offset + 4], "big"), data[offset + 4 : offset + 8]
        if kind == b"mdat":
            return data[: offset + 8] + bytes(size - 8) + data[offset + size :]
        offset += size
    raise AssertionError("no mdat box")
