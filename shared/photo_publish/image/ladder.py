"""The responsive ladder's arithmetic (SPEC 18): which long edges a picture gets. Pure, no libvips."""

from __future__ import annotations

from collections.abc import Iterable

# Each format the ladder is encoded in: its content type and file extension.
FORMATS = {"webp": ("image/webp", "webp"), "avif": ("image/avif", "avif")}


def steps(widths: Iterable[int], long_edge: int) -> tuple[int, ...]:
    """The long edges of a picture whose own long edge is `long_edge`, smallest first.

    Never upscaled: every width at or above `long_edge` collapses into one step at `long_edge`
    itself (a 1500-pixel picture with widths 320..1920 gets 320, 640, 960, 1280 and 1500).
    """
    wanted = set(widths)
    below = sorted(width for width in wanted if width < long_edge)
    return (*below, long_edge) if any(width >= long_edge for width in wanted) else tuple(below)
