"""`make mutants`: each recorded defect put back into a scratch copy, and whether its test finds it.

Each patch under tests/mutants/ puts one fixed defect back (issue 32). Its header, the text before
the first `diff --git` (which git apply ignores), says what the defect is and which test should
find it:

    Put back: the defect, in a sentence (it may go on over the next lines)
    Recorded: where it was found and fixed (issue, finding)
    Test: the pytest node id that should find it
    Profile: the HYPOTHESIS_PROFILE of the run (optional; `find` for the model-based test)
    Seeded: no (for a test that draws nothing: one run, no seed)

For each patch and seed, the working tree as it is (tracked and untracked files, not the ignored
ones) is copied to .local/mutants/<name>/, the patch applied there by `git apply`, and the test run
with `--hypothesis-seed` for at most MUTANT_SECONDS, one run at a time. A run is
- found: the test failed in its body (an invariant's assertion, or the product raising);
- not found: it passed, or was still running at the bound (interrupted as Ctrl-C would);
- broken: it did not collect or set up, or failed on an import, syntax or name error (the patch
  no longer fits the code around it);
- does not apply: git apply refused the patch (the code it changes has moved: write it again).

`python -m devkit.mutants check` only says whether each patch still applies to the working tree.
MUTANTS=name1,name2 (file names without .patch) runs some; MUTANT_SEEDS ("1 2 3"); MUTANT_SECONDS
(300). Logs in .local/mutants/logs/. The exit status is 1 if a mutant is found on fewer than two
of its seeds (on fewer than all, where fewer than two are run), is broken, or does not apply.

The same module is the pytest plugin of each run (`-p devkit.mutants`): it writes what failed, in
which phase and with which exception, to MUTANT_REPORT.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PATCHES = ROOT / "tests" / "mutants"
SCRATCH = ROOT / ".local" / "mutants"
# The functions' layout, as the Makefile sets it: the handler folder, the shared package, devkit.
PYTHONPATH = "functions/process:shared:."
# Failures that say the patched code does not run at all, rather than that the test caught it.
BROKEN_TYPES = frozenset(
    {"ImportError", "ModuleNotFoundError", "SyntaxError", "IndentationError", "NameError", "Skipped"}
)
# What an interrupted run may take to tear down (its PostgreSQL stopped) before it is killed, after
# a second interruption SECOND_INTERRUPT_SECONDS after the first.
SECOND_INTERRUPT_SECONDS = 15
GRACE_SECONDS = 60

FOUND, NOT_FOUND, BROKEN, NOT_APPLIED = "found", "not found", "broken", "does not apply"


@dataclass(frozen=True)
class Mutant:
    name: str
    patch: Path
    put_back: str
    recorded: str
    test: str
    profile: str | None
    seeded: bool


@dataclass
class Run:
    mutant: str
    seed: int | None
    outcome: str
    why: str = ""
    seconds: float = 0.0
    checks: int | None = None
    examples: int | None = None


def header(text: str) -> dict[str, str]:
    """The header's fields, by lower-case name; a line that names no field goes on the one before."""
    fields: dict[str, str] = {}
    last = None
    for line in text.split("diff --git", 1)[0].splitlines():
        name, colon, value = line.partition(":")
        if colon and re.fullmatch(r"[A-Z][a-z]*( [a-z]+)?", name):
            last = name.lower()
            fields[last] = value.strip()
        elif last is not None and line.strip():
            fields[last] += " " + line.strip()
    return fields


def mutant(patch: Path) -> Mutant:
    fields = header(patch.read_text())
    if "test" not in fields:
        raise SystemExit(f"{patch}: its header names no Test:")
    return Mutant(
        name=patch.stem,
        patch=patch,
        put_back=fields.get("put back", ""),
        recorded=fields.get("recorded", ""),
        test=fields["test"],
        profile=fields.get("profile") or None,
        seeded=fields.get("seeded", "yes").lower() != "no",
    )


def chosen(names: str | None) -> list[Mutant]:
    patches = sorted(PATCHES.glob("*.patch"))
    if not names:
        return [mutant(p) for p in patches]
    wanted = [n.strip().removesuffix(".patch") for n in names.split(",") if n.strip()]
    unknown = sorted(set(wanted) - {p.stem for p in patches})
    if unknown:
        raise SystemExit(f"no such mutant: {', '.join(unknown)} (tests/mutants/*.patch)")
    return [mutant(PATCHES / f"{n}.patch") for n in wanted]


# --- one run ------------------------------------------------------------------------------------


def copy_tree(dest: Path) -> None:
    """The working tree as it is now (uncommitted changes included, ignored files not) in `dest`."""
    if dest.exists():
        shutil.rmtree(dest)
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree, not yet in the index
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest / name, follow_symlinks=False)


def apply(patch: Path, dest: Path) -> str | None:
    """Apply `patch` in `dest`; git's refusal if it does not apply."""
    # The scratch copy lies inside this checkout: without the ceiling, git would take it for a
    # subfolder of the checkout's repository and skip every path outside it.
    env = os.environ | {"GIT_CEILING_DIRECTORIES": str(dest.parent)}
    done = subprocess.run(
        ["git", "apply", str(patch)], cwd=dest, env=env, capture_output=True, text=True, check=False
    )
    return None if done.returncode == 0 else (done.stderr.strip() or done.stdout.strip())


def command(test: str, seed: int | None, dest: Path) -> list[str]:
    args = [sys.executable, "-m", "pytest", test, "-q", "-s", "-p", "no:cacheprovider"]
    # The project's addopts may spread tests over workers; the test's own bound is this runner's.
    args += ["-o", "addopts=", "--timeout=0", "--basetemp", str(dest / ".pytest-tmp")]
    args += ["-p", "devkit.mutants", "--hypothesis-show-statistics"]
    if seed is not None:
        args.append(f"--hypothesis-seed={seed}")
    return args


def run(m: Mutant, seed: int | None, seconds: float) -> Run:
    dest = SCRATCH / m.name
    logs = SCRATCH / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{m.name}-seed-{seed if seed is not None else 'none'}.log"
    copy_tree(dest)
    refused = apply(m.patch, dest)
    if refused is not None:
        log.write_text(refused + "\n")
        return Run(m.name, seed, NOT_APPLIED, refused.splitlines()[0])
    report = dest / "mutant-report.json"
    # The run's temporary folder, where the embedded PostgreSQL keeps its data and socket: short (a
    # socket's path has a limit), and where it is found again if the run is killed.
    scratch_tmp = Path(tempfile.mkdtemp(prefix="mutant-"))
    env = os.environ | {
        "PYTHONPATH": PYTHONPATH,
        "PYTHONDONTWRITEBYTECODE": "1",
        "TMPDIR": str(scratch_tmp),
        "MUTANT_REPORT": str(report),
    }
    env.pop("HYPOTHESIS_PROFILE", None)
    if m.profile:
        env["HYPOTHESIS_PROFILE"] = m.profile
    started = time.monotonic()
    with log.open("w") as out:
        child = subprocess.Popen(
            command(m.test, seed, dest),
            cwd=dest,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            timed_out = _wait(child, seconds)
        finally:
            _stop_postgres_under(scratch_tmp)
    elapsed = time.monotonic() - started
    text = log.read_text(errors="replace")
    result = verdict(json.loads(report.read_text()) if report.exists() else None, timed_out)
    return Run(
        m.name,
        seed,
        result[0],
        result[1],
        seconds=elapsed,
        checks=checks_run(text),
        examples=examples_run(text),
    )


def _wait(child: subprocess.Popen[bytes], seconds: float) -> bool:
    """Wait for the run; at the bound interrupt it as Ctrl-C would (its fixtures tear down), and kill
    what is left after the grace. True if it had to be interrupted."""
    try:
        child.wait(seconds)
        return False
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(SECOND_INTERRUPT_SECONDS)
        except subprocess.TimeoutExpired:
            # A state machine's teardown runs even when interrupted (its settling rounds can take a
            # minute on a busy machine): a second Ctrl-C ends it, and pytest's fixtures tear down.
            child.send_signal(signal.SIGINT)
        try:
            child.wait(GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        return True
    except KeyboardInterrupt:
        child.send_signal(signal.SIGINT)
        child.wait(GRACE_SECONDS)
        raise


def _stop_postgres_under(folder: Path) -> None:
    """A PostgreSQL the run started and did not stop (the run was killed) told to shut down fast, by
    the pid in its data folder, which lies in the run's temporary folder; then the folder goes."""
    for pid_file in folder.glob("*/postmaster.pid"):
        try:
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGINT)
        except (OSError, ValueError, IndexError):
            continue
        for _ in range(100):
            if not pid_file.exists():
                break
            time.sleep(0.1)
    shutil.rmtree(folder, ignore_errors=True)


# --- what a run's report and log say ------------------------------------------------------------


def verdict(report: dict[str, Any] | None, timed_out: bool) -> tuple[str, str]:
    """The outcome of a run and why, from its plugin's report (None: pytest wrote none)."""
    if report is None:
        return (NOT_FOUND, "killed at the bound") if timed_out else (BROKEN, "pytest wrote no report")
    if report["collect"]:
        return BROKEN, f"collection: {report['collect'][0]}"
    if not report["phases"]:
        return (NOT_FOUND, "interrupted at the bound") if timed_out else (BROKEN, "no test ran")
    for phase in report["phases"]:
        if phase["type"] is None:
            continue
        where = f"{phase['when']}: {phase['type']}"
        if phase["type"] in BROKEN_TYPES or phase["when"] == "setup":
            return BROKEN, f"{where} {phase['message']}".strip()
        if timed_out and phase["when"] == "teardown":
            continue  # the interruption's own
        return FOUND, where
    return (NOT_FOUND, "interrupted at the bound") if timed_out else (NOT_FOUND, "passed")


def checks_run(log: str) -> int | None:
    """The model-based test's invariant checks, as its fixture prints them at the end."""
    found = re.findall(r"state machine: (\d+) checks run in", log)
    return int(found[-1]) if found else None


def examples_run(log: str) -> int | None:
    """Hypothesis' examples run (passing and failing, every phase), from its statistics."""
    # "61 passing examples, 1 failing examples" or, in later versions, "500 passing, 0 failing, and".
    counts = re.findall(r"- (\d+) passing(?: examples?)?, (\d+) failing", log)
    return sum(int(p) + int(f) for p, f in counts) if counts else None


# --- the table ----------------------------------------------------------------------------------


def cell(run: Run | None) -> str:
    if run is None:
        return "-"
    figures = []
    if run.checks is not None:
        figures.append(f"{run.checks:,} checks")
    elif run.examples is not None:
        figures.append(f"{run.examples:,} examples")
    figures.append(f"{run.seconds:.0f} s")
    if run.outcome == FOUND:
        return ", ".join(figures) + ("" if run.seed is not None else " (one run, no seed)")
    if run.outcome == NOT_FOUND:
        return f"not found ({', '.join(figures)}; {run.why})"
    return f"{run.outcome}: {run.why}"


def passes(runs: list[Run]) -> bool:
    """Found on at least two of its runs (on all of them, where fewer than two ran)."""
    if any(r.outcome in (BROKEN, NOT_APPLIED) for r in runs):
        return False
    return sum(r.outcome == FOUND for r in runs) >= min(2, len(runs))


def table(mutants: list[Mutant], seeds: list[int], runs: list[Run]) -> str:
    lines = [
        "| mutant | " + " | ".join(f"seed {s}" for s in seeds) + " | |",
        "| --- | " + " | ".join("---" for _ in seeds) + " | --- |",
    ]
    for m in mutants:
        mine = [r for r in runs if r.mutant == m.name]
        # A run with no seed (a test that draws nothing) stands in the first seed's column.
        cells = [
            cell(next((r for r in mine if (seeds[0] if r.seed is None else r.seed) == s), None))
            for s in seeds
        ]
        lines.append(f"| {m.name} | " + " | ".join(cells) + f" | {'ok' if passes(mine) else 'FAIL'} |")
    return "\n".join(lines)


def check(mutants: list[Mutant]) -> int:
    """Whether each patch still applies to the working tree (and names a test file there), without
    running anything: the quick look after a refactor."""
    failed = []
    for m in mutants:
        done = subprocess.run(
            ["git", "apply", "--check", str(m.patch)], cwd=ROOT, capture_output=True, text=True, check=False
        )
        test_file = ROOT / m.test.split("::")[0]
        if done.returncode != 0:
            failed.append(m.name)
            print(f"{m.name}: {NOT_APPLIED}: {done.stderr.strip()}")
        elif not test_file.exists():
            failed.append(m.name)
            print(f"{m.name}: its test file {test_file.relative_to(ROOT)} is gone")
        else:
            print(f"{m.name}: applies")
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    if argv not in ([], ["check"]):
        raise SystemExit("python -m devkit.mutants [check]")
    if argv == ["check"]:
        return check(chosen(os.environ.get("MUTANTS")))
    # Started in the background (`&`), this process ignores SIGINT and its runs would inherit that:
    # interrupted at the bound, they would go on until killed, their counts unsaid.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    seeds = [int(s) for s in os.environ.get("MUTANT_SEEDS", "1 2 3").replace(",", " ").split()]
    seconds = float(os.environ.get("MUTANT_SECONDS", "300"))
    mutants = chosen(os.environ.get("MUTANTS"))
    # The code measured: HEAD, and whether the working tree differed from it.
    head = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    print(
        f"{len(mutants)} mutants, seeds {seeds}, at most {seconds:.0f} s a run, one run at a time", flush=True
    )
    runs: list[Run] = []
    # Seed by seed: every mutant's first run before any second, so a short session sees them all.
    for seed in seeds:
        for m in mutants:
            earlier = [r for r in runs if r.mutant == m.name]
            if earlier and (not m.seeded or any(r.outcome in (BROKEN, NOT_APPLIED) for r in earlier)):
                continue  # one run says all: the test draws nothing, or the patch does not run
            result = run(m, seed if m.seeded else None, seconds)
            runs.append(result)
            print(f"{m.name} seed {result.seed}: {cell(result)}", flush=True)
            with (SCRATCH / "results.jsonl").open("a") as out:
                stamp = {"at": datetime.now(UTC).isoformat(timespec="seconds"), "head": head}
                out.write(json.dumps(stamp | {"bound": seconds} | asdict(result)) + "\n")
    print()
    print(table(mutants, seeds, runs))
    failed = [m.name for m in mutants if not passes([r for r in runs if r.mutant == m.name])]
    if failed:
        print(f"\nFAILED: {', '.join(failed)}")
    return 1 if failed else 0


# --- the plugin of each run (pytest -p devkit.mutants) ------------------------------------------


@dataclass
class _Report:
    collect: list[str] = field(default_factory=list)
    phases: list[dict[str, Any]] = field(default_factory=list)


_REPORT = _Report()


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _REPORT.collect.append(str(report.longrepr).strip().splitlines()[-1][:300])


def pytest_runtest_makereport(item: Any, call: Any) -> None:
    failed = call.excinfo is not None
    _REPORT.phases.append(
        {
            "when": call.when,
            "type": call.excinfo.typename if failed else None,
            "message": str(call.excinfo.value).strip().split("\n")[0][:300] if failed else "",
        }
    )


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    path = os.environ.get("MUTANT_REPORT")
    if path:
        Path(path).write_text(json.dumps(asdict(_REPORT) | {"exitstatus": int(exitstatus)}))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
