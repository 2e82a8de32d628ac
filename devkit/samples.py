"""Real photographs, and the odd cases made from them (for the tests and the demo).

Every odd case starts from one of the project's real photographs (tests/images, see its LICENSE),
so that a test sees camera-like pixels, not synthetic gradients.
"""

from __future__ import annotations

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
