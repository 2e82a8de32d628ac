"""ThumbHash placeholders (evanw/thumbhash) and the average colour, from the decoded browse image.

The encoder's bytes are those of the reference, the npm package `thumbhash`, for the same RGBA
input, and the decoder's pixels are those of its `thumbHashToRGBA`: the same float64 operations
in the same order. Three things make that hold, and each is tested against the reference:
- every sum over pixels is sequential, as the reference's loops add (`np.add.accumulate`, never
  numpy's pairwise `sum` or a BLAS product, which round differently);
- cosines are fdlibm's, as V8 computes `Math.cos`, not the C library's (glibc differs from V8 in the
  last bit for about 3% of the arguments used here). On a flat picture every varying factor is
  rounding noise that the hash stores normalised, so one bit decides whole nibbles;
- `Math.round` rounds halves up (Python's `round` rounds them to even).

numpy (about 40 ms to import) is imported on the first photo a container encodes, not at start.
"""

from __future__ import annotations

import base64
import math
import struct
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

import pyvips

from photo_publish.contracts import Placeholder

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Floats = npt.NDArray[np.float64]

MAX_SIZE = 100  # the reference refuses larger input: slower, and no better


@dataclass(frozen=True, slots=True)
class RGBAImage:
    """Pixels row by row, 4 bytes each, RGB not premultiplied by A."""

    width: int
    height: int
    rgba: bytes


def placeholder(image: pyvips.Image) -> Placeholder:
    """The ThumbHash and average colour of a decoded sRGB uchar image (1-4 bands, any size)."""
    small = rgba_for_thumbhash(image)
    return Placeholder(
        thumbhash=base64.b64encode(rgba_to_thumbhash(small.width, small.height, small.rgba)).decode("ascii"),
        average_color=average_color(small.width, small.height, small.rgba),
    )


def rgba_for_thumbhash(image: pyvips.Image) -> RGBAImage:
    """The image made to fit 100 x 100 (never enlarged), grey made RGB, opaque alpha added if none."""
    small = image.thumbnail_image(MAX_SIZE, height=MAX_SIZE, size="down")
    if small.bands < 3:
        small = small.colourspace("srgb")
    if not small.hasalpha():
        small = small.bandjoin_const(255)
    if small.bands != 4 or small.format != "uchar":
        raise ValueError(f"expected sRGB uchar with 1-4 bands, got {image.bands} bands of {image.format}")
    return RGBAImage(small.width, small.height, bytes(small.write_to_memory()))


# --- the encoder --------------------------------------------------------------------------------


def rgba_to_thumbhash(width: int, height: int, rgba: bytes) -> bytes:
    """The reference's rgbaToThumbHash: the hash of a picture of at most 100 x 100 pixels."""
    import numpy as np

    _, has_alpha, (lum, p, q, a) = _lpqa(width, height, rgba)
    l_limit = 5 if has_alpha else 7  # fewer luminance factors when alpha needs room
    lx = max(1, js_round(l_limit * width / max(width, height)))
    ly = max(1, js_round(l_limit * height / max(width, height)))
    l_dc, l_ac, l_scale = _encode_channel(lum, width, height, max(3, lx), max(3, ly))
    p_dc, p_ac, p_scale = _encode_channel(p, width, height, 3, 3)
    q_dc, q_ac, q_scale = _encode_channel(q, width, height, 3, 3)

    landscape = width > height
    header24 = (
        js_round(63 * l_dc)
        | js_round(31.5 + 31.5 * p_dc) << 6
        | js_round(31.5 + 31.5 * q_dc) << 12
        | js_round(31 * l_scale) << 18
        | has_alpha << 23
    )
    header16 = (
        (ly if landscape else lx)
        | js_round(63 * p_scale) << 3
        | js_round(63 * q_scale) << 9
        | landscape << 15
    )
    head = [header24 & 255, header24 >> 8 & 255, header24 >> 16, header16 & 255, header16 >> 8]
    factors = [l_ac, p_ac, q_ac]
    if has_alpha:
        a_dc, a_ac, a_scale = _encode_channel(a, width, height, 5, 5)
        head.append(js_round(15 * a_dc) | js_round(15 * a_scale) << 4)
        factors.append(a_ac)

    # Two 4-bit factors a byte, the first in the low nibble.
    nibbles = _js_round_array(15 * np.concatenate(factors)).astype(np.uint8)
    if len(nibbles) % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    packed = nibbles[0::2] | nibbles[1::2] << 4
    return bytes(v & 255 for v in head) + packed.tobytes()


def average_color(width: int, height: int, rgba: bytes) -> str:
    """The mean of the visible picture's sRGB values, weighted by alpha, as `#rrggbb` (black if none is).

    The same mean the hash's own average approximates (to 6 bits a component), rounded to 8 bits.
    """
    (r, g, b), _, _ = _lpqa(width, height, rgba)
    return "#" + "".join(f"{min(255, max(0, js_round(255 * v))):02x}" for v in (r, g, b))


def _lpqa(
    width: int, height: int, rgba: bytes
) -> tuple[tuple[float, float, float], bool, tuple[Floats, Floats, Floats, Floats]]:
    """The alpha-weighted average colour, whether any pixel is not opaque, and L, P, Q, A per pixel.

    L, P, Q are luminance, yellow-blue and red-green of the picture composited over its average
    colour; A is alpha, 0 to 1.
    """
    import numpy as np

    if not (1 <= width <= MAX_SIZE and 1 <= height <= MAX_SIZE):
        raise ValueError(f"{width}x{height} does not fit in {MAX_SIZE}x{MAX_SIZE}")
    if len(rgba) != width * height * 4:
        raise ValueError(f"{len(rgba)} bytes are not {width}x{height} RGBA pixels")
    pixels = np.frombuffer(rgba, dtype=np.uint8).reshape(-1, 4).T.astype(np.float64)
    alpha = pixels[3] / 255
    weight = alpha / 255
    total_alpha = _sequential_sum(alpha)
    sums = [_sequential_sum(weight * pixels[band]) for band in range(3)]
    avg_r, avg_g, avg_b = (s / total_alpha for s in sums) if total_alpha else sums
    r = avg_r * (1 - alpha) + weight * pixels[0]
    g = avg_g * (1 - alpha) + weight * pixels[1]
    b = avg_b * (1 - alpha) + weight * pixels[2]
    lpqa = ((r + g + b) / 3, (r + g) / 2 - b, r - g, alpha)
    return (avg_r, avg_g, avg_b), bool(total_alpha < width * height), lpqa


def _encode_channel(
    channel: Floats, width: int, height: int, nx: int, ny: int
) -> tuple[float, Floats, float]:
    """The DCT factor at (0, 0), the others normalised to 0-1, and their scale (largest magnitude)."""
    import numpy as np

    cx, cy = _triangle(nx, ny)
    # terms[k, y, x] = (channel * fx) * fy, in the reference's order of multiplication
    terms = channel.reshape(1, height, width) * _encoder_cosines(width)[cx][:, None, :]
    terms *= _encoder_cosines(height)[cy][:, :, None]
    factors = np.add.accumulate(terms.reshape(len(cx), -1), axis=1)[:, -1] / (width * height)
    dc, ac = float(factors[0]), factors[1:]
    scale = float(np.abs(ac).max())
    if scale:
        ac = 0.5 + 0.5 / scale * ac
    return dc, ac, scale


@cache
def _triangle(nx: int, ny: int) -> tuple[list[int], list[int]]:
    """The (cx, cy) of the factors a channel keeps, in the order the hash stores them."""
    pairs = [(cx, cy) for cy in range(ny) for cx in range(nx) if cx * ny < nx * (ny - cy)]
    return [cx for cx, _ in pairs], [cy for _, cy in pairs]


@cache
def _encoder_cosines(size: int) -> Floats:
    """cos(PI / size * c * (i + 0.5)) for c < 7, i < size, as the encoder multiplies it."""
    import numpy as np

    return np.array([[js_cos(math.pi / size * c * (i + 0.5)) for i in range(size)] for c in range(7)])


def _sequential_sum(values: Floats) -> float:
    import numpy as np

    return float(np.add.accumulate(values)[-1])


# --- the decoder --------------------------------------------------------------------------------


def thumbhash_to_rgba(thumbhash: bytes) -> RGBAImage:
    """The reference's thumbHashToRGBA: the placeholder picture, at most 32 x 32 pixels."""
    import numpy as np

    h = thumbhash + bytes(max(0, 6 - len(thumbhash)))  # the reference reads missing bytes as 0
    header24 = h[0] | h[1] << 8 | h[2] << 16
    header16 = h[3] | h[4] << 8
    l_dc = (header24 & 63) / 63
    p_dc = (header24 >> 6 & 63) / 31.5 - 1
    q_dc = (header24 >> 12 & 63) / 31.5 - 1
    l_scale = (header24 >> 18 & 31) / 31
    has_alpha = bool(header24 >> 23)
    p_scale = (header16 >> 3 & 63) / 63
    q_scale = (header16 >> 9 & 63) / 63
    landscape = bool(header16 >> 15)
    lx = max(3, (5 if has_alpha else 7) if landscape else header16 & 7)
    ly = max(3, header16 & 7 if landscape else 5 if has_alpha else 7)
    a_dc = (h[5] & 15) / 15 if has_alpha else 1.0
    a_scale = (h[5] >> 4) / 15

    nibbles = [n for byte in thumbhash[6 if has_alpha else 5 :] for n in (byte & 15, byte >> 4)]
    start = 0

    def factors(nx: int, ny: int, scale: float) -> list[tuple[int, int, float]]:
        nonlocal start
        cxs, cys = _triangle(nx, ny)
        found = [
            (cx, cy, (n / 7.5 - 1) * scale)
            for cx, cy, n in zip(cxs[1:], cys[1:], _padded(nibbles, start, len(cxs) - 1), strict=True)
        ]
        start += len(found)
        return found

    # Saturation boosted by 1.25 to make up for the quantisation, as the reference does.
    l_ac = factors(lx, ly, l_scale)
    p_ac = factors(3, 3, p_scale * 1.25)
    q_ac = factors(3, 3, q_scale * 1.25)
    a_ac = factors(5, 5, a_scale) if has_alpha else []

    ratio = thumbhash_to_approximate_aspect_ratio(thumbhash)
    width = js_round(32 if ratio > 1 else 32 * ratio)
    height = js_round(32 / ratio if ratio > 1 else 32)
    fx, fy = _decoder_cosines(width), _decoder_cosines(height)

    def channel(dc: float, ac: list[tuple[int, int, float]]) -> Floats:
        # Added one factor after another over all pixels at once: the reference's order per pixel.
        value = np.full((height, width), dc)
        for cx, cy, f in ac:
            value += (f * fx[cx])[None, :] * (fy[cy] * 2)[:, None]
        return value

    lum, a = channel(l_dc, l_ac), channel(a_dc, a_ac)
    p, q = np.full((height, width), p_dc), np.full((height, width), q_dc)
    for (cx, cy, pf), (_, _, qf) in zip(p_ac, q_ac, strict=True):
        f = fx[cx][None, :] * (fy[cy] * 2)[:, None]
        p += pf * f
        q += qf * f
    b = lum - 2 / 3 * p
    r = (3 * lum - b + q) / 2
    g = r - q
    # Uint8Array truncates what it stores.
    planes = [np.maximum(0, 255 * np.minimum(1, c)) for c in (r, g, b, a)]
    return RGBAImage(width, height, np.stack(planes, axis=-1).astype(np.uint8).tobytes())


def thumbhash_to_average_rgba(thumbhash: bytes) -> tuple[float, float, float, float]:
    """The reference's thumbHashToAverageRGBA: red, green, blue and alpha, each 0 to 1."""
    header = thumbhash[0] | thumbhash[1] << 8 | thumbhash[2] << 16
    lum = (header & 63) / 63
    p = (header >> 6 & 63) / 31.5 - 1
    q = (header >> 12 & 63) / 31.5 - 1
    a = (thumbhash[5] & 15) / 15 if header >> 23 else 1.0
    b = lum - 2 / 3 * p
    r = (3 * lum - b + q) / 2
    g = r - q
    return max(0.0, min(1.0, r)), max(0.0, min(1.0, g)), max(0.0, min(1.0, b)), a


def thumbhash_to_approximate_aspect_ratio(thumbhash: bytes) -> float:
    """The reference's thumbHashToApproximateAspectRatio: width / height of the original."""
    header = thumbhash[3]
    has_alpha = thumbhash[2] & 0x80
    landscape = thumbhash[4] & 0x80
    lx = (5 if has_alpha else 7) if landscape else header & 7
    ly = header & 7 if landscape else 5 if has_alpha else 7
    return lx / ly


def thumbhash_to_png(thumbhash: bytes) -> bytes:
    """The decoded placeholder as a PNG (the reference's thumbHashToDataURL, without the URL)."""
    image = thumbhash_to_rgba(thumbhash)
    pixels = pyvips.Image.new_from_memory(image.rgba, image.width, image.height, 4, "uchar")
    return bytes(pixels.copy(interpretation="srgb").pngsave_buffer())


def _padded(values: list[int], start: int, count: int) -> list[int]:
    return (values[start : start + count] + [0] * count)[:count]


@cache
def _decoder_cosines(size: int) -> Floats:
    """cos(PI / size * (i + 0.5) * c) for c < 7, i < size, as the decoder multiplies it."""
    import numpy as np

    return np.array([[js_cos(math.pi / size * (i + 0.5) * c) for i in range(size)] for c in range(7)])


# --- JavaScript's arithmetic --------------------------------------------------------------------


def js_round(x: float) -> int:
    """Math.round: the nearest integer, halves up (and 0.49999999999999994 down, unlike floor(x + 0.5))."""
    down = math.floor(x)
    return down + 1 if x - down >= 0.5 else down


def _js_round_array(x: Floats) -> Floats:
    import numpy as np

    down = np.floor(x)
    return down + (x - down >= 0.5)


# fdlibm's cos, the one V8 computes Math.cos with (src/base/ieee754.cc, Node.js 20), ported for
# 0 <= x < 2^19 * pi/2: ThumbHash's arguments stay below 7 * pi. Its notice, kept as it asks:
#   Copyright (C) 1993 by Sun Microsystems, Inc. All rights reserved.
#   Developed at SunSoft, a Sun Microsystems, Inc. business.
#   Permission to use, copy, modify, and distribute this software is freely granted,
#   provided that this notice is preserved.
_INVPIO2 = 6.36619772367581382433e-01
_PIO2 = (  # pi/2 in three parts of 33 bits, each with the tail after it
    (1.57079632673412561417e00, 6.07710050650619224932e-11),
    (6.07710050630396597660e-11, 2.02226624879595063154e-21),
    (2.02226624871116645580e-21, 8.47842766036889956997e-32),
)
# The high words of n * pi/2 for n = 1..32: an argument this close to one needs more of pi.
_NPIO2_HW = (
    0x3FF921FB, 0x400921FB, 0x4012D97C, 0x401921FB, 0x401F6A7A, 0x4022D97C, 0x4025FDBB, 0x402921FB,
    0x402C463A, 0x402F6A7A, 0x4031475C, 0x4032D97C, 0x40346B9C, 0x4035FDBB, 0x40378FDB, 0x403921FB,
    0x403AB41B, 0x403C463A, 0x403DD85A, 0x403F6A7A, 0x40407E4C, 0x4041475C, 0x4042106C, 0x4042D97C,
    0x4043A28C, 0x40446B9C, 0x404534AC, 0x4045FDBB, 0x4046C6CB, 0x40478FDB, 0x404858EB, 0x404921FB,
)  # fmt: skip
_COS = (
    4.16666666666666019037e-02, -1.38888888888741095749e-03, 2.48015872894767294178e-05,
    -2.75573143513906633035e-07, 2.08757232129817482790e-09, -1.13596475577881948265e-11,
)  # fmt: skip
_SIN = (
    -1.66666666666666324348e-01, 8.33333333332248946124e-03, -1.98412698298579493134e-04,
    2.75573137070700676789e-06, -2.50507602534068634195e-08, 1.58969099521155010221e-10,
)  # fmt: skip


def _high_word(x: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", x))[0] >> 32)


def _from_high_word(word: int) -> float:
    return float(struct.unpack("<d", struct.pack("<Q", word << 32))[0])


def js_cos(x: float) -> float:
    """Math.cos as V8 (fdlibm) computes it, to the last bit."""
    x = abs(x)  # cos is even, and so is fdlibm's
    word = _high_word(x)
    if word <= 0x3FE921FB:  # |x| <= pi/4: no reduction
        return _kernel_cos(x, 0.0)
    if word >= 0x7FF00000:
        return math.nan
    if word > 0x413921FB:
        raise ValueError(f"cos({x}): argument beyond what ThumbHash uses")
    n, y0, y1 = _rem_pio2(x, word)
    quadrant = n & 3
    if quadrant == 0:
        return _kernel_cos(y0, y1)
    if quadrant == 1:
        return -_kernel_sin(y0, y1)
    if quadrant == 2:
        return -_kernel_cos(y0, y1)
    return _kernel_sin(y0, y1)


def _rem_pio2(x: float, word: int) -> tuple[int, float, float]:
    """n and x - n * pi/2 as a head and a tail, for 0 < x < 2^19 * pi/2."""
    (pio2_1, pio2_1t), (pio2_2, pio2_2t), (pio2_3, pio2_3t) = _PIO2
    if word < 0x4002D97C:  # x < 3pi/4: n = 1
        z = x - pio2_1
        if word != 0x3FF921FB:
            y0 = z - pio2_1t
            return 1, y0, (z - y0) - pio2_1t
        z -= pio2_2  # near pi/2: more of pi
        y0 = z - pio2_2t
        return 1, y0, (z - y0) - pio2_2t
    n = int(x * _INVPIO2 + 0.5)
    fn = float(n)
    r = x - fn * pio2_1
    w = fn * pio2_1t
    y0 = r - w
    if not (n < 32 and word != _NPIO2_HW[n - 1]):
        exponent = word >> 20
        if exponent - (_high_word(y0) >> 20 & 0x7FF) > 16:  # cancellation: a second part of pi
            t = r
            w = fn * pio2_2
            r = t - w
            w = fn * pio2_2t - ((t - r) - w)
            y0 = r - w
            if exponent - (_high_word(y0) >> 20 & 0x7FF) > 49:  # and a third
                t = r
                w = fn * pio2_3
                r = t - w
                w = fn * pio2_3t - ((t - r) - w)
                y0 = r - w
    return n, y0, (r - y0) - w


def _kernel_cos(x: float, y: float) -> float:
    """cos(x + y) for |x| <= pi/4, y the tail of x."""
    word = _high_word(x) & 0x7FFFFFFF
    if word < 0x3E400000 and int(x) == 0:  # |x| < 2^-27
        return 1.0
    c1, c2, c3, c4, c5, c6 = _COS
    z = x * x
    r = z * (c1 + z * (c2 + z * (c3 + z * (c4 + z * (c5 + z * c6)))))
    if word < 0x3FD33333:  # |x| < 0.3
        return 1.0 - (0.5 * z - (z * r - x * y))
    qx = 0.28125 if word > 0x3FE90000 else _from_high_word(word - 0x00200000)
    return (1.0 - qx) - ((0.5 * z - qx) - (z * r - x * y))


def _kernel_sin(x: float, y: float) -> float:
    """sin(x + y) for |x| <= pi/4, y the tail of x."""
    if _high_word(x) & 0x7FFFFFFF < 0x3E400000 and int(x) == 0:
        return x
    s1, s2, s3, s4, s5, s6 = _SIN
    z = x * x
    v = z * x
    r = s2 + z * (s3 + z * (s4 + z * (s5 + z * s6)))
    return x - ((z * (0.5 * y - v * r) - y) - v * s1)
