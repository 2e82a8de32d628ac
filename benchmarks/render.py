"""`make bench`: the render of one photo, against peers measured in the same run, interleaved.

Each measurement is a fresh process that renders one photo (thumb fitting 400x400 and browse with
a long edge of 2048, WebP quality 80) and reports the render's wall time and its peak resident
memory. Peers, run as A B C A B C ... over the corpus:
- photo-publish: shared/photo_publish/pipeline.py (stream in, decode once at browse size);
- two-decodes: pyvips making each variant from the original, as the original worker did with sharp;
- pillow: draft mode, exif_transpose, LANCZOS resize, WebP (the usual Python choice).
It prints medians and the ratios against each peer; targets are checked as ratios, never as times.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.corpus import photos
from devkit.stack import ROOT

ROUNDS = 5

CHILD = r"""
import io, json, sys, time
sys.path[:0] = [{shared!r}]
peer, path = sys.argv[1], sys.argv[2]
data = open(path, "rb").read()
if peer == "photo-publish":
    from photo_publish.pipeline import RenderOptions, render
    def run():
        rendered = render(io.BytesIO(data), RenderOptions())
        return sum(len(v.data) for v in rendered.variants)
elif peer == "two-decodes":
    import pyvips
    pyvips.cache_set_max(0)
    def run():
        total = 0
        for size in (400, 2048):
            image = pyvips.Image.thumbnail_buffer(data, size, height=size, size="down")
            total += len(image.webpsave_buffer(Q=80, keep="none"))
        return total
else:
    from PIL import Image, ImageOps
    def run():
        image = Image.open(io.BytesIO(data))
        image.draft("RGB", (2048, 2048))
        image = ImageOps.exif_transpose(image).convert("RGB")
        browse = image.copy()
        browse.thumbnail((2048, 2048), Image.LANCZOS)
        thumb = browse.copy()
        thumb.thumbnail((400, 400), Image.LANCZOS)
        total = 0
        for im in (browse, thumb):
            out = io.BytesIO()
            im.save(out, "WEBP", quality=80, method=4)
            total += out.tell()
        return total
started = time.perf_counter()
size = run()
seconds = time.perf_counter() - started
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across fork and exec.
peak_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({{"seconds": seconds, "peak_mb": peak_kb / 1024, "bytes": size}}))
"""

PEERS = ("photo-publish", "two-decodes", "pillow")


def measure(peer: str, photo: Path) -> dict[str, float]:
    code = CHILD.format(shared=str(ROOT / "shared"))
    env = {"MALLOC_ARENA_MAX": "2", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code, peer, str(photo)], capture_output=True, text=True, check=True, env=env
    )
    return json.loads(out.stdout)


def main() -> None:
    corpus = photos()
    results: dict[str, dict[str, list[dict[str, float]]]] = {p: {c.name: [] for c in corpus} for p in PEERS}
    for _ in range(ROUNDS):
        for photo in corpus:
            for peer in PEERS:
                results[peer][photo.name].append(measure(peer, photo))

    def median(peer: str, photo: str, key: str) -> float:
        return statistics.median(r[key] for r in results[peer][photo])

    print(f"render per photo, median of {ROUNDS} interleaved runs (seconds / peak MB / output KB)")
    print(f"{'photo':32}" + "".join(f"{peer:>28}" for peer in PEERS))
    for photo in corpus:
        cells = [
            f"{median(p, photo.name, 'seconds'):8.3f}s {median(p, photo.name, 'peak_mb'):6.0f}MB "
            f"{median(p, photo.name, 'bytes') / 1024:6.0f}KB"
            for p in PEERS
        ]
        print(f"{photo.name:32}" + "".join(f"{c:>28}" for c in cells))
    print()
    for peer in PEERS[1:]:
        ratios = [
            median("photo-publish", c.name, "seconds") / median(peer, c.name, "seconds") for c in corpus
        ]
        memory = [
            median("photo-publish", c.name, "peak_mb") / median(peer, c.name, "peak_mb") for c in corpus
        ]
        print(
            f"photo-publish / {peer:12} time x{statistics.median(ratios):.2f}  peak memory x{statistics.median(memory):.2f}"
        )


if __name__ == "__main__":
    main()
