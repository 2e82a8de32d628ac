"""HEIC: decode time and peak memory of a 12-megapixel iPhone-like HEIC, against the same picture as a JPEG.

The picture is the corpus' 18-megapixel photograph (benchmarks/corpus.py) cut to 4:3 and resized to
4032 x 3024, an iPhone's 12 MP, then stored as an iPhone does (samples.heic: HEVC in 512 x 512
tiles, stored sideways with irot and EXIF 6, Display P3, about 3.4 MB), and as a JPEG stored the same way
(EXIF 6, Display P3, quality 92), made once into .local/bench-corpus.

Each measurement is a fresh process (MALLOC_ARENA_MAX=2, as in Lambda) that reports its wall time
and its peak resident memory (VmHWM), run as A B C D A B C D ... for ROUNDS rounds:
- heic-decode: pi-heif's decode of the HEIC alone (heic.decoded: the primary image, full size);
- heic-render: the whole pipeline on the HEIC (header, decode, browse, thumb, two WebPs);
- jpeg-render: the whole pipeline on the JPEG, the peer (shrink-on-load, streamed);
- imports, imports+pi_heif: a process doing nothing but the imports (the pipeline's, and pi-heif's
  too, as a HEIC's process has them), the floor under the JPEG's peak and under the HEIC's.
It prints medians, and pi_heif's import time in a fresh process that has imported the pipeline.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pyvips

from benchmarks.corpus import CORPUS, photos
from devkit import samples
from devkit.stack import ROOT

ROUNDS = 5
SIZE = (4032, 3024)

CHILD = r"""
import io, json, sys, time
sys.path[:0] = [{shared!r}]
peer, path = sys.argv[1], sys.argv[2]
data = open(path, "rb").read()
import pyvips
from photo_publish import heic
from photo_publish.pipeline import RenderOptions, render
if peer == "heic-decode":
    def run():
        with heic.decoded(data) as image:
            return image.width * image.height
elif peer.startswith("imports"):
    if peer == "imports+pi_heif":
        import pi_heif
    def run():
        return 0
else:
    def run():
        rendered = render(io.BytesIO(data), RenderOptions())
        return rendered.width * rendered.height
started = time.perf_counter()
pixels = run()
seconds = time.perf_counter() - started
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across fork and exec.
peak_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({{"seconds": seconds, "peak_mb": peak_kb / 1024, "pixels": pixels}}))
"""

IMPORT_TIME = r"""
import sys, time
sys.path[:0] = [{shared!r}]
import photo_publish.pipeline
started = time.perf_counter()
import pi_heif
print(time.perf_counter() - started)
"""

PEERS = ("heic-decode", "heic-render", "jpeg-render", "imports", "imports+pi_heif")
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


def child_env() -> dict[str, str]:
    return {"MALLOC_ARENA_MAX": "2", "PATH": "/usr/bin:/bin"}


def measure(peer: str, path: Path) -> dict[str, float]:
    code = CHILD.format(shared=str(ROOT / "shared"))
    out = subprocess.run(
        [sys.executable, "-c", code, peer, str(path)],
        capture_output=True,
        text=True,
        check=True,
        env=child_env(),
    )
    return json.loads(out.stdout)


def import_seconds() -> float:
    code = IMPORT_TIME.format(shared=str(ROOT / "shared"))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=child_env()
    )
    return float(out.stdout)


def main() -> None:
    files = pictures()
    path = {peer: files["jpeg" if peer in ("jpeg-render", "imports") else "heic"] for peer in PEERS}
    results: dict[str, list[dict[str, float]]] = {peer: [] for peer in PEERS}
    imports: list[float] = []
    for _ in range(ROUNDS):
        for peer in PEERS:
            results[peer].append(measure(peer, path[peer]))
        imports.append(import_seconds())

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
    print(f"import pi_heif after the pipeline: {statistics.median(imports) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
