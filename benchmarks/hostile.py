"""Issue 11, item 1: every hostile input refused or rendered, each under 400 MB and 10 s.

The corpus is devkit/hostile.py's CASES, made once into .local/hostile-corpus (by a child process
under a memory cap: `python -m devkit.hostile`): every accepted format (PNG, TIFF, JPEG, GIF, WebP,
AVIF, HEIC), extreme shapes both ways, 16-bit and float samples, many frames and pages, tiny files
with huge canvases, each limit's default met and just passed, and the phones' HEIC layouts.

Each input is rendered in a fresh process (benchmarks/child.py's photo-publish peer, --stream: the
file read as a stream, as S3's body is; MALLOC_ARENA_MAX=2; the default limits), under an address
space cap of 4 GB so that a bomb that got through costs that process, not the machine, and a
timeout of 60 s. The ladder is rendered in both formats (--formats webp,avif; BENCH_VARIANT_FORMATS
changes it): AVIF's encoder is the costliest configuration the bounds must hold for. Each prints its outcome (the browse's size, or the code of its refusal), its
render's seconds and its peak resident memory (VmHWM, the interpreter and imports included).

Verdict: every input refused with a code or rendered, none crashed or timed out, each at the
outcome its case expects, with peak < 400 MB and < 10 s. Results go to
.local/bench-results/hostile.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks import child
from devkit import hostile
from devkit.stack import ROOT
from photo_publish.image.pipeline import RenderOptions

CORPUS = ROOT / ".local" / "hostile-corpus"
RESULTS = ROOT / ".local" / "bench-results"
PEAK_MB, SECONDS = 400, 10
CAP_BYTES = 4 << 30  # address space: libvips' threads and arenas reserve far more than they touch
TIMEOUT = 60
FORMATS = os.environ.get("BENCH_VARIANT_FORMATS", "webp,avif")


def make_corpus() -> None:
    """The corpus' files, made in a child process under a cap: some generators hold 100 MP pictures."""
    subprocess.run(
        ["prlimit", f"--as={8 << 30}", sys.executable, "-m", "devkit.hostile", str(CORPUS)],
        check=True,
        cwd=ROOT,
        env=child.env(),
        stdout=subprocess.DEVNULL,
    )


def measure(path: Path) -> dict[str, Any]:
    """One render in a fresh, capped process: its JSON, or what happened to it instead."""
    try:
        out = subprocess.run(
            [
                "prlimit",
                f"--as={CAP_BYTES}",
                *child.command("photo-publish", path, "--stream", "--formats", FORMATS),
            ],
            capture_output=True,
            text=True,
            env=child.env(),
            cwd=ROOT,
            timeout=TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"outcome": f"timed out ({TIMEOUT} s)", "seconds": float(TIMEOUT), "peak_mb": float("nan")}
    if out.returncode:
        last = out.stderr.strip().splitlines()[-1:] or [""]
        return {
            "outcome": f"crashed ({out.returncode}): {last[0][:60]}",
            "seconds": 0.0,
            "peak_mb": float("nan"),
        }
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def outcome(result: dict[str, Any]) -> str:
    """ "rendered", or the code of the refusal, or what went wrong."""
    return "rendered" if str(result.get("outcome", "")).endswith("browse") else str(result["outcome"])


def main() -> None:
    make_corpus()
    rows = []
    for case in hostile.CASES:
        path = CORPUS / case.name
        result = measure(path)
        got = outcome(result)
        ok = (
            got == case.expect
            and result["peak_mb"] < PEAK_MB
            and result["seconds"] < SECONDS
            and (got == "rendered" or got.isupper())
        )
        rows.append(
            {"case": case.name, "bytes": path.stat().st_size, "expect": case.expect, "got": got, "ok": ok}
            | {key: result[key] for key in ("seconds", "peak_mb")}
            | {"note": case.note}
        )

    limits = RenderOptions()
    print(
        f"{len(rows)} hostile inputs, each rendered in a fresh process, {PEAK_MB} MB and {SECONDS} s allowed; "
        f"the default limits: {limits.max_input_pixels:,} pixels, {limits.max_input_dimension:,} a side, "
        f"rows of {limits.max_input_row_bytes:,} bytes, decode buffers of {limits.max_decode_buffer_bytes:,} "
        f"bytes, {limits.render_timeout_seconds:g} s; the ladder {limits.variant_widths} in {FORMATS}"
    )
    print(f"{'input':44}{'file bytes':>12}  {'outcome':24}{'peak MB':>8}{'seconds':>9}  note")
    for row in rows:
        mark = (
            ""
            if row["ok"]
            else "  <-- " + ("expected " + row["expect"] if row["got"] != row["expect"] else "over")
        )
        print(
            f"{row['case']:44}{row['bytes']:>12,}  {row['got']:24}{row['peak_mb']:>8.0f}{row['seconds']:>9.2f}"
            f"  {row['note']}{mark}"
        )
    failed = [row for row in rows if not row["ok"]]
    peak = max(rows, key=lambda row: row["peak_mb"])
    slowest = max(rows, key=lambda row: row["seconds"])
    print(
        f"\nhighest peak {peak['peak_mb']:.0f} MB ({peak['case']}), longest render {slowest['seconds']:.2f} s "
        f"({slowest['case']}); {sum(row['got'] == 'rendered' for row in rows)} rendered, "
        f"{sum(row['got'] != 'rendered' for row in rows)} refused"
    )
    verdict = "met" if not failed else f"MISSED by {len(failed)}: {', '.join(row['case'] for row in failed)}"
    print(f"verdict: every input refused or rendered as expected, < {PEAK_MB} MB, < {SECONDS} s: {verdict}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "hostile.json").write_text(
        json.dumps({"limits": {"peak_mb": PEAK_MB, "seconds": SECONDS}, "rows": rows}, indent=1)
    )
    print(f"written {(RESULTS / 'hostile.json').relative_to(ROOT)}")
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
