"""Issue 15: what the placeholder (ThumbHash and average colour) costs, against the render, in one run.

One process, as a warm Lambda container: each corpus photo (benchmarks/corpus.py, 8 to 24 MP JPEGs)
is rendered once to warm up, then ROUNDS rounds of, per photo in turn:
- render: shared/photo_publish/image/pipeline.py's render(stream, RenderOptions()) from the file, timed;
- placeholder: photo_publish.image.thumbhash.placeholder(browse), REPEATS times, each timed: the browse
  image made as the pipeline makes it (decoded once at long edge 2048, in sRGB, in memory), shrunk
  to fit 100x100 with libvips, hashed and averaged; and its parts apart (the shrink; the hash; the
  colour).
Per photo, the median placeholder over the median render; their median over photos is the verdict
against the issue's target, 2%. (Should the pipeline make the placeholder itself, its render time
includes it, and the ratio then reads a little low: the step over the render with it.)

The first photo a container encodes also imports numpy and builds the cosine tables: FIRST fresh
interpreters each time a first and a second placeholder after the pipeline's imports, and
`import numpy` alone; that extra is paid once, on the first photo, not at the cold start.

BENCH_ROUNDS sets the rounds (default 5). Results go to .local/bench-results/placeholder.json.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyvips

from benchmarks import child
from benchmarks.corpus import photos
from devkit.stack import ROOT
from photo_publish.image import thumbhash
from photo_publish.image.pipeline import RenderOptions, render

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
REPEATS = 5
FIRST = 7
TARGET = 0.02
RESULTS = ROOT / ".local" / "bench-results"

NUMPY_IMPORT = "import json, time; t = time.perf_counter(); import numpy; print(json.dumps({'numpy': time.perf_counter() - t}))"
FIRST_PLACEHOLDER = """
import json, sys, time
import pyvips
from photo_publish.image import pipeline, thumbhash
browse = pyvips.Image.thumbnail(sys.argv[1], 2048, height=2048, size="down").copy_memory()
assert "numpy" not in sys.modules, "numpy is imported before the first placeholder"
times = []
for _ in range(2):
    t = time.perf_counter(); thumbhash.placeholder(browse); times.append(time.perf_counter() - t)
print(json.dumps({"first": times[0], "second": times[1]}))
"""


def browse_of(photo: Path) -> pyvips.Image:
    """The browse as the pipeline holds it: one decode at long edge 2048, in sRGB, in memory."""
    profiled = "icc-profile-data" in pyvips.Image.new_from_file(str(photo)).get_fields()
    options = {"export_profile": "srgb"} if profiled else {}
    return pyvips.Image.thumbnail(str(photo), 2048, height=2048, size="down", **options).copy_memory()


def timed(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def render_seconds(photo: Path) -> float:
    with photo.open("rb") as stream:
        return timed(lambda: render(stream, RenderOptions()))


def placeholder_parts(browse: pyvips.Image) -> dict[str, float]:
    small = thumbhash.rgba_for_thumbhash(browse)
    return {
        "placeholder": timed(lambda: thumbhash.placeholder(browse)),
        "shrink": timed(lambda: thumbhash.rgba_for_thumbhash(browse)),
        "hash": timed(lambda: thumbhash.rgba_to_thumbhash(small.width, small.height, small.rgba)),
        "colour": timed(lambda: thumbhash.average_color(small.width, small.height, small.rgba)),
    }


def first_photo(photo: Path) -> dict[str, float]:
    """In fresh interpreters: the first placeholder, the second, and `import numpy` alone (medians)."""

    def run(*args: str) -> dict[str, float]:
        out = subprocess.run(
            [sys.executable, "-c", *args], capture_output=True, text=True, check=True, env=child.env()
        )
        result: dict[str, float] = json.loads(out.stdout)
        return result

    runs = [run(FIRST_PLACEHOLDER, str(photo)) | run(NUMPY_IMPORT) for _ in range(FIRST)]
    return {key: statistics.median(r[key] for r in runs) for key in ("first", "second", "numpy")}


def main() -> None:
    corpus = photos()
    browses = {photo.name: browse_of(photo) for photo in corpus}
    renders: dict[str, list[float]] = {photo.name: [] for photo in corpus}
    parts: dict[str, list[dict[str, float]]] = {photo.name: [] for photo in corpus}
    for photo in corpus:  # warm-up: libvips' first run, numpy's import, the cosine tables
        render_seconds(photo)
        placeholder_parts(browses[photo.name])
    for _ in range(ROUNDS):
        for photo in corpus:
            renders[photo.name].append(render_seconds(photo))
            parts[photo.name] += [placeholder_parts(browses[photo.name]) for _ in range(REPEATS)]

    def median(photo: str, key: str) -> float:
        return statistics.median(p[key] for p in parts[photo])

    print(
        f"placeholder against render, one warm process, {ROUNDS} renders and {ROUNDS * REPEATS} "
        f"placeholders per photo, medians, {len(os.sched_getaffinity(0))} CPUs"
    )
    keys = ("placeholder", "shrink", "hash", "colour")
    print(f"{'photo':30}{'render s':>10}" + "".join(f"{key + ' ms':>15}" for key in keys) + f"{'ratio':>9}")
    ratios = {}
    for photo in corpus:
        name = photo.name
        render_median = statistics.median(renders[name])
        ratios[name] = median(name, "placeholder") / render_median
        cells = "".join(f"{median(name, key) * 1000:15.2f}" for key in keys)
        print(f"{name:30}{render_median:10.3f}{cells}{ratios[name]:9.2%}")
    ratio = statistics.median(ratios.values())
    first = first_photo(corpus[0])
    print(
        f"\nfirst photo of a container (fresh interpreters, median of {FIRST}): first placeholder "
        f"{first['first'] * 1000:.1f} ms, second {first['second'] * 1000:.1f} ms; `import numpy` alone "
        f"{first['numpy'] * 1000:.1f} ms"
    )
    print("\ntarget (a verdict, not an assertion)")
    verdict = "MET" if ratio <= TARGET else "MISSED"
    print(f"  {'placeholder <= 2% of the render (median over photos)':60} {ratio:8.2%}  {verdict}")

    RESULTS.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "rounds": ROUNDS,
        "repeats": REPEATS,
        "render_median": {name: statistics.median(values) for name, values in renders.items()},
        "placeholder_median": {name: {key: median(name, key) for key in keys} for name in parts},
        "ratio": ratio,
        "ratios": ratios,
        "first_photo": first,
        "target": TARGET,
    }
    (RESULTS / "placeholder.json").write_text(json.dumps(summary, indent=1))
    print(f"\nwritten {(RESULTS / 'placeholder.json').relative_to(ROOT)}")


if __name__ == "__main__":
    main()
