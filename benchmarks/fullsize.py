"""Issue 24, item 4: every accepted format at the pixel limit (100 MP) publishes within the function's memory.

The corpus is devkit/fullsize.py's CASES, made once into .local/fullsize (by a child process:
python -m devkit.fullsize): the project's photograph enlarged to 100 MP (or 48 MP, the issue's own
camera) and written by each format's encoder: progressive JPEG (4:2:0 as mozjpeg writes it, 4:4:4,
CMYK), baseline JPEG, interlaced PNG (8-bit, 16-bit RGBA), plain PNG, tiled TIFF, 8 and 10-bit
HEIC, 8 and 10-bit AVIF, animated GIF and WebP, still WebP.

Each is rendered in a fresh process (benchmarks/child.py's photo-publish peer, --stream
--as-function: as the process function does at the template's memory, in a shared slot or, where
its header says more than a slot, alone), under a 6 GB address space cap, and reports its route,
its seconds, its peak (VmHWM), its floor (the resident set before the render, imports done) and what
its header said it would hold (the estimate the gate admits it by). Then the heaviest renders the
function lets run side by side (the two shared cases of the largest estimates) run at once in one
process, a thread each.

Verdicts: each case publishes at its size, by the route its case expects; what it held over its floor is within its estimate and a
render's work (the estimate is honest: the budget's work, slots.RENDER_WORK and AVIF_WORK with AVIF,
is all the render holds beyond it), and within its allowance (its slot or the whole, and the work); the pair at once within two slots, two
renders' work and the heap's growth (image/slots.py: what the function's memory is shared into).
Results go to .local/bench-results/fullsize.json.
"""

from __future__ import annotations

import json
import subprocess
import sys

from benchmarks import child
from devkit import fullsize
from devkit.stack import ROOT
from photo_publish.image import slots

RESULTS = ROOT / ".local" / "bench-results"
CAP_BYTES = 6 << 30  # address space, not memory: libvips' threads and arenas reserve more than they touch
TIMEOUT = 180
MB = 1 << 20


def make_corpus() -> None:
    """The corpus' files, made in a child process: making them holds 100 MP pictures."""
    subprocess.run(
        [sys.executable, "-m", "devkit.fullsize", str(fullsize.FOLDER)],
        check=True,
        cwd=ROOT,
        env=child.env(),
        stdout=subprocess.DEVNULL,
    )


def allowance(route: str, budget: slots.DecodeBudget = slots.DEFAULT) -> int:
    return {"shared": budget.slot, "alone": budget.whole}.get(route, 0) + budget.work


def main() -> None:
    make_corpus()
    budget = slots.DEFAULT
    rows = []
    for case in fullsize.CASES:
        path = fullsize.FOLDER / case.name
        formats = ",".join(case.formats)
        result = child.capped(
            "photo-publish",
            path,
            "--stream",
            "--as-function",
            "--formats",
            formats,
            cap_bytes=CAP_BYTES,
            timeout=TIMEOUT,
        )
        case_budget = budget.encoding(case.formats)
        held = (result["peak_mb"] - result["floor_mb"]) * MB
        estimate = result.get("decode_bytes") or 0
        route = str(result.get("route", "-"))
        published = result.get("code") is None and tuple(result.get("size", ())) == case.size
        if case.route == "refused":
            route, published = "refused", result.get("code") == "DIMENSIONS_EXCEEDED"
        rows.append(
            {
                "case": case.name,
                "bytes": path.stat().st_size,
                "route": route if published else str(result.get("code")),
                "estimate_mb": estimate / MB,
                "held_mb": held / MB,
                "allowance_mb": allowance(route, case_budget) / MB,
                "seconds": result["seconds"],
                "honest": route == "refused" or held <= estimate + case_budget.work,
                "ok": published
                and route == case.route
                and (route == "refused" or held <= estimate + case_budget.work)
                and held <= allowance(route, case_budget),
                "note": case.note,
            }
        )

    webp_only = {case.name for case in fullsize.CASES if case.formats == ("webp",)}
    shared = sorted(
        (row for row in rows if row["route"] == "shared" and row["case"] in webp_only),
        key=lambda row: -row["estimate_mb"],
    )[:2]
    pair = child.capped(
        "at-once", *(fullsize.FOLDER / row["case"] for row in shared), cap_bytes=CAP_BYTES, timeout=TIMEOUT
    )
    pair_held = (pair["peak_mb"] - pair["floor_mb"]) * MB
    pair_allowed = 2 * (budget.slot + budget.work) + slots.HEAP_GROWTH
    pair_ok = all(r.get("code") is None for r in pair.get("results", [None])) and pair_held <= pair_allowed

    print(
        f"{len(rows)} photos at the pixel limit, each in a fresh process as the process function renders "
        f"them at {budget.memory // MB} MB: a shared slot of {budget.slot:,} bytes ({budget.slot // MB} MB), "
        f"alone {budget.whole:,} ({budget.whole // MB} MB); {budget.describe()}"
    )
    print(
        f"{'photo':44}{'file MB':>8}  {'route':20}{'estimate':>9}{'held':>7}{'of':>6}{'seconds':>9}  verdict  note"
    )
    for row in rows:
        verdict = "ok" if row["ok"] else ("OVER ESTIMATE" if not row["honest"] else "MISSED")
        print(
            f"{row['case']:44}{row['bytes'] / MB:>8.1f}  {row['route']:20}{row['estimate_mb']:>9.0f}"
            f"{row['held_mb']:>7.0f}{row['allowance_mb']:>6.0f}{row['seconds']:>9.2f}  {verdict:7}  {row['note']}"
        )
    print(
        f"\nat once, {' and '.join(row['case'] for row in shared)}: held {pair_held / MB:.0f} MB over the floor "
        f"in {pair['seconds']:.2f} s, of {pair_allowed / MB:.0f} MB (two slots, two renders' work, the heap's "
        f"growth): {'ok' if pair_ok else 'MISSED'}"
    )
    worst = max(rows, key=lambda row: row["held_mb"])
    print(
        f"highest: {worst['held_mb']:.0f} MB over the floor ({worst['case']}, {worst['route']}); as the function, "
        f"with its {slots.NOMINAL_RESIDENT // MB} MB resident and {slots.HEAP_GROWTH // MB} MB of heap growth: "
        f"{(worst['held_mb'] * MB + slots.NOMINAL_RESIDENT + slots.HEAP_GROWTH) / MB:.0f} of {budget.memory // MB} MB"
    )
    failed = [row["case"] for row in rows if not row["ok"]] + ([] if pair_ok else ["at once"])
    verdict = "met" if not failed else f"MISSED by {len(failed)}: {', '.join(failed)}"
    print(
        f"verdict: every format at 100 MP publishes within its share of {budget.memory // MB} MB: {verdict}"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fullsize.json").write_text(
        json.dumps(
            {
                "budget": {"slot": budget.slot, "whole": budget.whole, "source": budget.describe()},
                "rows": rows,
                "at_once": {
                    "cases": [row["case"] for row in shared],
                    "held_mb": pair_held / MB,
                    "ok": pair_ok,
                },
            },
            indent=1,
        )
    )
    print(f"written {(RESULTS / 'fullsize.json').relative_to(ROOT)}")
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
