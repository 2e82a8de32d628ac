"""The reference ThumbHash, the npm package `thumbhash` on Node.js, run by tests/thumbhash_reference.mjs.

The package is installed from the npm registry into .local/thumbhash-node on first use, so a fresh
clone's `make test` needs only Node.js with npm on PATH.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from photo_publish.image.thumbhash import RGBAImage

ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.1.1"  # the latest release, the same code as evanw/thumbhash's js/thumbhash.js
PREFIX = ROOT / ".local" / "thumbhash-node"
PACKAGE = PREFIX / "node_modules" / "thumbhash"
SCRIPT = Path(__file__).with_name("thumbhash_reference.mjs")


@dataclass(frozen=True)
class Decoded:
    image: RGBAImage
    average: tuple[float, float, float, float]
    ratio: float


def install() -> Path:
    """The package's folder, installed with npm if it is not there at the pinned version."""
    manifest = PACKAGE / "package.json"
    if manifest.exists() and json.loads(manifest.read_text())["version"] == VERSION:
        return PACKAGE
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"the ThumbHash reference needs Node.js with npm: {tool} is not on PATH")
    subprocess.run(
        ["npm", "install", "--prefix", str(PREFIX), "--no-audit", "--no-fund", f"thumbhash@{VERSION}"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return PACKAGE


def run(request: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run(
        ["node", str(SCRIPT), str(install())],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    answer: dict[str, Any] = json.loads(out.stdout)
    return answer


def encode(images: Sequence[RGBAImage]) -> list[bytes]:
    """rgbaToThumbHash of each image."""
    request = [
        {"width": i.width, "height": i.height, "rgba": base64.b64encode(i.rgba).decode()} for i in images
    ]
    return [base64.b64decode(h) for h in run({"encode": request})["encode"]]


def decode(hashes: Sequence[bytes]) -> list[Decoded]:
    """thumbHashToRGBA, thumbHashToAverageRGBA and thumbHashToApproximateAspectRatio of each hash."""
    answers = run({"decode": [base64.b64encode(h).decode() for h in hashes]})["decode"]
    return [
        Decoded(
            image=RGBAImage(a["width"], a["height"], base64.b64decode(a["rgba"])),
            average=(a["average"]["r"], a["average"]["g"], a["average"]["b"], a["average"]["a"]),
            ratio=a["ratio"],
        )
        for a in answers
    ]


def cosines(sizes: Sequence[int], order: str) -> tuple[dict[int, list[float]], str]:
    """Math.cos of every argument the package uses for these sizes, and the V8 that computed them."""
    answer = run({"cosines": [[size, order] for size in sizes]})
    tables = {}
    for size, table in zip(sizes, answer["cosines"], strict=True):
        data = base64.b64decode(table)
        tables[size] = list(memoryview(data).cast("d"))
    return tables, f"node {answer['node']}, V8 {answer['v8']}"
