"""`make fuzz`: atheris (libFuzzer, coverage-guided) over the pipeline's render().

Every input must end in rendered variants or a PhotoError with a code of the file's fault. Anything
else is a finding: another exception, variants that break the contract (not WebP, not their stated
size, not the declared picture fitted to their bound), an interpreter crash (a libvips, libheif or
pi-heif segfault or abort), a peak over the memory bound or a render past its deadline.

    python -m devkit.fuzz run          the fuzzer for FUZZ_RUNS executions, restarted after each
                                       finding (libFuzzer stops at one), then its figures
    python -m devkit.fuzz target ...   one libFuzzer process (what `run` starts); with file
                                       arguments instead of folders, it replays those inputs
                                       (-minimize_crash=1 minimises one)
    python -m devkit.fuzz check FILE   one input through the oracle in this (fresh) process

Memory: each input is rendered as the process function renders it beside others, in a shared slot
of the template's memory (image/slots.py); one whose header says more than a slot is handed back
(RenderAlone, before decoding: the function renders it alone), a legitimate ending. Each input's own
peak, counted from a fresh process' imports (the process' peak is reset before each input), must
stay under FUZZ_PEAK_MB (by default the slot and a render's work); libFuzzer's -rss_limit_mb, that
plus the fuzzer's own memory, stops one that never returns. The process runs under an address-space cap as
well, so that a bomb costs it, not the machine.

Time: render() runs with a short deadline (FUZZ_DEADLINE_SECONDS, RenderOptions'
render_timeout_seconds); an input whose render returns later than the deadline plus
FUZZ_GRACE_SECONDS (the work between two deadline checks: one encode, one step of a decoder) is a
finding, and libFuzzer's -timeout, one second past that, catches a render that never returns.

Coverage is of the Python code only (photo_publish, instrumented by atheris): libvips, libheif and
their codecs are prebuilt without coverage instrumentation, so libFuzzer's mutations explore them
blind, guided by the Python branches (the header checks, frames.py's walks, heic.py's boxes) and
the seeds.

Files: .local/fuzz/seeds (devkit/fuzzseeds.py), .local/fuzz/corpus (what libFuzzer keeps, grown
run after run), .local/fuzz/findings (crash-, timeout-, oom- files), .local/fuzz/fuzz.log,
.local/fuzz/summary.json. Findings worth keeping go to tests/images/fuzz, minimised.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from photo_publish.image import slots

ROOT = Path(__file__).resolve().parent.parent
FUZZ = ROOT / ".local" / "fuzz"
SEEDS, CORPUS, FINDINGS = FUZZ / "seeds", FUZZ / "corpus", FUZZ / "findings"


def _setting(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


RUNS = int(_setting("FUZZ_RUNS", 100_000))
# The memory bound: what a render in a shared slot may hold (benchmarks/hostile.py's allowance).
PEAK_MB = int(_setting("FUZZ_PEAK_MB", (slots.DEFAULT.slot + slots.RENDER_WORK) // slots.MIB))
DEADLINE_SECONDS = _setting("FUZZ_DEADLINE_SECONDS", 3)
GRACE_SECONDS = _setting("FUZZ_GRACE_SECONDS", 2)
TIMEOUT_SECONDS = math.ceil(DEADLINE_SECONDS + GRACE_SECONDS) + 1
ADDRESS_SPACE_MB = int(_setting("FUZZ_ADDRESS_SPACE_MB", 4096))
OVERHEAD_MB = int(_setting("FUZZ_OVERHEAD_MB", 100))
SEED = int(_setting("FUZZ_SEED", 1))
# libFuzzer stops at a finding; the run restarts it, at most this many times.
MAX_FINDINGS = int(_setting("FUZZ_MAX_FINDINGS", 25))

# The codes render() may end with for a file's own fault: anything else from an in-memory stream
# (a storage error, an unexpected error) is a finding.
FILE_CODES = frozenset(
    {"UNSUPPORTED_FORMAT", "DECODE_FAILED", "DIMENSIONS_EXCEEDED", "ENCODE_FAILED", "RENDER_TIME_EXCEEDED"}
)


class Finding(AssertionError):
    """An input that broke the pipeline's promise (libFuzzer saves it as a crash- file)."""


# --- the oracle (runs in the fuzzed process) --------------------------------------------------------


def options() -> Any:
    from photo_publish.image.pipeline import RenderOptions

    # The service's defaults (its limits among them, a shared slot), with the fuzzer's short deadline.
    return RenderOptions(render_timeout_seconds=DEADLINE_SECONDS).sharing(slots.DEFAULT)


def check(data: bytes, render_options: Any = None) -> str:
    """Render `data`; its outcome ("rendered WxH" or the code), or a Finding."""
    from photo_publish.errors import PhotoError
    from photo_publish.image.pipeline import RenderAlone, render

    chosen = render_options or options()
    started = time.monotonic()
    try:
        rendered = render(io.BytesIO(data), chosen)
    except RenderAlone:
        outcome = "RENDER_ALONE"  # over a shared slot, from its header: the function renders it alone
    except PhotoError as error:
        outcome = str(error.code)
        if outcome not in FILE_CODES:
            raise Finding(f"{outcome} from an in-memory file: {error.detail}") from error
    else:
        outcome = f"rendered {rendered.width}x{rendered.height}"
        _check_variants(rendered, chosen)
    seconds = time.monotonic() - started
    if seconds > chosen.render_timeout_seconds + GRACE_SECONDS:
        raise Finding(
            f"{outcome} after {seconds:.1f} s: past the deadline of {chosen.render_timeout_seconds} s"
        )
    return outcome


def _check_variants(rendered: Any, chosen: Any) -> None:
    """WebP thumb and browse, then the ladder's steps in its formats, each its stated size: the
    picture declared, fitted to its bound."""
    import pyvips

    from photo_publish.image import ladder

    thumb, browse = rendered.variants[:2]
    edges = ladder.steps(chosen.variant_widths, max(browse.width, browse.height))
    expected_kinds = ("thumb", "browse", *(f"w{e}-{f}" for e in edges for f in chosen.variant_formats))
    kinds = tuple(variant.kind for variant in rendered.variants)
    if kinds != expected_kinds:
        raise Finding(f"variants {kinds}")
    limits = {"thumb": chosen.thumb_size, "browse": chosen.browse_size}
    for variant in rendered.variants:
        magic = {"webp": variant.data[:4] == b"RIFF" and variant.data[8:12] == b"WEBP"}.get(
            variant.extension, variant.data[4:12] == b"ftypavif"
        )
        if not magic:
            raise Finding(f"the {variant.kind} is not a {variant.extension}")
        written = pyvips.Image.new_from_buffer(variant.data, "")
        size = (variant.width, variant.height)
        if (written.width, written.height) != size:
            raise Finding(f"the {variant.kind} says {size}, its file {written.width}x{written.height}")
        bound = limits.get(variant.kind) or int(variant.kind[1:].split("-")[0])
        if min(size) < 1 or max(size) > bound:
            raise Finding(f"the {variant.kind} is {size}")
    # The browse is the picture the header declared (the size recorded for the photo), fitted, never
    # enlarged; the thumb is the browse fitted.
    for variant, (width, height), bound in (
        (browse, (rendered.width, rendered.height), chosen.browse_size),
        (thumb, (browse.width, browse.height), chosen.thumb_size),
    ):
        scale = min(1.0, bound / max(width, height))
        expected = (max(1, round(width * scale)), max(1, round(height * scale)))
        if abs(variant.width - expected[0]) > 1 or abs(variant.height - expected[1]) > 1:
            raise Finding(
                f"the {variant.kind} is {variant.width}x{variant.height}, not {expected[0]}x{expected[1]} "
                f"(the picture is {rendered.width}x{rendered.height})"
            )


def peak_mb() -> float:
    """The process' peak resident memory (VmHWM) since it started, or since it was last reset.

    Not getrusage's ru_maxrss: Linux carries the parent's peak across fork and exec into it.
    """
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024


def _resident_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / (1 << 20)


def _reset_peak() -> None:
    # Linux resets the peak (VmHWM) on this write: each input's peak is its own, and libFuzzer's
    # -rss_limit_mb, which samples getrusage's peak (the same, unless the parent's was higher),
    # judges it alone.
    Path("/proc/self/clear_refs").write_text("5")


# The resident memory of a fresh process that has imported the pipeline: what a render's own use is
# added to, for the bound (benchmarks/hostile.py measures each input from there, in a fresh process).
_measured = {"imports_mb": 0.0}
# The heaviest and the slowest input so far, kept in a file the run reads when the process ends
# (libFuzzer ends it with exit(): no Python code runs then).
EXTREMES = FUZZ / "extremes"


def _one_input(data: bytes) -> None:
    before = _resident_mb()
    _reset_peak()
    started = time.monotonic()
    outcome = check(data)
    seconds = time.monotonic() - started
    peak = _measured["imports_mb"] + peak_mb() - before
    if peak > PEAK_MB:
        raise Finding(
            f"peak resident memory {peak:.0f} MB ({peak_mb() - before:.0f} MB over the imports), over {PEAK_MB} MB"
        )
    for kind, value in (("peak_mb", peak), ("seconds", seconds)):
        if value > _measured.get(kind, 0.0):
            _measured[kind] = value
            path = EXTREMES / f"{os.getpid()}-{kind}.json"
            path.write_text(json.dumps({kind: round(value, 3), "outcome": outcome, "bytes": len(data)}))


def target(argv: list[str]) -> None:
    """One libFuzzer process over render(): `argv` is libFuzzer's (flags, then folders or files)."""
    cap = ADDRESS_SPACE_MB << 20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))  # before libvips starts a thread
    import atheris

    with atheris.instrument_imports(include=["photo_publish"]):
        import photo_publish.image.pipeline  # noqa: F401

    _measured["imports_mb"] = _resident_mb()
    # libFuzzer runs its argv[0] through the shell for its own child processes (-minimize_crash,
    # -fork): this process' own command.
    atheris.Setup([f"{sys.executable} -m devkit.fuzz target", *argv], _one_input)
    atheris.Fuzz()


def replay(path: Path) -> str:
    """One input in this (fresh) process, judged as the fuzzer judges it: its outcome, or a Finding."""
    cap = ADDRESS_SPACE_MB << 20
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    outcome = check(path.read_bytes())
    if peak_mb() > PEAK_MB:
        raise Finding(f"{outcome}, peak resident memory {peak_mb():.0f} MB, over {PEAK_MB} MB")
    return f"{outcome}, peak {peak_mb():.0f} MB"


# --- the run (make fuzz) ---------------------------------------------------------------------------


@dataclass
class Stats:
    executions: int = 0
    seconds: float = 0.0
    cov: int = 0
    ft: int = 0
    corpus_files: int = 0
    corpus_bytes: int = 0
    # The heaviest input (its peak in a fresh process: the imports and what it added) and the
    # slowest render, each with its outcome and size.
    heaviest: dict[str, Any] = field(default_factory=dict)
    slowest: dict[str, Any] = field(default_factory=dict)
    restarts: int = 0
    findings: list[dict[str, str]] = field(default_factory=list)


_PROGRESS = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/(\d+)(b|Kb|Mb)")
_FINAL = re.compile(r"^stat::(\w+):\s+(\d+)")
_WRITTEN = re.compile(r"Test unit written to (\S+)")
_UNITS = {"b": 1, "Kb": 1 << 10, "Mb": 1 << 20}


def libfuzzer_flags(runs: int) -> list[str]:
    return [
        f"-runs={runs}",
        # The bound, plus what the fuzzer holds beyond a fresh process (atheris, the corpus): the
        # per-input check above is the exact one; this one stops an input that never returns.
        f"-rss_limit_mb={PEAK_MB + OVERHEAD_MB}",
        f"-timeout={TIMEOUT_SECONDS}",
        f"-seed={SEED}",
        f"-artifact_prefix={FINDINGS}/",
        "-use_value_profile=1",
        "-print_final_stats=1",
        # A finding's input is saved, then the process stops; `run` starts the next one.
        "-reload=0",
    ]


def _env(fuzzing: bool = True) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'shared'}:{ROOT}",
        "MALLOC_ARENA_MAX": "2",
        # libvips' warnings about damaged files, by the hundred thousand, are not findings.
        "VIPS_WARNING": "0",
    }
    if fuzzing:
        # Large blocks always mapped and unmapped (glibc otherwise raises this threshold as blocks
        # are freed, and keeps them): what an input holds is not hidden in what an earlier one left.
        env["MALLOC_MMAP_THRESHOLD_"] = str(128 << 10)
    return env


def _replay(finding: Path) -> tuple[bool, str]:
    """The finding again in a fresh process, as production runs (whether it reproduces, and how)."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "devkit.fuzz", "check", str(finding)],
            cwd=ROOT,
            env=_env(fuzzing=False),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=TIMEOUT_SECONDS * 4,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return True, f"still running after {TIMEOUT_SECONDS * 4} s"
    if out.returncode < 0:
        return True, f"killed by signal {-out.returncode}"
    if out.returncode:
        return True, (out.stderr.strip().splitlines() or ["failed"])[-1]
    return False, out.stdout.strip().rpartition(": ")[2]


def _one_process(runs: int, log: io.TextIOBase, stats: Stats) -> tuple[int, str, Path | None]:
    """One libFuzzer process: its executions, the tail of what it said, the input it saved."""
    command = [sys.executable, "-m", "devkit.fuzz", "target", *libfuzzer_flags(runs), str(CORPUS), str(SEEDS)]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    assert process.stdout is not None
    executions, tail, saved = 0, [], None
    for line in process.stdout:
        log.write(line)
        tail = [*tail[-40:], line.rstrip()]
        if progress := _PROGRESS.match(line):
            executions = int(progress[1])
            stats.cov, stats.ft, stats.corpus_files = int(progress[2]), int(progress[3]), int(progress[4])
            stats.corpus_bytes = int(progress[5]) * _UNITS[progress[6]]
            if line.split()[1] in ("NEW", "pulse", "INITED", "DONE"):
                print(line.rstrip(), flush=True)
        elif written := _WRITTEN.search(line):
            saved = Path(written[1])
        elif (final := _FINAL.match(line)) and final[1] == "number_of_executed_units":
            executions = max(executions, int(final[2]))
    process.wait()
    return executions, "\n".join(tail), saved


def _what_happened(tail: str) -> str:
    for pattern in (
        r"(Finding: .*)",
        r"=== Uncaught Python exception: ===\s*\n(.*)",
        r"ERROR: libFuzzer: (.*)",
        r"(\w+Error: .*)",
    ):
        if found := re.search(pattern, tail):
            return found[1].strip()
    return tail.splitlines()[-1] if tail else "stopped"


def _out_of_the_corpus(finding: Path) -> None:
    """A finding met while loading the corpus (an input the code changed under) would stop every
    restart: it leaves the corpus, kept in the findings. Corpus files are named by their SHA-1, as
    libFuzzer names its findings."""
    digest = finding.name.rpartition("-")[2]
    (CORPUS / digest).unlink(missing_ok=True)
    for seed in SEEDS.iterdir():
        if hashlib.sha1(seed.read_bytes()).hexdigest() == digest:
            raise SystemExit(f"the seed {seed.name} is a finding ({finding}): fix it before fuzzing on")


def run() -> Stats:
    for folder in (CORPUS, FINDINGS, EXTREMES):
        folder.mkdir(parents=True, exist_ok=True)
    for stale in EXTREMES.iterdir():
        stale.unlink()
    print(
        f"fuzzing render() for {RUNS} executions (FUZZ_RUNS), seed {SEED} (FUZZ_SEED): "
        f"peak {PEAK_MB} MB (-rss_limit_mb={PEAK_MB + OVERHEAD_MB}), deadline {DEADLINE_SECONDS:g} s + {GRACE_SECONDS:g} s, "
        f"-timeout={TIMEOUT_SECONDS}, address space {ADDRESS_SPACE_MB} MB",
        flush=True,
    )
    stats = Stats()
    started = time.monotonic()
    with (FUZZ / "fuzz.log").open("a") as log:
        while stats.executions < RUNS:
            executions, tail, saved = _one_process(RUNS - stats.executions, log, stats)
            stats.executions += executions
            if saved is None:
                if stats.executions < RUNS:
                    raise SystemExit(
                        f"libFuzzer stopped after {executions} executions with no finding:\n{tail}"
                    )
                break
            what = _what_happened(tail)
            reproduced, fresh = _replay(saved)
            stats.findings.append(
                {"file": str(saved.relative_to(ROOT)), "what": what, "fresh process": fresh}
                | ({} if reproduced else {"not reproduced": "yes"})
            )
            print(f"FINDING {saved.relative_to(ROOT)}: {what}; in a fresh process: {fresh}", flush=True)
            _out_of_the_corpus(saved)
            if len(stats.findings) >= MAX_FINDINGS:
                print(f"stopping: {MAX_FINDINGS} findings (FUZZ_MAX_FINDINGS)")
                break
            stats.restarts += 1
    stats.seconds = time.monotonic() - started
    for path in EXTREMES.iterdir():
        found = json.loads(path.read_text())
        kind, record = ("heaviest", stats.heaviest) if "peak_mb" in found else ("slowest", stats.slowest)
        key = "peak_mb" if kind == "heaviest" else "seconds"
        if found[key] > record.get(key, -1):
            record.clear()
            record.update(found)
    (FUZZ / "summary.json").write_text(json.dumps(asdict(stats), indent=2))
    heaviest, slowest = stats.heaviest, stats.slowest
    print(
        f"fuzz: {stats.executions} executions in {stats.seconds:.0f} s "
        f"({stats.executions / max(stats.seconds, 1e-9):.0f}/s), cov {stats.cov}, ft {stats.ft}, "
        f"corpus {stats.corpus_files} files ({stats.corpus_bytes} bytes), "
        f"{len(stats.findings)} findings, {stats.restarts} restarts\n"
        f"  heaviest input: {heaviest.get('peak_mb', 0):.0f} MB with the imports "
        f"({heaviest.get('bytes')} bytes, {heaviest.get('outcome')}); "
        f"slowest: {slowest.get('seconds', 0):.2f} s ({slowest.get('bytes')} bytes, {slowest.get('outcome')})"
    )
    for finding in stats.findings:
        verdict = "NOT REPRODUCED in a fresh process" if "not reproduced" in finding else "reproduced"
        print(f"  {finding['file']}: {finding['what']} ({verdict}: {finding['fresh process']})")
    return stats


def main(argv: list[str]) -> None:
    match argv:
        case ["run"]:
            stats = run()
            if any("not reproduced" not in finding for finding in stats.findings):
                raise SystemExit(1)
        case ["target", *flags]:
            target(flags)
        case ["check", path]:
            print(f"{path}: {replay(Path(path))}")
        case _:
            raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
