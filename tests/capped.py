"""Render in a child process under a memory cap, for inputs built to cost gigabytes.

A bomb the pipeline fails to refuse costs the child (its allocation fails, or it is killed), never
the test run or the machine it shares. The child streams the file to render() as S3 would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# RLIMIT_AS counts address space, not resident memory: libvips' threads and glibc's arenas reserve
# a few hundred MB they never touch, so the cap sits well above what a render may use.
CAP_BYTES = 1536 << 20

_CHILD = r"""
import json, resource, sys, time
cap = int(sys.argv[4])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))  # first, before libvips starts a thread
from photo_publish.errors import PhotoError
from photo_publish.image.pipeline import RenderAlone, RenderOptions, render
options = RenderOptions(**json.loads(sys.argv[2]))
started = time.monotonic()
with open(sys.argv[1], "rb") as stream:
    try:
        rendered = render(stream, options, **json.loads(sys.argv[3]))
        result = {"code": None, "size": [rendered.width, rendered.height], "loader": rendered.loader}
    except PhotoError as error:
        result = {"code": str(error.code), "detail": error.detail}
    except RenderAlone as alone:
        result = {"code": "RENDER_ALONE", "detail": str(alone.needs)}
    result["bytes_read"] = stream.tell()
result["seconds"] = time.monotonic() - started
# VmHWM, not getrusage: Linux carries the parent's peak across fork and exec into ru_maxrss.
status = open("/proc/self/status").read()
result["peak_mb"] = int(status.split("VmHWM:")[1].split()[0]) / 1024
print(json.dumps(result))
"""


@dataclass(frozen=True)
class Outcome:
    code: str | None  # None: rendered; RENDER_ALONE: over its shared slot (detail: its estimate)
    size: tuple[int, int] | None
    loader: str | None
    bytes_read: int
    seconds: float
    detail: str = ""
    peak_mb: float = 0.0  # the child's peak resident memory, the interpreter and imports included


def render(
    data: bytes,
    *,
    options: dict[str, object] | None = None,
    time_budget: float | None = None,
    timeout: float = 120,
    cap_bytes: int = CAP_BYTES,
) -> Outcome:
    """render() of `data` with RenderOptions(**options) in a fresh interpreter under the cap."""

    keywords = {} if time_budget is None else {"time_budget": time_budget}
    with tempfile.NamedTemporaryFile(suffix=".bin") as file:
        file.write(data)
        file.flush()
        result = subprocess.run(
            [
                sys.executable,
                "-c",
                _CHILD,
                file.name,
                json.dumps(options or {}),
                json.dumps(keywords),
                str(cap_bytes),
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PYTHONPATH": f"{ROOT / 'shared'}:{ROOT}", "MALLOC_ARENA_MAX": "2"},
            cwd=ROOT,
            check=False,
        )
    assert result.returncode == 0, f"the child failed ({result.returncode}): {result.stderr[-2000:]}"
    values = json.loads(result.stdout.strip().splitlines()[-1])
    size = values.get("size")
    return Outcome(
        code=values["code"],
        size=tuple(size) if size else None,
        loader=values.get("loader"),
        bytes_read=values["bytes_read"],
        seconds=values["seconds"],
        detail=values.get("detail", ""),
        peak_mb=values["peak_mb"],
    )
