"""Issue #7, part 1: the render of one photo against every peer, in one run, interleaved.

Each measurement is a fresh process that renders one photo of the corpus (benchmarks/corpus.py,
8 to 24 MP JPEGs): thumb fitting 400x400, browse with a long edge of 2048, never upscaled, WebP
quality 80, no metadata kept. The peers, run as A B C D E F A B C D E F ... for ROUNDS rounds:
- photo-publish: shared/photo_publish/image/pipeline.py, render(stream, RenderOptions());
- pyvips-2dec: the original worker's two pipelines on this very libvips, in-process: pyvips making
  each variant from the original (thumbnail_buffer, WebP at libvips' default effort 4). No target:
  it tells what the pipeline's design gains from what a newer libvips gives (sharp bundles its own,
  vipsthumbnail is Debian's);
- sharp-2pipe: sharp on Node.js as the original worker did, one pipeline per variant, each from the
  original (benchmarks/sharp_render.mjs two-pipelines);
- sharp-1dec: the best sharp does, decode once at browse size, thumb from that (decode-once);
- pillow: draft mode, exif_transpose, LANCZOS, WebP method 4, the usual Python choice;
- vipsthumbnail: Debian's libvips-tools CLI, run twice (browse, then thumb), each from the
  original, `-e srgb` when the photo carries an ICC profile (photo-publish converts those only).
The Python peers are benchmarks/child.py's (which says what each does and imports), each run as
`python -m benchmarks.child <peer> <photo> --browse-to <file>`.
Timed: the render only for photo-publish, pyvips, sharp and Pillow (after the interpreter's start and
the imports); for vipsthumbnail, its two whole processes (libvips' start included: that is the CLI).
Peak memory: VmHWM of the rendering process; for vipsthumbnail, the larger of its two processes'
ru_maxrss (its parent is a bare Python of about 10 MB, the floor of that figure). All Python and
vipsthumbnail children run with MALLOC_ARENA_MAX=2 (as Lambda); Node.js as it comes.

Quality: SSIM of each peer's browse against a careful reference, the full decode (pyvips, no
shrink-on-load, orientation applied, ICC profile to sRGB) resized to the browse's exact size with
lanczos3, on luma (Rec. 601) with an 11-tap Gaussian window of sigma 1.5 (Wang et al.'s constants).

It prints, per photo, the medians (seconds, peak MB, output KB, SSIM), then the median over photos
of photo-publish's ratio to each peer, and the issue's targets as verdicts (never asserted). A peer
whose tool is missing is skipped and said so. Results go to .local/bench-results/compare.json
(benchmarks/report.py makes the cost table and plots from it).

BENCH_ROUNDS sets the rounds (default 5): about 5 minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyvips

from benchmarks import child
from benchmarks.corpus import photos
from devkit.stack import ROOT

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
RESULTS = ROOT / ".local" / "bench-results"
NODE_DIR = ROOT / ".local" / "bench-node"
SHARP = NODE_DIR / "node_modules" / "sharp"
SHARP_SCRIPT = Path(__file__).with_name("sharp_render.mjs")

# A bare Python (no imports beyond the standard library's few) runs vipsthumbnail twice.
VIPSTHUMBNAIL_CHILD = r"""
import json, os, resource, subprocess, sys, time
path, browse_path, thumb_path, profile = sys.argv[1:5]
export = ["-e", "srgb"] if profile == "1" else []
started = time.perf_counter()
for size, out in (("2048x2048>", browse_path), ("400x400>", thumb_path)):
    subprocess.run(["vipsthumbnail", path, "-s", size, *export, "-o", out + "[Q=80,strip]"], check=True)
seconds = time.perf_counter() - started
peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
sizes = [os.path.getsize(p) for p in (browse_path, thumb_path)]
print(json.dumps({"seconds": seconds, "peak_mb": peak_kb / 1024, "bytes": sum(sizes), "browse_bytes": sizes[0]}))
"""

PEERS = ("photo-publish", "pyvips-2dec", "sharp-2pipe", "sharp-1dec", "pillow", "vipsthumbnail")
PYTHON_PEERS = ("photo-publish", "pyvips-2dec", "pillow")  # benchmarks/child.py
# The targets for photo-publish's render time, as a ratio to each peer's.
TIME_TARGETS = {"sharp-2pipe": 0.70, "sharp-1dec": 0.85, "pillow": 0.57, "vipsthumbnail": 1.00}


def available_peers() -> tuple[list[str], dict[str, str]]:
    """The peers this machine can run, and why any other is skipped."""
    skipped: dict[str, str] = {}
    if shutil.which("node") is None:
        skipped["sharp-2pipe"] = skipped["sharp-1dec"] = "node is not on PATH"
    elif not SHARP.exists():
        reason = f"sharp is not installed (npm install --prefix {NODE_DIR.relative_to(ROOT)} sharp)"
        skipped["sharp-2pipe"] = skipped["sharp-1dec"] = reason
    if shutil.which("vipsthumbnail") is None:
        skipped["vipsthumbnail"] = "vipsthumbnail is missing (apt-get install libvips-tools)"
    return [p for p in PEERS if p not in skipped], skipped


def measure(peer: str, photo: Path, work: Path, profiled: bool) -> dict[str, float]:
    browse = work / f"{peer}-{photo.stem}-browse.webp"
    if peer in PYTHON_PEERS:
        return child.measure(peer, photo, "--browse-to", browse)
    if peer.startswith("sharp"):
        mode = "two-pipelines" if peer == "sharp-2pipe" else "decode-once"
        command = ["node", str(SHARP_SCRIPT), mode, str(photo), str(browse)]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SHARP_PATH": str(SHARP)}
    else:
        thumb = work / f"{peer}-{photo.stem}-thumb.webp"
        command = [
            sys.executable,
            "-c",
            VIPSTHUMBNAIL_CHILD,
            str(photo),
            str(browse),
            str(thumb),
            "1" if profiled else "0",
        ]
        env = child.env()
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _gaussian_filter(plane: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Separable 'valid' convolution with a symmetric kernel."""
    n = len(weights)
    rows = sum(w * plane[i : plane.shape[0] - n + 1 + i, :] for i, w in enumerate(weights))
    return sum(w * rows[:, i : rows.shape[1] - n + 1 + i] for i, w in enumerate(weights))


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Mean SSIM of two luma planes (0-255), 11-tap Gaussian window, sigma 1.5."""
    x = np.arange(11) - 5
    weights = np.exp(-(x**2) / (2 * 1.5**2))
    weights /= weights.sum()
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    mu_a, mu_b = _gaussian_filter(a, weights), _gaussian_filter(b, weights)
    var_a = _gaussian_filter(a * a, weights) - mu_a**2
    var_b = _gaussian_filter(b * b, weights) - mu_b**2
    cov = _gaussian_filter(a * b, weights) - mu_a * mu_b
    index = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return float(index.mean())


def _luma(image: pyvips.Image) -> np.ndarray:
    if image.hasalpha():
        image = image.flatten()
    if image.bands == 1:
        image = image.bandjoin([image, image])
    rgb = np.ndarray(
        buffer=image.cast("uchar").write_to_memory(),
        dtype=np.uint8,
        shape=(image.height, image.width, image.bands),
    )[:, :, :3].astype(np.float64)
    return rgb @ np.array([0.299, 0.587, 0.114])


def reference(photo: Path) -> pyvips.Image:
    """The full decode, upright and in sRGB, kept in memory."""
    full = pyvips.Image.new_from_file(str(photo)).autorot()
    if "icc-profile-data" in full.get_fields():
        full = full.icc_transform("srgb", embedded=True, intent="perceptual")
    return full.colourspace("srgb").copy_memory()


def quality(full: pyvips.Image, browse_path: Path) -> dict[str, float]:
    browse = pyvips.Image.new_from_file(str(browse_path))
    if browse.interpretation != "srgb":
        browse = browse.colourspace("srgb")
    exact = full.resize(browse.width / full.width, vscale=browse.height / full.height, kernel="lanczos3")
    return {"ssim": ssim(_luma(exact), _luma(browse)), "width": browse.width, "height": browse.height}


def print_verdicts(
    ratios: dict[str, dict[str, float]],
    ssim_drop: dict[str, float],
    peaks_24mp: dict[str, float],
    skipped: dict[str, str],
) -> None:
    """The issue's targets, each MET, MISSED or NOT MEASURED (with the reason its peer was skipped)."""
    print("\ntargets (verdicts, not assertions)")
    checks: list[tuple[str, str, str, bool]] = []  # what, against, the figure, met
    for peer, limit in TIME_TARGETS.items():
        if peer in ratios:
            got = ratios[peer]["seconds"]
            checks.append((f"time <= x{limit:.2f}", peer, f"x{got:.2f}", got <= limit))
        else:
            checks.append((f"time <= x{limit:.2f}", peer, "", False))
    for peer in ("sharp-2pipe", "sharp-1dec"):
        if peer in ratios:
            got = ratios[peer]["peak_mb"]
            checks.append(("peak memory <= x0.70", peer, f"x{got:.2f}", got <= 0.70))
        else:
            checks.append(("peak memory <= x0.70", peer, "", False))
    if "sharp-2pipe" in ratios:
        got = ratios["sharp-2pipe"]["bytes"]
        checks.append(("output bytes within 5% of", "sharp-2pipe", f"x{got:.3f}", abs(got - 1) <= 0.05))
        drop = ssim_drop["sharp-2pipe"]
        checks.append(("browse SSIM at most 0.005 under", "sharp-2pipe", f"{drop:+.4f}", drop <= 0.005))
    else:
        checks.append(("output bytes and SSIM against", "sharp-2pipe", "", False))
    for name, peak in peaks_24mp.items():
        checks.append(("24 MP peak < 150 MB", name, f"{peak:.0f} MB", peak < 150))
    for what, against, figure, met in checks:
        if not figure:
            print(f"  {what} {against}: NOT MEASURED ({skipped.get(against, 'skipped')})")
        else:
            print(f"  {what + ' ' + against:60} {figure:>8}  {'MET' if met else 'MISSED'}")


def main() -> None:  # noqa: C901
    corpus = photos()
    peers, skipped = available_peers()
    for peer, reason in skipped.items():
        print(f"SKIPPED peer {peer}: {reason}")
    profiled = {c.name: "icc-profile-data" in pyvips.Image.new_from_file(str(c)).get_fields() for c in corpus}
    results: dict[str, dict[str, list[dict[str, float]]]] = {p: {c.name: [] for c in corpus} for p in peers}
    qualities: dict[str, dict[str, dict[str, float]]] = {p: {} for p in peers}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for _ in range(ROUNDS):
            for photo in corpus:
                for peer in peers:
                    results[peer][photo.name].append(measure(peer, photo, work, profiled[photo.name]))
        for photo in corpus:
            full = reference(photo)
            for peer in peers:
                qualities[peer][photo.name] = quality(full, work / f"{peer}-{photo.stem}-browse.webp")
            del full

    def median(peer: str, photo: str, key: str) -> float:
        return statistics.median(r[key] for r in results[peer][photo])

    print(f"\nrender per photo, median of {ROUNDS} interleaved runs, fresh process each")
    print("cells: seconds / peak MB / both variants KB / browse SSIM against the lanczos3 reference")
    print(f"{'photo':30}" + "".join(f"{peer:>32}" for peer in peers))
    for photo in corpus:
        cells = [
            f"{median(p, photo.name, 'seconds'):6.3f}s {median(p, photo.name, 'peak_mb'):5.0f}MB "
            f"{median(p, photo.name, 'bytes') / 1024:5.0f}KB {qualities[p][photo.name]['ssim']:.4f}"
            for p in peers
        ]
        print(f"{photo.name:30}" + "".join(f"{c:>32}" for c in cells))
    sizes = []
    for p in peers:
        seen = sorted({f"{int(q['width'])}x{int(q['height'])}" for q in qualities[p].values()})
        sizes.append(seen[0] if len(seen) == 1 else "(varies by photo)")
    print("browse sizes: " + ", ".join(f"{p} {s}" for p, s in zip(peers, sizes, strict=True)))

    ratios: dict[str, dict[str, float]] = {}
    print("\nphoto-publish / peer, median over photos of the per-photo ratio of medians")
    for peer in peers[1:]:
        ratio = {
            key: statistics.median(
                median("photo-publish", c.name, key) / median(peer, c.name, key) for c in corpus
            )
            for key in ("seconds", "peak_mb", "bytes")
        }
        ratios[peer] = ratio
        print(
            f"  vs {peer:14} time x{ratio['seconds']:.2f}  peak memory x{ratio['peak_mb']:.2f}  "
            f"output bytes x{ratio['bytes']:.2f}"
        )

    ssim_drop = {
        peer: statistics.median(
            qualities[peer][c.name]["ssim"] - qualities["photo-publish"][c.name]["ssim"] for c in corpus
        )
        for peer in peers
    }
    peaks_24mp = {c.name: median("photo-publish", c.name, "peak_mb") for c in corpus if "24MP" in c.name}
    print_verdicts(ratios, ssim_drop, peaks_24mp, skipped)

    RESULTS.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "rounds": ROUNDS,
        "skipped": skipped,
        "photos": [c.name for c in corpus],
        "medians": {
            p: {
                c.name: {k: median(p, c.name, k) for k in ("seconds", "peak_mb", "bytes", "browse_bytes")}
                | {"ssim": qualities[p][c.name]["ssim"]}
                for c in corpus
            }
            for p in peers
        },
        "ratios": ratios,
        "runs": results,
    }
    (RESULTS / "compare.json").write_text(json.dumps(summary, indent=1))
    print(f"\nwritten {(RESULTS / 'compare.json').relative_to(ROOT)}")


if __name__ == "__main__":
    main()
