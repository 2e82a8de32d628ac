"""Issue #7, parts 2 and 3: peak memory on very large images, and memory over time in one process.

Large images (part 2). Made once into .local/bench-corpus from the corpus' 18 MP photograph, by
libvips without ever holding the big image: the photograph (54 MB decoded) is resized up, repeated
by replicate() and cropped, and the saver streams it out in strips:
- Elephants-192MP.jpg, 16000 x 12000, quality 90;
- Elephants-600MP.png, 30000 x 20000, 8-bit RGB, zlib level 1, no filter.
Each measurement is a fresh process (benchmarks/child.py with --stream: MALLOC_ARENA_MAX=2) reporting
wall time and VmHWM, the photo read as a file stream (never whole into memory):
- photo-publish: render(stream, RenderOptions(max_input_pixels=10**9)), the pipeline with its pixel
  limit raised for the measurement: in production (MAX_INPUT_PIXELS, 100 MP) both images are refused
  from their header (photo-publish-default, measured too, shows that refusal and its cost);
- pillow: as in benchmarks/compare.py (draft mode: a JPEG decodes at 1/4 scale; a PNG has no such
  mode and is decoded whole), with Pillow's decompression-bomb limit lifted; Pillow's imports only;
- imports: a process doing nothing but the pipeline's imports, the floor under photo-publish's.
Target: photo-publish's peak bounded by the output, not by the input: under 120 MB for the JPEG and
300 MB for the PNG (printed as verdicts).

Memory over time (part 3). One process renders RENDERS photos in a row (the corpus' 24 MP, 24 MP
sideways, 12 MP Display P3 and 8 MP JPEGs in turn, each read from a file stream) and samples its
resident set (VmRSS) after every photo (`python -m benchmarks.child over-time`). Two processes, run at the same time (the render
is mostly single-threaded WebP encoding, so they overlap on 2 cores): MALLOC_ARENA_MAX=2 (as in
Lambda and the Makefile) and MALLOC_ARENA_MAX unset (glibc's default, 8 arenas per core).
Target: RSS at photo 1,000 within 10% of RSS at photo 100. The resident set swings by about 10%
from one photo to the next as glibc keeps or returns freed pages, so one sample against another
measures that swing, not growth: "at photo N" is the median of the 100 photos around it (51-150,
and the last 100), the verdict is given on those, and the single samples and the least-squares
slope from photo 100 on are printed beside it. A shorter run compares its last 100 photos with
photos 51-150 and says so; one of 150 photos or fewer has no verdict.

BENCH_RENDERS sets the renders per process (default 1000, about 8 minutes on 2 cores);
BENCH_LARGE_ROUNDS the rounds of the large images (default 3; the 600 MP PNG is measured once).
Results go to .local/bench-results/memory.json (benchmarks/report.py plots them).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyvips

from benchmarks import child
from benchmarks.corpus import CORPUS, photos
from devkit.stack import ROOT

RENDERS = int(os.environ.get("BENCH_RENDERS", "1000"))
LARGE_ROUNDS = int(os.environ.get("BENCH_LARGE_ROUNDS", "3"))
SAMPLE_EVERY = 100
RESULTS = ROOT / ".local" / "bench-results"
BIG_JPEG = CORPUS / "Elephants-192MP.jpg"
BIG_PNG = CORPUS / "Elephants-600MP.png"
LARGE_TARGETS_MB = {BIG_JPEG: 120, BIG_PNG: 300}  # photo-publish's peak, the targets


def make_large() -> None:
    """The two large images, made once, in a child process so the generation's memory is not ours."""
    code = r"""
import sys, pyvips
source = pyvips.Image.new_from_file(sys.argv[1]).copy_memory()
def tiled(width, height):
    scale = max(width / source.width, height / source.height) / 2
    tile = source.resize(scale, kernel="lanczos3").copy_memory()
    across, down = -(-width // tile.width), -(-height // tile.height)
    return tile.replicate(across, down).crop(0, 0, width, height)
if sys.argv[2] == "jpeg":
    tiled(16000, 12000).jpegsave(sys.argv[3], Q=90)
else:
    tiled(30000, 20000).pngsave(sys.argv[3], compression=1, filter="none")
"""
    source = photos()[0]
    for kind, path in (("jpeg", BIG_JPEG), ("png", BIG_PNG)):
        if path.exists():
            continue
        partial = path.with_suffix(".partial" + path.suffix)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", code, str(source), kind, str(partial)], check=True)
        partial.rename(path)
        print(
            f"made {path.name} in {time.perf_counter() - started:.0f} s ({path.stat().st_size / 2**20:.0f} MB)"
        )


# The peers here, as benchmarks/child.py runs them.
PEAK_PEERS = {
    "imports": ("imports",),
    "photo-publish-default": ("photo-publish",),
    "photo-publish": ("photo-publish", "--max-pixels", str(10**9)),
    "pillow": ("pillow",),
}


def peak(peer: str, photo: Path) -> dict[str, Any]:
    name, *options = PEAK_PEERS[peer]
    return child.measure(name, photo, "--stream", *options)


def large_peaks() -> dict[str, dict[str, list[dict[str, Any]]]]:
    make_large()
    peers = tuple(PEAK_PEERS)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for photo, rounds in ((BIG_JPEG, LARGE_ROUNDS), (BIG_PNG, 1)):
        results[photo.name] = {p: [] for p in peers}
        for _ in range(rounds):
            for peer in peers:
                results[photo.name][peer].append(peak(peer, photo))
    print("\nlarge images: median wall time and peak memory (VmHWM), fresh process each")
    for photo, runs in results.items():
        size = pyvips.Image.new_from_file(str(CORPUS / photo))
        print(
            f"{photo} ({size.width} x {size.height}, {(CORPUS / photo).stat().st_size / 2**20:.0f} MB), "
            f"{len(runs['imports'])} run(s)"
        )
        for peer, measured in runs.items():
            seconds = statistics.median(r["seconds"] for r in measured)
            peak_mb = statistics.median(r["peak_mb"] for r in measured)
            print(f"  {peer:22} {seconds:7.2f} s {peak_mb:7.0f} MB  {measured[0]['outcome']}")
        floor = statistics.median(r["peak_mb"] for r in runs["imports"])
        ours = statistics.median(r["peak_mb"] for r in runs["photo-publish"])
        print(f"  photo-publish over imports: {ours - floor:.0f} MB")
    print("targets (verdicts, not assertions)")
    for photo, limit in LARGE_TARGETS_MB.items():
        ours = statistics.median(r["peak_mb"] for r in results[photo.name]["photo-publish"])
        print(f"  {photo.name} peak < {limit} MB: {ours:.0f} MB  {'MET' if ours < limit else 'MISSED'}")
    return results


def rss_at(result: dict[str, Any], photo: int) -> float:
    return float(result["samples"][photo]["rss_mb"])  # sample 0 is before the first photo


def window(result: dict[str, Any], first: int, last: int) -> float:
    return statistics.median(s["rss_mb"] for s in result["samples"][first : last + 1])


def slope(result: dict[str, Any]) -> float:
    """Least-squares MB per photo from photo 100 on."""
    points = [s for s in result["samples"] if s["photo"] >= 100]
    return statistics.linear_regression([s["photo"] for s in points], [s["rss_mb"] for s in points]).slope


def over_time() -> dict[str, Any]:
    corpus = {p.name: p for p in photos()}
    paths = [
        str(corpus[n])
        for n in (
            "Elephants-24MP.jpg",
            "Elephants-24MP-sideways.jpg",
            "Elephants-12MP-P3.jpg",
            "Elephants-8MP.jpg",
        )
    ]
    settings = {"MALLOC_ARENA_MAX=2": "2", "MALLOC_ARENA_MAX unset": None}
    started = time.perf_counter()
    running = {
        name: subprocess.Popen(
            child.command("over-time", RENDERS, 1, *paths),
            stdout=subprocess.PIPE,
            text=True,
            env=child.env(malloc_arena_max=extra),
            cwd=ROOT,
        )
        for name, extra in settings.items()
    }
    results = {}
    for name, process in running.items():
        stdout, _ = process.communicate()
        if process.returncode:
            raise SystemExit(f"{name}: the rendering process failed ({process.returncode})")
        results[name] = json.loads(stdout)
    print(
        f"\nmemory over time: one process renders {RENDERS} photos in a row (4 corpus JPEGs in turn), "
        f"both settings at once, {time.perf_counter() - started:.0f} s"
    )
    print(f"{'photo':>7}" + "".join(f"{name:>26}" for name in results))
    for photo in [1, *range(SAMPLE_EVERY, RENDERS + 1, SAMPLE_EVERY)]:
        row = [rss_at(result, photo) for result in results.values()]
        print(f"{photo:>7}" + "".join(f"{mb:>20.0f} MB RSS" for mb in row))
    short = f" (BENCH_RENDERS={RENDERS}: the target is for 1,000)" if RENDERS < 1000 else ""
    print(f"targets (verdicts, not assertions){short}")
    for name, result in results.items():
        if RENDERS <= 150:
            print(f"  {name:24} NOT MEASURED: photos 51-150 are the baseline, {RENDERS} renders")
            continue
        early, late = window(result, 51, 150), window(result, RENDERS - 99, RENDERS)
        growth = late / early - 1
        single = rss_at(result, RENDERS) / rss_at(result, 100) - 1
        print(
            f"  {name:24} RSS around photo {RENDERS} {late:.0f} MB vs around 100 {early:.0f} MB: {growth:+.1%} "
            f"(within 10%: {'MET' if growth <= 0.10 else 'MISSED'}); single samples {single:+.1%}, "
            f"slope {slope(result) * 1000:+.1f} MB per 1,000 photos; peak {result['peak_mb']:.0f} MB"
        )
    return results


def main() -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    which = sys.argv[1:] or ["large", "over-time"]
    summary: dict[str, Any] = {"renders": RENDERS, "large_rounds": LARGE_ROUNDS}
    if "large" in which:
        summary["large"] = large_peaks()
    if "over-time" in which:
        summary["over_time"] = over_time()
    target = RESULTS / "memory.json"
    previous = json.loads(target.read_text()) if target.exists() else {}
    target.write_text(json.dumps(previous | summary, indent=1))
    print(f"\nwritten {target.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
