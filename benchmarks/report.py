"""Issue #7, parts 6 and 7: the Lambda cost table and the plots, from the other benchmarks' results.

Cost (part 6). Lambda gives a function 1 vCPU at 1,769 MB and 2 vCPUs at 3,538 MB; this machine's
render time is measured here both ways, photo-publish rendering each corpus photo in a fresh process
(benchmarks/child.py: MALLOC_ARENA_MAX=2, the photo in memory, the render alone timed), pinned to
one core (`taskset -c 0`, for 1,769 MB) and on two cores (3,538 MB), ROUNDS rounds interleaved, and
the median over the corpus taken. GB-seconds per 1,000 photos are that
time x the memory in GB (MB / 1024) x 1,000, billed to the millisecond; $ adds the request charge.
Prices (us-east-1, the published Lambda prices): x86_64 $0.0000166667 per GB-s, arm64 $0.0000133334
per GB-s, $0.20 per 1M requests. The render time is this x86_64 machine's for both architectures
(arm64 is not measured here: its row differs by price only). The render alone: the S3 read and
writes, the database and the handler's own start are not in it. The 12 MP iPhone-like HEIC of
benchmarks/heic.py is timed the same way, in its own rows, with its decode time and peak memory
from .local/bench-results/heic.json (benchmarks.heic) when there. It prints the memory size that
costs least per photo, the one the template should default to, and from delivery.json
(benchmarks.delivery) what a photo costs when the whole invocation is billed.

Plots (part 7), PNG, written to docs/benchmarks/ (where docs/performance.md shows them), from .local/bench-results/compare.json (benchmarks.compare) and memory.json
(benchmarks.memory), whichever exist: compare.png (render time, peak memory and SSIM per photo and
peer) and memory.png (RSS over BENCH_RENDERS renders per allocator setting).

BENCH_ROUNDS sets the rounds of the cost timing (default 3, about a minute on 2 cores).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from benchmarks import child
from benchmarks.corpus import photos
from benchmarks.heic import pictures
from devkit.stack import ROOT

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
RESULTS = ROOT / ".local" / "bench-results"
# docs/performance.md shows these: each full run replaces them, to be committed with its figures.
PLOTS = ROOT / "docs" / "benchmarks"
PRICE_GB_S = {"arm64": 0.0000133334, "x86_64": 0.0000166667}
PRICE_REQUEST = 0.20 / 1_000_000
MEMORY_MB = {1769: "0", 3538: "0,1"}  # Lambda memory size -> the cores it is measured on here


def render_seconds(cores: str, photo: Path) -> float:
    return float(child.measure("photo-publish", photo, prefix=("taskset", "-c", cores))["seconds"])


def cost_rows(seconds: dict[int, float]) -> list[dict[str, Any]]:
    """GB-s and dollars per 1,000 renders at each memory size and architecture."""
    rows = []
    for arch, price in PRICE_GB_S.items():
        for mb in MEMORY_MB:
            billed = math.ceil(seconds[mb] * 1000) / 1000
            gb_s = billed * mb / 1024 * 1000
            dollars = gb_s * price + 1000 * PRICE_REQUEST
            rows.append({"arch": arch, "memory_mb": mb, "seconds": seconds[mb], "gb_s": gb_s, "usd": dollars})
    return rows


def cost_table() -> dict[str, Any]:
    if shutil.which("taskset") is None:
        print("SKIPPED cost table: taskset is missing (util-linux)")
        return {}
    corpus = photos()
    heic_photo = pictures()["heic"]
    runs: dict[int, dict[str, list[float]]] = {
        mb: {c.name: [] for c in [*corpus, heic_photo]} for mb in MEMORY_MB
    }
    for _ in range(ROUNDS):
        for photo in [*corpus, heic_photo]:
            for mb, cores in MEMORY_MB.items():
                runs[mb][photo.name].append(render_seconds(cores, photo))
    seconds = {
        mb: statistics.median(statistics.median(per_photo[c.name]) for c in corpus)
        for mb, per_photo in runs.items()
    }
    heic_seconds = {mb: statistics.median(per_photo[heic_photo.name]) for mb, per_photo in runs.items()}
    print(f"Lambda cost per 1,000 photos, render time measured here (median of {ROUNDS} runs)")
    print("prices: x86_64 $0.0000166667/GB-s, arm64 $0.0000133334/GB-s, $0.20 per 1M requests")
    print(
        f"{'photos':26}{'arch':8}{'memory':>9}{'cores here':>12}{'render s':>10}{'GB-s/1000':>11}{'$/1000':>10}"
    )
    rows = cost_rows(seconds)
    heic_rows = cost_rows(heic_seconds)
    for label, table in (("corpus JPEGs (median)", rows), ("12 MP iPhone HEIC", heic_rows)):
        for row in table:
            cores = len(MEMORY_MB[row["memory_mb"]].split(","))
            print(
                f"{label:26}{row['arch']:8}{row['memory_mb']:>6} MB{cores:>12}{row['seconds']:>10.3f}"
                f"{row['gb_s']:>11.0f}{row['usd']:>10.4f}"
            )
    cheapest = min((r for r in rows if r["arch"] == "arm64"), key=lambda r: r["gb_s"])
    print(
        f"cheapest per photo: {cheapest['memory_mb']} MB ({cheapest['gb_s']:.0f} GB-s per 1,000 photos); "
        f"render time at {max(MEMORY_MB)} MB x{seconds[max(MEMORY_MB)] / seconds[min(MEMORY_MB)]:.2f} "
        f"that at {min(MEMORY_MB)} MB"
    )
    heic = RESULTS / "heic.json"
    if heic.exists():
        medians = json.loads(heic.read_text())["medians"]
        print(
            "12 MP HEIC (benchmarks.heic, both cores): pi-heif's decode "
            f"{medians['heic-decode']['seconds']:.2f} s, peak {medians['heic-decode']['peak_mb']:.0f} MB; "
            f"whole render {medians['heic-render']['seconds']:.2f} s, peak {medians['heic-render']['peak_mb']:.0f} MB "
            f"(the same photo as a JPEG: {medians['jpeg-render']['seconds']:.2f} s, "
            f"{medians['jpeg-render']['peak_mb']:.0f} MB)"
        )
    else:
        print(f"HEIC decode and peak memory: no {heic.relative_to(ROOT)} (run benchmarks.heic first)")
    delivery = RESULTS / "delivery.json"
    if delivery.exists():
        # Lambda bills the whole invocation: the batch's wall time, S3, claim and commit included.
        result = json.loads(delivery.read_text())
        per_photo = result["medians"]["delivery"] / len(result["photos"])
        mb = max(MEMORY_MB)
        gb_s = per_photo * mb / 1024 * 1000
        print(
            f"whole delivery (benchmarks.delivery, both cores, {len(result['photos'])}-record batches): "
            f"{per_photo:.3f} s per photo, {gb_s:.0f} GB-s per 1,000 photos at {mb} MB "
            f"(${gb_s * PRICE_GB_S['arm64'] + 1000 * PRICE_REQUEST / len(result['photos']):.4f} arm64)"
        )
    return {"rounds": ROUNDS, "seconds": seconds, "rows": rows, "heic_rows": heic_rows, "runs": runs}


def plot_compare(compare: dict[str, Any]) -> Path:
    medians = compare["medians"]
    peers = list(medians)
    names = compare["photos"]
    labels = [n.removeprefix("Elephants-").removesuffix(".jpg") for n in names]
    figure, axes = plt.subplots(1, 3, figsize=(17, 5))
    width = 0.8 / len(peers)
    for axis, key, title in zip(
        axes,
        ("seconds", "peak_mb", "ssim"),
        ("render time (s, median)", "peak memory (MB, VmHWM)", "browse SSIM vs lanczos3 reference"),
        strict=True,
    ):
        for i, peer in enumerate(peers):
            values = [medians[peer][n][key] for n in names]
            axis.bar([x + i * width for x in range(len(names))], values, width, label=peer)
        axis.set_xticks([x + 0.4 - width / 2 for x in range(len(names))], labels, rotation=20)
        axis.set_title(title)
        if key == "ssim":
            low = min(medians[p][n][key] for p in peers for n in names)
            axis.set_ylim(low - 0.005, 1.0)
    axes[0].legend()
    figure.suptitle(f"render per photo, fresh process, median of {compare['rounds']} interleaved runs")
    figure.tight_layout()
    target = PLOTS / "compare.png"
    figure.savefig(target, dpi=100)
    plt.close(figure)
    return target


def plot_memory(memory: dict[str, Any]) -> Path:
    figure, axis = plt.subplots(figsize=(8, 5))
    for name, result in memory["over_time"].items():
        samples = result["samples"]
        axis.plot([s["photo"] for s in samples], [s["rss_mb"] for s in samples], linewidth=0.8, label=name)
    axis.set_xlabel("photos rendered by one process")
    axis.set_ylabel("resident set (MB, VmRSS)")
    axis.set_ylim(bottom=0)
    axis.set_title("memory over time, one process per allocator setting (corpus JPEGs in turn)")
    axis.legend()
    figure.tight_layout()
    target = PLOTS / "memory.png"
    figure.savefig(target, dpi=100)
    plt.close(figure)
    return target


def main() -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    summary = cost_table()
    if summary:
        (RESULTS / "cost.json").write_text(json.dumps(summary, indent=1))
    for name, plot in (("compare.json", plot_compare), ("memory.json", plot_memory)):
        source = RESULTS / name
        if not source.exists():
            print(f"SKIPPED plot: no {source.relative_to(ROOT)} (run its benchmark first)")
            continue
        data = json.loads(source.read_text())
        if name == "memory.json" and "over_time" not in data:
            print("SKIPPED plot: memory.json has no over_time results")
            continue
        print(f"written {plot(data).relative_to(ROOT)}")


if __name__ == "__main__":
    main()
