"""HEIC: decode time and peak memory of a 12-megapixel iPhone-like HEIC, against the same picture as a JPEG.

The picture is the corpus' 18-megapixel photograph (benchmarks/corpus.py) cut to 4:3 and resized to
4032 x 3024, an iPhone's 12 MP, then stored as an iPhone does (samples.heic: HEVC in 512 x 512
tiles, stored sideways with irot and EXIF 6, Display P3, about 3.4 MB), and as a JPEG stored the same way
(EXIF 6, Display P3, quality 92), made once into .local/bench-corpus.

Each measurement is a fresh process (benchmarks/child.py: MALLOC_ARENA_MAX=2, as in Lambda, the
file read into memory first, as an S3 body is) that reports its wall time and its peak resident
memory (VmHWM), run as A B C D E A B C D E ... for ROUNDS rounds:
- heic-decode: pi-heif's decode of the HEIC alone (heic.decoded: the primary image, full size);
- heic-render: the whole pipeline on the HEIC (header, decode, browse, thumb, two WebPs);
- jpeg-render: the whole pipeline on the JPEG, the peer (shrink-on-load, streamed);
- imports, imports+pi_heif: a process doing nothing but the imports (the pipeline's, and pi-heif's
  too, as a HEIC's process has them) with the file read, the floor under the JPEG's peak and under
  the HEIC's; imports+pi_heif's time is that of `import pi_heif` after the pipeline's imports.
It prints medians, and pi_heif's import time. BENCH_ROUNDS sets the rounds (default 5). Results go
to .local/bench-results/heic.json (benchmarks/report.py puts the HEIC in the cost table).
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import pyvips

from benchmarks import child
from benchmarks.corpus import CORPUS, photos
from devkit import samples
from devkit.stack import ROOT

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
SIZE = (4032, 3024)
RESULTS = ROOT / ".local" / "bench-results"

PEERS = ("heic-decode", "heic-render", "jpeg-render", "imports", "imports+pi_heif")
CHILD_PEER = {"heic-render": "photo-publish", "jpeg-render": "photo-publish"}  # else the same name
FLOOR = {"heic-decode": "imports+pi_heif", "heic-render": "imports+pi_heif", "jpeg-render": "imports"}


def pictures() -> dict[str, Path]:
    """The 12 MP HEIC and JPEG (made once, then kept in .local/bench-corpus)."""
    made = {"heic": CORPUS / "Elephants-12MP-iPhone.heic", "jpeg": CORPUS / "Elephants-12MP-iPhone.jpg"}
    if not all(path.exists() for path in made.values()):
        source = pyvips.Image.new_from_file(str(photos()[0])).copy_memory()
        width = source.height * SIZE[0] // SIZE[1]
        four_three = source.crop((source.width - width) // 2, 0, width, source.height)
        upright = four_three.resize(SIZE[0] / four_three.width).crop(0, 0, *SIZE).copy_memory()
        # Quality 50: about 3.4 MB, an iPhone's usual size for 12 MP (quality 90 would make 10 MB).
        made["heic"].write_bytes(samples.heic(upright, 6, profile="p3", quality=50))
        p3 = upright.icc_transform("p3", input_profile="srgb")
        made["jpeg"].write_bytes(samples.oriented_jpeg(p3, 6))
    return made


def main() -> None:
    files = pictures()
    path = {peer: files["jpeg" if peer in ("jpeg-render", "imports") else "heic"] for peer in PEERS}
    results: dict[str, list[dict[str, float]]] = {peer: [] for peer in PEERS}
    for _ in range(ROUNDS):
        for peer in PEERS:
            results[peer].append(child.measure(CHILD_PEER.get(peer, peer), path[peer]))

    def median(peer: str, key: str) -> float:
        return statistics.median(r[key] for r in results[peer])

    print(
        f"{SIZE[0]}x{SIZE[1]} ({SIZE[0] * SIZE[1] / 1e6:.1f} MP): HEIC {files['heic'].stat().st_size / 1e6:.1f} MB, "
        f"JPEG {files['jpeg'].stat().st_size / 1e6:.1f} MB; median of {ROUNDS} fresh processes, "
        f"{len(os.sched_getaffinity(0))} CPUs"
    )

    def over(peer: str) -> float:
        return median(peer, "peak_mb") - median(FLOOR[peer], "peak_mb")

    print(f"{'':16}{'seconds':>10}{'peak MB':>10}{'MB over its imports':>22}")
    for peer in PEERS:
        extra = f"{over(peer):22.0f}" if peer in FLOOR else ""
        print(f"{peer:16}{median(peer, 'seconds'):10.3f}{median(peer, 'peak_mb'):10.0f}{extra}")
    print()
    time_ratio = median("heic-render", "seconds") / median("jpeg-render", "seconds")
    print(
        f"heic-render / jpeg-render: time x{time_ratio:.2f}, "
        f"memory over imports x{over('heic-render') / over('jpeg-render'):.2f}"
    )
    print(f"import pi_heif after the pipeline: {median('imports+pi_heif', 'seconds') * 1000:.0f} ms")
    RESULTS.mkdir(parents=True, exist_ok=True)
    summary = {
        "rounds": ROUNDS,
        "size": SIZE,
        "medians": {peer: {key: median(peer, key) for key in ("seconds", "peak_mb")} for peer in PEERS},
        "runs": results,
    }
    (RESULTS / "heic.json").write_text(json.dumps(summary, indent=1))
    print(f"written {(RESULTS / 'heic.json').relative_to(ROOT)}")


if __name__ == "__main__":
    main()
