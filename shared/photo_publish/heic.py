"""HEVC-coded HEIF (phone photos), decoded by libheif through pi-heif.

The prebuilt libvips reads a HEIC's header but has no HEVC decoder. pi-heif (libheif and libde265,
LGPL, decode only) decodes the primary image into one interleaved buffer, which libvips wraps without
a copy; from there the photo goes through the same pipeline as any other.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pyvips

from photo_publish.errors import ErrorCode, PhotoError

# libvips' heifload header field, and the value that routes a HEIF here (AVIF says "av1").
COMPRESSION_FIELD = "heif-compression"
COMPRESSION = "hevc"
# What `Rendered.loader` says for a photo decoded here.
DECODER = "pi_heif"

# pi-heif's documented exceptions, by type: invalid input (ValueError), corrupted data (EOFError),
# an unsupported feature (SyntaxError), any other libheif error (RuntimeError), and libheif's
# refusals to allocate, its security limits among them (OSError). Each is the file's fault.
_DECODE_ERRORS = (ValueError, EOFError, SyntaxError, RuntimeError, OSError)


@dataclass(frozen=True, slots=True)
class Declared:
    """What a HEIF's primary image declares, read by pi-heif without decoding it."""

    width: int
    height: int
    bands: int
    sample_bytes: int  # 2 for 10 and 12-bit pictures


def header(data: bytes | bytearray) -> Declared:
    """The primary image's size and samples, as pi-heif's libheif reads them (no pixel decoded).

    libvips' own libheif refuses HEIFs of more than 256 items (grid tiles, auxiliary images,
    metadata); pi-heif's allows libheif's default of 1000, so it reads the files libvips refuses.
    """
    import pi_heif

    try:
        heif = pi_heif.open_heif(data, convert_hdr_to_8bit=False)
        width, height = heif.size
        mode = str(heif.mode)
    except _DECODE_ERRORS as error:
        raise PhotoError(ErrorCode.DECODE_FAILED, repr(error)) from None
    channels, _, depth = mode.partition(";")
    return Declared(width, height, len(channels), 2 if depth else 1)


@contextmanager
def decoded(data: bytes | bytearray, *, eight_bit: bool = False) -> Iterator[pyvips.Image]:
    """The primary image of an HEVC-coded HEIF, upright, at full size, with its ICC profile.

    The image is valid inside the `with` block only: libvips reads libheif's own buffer, without a
    copy, and pi-heif hands it out as a memoryview that does not keep it alive (measured: once the
    decoded file was collected, libvips read freed memory, pictures came out shifted). Make what
    you need from it (`copy_memory()`) before the block ends.

    Only the primary is decoded: the other images of a burst or a stereo pair, thumbnails, depth
    maps and gain maps are never touched. A grid (iPhones code 512 x 512 tiles) comes out whole.
    10 and 12-bit pictures come out as 16 bits, so that libvips rounds them to 8 bits after the
    colour conversion (libheif's own reduction to 8 bits truncates: measured 0.6 darker on average),
    unless `eight_bit` asks for libheif's reduction: half the memory, for pictures too large for 16.

    Memory: not streamed. About 4.5 bytes a pixel for 8-bit (the YCbCr planes, then the RGB), about
    9 for 10-bit, which is why the caller refuses oversized pictures from the header first.
    """
    # Imported on the first HEIC, not with the pipeline: it costs 25 ms (and Pillow's import) that
    # a cold start with a JPEG need not pay.
    import pi_heif

    try:
        heif = pi_heif.open_heif(data, convert_hdr_to_8bit=eight_bit)
        pixels = heif.data  # decodes the primary image, and only it
        width, height = heif.size
        mode = str(heif.mode)
        profile = heif.info.get("icc_profile")
    except _DECODE_ERRORS as error:
        raise PhotoError(ErrorCode.DECODE_FAILED, repr(error)) from None

    # Modes are "L", "LA", "RGB", "RGBA" (a lower-case "a": premultiplied alpha), ";16" when deeper
    # than 8 bits ("I;16" for grey).
    channels, _, depth = mode.partition(";")
    bands, wide = len(channels), bool(depth)
    if len(pixels) != width * height * bands * (2 if wide else 1):
        raise PhotoError(ErrorCode.DECODE_FAILED, f"{len(pixels)} bytes for {width}x{height} {mode}")
    image = pyvips.Image.new_from_memory(pixels, width, height, bands, "ushort" if wide else "uchar")
    colour = bands >= 3
    image = image.copy(
        interpretation=("rgb16" if colour else "grey16") if wide else ("srgb" if colour else "b-w")
    )
    if channels.endswith("a"):
        image = image.unpremultiply(max_alpha=65535 if wide else 255).cast(image.format)
    if profile:
        # The profile is what the colour conversion starts from (iPhones: Display P3).
        image.set_type(pyvips.GValue.blob_type, "icc-profile-data", bytes(profile))
    # Nothing else is carried over, EXIF least of all: libheif has already turned the picture
    # upright by the file's `irot`/`imir`, and the EXIF Orientation Apple also writes describes that
    # same turn. With no orientation on the image, libvips cannot apply it a second time.
    yield image  # `heif`, which owns the pixels, lives on until the block ends
