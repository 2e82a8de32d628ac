"""Malformed image files end in a code or in variants: the inputs `make fuzz` (devkit/fuzz.py)
found, each kept as a test.

Each reproducer in tests/images/fuzz (see its README) renders through the real pipeline in a child
process under a memory cap (tests/capped.py): a crash or a balloon costs the child, and fails the
test, not the run. The bombs that a finding pointed to are built here from devkit/hostile.py's
writers, at their full size.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
import pyvips

from devkit import hostile, samples
from photo_publish.errors import ErrorCode, PhotoError
from photo_publish.image import frames, heic
from photo_publish.image.pipeline import RenderOptions, render
from tests import capped

FINDINGS = Path(__file__).resolve().parent.parent / "images" / "fuzz"

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


@pytest.fixture(scope="module")
def tile() -> hostile.CodedPicture:
    """A real 512 x 512 HEVC picture: a phone's tile."""
    return hostile.coded_picture(samples.heic(samples.photograph().crop(0, 0, 512, 512), tile_size=0))


@pytest.mark.parametrize("declared", [(128, 128), None], ids=["declaring-128x128", "declaring-nothing"])
def test_a_grid_whose_canvas_is_not_its_declared_size_is_refused_before_decoding(
    tile: hostile.CodedPicture, declared: tuple[int, int] | None
) -> None:
    # GIVEN a 130 KB HEIC of one tile repeated 30 x 30 times on a canvas of 15000 x 15000 (225 MP),
    # declaring 128 x 128, or no size at all (the fuzzer's finding, at full size). Measured before:
    # 448 MB and 10 s before libheif's own DECODE_FAILED; 1.1 GB and rendered
    size = (15000, 15000)
    honest = hostile.heif(hostile.Grid(tile, 30, 30, size))
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
    tile: hostile.CodedPicture,
) -> None:
    # GIVEN a HEIC whose primary grid is honest, and whose second grid (a gain map, which an
    # identity image could show as well) declares 512 x 512 on a canvas of 4096 x 3072
    aux_size = (4096, 3072)
    honest = hostile.heif(
        hostile.Grid(tile, 2, 2, (1000, 1000)), auxiliary=(hostile.Grid(tile, 8, 6, aux_size),)
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


def test_an_honest_grid_still_renders(tile: hostile.CodedPicture) -> None:
    # GIVEN a grid whose canvas is the size it declares (tiles overhanging it, as phones write them)
    data = hostile.heif(hostile.Grid(tile, 3, 2, (1400, 1000)))

    # WHEN it is rendered
    outcome = capped.render(data)

    # THEN it renders at that size
    assert (outcome.code, outcome.size) == (None, (1400, 1000)), outcome
