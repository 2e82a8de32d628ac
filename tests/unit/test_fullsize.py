"""Every accepted format at the pixel limit publishes within the function's memory (SPEC 3, amended).

The photos are devkit/fullsize.py's (100 MP, the 48 MP camera's progressive JPEG among them), made
once into .local/fullsize (a few minutes the first time). Each is rendered by the real render() in a
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
