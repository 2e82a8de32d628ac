"""ThumbHash against its reference, the npm package `thumbhash` on Node.js (tests/thumbhash_reference.py).

Encoder: the same bytes for the same RGBA pixels. Decoder: the same pixels, exactly (not within a
rounding): the same float64 operations in the same order, so nothing is left to tolerate.
"""

from __future__ import annotations

import base64
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import pyvips

from devkit import samples
from photo_publish.image.thumbhash import (
    Placeholder,
    RGBAImage,
    average_color,
    js_cos,
    js_round,
    placeholder,
    rgba_for_thumbhash,
    rgba_to_thumbhash,
    thumbhash_to_approximate_aspect_ratio,
    thumbhash_to_average_rgba,
    thumbhash_to_png,
    thumbhash_to_rgba,
)
from tests import thumbhash_reference as reference

Make = Callable[[], RGBAImage]


def browse(name: str) -> pyvips.Image:
    """A photo as the pipeline holds it after decoding: long edge 2048, sRGB uchar, in memory."""
    path = samples.IMAGES / name
    return pyvips.Image.thumbnail(str(path), 2048, height=2048, size="down").copy_memory()


def pixels(array: np.ndarray) -> RGBAImage:
    height, width, _ = array.shape
    return RGBAImage(width, height, np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def flat(width: int, height: int, rgba: tuple[int, int, int, int]) -> Make:
    return lambda: pixels(np.broadcast_to(np.array(rgba, dtype=np.uint8), (height, width, 4)))


def noise(width: int, height: int, *, alpha: str = "opaque", seed: int = 0) -> Make:
    def make() -> RGBAImage:
        rng = np.random.default_rng(seed * 1000 + width * 101 + height)
        array = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
        if alpha == "opaque":
            array[..., 3] = 255
        elif alpha == "binary":
            array[..., 3] = rng.integers(0, 2, (height, width)) * 255
        return pixels(array)

    return make


def gradient(width: int, height: int, axis: int) -> Make:
    def make() -> RGBAImage:
        ramp = np.linspace(0, 255, (width, height)[axis]).round().astype(np.uint8)
        plane = np.broadcast_to(ramp[None, :] if axis == 0 else ramp[:, None], (height, width))
        return pixels(np.stack([plane, 255 - plane, np.full_like(plane, 90), np.full_like(plane, 255)], -1))

    return make


def checkerboard(width: int, height: int, cell: int) -> Make:
    def make() -> RGBAImage:
        y, x = np.mgrid[0:height, 0:width]
        on = ((x // cell + y // cell) % 2).astype(np.uint8) * 255
        return pixels(np.stack([on, on, on, np.full_like(on, 255)], -1))

    return make


def one_transparent_pixel() -> RGBAImage:
    array = np.full((40, 60, 4), (200, 30, 30, 255), dtype=np.uint8)
    array[17, 23, 3] = 0
    return pixels(array)


def photo(name: str, change: Callable[[pyvips.Image], pyvips.Image] = lambda im: im) -> Make:
    return lambda: rgba_for_thumbhash(change(browse(name)))


def half_transparent(image: pyvips.Image) -> pyvips.Image:
    return pyvips.Image.new_from_buffer(samples.alpha_png(image), "")


def alpha_ramp(image: pyvips.Image) -> pyvips.Image:
    ramp = pyvips.Image.xyz(image.width, image.height)[0] * (255 / image.width)
    return image.bandjoin(ramp.cast("uchar"))


def grey(image: pyvips.Image) -> pyvips.Image:
    return image.colourspace("b-w")


CASES: dict[str, Make] = {
    **{f"photo {p.name}": photo(p.name) for p in samples.photographs()},
    "photo, right half transparent": photo("LadyBird.jpg", half_transparent),
    "photo, alpha ramp": photo("Garden.jpg", alpha_ramp),
    "photo, grey": photo("Storm.jpg", grey),
    "photo, grey with alpha": photo("Wood.jpg", lambda im: alpha_ramp(grey(im))),
    "photo, fully transparent": photo("Aqua.jpg", lambda im: im.bandjoin_const(0)),
    **{f"noise {w}x{h}": noise(w, h) for w, h in [(1, 1), (100, 1), (1, 100), (2, 1), (1, 2), (3, 7),
                                                  (7, 3), (99, 37), (37, 99), (100, 100), (100, 99),
                                                  (51, 100), (13, 1), (1, 13), (64, 48)]},
    **{f"noise {w}x{h} alpha": noise(w, h, alpha="random") for w, h in [(100, 100), (57, 83), (1, 1), (5, 5)]},
    "noise 80x60 binary alpha": noise(80, 60, alpha="binary"),
    **{f"flat {c} 100x75": flat(100, 75, c) for c in [(0, 0, 0, 255), (255, 255, 255, 255),
                                                      (128, 128, 128, 255), (255, 0, 0, 255),
                                                      (0, 255, 0, 255), (0, 0, 255, 255),
                                                      (12, 200, 99, 255)]},
    **{f"flat {w}x{h}": flat(w, h, (70, 130, 180, 255)) for w, h in [(1, 1), (33, 17), (100, 100),
                                                                     (100, 1), (1, 100), (2, 3)]},
    "flat half alpha": flat(48, 64, (240, 120, 10, 128)),
    "flat fully transparent": flat(100, 100, (0, 0, 0, 0)),
    "flat transparent 1x1": flat(1, 1, (255, 255, 255, 0)),
    "flat with one transparent pixel": one_transparent_pixel,
    "gradient horizontal": gradient(100, 50, 0),
    "gradient vertical": gradient(30, 100, 1),
    "checkerboard 1px": checkerboard(100, 100, 1),
    "checkerboard 10px": checkerboard(97, 61, 10),
}  # fmt: skip


@pytest.fixture(scope="session")
def cases() -> dict[str, RGBAImage]:
    return {name: make() for name, make in CASES.items()}


@pytest.fixture(scope="session")
def reference_hashes(cases: dict[str, RGBAImage]) -> dict[str, bytes]:
    return dict(zip(cases, reference.encode(list(cases.values())), strict=True))


@pytest.fixture(scope="session")
def reference_decoded(reference_hashes: dict[str, bytes]) -> dict[str, reference.Decoded]:
    return dict(zip(reference_hashes, reference.decode(list(reference_hashes.values())), strict=True))


def test_there_are_at_least_50_cases_with_every_photo_alpha_grey_and_the_odd_sizes() -> None:
    assert len(CASES) >= 50
    assert {f"photo {p.name}" for p in samples.photographs()} <= set(CASES)
    assert {"noise 1x1", "noise 100x1", "noise 1x100", "photo, grey", "photo, right half transparent"} <= set(
        CASES
    )


@pytest.mark.parametrize("name", CASES)
def test_the_hash_is_the_references_byte_for_byte(
    name: str, cases: dict[str, RGBAImage], reference_hashes: dict[str, bytes]
) -> None:
    # GIVEN the RGBA pixels the reference encoded
    image = cases[name]

    # WHEN they are encoded here
    mine = rgba_to_thumbhash(image.width, image.height, image.rgba)

    # THEN the bytes are the reference's
    assert mine.hex() == reference_hashes[name].hex()


@pytest.mark.parametrize("name", CASES)
def test_the_decoded_picture_is_the_references_exactly(
    name: str, reference_hashes: dict[str, bytes], reference_decoded: dict[str, reference.Decoded]
) -> None:
    # GIVEN a hash made by the reference, and the reference's decoding of it
    thumbhash, theirs = reference_hashes[name], reference_decoded[name]

    # WHEN it is decoded here
    mine = thumbhash_to_rgba(thumbhash)

    # THEN size and every byte of every pixel are the same, and so are the average and the ratio
    assert (mine.width, mine.height) == (theirs.image.width, theirs.image.height)
    assert mine.rgba == theirs.image.rgba
    assert thumbhash_to_average_rgba(thumbhash) == theirs.average
    assert thumbhash_to_approximate_aspect_ratio(thumbhash) == theirs.ratio


def random_pictures(count: int) -> Iterator[RGBAImage]:
    """Sizes from 1 to 100, opaque and not, noisy, flat and nearly flat: 1 in 5 of each."""
    rng = np.random.default_rng(15)
    for index in range(count):
        width, height = (int(v) for v in rng.integers(1, 101, 2))
        kind = index % 5
        if kind == 0:  # noise
            array = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
        elif kind == 1:  # noise, opaque
            array = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
            array[..., 3] = 255
        elif kind == 2:  # one colour, maybe translucent
            array = np.broadcast_to(rng.integers(0, 256, 4, dtype=np.uint8), (height, width, 4))
        elif kind == 3:  # one colour, plus or minus 1
            base = rng.integers(1, 255, 4)
            array = (base + rng.integers(-1, 2, (height, width, 4))).astype(np.uint8)
        else:  # a smooth blob of colour on a transparent ground
            y, x = np.mgrid[0:height, 0:width]
            inside = ((x - width / 2) ** 2 + (y - height / 2) ** 2) < (min(width, height) / 3) ** 2
            array = np.zeros((height, width, 4), dtype=np.uint8)
            array[inside] = rng.integers(0, 256, 4, dtype=np.uint8)
            array[inside, 3] = 255
        yield pixels(array)


def test_300_random_pictures_hash_and_decode_as_the_reference_does() -> None:
    # GIVEN 300 seeded random pictures of every size and kind
    pictures = list(random_pictures(300))

    # WHEN both encode them, and both decode the reference's hashes
    theirs = reference.encode(pictures)
    decoded = reference.decode(theirs)

    # THEN every hash and every decoded picture is the same
    mine = [rgba_to_thumbhash(p.width, p.height, p.rgba) for p in pictures]
    assert [h.hex() for h in mine] == [h.hex() for h in theirs]
    assert [thumbhash_to_rgba(h) for h in theirs] == [d.image for d in decoded]


@pytest.mark.parametrize("order", ["encoder", "decoder"])
def test_cosines_are_v8s_to_the_last_bit(order: str) -> None:
    # GIVEN Math.cos of every argument the package computes (sizes 1 to 100, factors 0 to 6)
    sizes = list(range(1, 101))
    tables, engine = reference.cosines(sizes, order)

    # WHEN the same arguments go through js_cos
    def argument(size: int, c: int, i: int) -> float:
        if order == "encoder":
            return math.pi / size * c * (i + 0.5)
        return math.pi / size * (i + 0.5) * c

    # THEN every value is the same: a flat picture's hash depends on their last bits
    differ = [
        (size, c, i)
        for size in sizes
        for c in range(7)
        for i in range(size)
        if js_cos(argument(size, c, i)) != tables[size][c * size + i]
    ]
    assert not differ, f"{len(differ)} cosines differ from {engine}'s Math.cos, first {differ[:5]}"
    # (the C library's differs: what js_cos is for)
    assert any(
        math.cos(argument(s, c, i)) != tables[s][c * s + i] for s in sizes for c in range(7) for i in range(s)
    )


def test_js_round_rounds_halves_up_like_math_round() -> None:
    assert [js_round(x) for x in (0.5, 1.5, 2.5, -0.5, -1.5, 2.4999999999999996)] == [1, 2, 3, 0, -1, 2]
    # floor(x + 0.5) would give 1: x + 0.5 rounds up to 1.0
    assert js_round(0.49999999999999994) == 0


def test_sizes_beyond_100_or_bytes_that_are_not_the_pixels_are_refused() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        rgba_to_thumbhash(101, 10, bytes(101 * 10 * 4))
    with pytest.raises(ValueError, match="not 2x2 RGBA"):
        rgba_to_thumbhash(2, 2, bytes(15))


# --- from the decoded image -------------------------------------------------------------------------


def test_the_small_image_fits_100x100_and_keeps_the_shape() -> None:
    # GIVEN the browse image of a 2560x1600 photo (2048x1280)
    image = browse("LadyBird.jpg")

    # WHEN it is made into the encoder's input
    small = rgba_for_thumbhash(image)

    # THEN it fits 100x100 on its long edge, with its aspect ratio, as opaque RGBA
    assert (small.width, small.height) == (100, 63)
    assert len(small.rgba) == 100 * 63 * 4
    assert set(small.rgba[3::4]) == {255}


def test_a_small_image_is_never_enlarged() -> None:
    image = browse("Aqua.jpg").thumbnail_image(40, height=40)
    small = rgba_for_thumbhash(image)
    assert max(small.width, small.height) == 40


def test_grey_becomes_rgb_and_alpha_is_kept() -> None:
    # GIVEN a grey image with a ramp of alpha (two bands)
    image = alpha_ramp(grey(browse("Storm.jpg")))
    assert image.bands == 2

    # WHEN it is made into RGBA
    small = np.frombuffer(rgba_for_thumbhash(image).rgba, dtype=np.uint8).reshape(-1, 4)

    # THEN red, green and blue are the grey, and alpha runs from transparent to nearly opaque
    assert (small[:, 0] == small[:, 1]).all() and (small[:, 1] == small[:, 2]).all()
    assert small[:, 3].min() < 10 and small[:, 3].max() > 240


def test_the_placeholder_is_the_hash_and_colour_of_the_small_image() -> None:
    image = browse("GreenMeadow.jpg")
    small = rgba_for_thumbhash(image)
    assert placeholder(image) == Placeholder(
        thumbhash=base64.b64encode(rgba_to_thumbhash(small.width, small.height, small.rgba)).decode(),
        average_color=average_color(small.width, small.height, small.rgba),
    )


# --- the average colour -----------------------------------------------------------------------------


def test_a_flat_picture_has_its_own_colour() -> None:
    image = flat(33, 17, (12, 200, 99, 255))()
    assert average_color(image.width, image.height, image.rgba) == "#0cc863"


def test_the_average_colour_is_of_what_is_visible() -> None:
    # GIVEN opaque blue on the left, transparent red on the right
    array = np.zeros((10, 20, 4), dtype=np.uint8)
    array[:, :10] = (0, 0, 255, 255)
    array[:, 10:] = (255, 0, 0, 0)
    image = pixels(array)

    # THEN the average is blue, and a wholly transparent picture's is black
    assert average_color(image.width, image.height, image.rgba) == "#0000ff"
    transparent = flat(5, 5, (255, 255, 255, 0))()
    assert average_color(5, 5, transparent.rgba) == "#000000"


@pytest.mark.parametrize("path", samples.photographs(), ids=lambda p: p.name)
def test_a_photos_colour_agrees_with_its_hashs_average(path: Path) -> None:
    # GIVEN a photo's placeholder
    found = placeholder(browse(path.name))

    # THEN its colour is within the hash's quantisation (6 bits per component) of the hash's average
    colour = [int(found.average_color[i : i + 2], 16) for i in (1, 3, 5)]
    from_hash = [255 * v for v in thumbhash_to_average_rgba(base64.b64decode(found.thumbhash))[:3]]
    assert max(abs(a - b) for a, b in zip(colour, from_hash, strict=True)) <= 8


def test_the_placeholder_png_holds_the_decoded_pixels() -> None:
    thumbhash = base64.b64decode(placeholder(browse("YellowFlower.jpg")).thumbhash)
    png = thumbhash_to_png(thumbhash)
    decoded = pyvips.Image.new_from_buffer(png, "")
    expected = thumbhash_to_rgba(thumbhash)
    assert png.startswith(b"\x89PNG")
    assert (decoded.width, decoded.height, decoded.bands) == (expected.width, expected.height, 4)
    assert decoded.write_to_memory() == expected.rgba
    assert len(set(expected.rgba)) > 20  # a picture, not a blank


def test_numpy_is_imported_by_the_first_placeholder_not_by_the_import() -> None:
    # GIVEN a fresh interpreter, as at a Lambda cold start
    code = (
        "import sys, pyvips; from photo_publish.image import thumbhash; before = 'numpy' in sys.modules; "
        "thumbhash.placeholder(pyvips.Image.black(300, 200, bands=3)); print(before, 'numpy' in sys.modules)"
    )

    # WHEN the module is imported, then makes a placeholder
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ | {"PYTHONPATH": str(reference.ROOT / "shared")},
    )

    # THEN numpy came with the placeholder (about 40 ms, once a container), not with the import
    assert out.stdout.split() == ["False", "True"]
