"""Issue 17: the process function's cold start as Lambda reports it, `Init Duration` under
`sam local invoke`.

The setup of `make test-aws-local` (SPEC 15, docs/dev/local-aws.md "On the host's network, offline"): the built
template (`make build`, run here when .aws-sam/build is missing or older than the code), the
python3.12 Lambda base image (AWS's, or the stand-in awslocal/image.py builds), SAM's runtime
interface emulator in the function's container on the host's network (awslocal.sam). Without a
Docker daemon that answers, the benchmark runs itself again under scripts/aws-local (with
AWS_LOCAL_NO_LOCALSTACK=1: dockerd and the image, installing Debian's docker.io and debootstrap
where missing, as root); what cannot be had is said (SKIPPED ...) and the benchmark exits 0.

Each round is one `sam local invoke ProcessFunction` in a fresh container (SAM makes one per
invoke), with a batch of no records: the handler answers at once, so no database or S3 is needed,
and the emulator's REPORT line gives the init phase (`Init Duration`: the runtime's start and
`import app`) of a truly cold container. BENCH_INIT_ROUNDS rounds (default: BENCH_ROUNDS, else 5);
the median is printed with the benchmarks' `import app` (coldstart.py's figure) in mind: the
factories of `ready` run at the first record, after init, and are not in `Init Duration`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

from devkit.stack import ROOT

ROUNDS = int(os.environ.get("BENCH_INIT_ROUNDS", os.environ.get("BENCH_ROUNDS", "5")))
TOOLS_PYTHON = ROOT / ".venv-tools" / "bin" / "python"
BUILT_TEMPLATE = ROOT / ".aws-sam" / "build" / "template.yaml"
BASE_IMAGE = "public.ecr.aws/lambda/python:3.12-x86_64"
RESULTS = ROOT / ".local" / "bench-results"
# The parameters `make test-aws-local` gives `sam local` (tests/aws_local/conftest.py).
PARAMETERS = (
    "SamLocal=true Stage=dev Architecture=x86_64 "
    "DbSecretArn=arn:aws:secretsmanager:us-east-1:000000000000:secret:local DbHost=127.0.0.1"
)
# The emulator's REPORT line of a cold invoke: "REPORT RequestId: ...\tInit Duration: 0.52 ms\t
# Duration: 402.11 ms\t...".
REPORT = re.compile(r"REPORT RequestId:.*?Init Duration:\s*([0-9.]+)\s*ms\s+Duration:\s*([0-9.]+)\s*ms")
UNDER_AWS_LOCAL = "LAMBDAINIT_UNDER_AWS_LOCAL"


def skipped(reason: str) -> NoReturn:
    print(f"SKIPPED lambdainit: {reason}")
    sys.exit(0)


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


def _stale(built: Path) -> bool:
    """The built template is missing, or older than anything `sam build` reads."""
    if not built.exists():
        return True
    built_at = built.stat().st_mtime
    sources = [ROOT / "template.yaml", *(ROOT / d for d in ("functions", "shared", "layers"))]
    for source in sources:
        paths = source.rglob("*") if source.is_dir() else [source]
        if any(p.is_file() and "__pycache__" not in p.parts and p.stat().st_mtime > built_at for p in paths):
            return True
    return False


def _invoke(env_file: Path, event: Path) -> tuple[tuple[float, float] | None, str]:
    """(Init Duration, Duration) of one cold invoke, in seconds, and SAM's output."""
    command = [
        str(TOOLS_PYTHON), "-m", "awslocal.sam", "local", "invoke", "ProcessFunction",
        "--template-file", str(BUILT_TEMPLATE), "--event", str(event), "--env-vars", str(env_file),
        "--parameter-overrides", PARAMETERS, "--docker-network", "host", "--skip-pull-image",
    ]  # fmt: skip
    environment = os.environ | {
        "PYTHONPATH": str(ROOT),
        "SAM_CLI_TELEMETRY": "0",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    done = subprocess.run(
        command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600, check=False
    )
    output = done.stdout + done.stderr
    found = REPORT.search(output)
    if not found or done.returncode != 0:
        return None, output
    return (float(found.group(1)) / 1000, float(found.group(2)) / 1000), output


def _setup() -> bool:
    """Docker, the image and the build ready here; False when this ran again under scripts/aws-local."""
    if not _docker_answers():
        if os.environ.get(UNDER_AWS_LOCAL) or os.environ.get("AWS_LOCAL") == "1":
            skipped(f"Docker does not answer (DOCKER_HOST={os.environ.get('DOCKER_HOST', 'default socket')})")
        if not TOOLS_PYTHON.exists():
            skipped("no .venv-tools (make tools): SAM and its runtime interface emulator live there")
        # scripts/aws-local starts dockerd and the python3.12 image and runs this again under them.
        print("lambdainit: no Docker daemon answers; running under scripts/aws-local", flush=True)
        status = subprocess.run(
            [str(ROOT / "scripts" / "aws-local"), sys.executable, "-m", "benchmarks.lambdainit"],
            cwd=ROOT,
            env=os.environ | {UNDER_AWS_LOCAL: "1", "AWS_LOCAL_NO_LOCALSTACK": "1"},
            check=False,
        ).returncode
        if status != 0:
            skipped(f"scripts/aws-local could not provide Docker and the python3.12 image (exit {status})")
        return False
    if subprocess.run(
        ["docker", "image", "inspect", BASE_IMAGE], capture_output=True, check=False
    ).returncode:
        skipped(f"no {BASE_IMAGE} image (scripts/aws-local builds the stand-in: make test-aws-local)")
    if _stale(BUILT_TEMPLATE):
        print("lambdainit: make build (the built template is missing or older than the code)", flush=True)
        if subprocess.run(["make", "build"], cwd=ROOT, check=False).returncode != 0:
            skipped("`make build` failed")
    return True


def main() -> None:
    if not _setup():
        return
    with tempfile.TemporaryDirectory(prefix="lambdainit-") as folder:
        env_file, event = Path(folder) / "env.json", Path(folder) / "event.json"
        variables = json.loads((ROOT / "env" / "local.json").read_text())["Parameters"]
        env_file.write_text(json.dumps({"Parameters": variables | {"POWERTOOLS_LOG_LEVEL": "WARNING"}}))
        event.write_text(json.dumps({"Records": []}))
        inits, durations = [], []
        for _ in range(ROUNDS):
            report, output = _invoke(env_file, event)
            if report is None:
                skipped(f"no REPORT line in sam local invoke's output: {output[-1500:]}")
            inits.append(report[0])
            durations.append(report[1])
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "lambdainit-last.txt").write_text(output)

    init, duration = statistics.median(inits), statistics.median(durations)
    print(f"the process function cold in the Lambda container (sam local invoke, {ROUNDS} fresh containers):")
    print(
        f"  Init Duration median {init * 1000:.1f} ms (min {min(inits) * 1000:.1f}, max {max(inits) * 1000:.1f}); "
        f"Duration of the empty batch median {duration * 1000:.0f} ms (min {min(durations) * 1000:.0f}, "
        f"max {max(durations) * 1000:.0f})"
    )
    # SAM's emulator starts the runtime only when the first invoke arrives and counts as init only
    # what precedes it: `import app` lands in that invoke's Duration (a warm empty batch takes ~1 ms).
    print(
        f"  cold start as the emulator reports it, Init Duration + Duration: {(init + duration) * 1000:.0f} ms"
    )
    coldstart = RESULTS / "coldstart.json"
    if coldstart.exists():
        medians = json.loads(coldstart.read_text())["medians"]
        print(
            f"  coldstart.py's figures (its last run): import {medians['process import compiled'] * 1000:.0f} ms, "
            f"ready {medians['process ready compiled'] * 1000:.0f} ms, import boto3 "
            f"{medians['boto3 alone (peer)'] * 1000:.0f} ms"
        )
    (RESULTS / "lambdainit.json").write_text(
        json.dumps({"rounds": ROUNDS, "init_durations": inits, "durations": durations}, indent=1)
    )
    print(f"written {(RESULTS / 'lambdainit.json').relative_to(ROOT)}")


if __name__ == "__main__":
    main()
