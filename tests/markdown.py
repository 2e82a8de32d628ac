"""For the tests that hold the docs to the code: a page's headings as GitHub anchors them, and its
tables by their header line."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.MULTILINE)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's Markdown text (before duplicates are numbered): the text as
    rendered (code, emphasis and links reduced to their text), lower-cased, every character but
    letters, digits, `_`, `-` and spaces removed, spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[`*]", "", text)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every anchor GitHub makes for the headings of a page, a repeated one suffixed -1, -2, ..."""
    seen: Counter[str] = Counter()
    found = set()
    for match in HEADING.finditer(FENCE.sub("", markdown)):
        base = slug(match.group(2))
        found.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
        seen[base] += 1
    return found


def table(path: Path, head: str) -> list[list[str]]:
    """The rows of the table whose header line is `head` in `path`, each a list of its cells."""
    lines = path.read_text().splitlines()
    assert head in lines, f"{path.name} has no table headed {head}"
    rows = []
    for line in lines[lines.index(head) + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows
