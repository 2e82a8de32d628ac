"""Every accepted format at the pixel limit publishes within the function's memory (SPEC 3, amended).

The photos are devkit/fullsize.py's (100 MP, the 48 MP camera's progressive JPEG among them), made
once into .local/fullsize/<what made them> (a few minutes the first time). Each is rendered by the real render() in a
fresh process, as the process function renders it at the template's memory (a shared slot, or again
alone: benchmarks/child.py's --as-function), its peak resident memory read from the kernel.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import child
from devkit import fullsize
from photo_publish.image import slots

# An address space cap for the child: well above what it touches (libvips' threads and arenas reserve
# more), so that a render that got through costs that process, not the machine.
CAP = ("prlimit", f"--as={6 << 30}")


@pytest.mark.slow
@pytest.mark.parametrize("case", fullsize.CASES, ids=[case.name for case in fullsize.CASES])
def test_every_accepted_format_at_the_pixel_limit_publishes_within_the_functions_memory(
    fullsize_corpus: Path, case: fullsize.Case
) -> None:
    # GIVEN a photo at the pixel limit, as its format's encoder writes it
    path = fullsize_corpus / case.name

    # WHEN it is rendered as the process function renders it at the template's memory (1769 MB), its
    # ladder in the case's formats
    formats = ("--formats", ",".join(case.formats))
    result = child.measure("photo-publish", path, "--stream", "--as-function", *formats, prefix=CAP)
    budget = slots.DEFAULT.encoding(case.formats)

    if case.route == "refused":
        # THEN one that no render of this function could hold is refused from its header, before a
        # pixel is decoded, saying what it would hold and what the function has
        assert result["code"] == "DIMENSIONS_EXCEEDED", result
        assert f"over the {budget.whole} a render may hold alone" in result["detail"], result
        return
    # THEN it renders at its size, beside the other renders or alone as its header says
    assert (result["code"], tuple(result["size"])) == (None, case.size), result
    assert result["route"] == case.route, result
    # AND what it held over its process's floor is within what its header said and a render's work
    # (the gate's figure is honest), and within its share of the function's memory: its slot or the
    # whole, and the work; so that the renders at once, with the rest of the process, fit in 1769 MB
    # (and, the figure being honest, in whatever memory the gate is given: at 512 MB, what the gate
    # admits to a slot still fits in it)
    held = (result["peak_mb"] - result["floor_mb"]) * slots.MIB
    assert held <= result["decode_bytes"] + budget.work, result
    share = budget.whole if case.route == "alone" else budget.slot
    assert held <= share + budget.work, result


# The hostile reviews' shapes at the template's least memory, where the counts decide most: each is
# refused from its header or renders within its share of 512 MB (with AVIF on, one render at a time,
# in 80 MB: a picture with alpha at the browse's size is refused there). The 48 MP progressive JPEG
# renders alone, a still lossy WebP in a slot.
AT_512 = {
    "avif-444-10000x10000.avif": "DIMENSIONS_EXCEEDED",
    "tiff-one-strip-ycbcr-10000x10000.tif": "DIMENSIONS_EXCEEDED",
    "webp-lossless-12500x8000.webp": "DIMENSIONS_EXCEEDED",
    "webp-alpha-12500x8000.webp": "DIMENSIONS_EXCEEDED",
    "webp-alpha-2048x2048-avif.webp": "DIMENSIONS_EXCEEDED",
    "png-16bit-alpha-2048x2048-avif.png": "DIMENSIONS_EXCEEDED",
    "jpeg-progressive-8000x6000.jpg": None,
    "webp-12500x8000.webp": None,
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(AT_512))
def test_at_512_mb_what_a_render_cannot_hold_is_refused_and_the_rest_fits(
    fullsize_corpus: Path, name: str
) -> None:
    # GIVEN a photo whose decoder or encoders hold much, and the process function at 512 MB
    case = next(case for case in fullsize.CASES if case.name == name)
    budget = slots.DEFAULT.encoding(case.formats).with_memory(512)

    # WHEN it is rendered as the function renders it there
    formats = ("--formats", ",".join(case.formats))
    result = child.measure(
        "photo-publish",
        fullsize_corpus / name,
        "--stream",
        "--as-function",
        *formats,
        "--memory-mb",
        "512",
        prefix=CAP,
    )

    # THEN it is refused from its header where no render of 512 MB could hold it
    assert result["code"] == AT_512[name], result
    held = (result["peak_mb"] - result["floor_mb"]) * slots.MIB
    if result["code"] is not None:
        assert f"over the {budget.whole} a render may hold alone" in result["detail"], result
        assert held < 64 * slots.MIB, result  # nothing decoded
        return
    # AND otherwise it holds no more than its share of 512 MB and its work
    share = budget.whole if result["route"] == "alone" else budget.slot
    assert held <= share + budget.work, result
