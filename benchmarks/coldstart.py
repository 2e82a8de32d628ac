"""Issue #7, part 5: cold start, the import time of each handler module under Python 3.12.

Lambda runs python3.12 with the handler's folder and the layers on sys.path; here the same layout is
PYTHONPATH=functions/<name>:shared and a Python 3.12 virtual environment holding requirements.txt
(BENCH_PY312, default .venv-bench312/bin/python; made with
`PYENV_VERSION=3.11.7:3.12.1 python3.12 -m venv .venv-bench312 && .venv-bench312/bin/pip install -r requirements.txt`).
The environment is the template's (POWERTOOLS_SERVICE_NAME, POWERTOOLS_METRICS_NAMESPACE,
MALLOC_ARENA_MAX=2) plus AWS_LAMBDA_FUNCTION_NAME and AWS_REGION, so Powertools behaves as in Lambda
(its tracer active: Tracing is Active in the template).

Each measurement is a fresh interpreter timing `import app` (perf_counter around the import, so the
interpreter's own start is not in it; that is measured apart as `python -c pass`), ROUNDS times,
interleaved, median:
- compiled: bytecode from a warm PYTHONPYCACHEPREFIX (as a layer built with compiled files);
- uncompiled: an empty PYTHONPYCACHEPREFIX each time, every module compiled on import.
Nothing is written into the repository or the virtual environment (the prefix is under .local).
Then `-X importtime` of the process handler (compiled), its ten largest imports by cumulative time.
Target: the process handler's compiled import under 400 ms.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from devkit.stack import ROOT

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "10"))
PY312 = Path(os.environ.get("BENCH_PY312", str(ROOT / ".venv-bench312" / "bin" / "python")))
PREFIX = ROOT / ".local" / "bench-pycache312"
RESULTS = ROOT / ".local" / "bench-results"
HANDLERS = ("process", "sweep")
TIMED = "import time; t = time.perf_counter(); import app; print(time.perf_counter() - t)"


def _env(handler: str, prefix: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": f"{ROOT / 'functions' / handler}:{ROOT / 'shared'}",
        "PYTHONPYCACHEPREFIX": str(prefix),
        "POWERTOOLS_SERVICE_NAME": "photo-publish",
        "POWERTOOLS_METRICS_NAMESPACE": "PhotoPublish",
        "AWS_LAMBDA_FUNCTION_NAME": f"photo-publish-{handler}",
        "AWS_REGION": "us-east-1",
        "MALLOC_ARENA_MAX": "2",
    }


def _run(handler: str, prefix: Path, code: str = TIMED) -> float:
    out = subprocess.run(
        [str(PY312), "-c", code], capture_output=True, text=True, check=True, env=_env(handler, prefix)
    )
    return float(out.stdout.strip().splitlines()[-1]) if code == TIMED else 0.0


def _interpreter(prefix: Path) -> float:
    started = time.perf_counter()
    _run("process", prefix, "pass")
    return time.perf_counter() - started


def _importtime(prefix: Path) -> list[tuple[int, str]]:
    out = subprocess.run(
        [str(PY312), "-X", "importtime", "-c", "import app"],
        capture_output=True,
        text=True,
        check=True,
        env=_env("process", prefix),
    )
    rows = []
    for line in out.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].rstrip()))
    return sorted(rows, reverse=True)[:10]


def main() -> None:
    if not PY312.exists():
        print(f"SKIPPED: no Python 3.12 at {PY312} (see this module's docstring to make .venv-bench312)")
        return
    version = subprocess.run([str(PY312), "--version"], capture_output=True, text=True, check=True).stdout
    for handler in HANDLERS:
        _run(handler, PREFIX)  # warm the compiled prefix
    results: dict[str, list[float]] = {f"{h} {k}": [] for h in HANDLERS for k in ("compiled", "uncompiled")}
    results["interpreter start"] = []
    for _ in range(ROUNDS):
        for handler in HANDLERS:
            results[f"{handler} compiled"].append(_run(handler, PREFIX))
            empty = Path(tempfile.mkdtemp(prefix="pyc-", dir=ROOT / ".local"))
            try:
                results[f"{handler} uncompiled"].append(_run(handler, empty))
            finally:
                shutil.rmtree(empty)
        results["interpreter start"].append(_interpreter(PREFIX))

    print(f"cold start under {version.strip()}: median of {ROUNDS} fresh interpreters, interleaved")
    medians = {name: statistics.median(values) for name, values in results.items()}
    for name, value in medians.items():
        print(f"  {name:22} {value * 1000:7.0f} ms  (min {min(results[name]) * 1000:.0f} ms)")
    print("the process handler's largest imports, cumulative (compiled, one run of -X importtime):")
    top = _importtime(PREFIX)
    for micros, module in top:
        print(f"  {micros / 1000:7.1f} ms {module}")
    got = medians["process compiled"]
    print("target (verdict, not assertion)")
    print(
        f"  process handler import, compiled, < 400 ms: {got * 1000:.0f} ms  {'MET' if got < 0.4 else 'MISSED'}"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "python": version.strip(),
        "rounds": ROUNDS,
        "runs": results,
        "medians": medians,
        "importtime_top": top,
    }
    (RESULTS / "coldstart.json").write_text(json.dumps(summary, indent=1))
    print(f"written {(RESULTS / 'coldstart.json').relative_to(ROOT)}")


if __name__ == "__main__":
    main()
