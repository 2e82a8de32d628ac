"""Issue 11, item 1 (issue 24, item 4): every hostile input refused or rendered, each within its share
of the function's memory and under 10 s.

The corpus is devkit/hostile.py's CASES, made once into .local/hostile-corpus (by a child process
under a memory cap: `python -m devkit.hostile`): every accepted format (PNG, TIFF, JPEG, GIF, WebP,
AVIF, HEIC), extreme shapes both ways, 16-bit and float samples, many frames and pages, tiny files
with huge canvases, each limit's default met and just passed, and the phones' HEIC layouts.

Each input is rendered in a fresh process (benchmarks/child.py's photo-publish peer, --stream
--as-function: the file read as a stream, as S3's body is; MALLOC_ARENA_MAX=2; the default limits;
rendered as the process function does at the template's memory, in a shared slot or, where its
header says more than a slot, alone), under an address space cap of 4 GB so that a bomb that got
through costs that process, not the machine, and a timeout of 60 s. Each prints its outcome (the
browse's size, or the code of its refusal), its route, its render's seconds, its peak resident
memory (VmHWM) and its floor (the resident set before the render, imports done).
The ladder is rendered in both formats (--formats webp,avif; BENCH_VARIANT_FORMATS changes it):
AVIF's encoder is the costliest configuration the bounds must hold for.

Verdict: every input refused with a code or rendered, none crashed or timed out, each at the
outcome its case expects, under 10 s, and what it held over its floor within what its header was
counted at and a render's work (the budget's: the count is honest) and within its share of the
function's memory (image/slots.py): a shared slot and the work if it rendered beside the others,
the whole and the work if alone; so that renders at once, with their neighbours, stay within the
function's memory. Results go to .local/bench-results/hostile.json.
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
from photo_publish.image import slots
from photo_publish.image.pipeline import RenderOptions

CORPUS = ROOT / ".local" / "hostile-corpus"
RESULTS = ROOT / ".local" / "bench-results"
SECONDS = 10
MB = 1 << 20
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
    """One render in a fresh, capped process, as the process function renders it."""
    return child.capped(
        "photo-publish",
        path,
        "--stream",
        "--as-function",
        "--formats",
        FORMATS,
        cap_bytes=CAP_BYTES,
        timeout=TIMEOUT,
    )


def outcome(result: dict[str, Any]) -> str:
    """ "rendered", or the code of the refusal, or what went wrong."""
    return "rendered" if result.get("code") is None else str(result["code"])


BUDGET = slots.DEFAULT.encoding(tuple(FORMATS.split(",")))


def allowance_mb(route: str, budget: slots.DecodeBudget = BUDGET) -> float:
    """What a render of that route may hold over its process's floor, in MB: its slot (or the whole)
    and a render's own work."""
    held = {"shared": budget.slot, "alone": budget.whole}.get(route, 0)
    return (held + budget.work) / MB


def main() -> None:
    make_corpus()
    rows = []
    for case in hostile.CASES:
        path = CORPUS / case.name
        result = measure(path)
        got, route = outcome(result), str(result.get("route", "-"))
        held = result["peak_mb"] - result.get("floor_mb", 0.0)
        counted = (result.get("decode_bytes") or 0) / MB
        ok = (
            got == case.expect
            and held <= allowance_mb(route)
            and (result.get("decode_bytes") is None or held <= counted + BUDGET.work / MB)
            and result["seconds"] < SECONDS
            and (got == "rendered" or got.isupper())
        )
        rows.append(
            {"case": case.name, "bytes": path.stat().st_size, "expect": case.expect, "got": got, "ok": ok}
            | {"route": route, "counted_mb": counted, "held_mb": held, "allowance_mb": allowance_mb(route)}
            | {key: result[key] for key in ("seconds", "peak_mb")}
            | {"note": case.note}
        )

    limits, budget = RenderOptions(), BUDGET
    print(
        f"{len(rows)} hostile inputs, each rendered in a fresh process as the process function would at "
        f"{budget.memory // MB} MB; the default limits: {limits.max_input_pixels:,} pixels, "
        f"{limits.max_input_dimension:,} a side, rows of {limits.max_input_row_bytes:,} bytes, decoders of "
        f"{budget.slot // MB} MB in a shared slot, {budget.whole // MB} MB alone ({budget.describe()}), "
        f"{limits.render_timeout_seconds:g} s; allowed: {SECONDS} s, and over its floor its slot or the "
        f"whole and a render's work; the ladder {limits.variant_widths} in {FORMATS}"
    )
    print(
        f"{'input':44}{'file bytes':>12}  {'outcome':22}{'route':>8}{'counted':>8}{'peak MB':>8}"
        f"{'held MB':>8}{'of MB':>7}{'seconds':>9}  note"
    )
    for row in rows:
        mark = (
            ""
            if row["ok"]
            else "  <-- " + ("expected " + row["expect"] if row["got"] != row["expect"] else "over")
        )
        print(
            f"{row['case']:44}{row['bytes']:>12,}  {row['got']:22}{row['route']:>8}{row['counted_mb']:>8.0f}"
            f"{row['peak_mb']:>8.0f}"
            f"{row['held_mb']:>8.0f}{row['allowance_mb']:>7.0f}{row['seconds']:>9.2f}  {row['note']}{mark}"
        )
    failed = [row for row in rows if not row["ok"]]
    peak = max(rows, key=lambda row: row["peak_mb"])
    slowest = max(rows, key=lambda row: row["seconds"])
    shared = [row for row in rows if row["route"] == "shared"]
    print(
        f"\nhighest peak {peak['peak_mb']:.0f} MB ({peak['case']}, {peak['route']}), highest beside others "
        f"{max(row['peak_mb'] for row in shared):.0f} MB, longest render {slowest['seconds']:.2f} s "
        f"({slowest['case']}); {sum(row['got'] == 'rendered' for row in rows)} rendered "
        f"({sum(row['route'] == 'alone' for row in rows)} alone), {sum(row['got'] != 'rendered' for row in rows)} refused"
    )
    verdict = "met" if not failed else f"MISSED by {len(failed)}: {', '.join(row['case'] for row in failed)}"
    print(
        f"verdict: every input refused or rendered as expected, within its share of {budget.memory // MB} MB, "
        f"< {SECONDS} s: {verdict}"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "hostile.json").write_text(
        json.dumps(
            {"limits": {"slot": budget.slot, "whole": budget.whole, "seconds": SECONDS}, "rows": rows},
            indent=1,
        )
    )
    print(f"written {(RESULTS / 'hostile.json').relative_to(ROOT)}")
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
