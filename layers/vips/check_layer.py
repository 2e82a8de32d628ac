"""Check a built layer: every pin of requirements.txt installed at exactly its version.

An `--only-binary` install quietly takes an older release when the pinned one has no wheel for the
target (pyvips 3.2.0 is a source package): this catches it. Run by the Makefile after the install.

    python3 check_layer.py REQUIREMENTS LAYER_PYTHON_DIR
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import distributions
from pathlib import Path

# What the Lambda python3.12 runtime already has: a copy in the layer would shadow its own.
RUNTIME_PROVIDED = {"boto3", "botocore", "s3transfer", "jmespath", "python-dateutil", "six", "urllib3"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(requirements: Path) -> dict[str, str]:
    found = {}
    for text in requirements.read_text().splitlines():
        line = text.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            found[normalize(name.split("[", 1)[0])] = version.strip()
    return found


def main(requirements: str, layer: str) -> int:
    wanted = pins(Path(requirements))
    installed = {normalize(d.metadata["Name"]): d.version for d in distributions(path=[layer])}
    problems = [
        f"{name}: wanted {version}, found {installed.get(name, 'nothing')}"
        for name, version in sorted(wanted.items())
        if installed.get(name) != version
    ]
    problems += [
        f"{name}: the runtime has it; the layer must not" for name in RUNTIME_PROVIDED & set(installed)
    ]
    problems += [
        f"{name}: installed but not in {requirements}" for name in sorted(set(installed) - set(wanted))
    ]
    for problem in problems:
        print(f"layer check: {problem}", file=sys.stderr)
    if not problems:
        print(f"layer check: {len(wanted)} packages at their pinned versions")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
