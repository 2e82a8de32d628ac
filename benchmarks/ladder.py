"""Issue 24: the responsive ladder and AVIF, against today's two-variant render, in one run.

Three parts, each printed as a table, with verdicts where the issue sets a target:

1. The AVIF curve (how AVIF_QUALITY and AVIF_EFFORT were chosen). Pictures: the bench corpus'
   photograph (benchmarks/corpus.py: its other photos are the same picture resized, rotated or in
   Display P3, identical once at ladder size) and the seven sample photographs (tests/images). Each
   made as the pipeline makes a ladder step: the browse (one decode at long edge 2048, sRGB), then
   resized to CURVE_EDGE. That step encoded as WebP at the recipe's settings (quality 80, effort 2)
   and as AVIF at each effort of EFFORTS and quality of QUALITIES; each encode scored by
   SSIMULACRA2 (the `ssimulacra2` package) against the step. Per picture and effort, the AVIF
   quality and bytes at WebP's score are interpolated along the curve (linear in quality, log in
   bytes); per effort, the median quality, the bytes summed over pictures against WebP's, and the
   encode's CPU time against WebP's. The encode times of the whole ladder at each effort go into
   part 2's estimate.
2. The cost (the issue's targets). Photos: the corpus' 8 to 24 MP JPEGs (benchmarks/corpus.py
   photos()) and its 1 to 2 MP ones (small_photos()). Configurations, each a RenderOptions of the
   pipeline's render() on a file stream: `two` (thumb and browse alone: VARIANT_WIDTHS=none, the
   render before the ladder), `ladder` (the default ladder, WebP), `ladder+avif` (webp,avif), and
   why not others: `ladder+avif e1` (AVIF at effort 1, quality 51: its equal-score quality) and
   `320-1280` (the ladder 320, 640, 960, 1280, without the browse's size). In one process,
   ROUNDS rounds of every photo in every configuration in turn; each render's CPU seconds (the
   process', all libvips threads: what one Lambda vCPU pays; wall seconds beside it, which the other
   loads of a shared 2-core machine disturb more). Ratio per photo: the median of its renders over
   the median of its `two` renders; the verdict reads the median over the large photos. Peak memory:
   each photo in each configuration in a fresh process (VmHWM, benchmarks/child.py's reading), the
   largest of the large photos against `two`'s.
3. Bytes and SSIMULACRA2 per step and format: every picture of part 1 through render() with the
   chosen settings, each ladder variant decoded and scored against its step as the pipeline resized
   it; medians per step and format, and docs/benchmarks/ladder.png (bytes and score by width, and
   part 1's curve).

Targets (verdicts, not assertions): ladder <= 1.35x two, ladder+avif <= 2.0x two, peak memory
within 10% of two's. BENCH_ROUNDS sets part 2's rounds (default 5). Results go to
.local/bench-results/ladder.json.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyvips

from benchmarks import child
from benchmarks.corpus import photos, small_photos
from benchmarks.placeholder import browse_of
from devkit import samples
from devkit.stack import ROOT
from photo_publish.image import ladder
from photo_publish.image.pipeline import RenderOptions, render

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
RESULTS = ROOT / ".local" / "bench-results"
PLOT = ROOT / "docs" / "benchmarks" / "ladder.png"
CURVE_EDGE = 960
QUALITIES = (35, 45, 55, 65, 75)
EFFORTS = (0, 1, 2, 3, 4)
LADDER_TARGET = 1.35
AVIF_TARGET = 2.0
PEAK_TARGET = 1.10

DEFAULTS = RenderOptions()
CONFIGS = {
    "two": replace(DEFAULTS, variant_widths=()),
    "ladder": DEFAULTS,
    "ladder+avif": replace(DEFAULTS, variant_formats=("webp", "avif")),
    # Why not these: AVIF one effort up (at its equal-score quality), and the ladder of 320 to 1280.
    "ladder+avif e1": replace(DEFAULTS, variant_formats=("webp", "avif"), avif_effort=1, avif_quality=51),
    "320-1280": replace(DEFAULTS, variant_widths=(320, 640, 960, 1280)),
}


def pictures() -> list[Path]:
    """The corpus' photograph and the sample photographs: distinct pictures."""
    return [photos()[0], *sorted(samples.IMAGES.glob("*.jpg"))]


def step_of(browse: pyvips.Image, edge: int) -> pyvips.Image:
    """A ladder step as the pipeline resizes it from the browse."""
    if edge >= max(browse.width, browse.height):
        return browse
    return browse.thumbnail_image(edge, height=edge).copy_memory()


def ssimulacra2(reference: pyvips.Image, encoded: bytes) -> float:
    from ssimulacra2 import compute_ssimulacra2

    distorted = pyvips.Image.new_from_buffer(encoded, "")
    score: float = compute_ssimulacra2(
        io.BytesIO(reference.pngsave_buffer(compression=1)),
        io.BytesIO(distorted.pngsave_buffer(compression=1)),
    )
    return score


def cpu_timed(run: Callable[..., bytes], *args: Any) -> tuple[bytes, float]:
    started = time.process_time()
    data = run(*args)
    return data, time.process_time() - started


def webp(image: pyvips.Image, options: RenderOptions = DEFAULTS) -> bytes:
    return bytes(image.webpsave_buffer(Q=options.quality, effort=options.effort, keep="none"))


def avif(image: pyvips.Image, quality: int, effort: int) -> bytes:
    return bytes(image.heifsave_buffer(Q=quality, effort=effort, compression="av1", keep="none"))


# --- part 1: the AVIF curve -----------------------------------------------------------------------


def at_score(target: float, points: Sequence[tuple[int, float, int, float]]) -> tuple[float, float, float]:
    """Along one picture's curve at one effort ((quality, score, bytes, seconds), by quality): the
    quality, bytes and encode seconds where the score is `target`, linearly between the two
    qualities around it (bytes geometrically); clamped at the curve's ends."""
    ordered = sorted(points, key=lambda p: p[1])
    if target <= ordered[0][1]:
        return float(ordered[0][0]), float(ordered[0][2]), ordered[0][3]
    for low, high in itertools.pairwise(ordered):
        if low[1] <= target <= high[1]:
            t = (target - low[1]) / (high[1] - low[1]) if high[1] > low[1] else 0.0
            size = math.exp(math.log(low[2]) + t * (math.log(high[2]) - math.log(low[2])))
            return low[0] + t * (high[0] - low[0]), size, low[3] + t * (high[3] - low[3])
    return float(ordered[-1][0]), float(ordered[-1][2]), ordered[-1][3]


def curve() -> dict[str, Any]:
    per_picture: dict[str, Any] = {}
    for picture in pictures():
        browse = browse_of(picture)
        step = step_of(browse, CURVE_EDGE)
        data, seconds = cpu_timed(webp, step)
        entry: dict[str, Any] = {
            "webp": {"bytes": len(data), "score": ssimulacra2(step, data), "seconds": seconds}
        }
        for effort in EFFORTS:
            points = []
            for quality in QUALITIES:
                encoded, seconds = cpu_timed(avif, step, quality, effort)
                points.append((quality, ssimulacra2(step, encoded), len(encoded), seconds))
            entry[f"avif-e{effort}"] = points
        # The whole ladder's AVIF encode at each effort (CPU seconds at quality 50): part 2's estimate.
        steps = [
            step_of(browse, edge)
            for edge in ladder.steps(DEFAULTS.variant_widths, max(browse.width, browse.height))
        ]
        entry["ladder_seconds"] = {
            str(effort): sum(cpu_timed(avif, s, 50, effort)[1] for s in steps) for effort in EFFORTS
        }
        entry["ladder_webp_seconds"] = sum(cpu_timed(webp, s)[1] for s in steps)
        per_picture[picture.name] = entry
        print(
            f"  {picture.name}: WebP {entry['webp']['bytes']} B, SSIMULACRA2 {entry['webp']['score']:.1f}",
            flush=True,
        )

    summary = {}
    for effort in EFFORTS:
        matched = [
            at_score(entry["webp"]["score"], entry[f"avif-e{effort}"]) for entry in per_picture.values()
        ]
        webp_bytes = sum(entry["webp"]["bytes"] for entry in per_picture.values())
        webp_seconds = sum(entry["webp"]["seconds"] for entry in per_picture.values())
        summary[effort] = {
            "quality": statistics.median(q for q, _, _ in matched),
            "bytes_ratio": sum(b for _, b, _ in matched) / webp_bytes,
            "seconds_ratio": sum(s for _, _, s in matched) / webp_seconds,
            "ladder_seconds": statistics.median(
                float(e["ladder_seconds"][str(effort)]) for e in per_picture.values()
            ),
        }
    return {"pictures": per_picture, "summary": {str(k): v for k, v in summary.items()}}


def print_curve(result: dict[str, Any]) -> None:
    print(
        f"\nAVIF against WebP (quality {DEFAULTS.quality}, effort {DEFAULTS.effort}) at equal SSIMULACRA2, "
        f"step of long edge {CURVE_EDGE}, {len(result['pictures'])} pictures"
    )
    print(
        f"{'effort':>8}{'quality at WebP score':>24}{'bytes vs WebP':>16}{'encode CPU vs WebP':>21}{'ladder s (median)':>20}"
    )
    for effort, row in result["summary"].items():
        print(
            f"{effort:>8}{row['quality']:24.1f}{row['bytes_ratio']:16.1%}{row['seconds_ratio']:20.1f}x"
            f"{row['ladder_seconds']:20.3f}"
        )
    print(
        f"\n{'picture':22}{'WebP B':>9}{'score':>7}"
        + "".join(f"{'e' + str(e) + ' q@score':>11}" for e in EFFORTS)
    )
    for name, entry in result["pictures"].items():
        qualities = "".join(
            f"{at_score(entry['webp']['score'], entry[f'avif-e{e}'])[0]:11.1f}" for e in EFFORTS
        )
        print(f"{name:22}{entry['webp']['bytes']:9}{entry['webp']['score']:7.1f}{qualities}")


# --- part 2: the cost ----------------------------------------------------------------------------


def render_times(photo: Path, options: RenderOptions) -> tuple[float, float]:
    """CPU and wall seconds of one render from a file stream."""
    with photo.open("rb") as stream:
        cpu, wall = time.process_time(), time.perf_counter()
        render(stream, options)
        return time.process_time() - cpu, time.perf_counter() - wall


PEAK = """
import json, sys
from dataclasses import replace
from photo_publish.image.pipeline import RenderOptions, render
from benchmarks.child import status_mb
changed = json.loads(sys.argv[1])
changed = {k: tuple(v) if isinstance(v, list) else v for k, v in changed.items()}
options = replace(RenderOptions(), **changed)
with open(sys.argv[2], "rb") as stream:
    render(stream, options)
print(json.dumps({"peak_mb": status_mb("VmHWM")}))
"""


def peak_mb(photo: Path, options: RenderOptions) -> float:
    changed = {
        "variant_widths": list(options.variant_widths),
        "variant_formats": list(options.variant_formats),
    }
    out = subprocess.run(
        [sys.executable, "-c", PEAK, json.dumps(changed), str(photo)],
        capture_output=True,
        text=True,
        env=child.env(),
        cwd=ROOT,
        check=True,
    )
    peak: float = json.loads(out.stdout.strip().splitlines()[-1])["peak_mb"]
    return peak


def costs() -> dict[str, Any]:
    large, small = photos(), small_photos()
    corpus = [*large, *small]
    for photo in corpus:  # warm-up: libvips' first run, the AV1 encoder's first load
        for options in CONFIGS.values():
            render_times(photo, options)
    cpu: dict[str, dict[str, list[float]]] = {p.name: {c: [] for c in CONFIGS} for p in corpus}
    wall: dict[str, dict[str, list[float]]] = {p.name: {c: [] for c in CONFIGS} for p in corpus}
    for _ in range(ROUNDS):
        for photo in corpus:
            for name, options in CONFIGS.items():
                seconds, elapsed = render_times(photo, options)
                cpu[photo.name][name].append(seconds)
                wall[photo.name][name].append(elapsed)
    peaks = {p.name: {name: peak_mb(p, options) for name, options in CONFIGS.items()} for p in large}
    return {
        "large": [p.name for p in large],
        "small": [p.name for p in small],
        "cpu": {p: {c: statistics.median(v) for c, v in per.items()} for p, per in cpu.items()},
        "wall": {p: {c: statistics.median(v) for c, v in per.items()} for p, per in wall.items()},
        "peak_mb": peaks,
    }


def ratios(result: dict[str, Any], clock: str, names: list[str], config: str) -> float:
    return statistics.median(result[clock][n][config] / result[clock][n]["two"] for n in names)


def print_costs(result: dict[str, Any]) -> dict[str, float]:
    print(
        f"\nrender cost per configuration, one process, {ROUNDS} rounds, medians; CPU seconds "
        f"(wall in brackets), {len(os.sched_getaffinity(0))} CPUs shared with other work"
    )
    print(f"{'photo':32}" + "".join(f"{name:>20}" for name in CONFIGS))
    for photo in result["cpu"]:
        cells = "".join(f"{result['cpu'][photo][c]:11.3f} ({result['wall'][photo][c]:5.3f})" for c in CONFIGS)
        print(f"{photo:32}{cells}")
    print(f"\n{'ratio to two (median over photos)':40}{'large CPU':>12}{'large wall':>12}{'small CPU':>12}")
    for config in CONFIGS:
        print(
            f"{config:40}{ratios(result, 'cpu', result['large'], config):12.2f}"
            f"{ratios(result, 'wall', result['large'], config):12.2f}{ratios(result, 'cpu', result['small'], config):12.2f}"
        )
    print(
        f"\npeak memory (VmHWM, MB, a fresh process per render)\n{'photo':32}"
        + "".join(f"{c:>14}" for c in CONFIGS)
    )
    for photo, peaks in result["peak_mb"].items():
        print(f"{photo:32}" + "".join(f"{peaks[c]:14.1f}" for c in CONFIGS))
    peak = {c: max(p[c] for p in result["peak_mb"].values()) for c in CONFIGS}
    worst = {c: max(p[c] / p["two"] for p in result["peak_mb"].values()) for c in CONFIGS}
    print(
        "largest peak over the photos against two's: "
        + ", ".join(f"{c} {peak[c] / peak['two']:.2f}x" for c in CONFIGS)
        + "; one photo's at most: "
        + ", ".join(f"{c} {worst[c]:.2f}x" for c in CONFIGS)
    )
    return {
        "ladder": ratios(result, "cpu", result["large"], "ladder"),
        "ladder+avif": ratios(result, "cpu", result["large"], "ladder+avif"),
        "peak_ladder": peak["ladder"] / peak["two"],
        "peak_avif": peak["ladder+avif"] / peak["two"],
        "photo_peak_ladder": worst["ladder"],
        "photo_peak_avif": worst["ladder+avif"],
    }


# --- part 3: bytes and SSIMULACRA2 per step and format ---------------------------------------------


def per_step() -> dict[str, Any]:
    options = CONFIGS["ladder+avif"]
    rows: dict[str, list[dict[str, Any]]] = {}
    for picture in pictures():
        browse = browse_of(picture)
        with picture.open("rb") as stream:
            rendered = render(stream, options)
        for variant in rendered.variants:
            if variant.kind in ("thumb", "browse"):
                continue
            edge = int(variant.kind[1:].split("-")[0])
            row = {
                "picture": picture.name,
                # a picture smaller than a step has its larger steps collapsed into one at its size
                "step": str(edge) if edge in options.variant_widths else "collapsed",
                "edge": edge,
                "width": variant.width,
                "bytes": len(variant.data),
                "score": ssimulacra2(step_of(browse, edge), variant.data),
            }
            rows.setdefault(variant.kind.split("-")[1], []).append(row)
        print(f"  {picture.name}: scored", flush=True)
    table = {
        fmt: {
            step: {
                "bytes": statistics.median(r["bytes"] for r in entries if r["step"] == step),
                "score": statistics.median(r["score"] for r in entries if r["step"] == step),
                "pictures": sum(r["step"] == step for r in entries),
            }
            for step in sorted({r["step"] for r in entries}, key=lambda s: int(s) if s.isdigit() else 10**6)
        }
        for fmt, entries in rows.items()
    }
    return {"rows": rows, "table": table}


def print_steps(result: dict[str, Any]) -> None:
    print(
        f"\nbytes and SSIMULACRA2 per step (median over {len(pictures())} pictures; WebP quality "
        f"{DEFAULTS.quality} effort {DEFAULTS.effort}, AVIF quality {DEFAULTS.avif_quality} effort {DEFAULTS.avif_effort})"
    )
    print(
        f"{'long edge':>10}{'pictures':>10}"
        + "".join(f"{fmt + ' bytes':>14}{fmt + ' score':>12}" for fmt in result["table"])
    )
    for step, cell in result["table"]["webp"].items():
        cells = "".join(
            f"{result['table'][fmt][step]['bytes']:14.0f}{result['table'][fmt][step]['score']:12.1f}"
            for fmt in result["table"]
        )
        print(f"{step:>10}{cell['pictures']:>10}{cells}")
    print("(collapsed: the top step of a picture smaller than it, at the picture's own long edge)")


def plot(curves: dict[str, Any], steps: dict[str, Any]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (by_width, by_score) = plt.subplots(1, 2, figsize=(13, 5))
    score_axis = by_width.twinx()
    for fmt, colour in (("webp", "tab:blue"), ("avif", "tab:orange")):
        table = steps["table"].get(fmt, {})
        edges = sorted(int(e) for e in table if e.isdigit())
        by_width.plot(
            edges, [table[str(e)]["bytes"] / 1000 for e in edges], "o-", color=colour, label=f"{fmt} KB"
        )
        score_axis.plot(
            edges,
            [table[str(e)]["score"] for e in edges],
            "s--",
            color=colour,
            alpha=0.6,
            label=f"{fmt} SSIMULACRA2",
        )
    by_width.set(
        xlabel="ladder step (long edge, px)", ylabel="KB (median)", title="the ladder: bytes and quality"
    )
    score_axis.set_ylabel("SSIMULACRA2 (median; dashed)")
    score_axis.set_ylim(50, 100)
    by_width.legend(loc="upper left")
    score_axis.legend(loc="lower right")

    summary = curves["summary"]
    costs_ = [summary[str(e)]["seconds_ratio"] for e in EFFORTS]
    sizes = [summary[str(e)]["bytes_ratio"] for e in EFFORTS]
    by_score.plot(costs_, sizes, "o-", color="tab:orange", label="AVIF at WebP's SSIMULACRA2")
    for effort, x, y in zip(EFFORTS, costs_, sizes, strict=True):
        quality = summary[str(effort)]["quality"]
        by_score.annotate(
            f"effort {effort}, q{quality:.0f}", (x, y), textcoords="offset points", xytext=(6, 4)
        )
    by_score.plot([1.0], [1.0], "k*", markersize=14, label=f"WebP q{DEFAULTS.quality} e{DEFAULTS.effort}")
    by_score.set_xscale("log")
    by_score.set(
        xlabel="encode CPU time, relative to WebP's (log)",
        ylabel="bytes at equal SSIMULACRA2, relative to WebP's",
        title=f"AVIF's curve at long edge {CURVE_EDGE} ({len(curves['pictures'])} pictures)",
    )
    by_score.grid(alpha=0.3)
    by_score.legend(fontsize=8)
    figure.tight_layout()
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(PLOT, dpi=100)
    return PLOT


def verdict(label: str, value: float, target: float, unit: str = "x") -> None:
    shown = f"{value:.2f}{unit}"
    print(f"  {label:60} {shown:>8}  {'MET' if value <= target else 'MISSED'}")


def main() -> None:
    saved = RESULTS / "ladder-curve.json"
    if sys.argv[1:] == ["rest"]:  # parts 2 and 3, part 1 read from its last run
        curves = json.loads(saved.read_text())
    else:
        print("part 1: the AVIF curve", flush=True)
        curves = curve()
        RESULTS.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps(curves, indent=1))
    print_curve(curves)
    if sys.argv[1:] == ["curve"]:  # part 1 alone: choosing the settings
        return
    print("\npart 2: the cost", flush=True)
    cost = costs()
    measured = print_costs(cost)
    print("\npart 3: bytes and SSIMULACRA2 per step", flush=True)
    steps = per_step()
    print_steps(steps)
    print("\ntargets (verdicts, not assertions)")
    verdict("default ladder / two variants, CPU, large photos (<= 1.35x)", measured["ladder"], LADDER_TARGET)
    verdict(
        "ladder in WebP + AVIF / two variants, CPU, large photos (<= 2.0x)",
        measured["ladder+avif"],
        AVIF_TARGET,
    )
    verdict(
        "largest peak memory over the photos, ladder / two (<= 1.10x)", measured["peak_ladder"], PEAK_TARGET
    )
    verdict("largest peak memory, ladder WebP + AVIF / two (<= 1.10x)", measured["peak_avif"], PEAK_TARGET)
    print(
        f"  (one photo's own peak against its two-variant render's, at most: ladder "
        f"{measured['photo_peak_ladder']:.2f}x, WebP + AVIF {measured['photo_peak_avif']:.2f}x)"
    )
    target = plot(curves, steps)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "ladder.json").write_text(
        json.dumps(
            {"rounds": ROUNDS, "curve": curves, "cost": cost, "ratios": measured, "steps": steps}, indent=1
        )
    )
    print(f"\nwritten {(RESULTS / 'ladder.json').relative_to(ROOT)} and {target.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
