"""The benchmark corpus: large real photographs from Debian's packages, and hard cases made from them.

Debian's `mate-backgrounds` (GPL-2+) ships an 18-megapixel photograph; `apt-get download` fetches it
without installing anything. A 24-megapixel JPEG is made from it (resampled), plus sideways (EXIF 6)
and Display P3 versions, so the corpus spans 8 to 24 megapixels with orientations and profiles.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pyvips

from devkit import samples
from devkit.stack import ROOT

CORPUS = ROOT / ".local" / "bench-corpus"
PACKAGE_FILE = "usr/share/backgrounds/mate/abstract/Elephants_5640x3172.jpg"


def _fetch_package_photo() -> Path:
    target = CORPUS / "Elephants-18MP.jpg"
    if target.exists():
        return target
    CORPUS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        try:
            subprocess.run(["apt-get", "download", "-qq", "mate-backgrounds"], cwd=work, check=True)
        except (OSError, subprocess.CalledProcessError) as error:
            raise SystemExit(
                f"the corpus needs Debian's mate-backgrounds package: `apt-get download mate-backgrounds` "
                f"failed ({error}); without package lists, run `apt-get update` as root first"
            ) from None
        deb = next(Path(work).glob("mate-backgrounds_*.deb"))
        subprocess.run(["dpkg-deb", "-x", str(deb), str(Path(work) / "x")], check=True)
        shutil.copy(Path(work) / "x" / PACKAGE_FILE, target)
    return target


def photos() -> list[Path]:
    """8 to 24 megapixel JPEGs (made once, then kept in .local/bench-corpus)."""
    source = _fetch_package_photo()
    made = {
        "Elephants-24MP.jpg": lambda im: im.resize(6000 / im.width).jpegsave_buffer(Q=92),
        "Elephants-24MP-sideways.jpg": lambda im: samples.oriented_jpeg(im.resize(6000 / im.width), 6),
        "Elephants-12MP-P3.jpg": lambda im: samples.profiled_jpeg(im.resize(4240 / im.width), "p3"),
        "Elephants-8MP.jpg": lambda im: im.resize(3460 / im.width).jpegsave_buffer(Q=90),
    }
    return [source, *_made(source, made)]


def small_photos() -> list[Path]:
    """1 to 2 megapixel JPEGs made from the same photograph, with the large ones' traits (EXIF
    orientation, a Display P3 profile): phones' shared and messaged sizes (issue 17)."""
    source = _fetch_package_photo()
    made = {
        "Small-2MP.jpg": lambda im: im.resize(1900 / im.width).jpegsave_buffer(Q=92),
        "Small-1.5MP-sideways.jpg": lambda im: samples.oriented_jpeg(im.resize(1640 / im.width), 6),
        "Small-1.5MP-P3.jpg": lambda im: samples.profiled_jpeg(im.resize(1640 / im.width), "p3"),
        "Small-1.2MP.jpg": lambda im: im.resize(1460 / im.width).jpegsave_buffer(Q=85),
        "Small-1MP.jpg": lambda im: im.resize(1340 / im.width).jpegsave_buffer(Q=90),
    }
    return _made(source, made)


def _made(source: Path, made: dict[str, Callable[[pyvips.Image], bytes]]) -> list[Path]:
    """Each photo made from `source` by its function, unless it is there already."""
    for name, make in made.items():
        path = CORPUS / name
        if not path.exists():
            path.write_bytes(bytes(make(pyvips.Image.new_from_file(str(source)).copy_memory())))
    return [CORPUS / name for name in made]
