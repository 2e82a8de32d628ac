"""The documentation holds together: every relative link and #anchor in the README, CONTRIBUTING.md
and docs/ resolves inside the repository, each guide says first who it is for, nothing names a
document a clone does not have, and the README stays a front page whose first lines are the two
commands.

Anchors follow GitHub's rules for a heading (tests/markdown.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.markdown import FENCE, anchors, slug

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = sorted([README, ROOT / "CONTRIBUTING.md", *(ROOT / "docs").rglob("*.md")])
GUIDES = [page for page in PAGES if ROOT / "docs" in page.parents]

CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def prose(text: str) -> str:
    """The Markdown with fenced blocks and code spans blanked: links there are not links."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return CODE_SPAN.sub("", text)


def links(page: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(prose(page.read_text()))]


def test_the_slugs_follow_githubs_rules() -> None:
    # GIVEN headings with code, punctuation, braces and a repeat
    page = "# A\n## The soak (`make soak`)\n## photo-publish-{stage}-dead-letters\n## On the host's network\n## Notes\n## Notes\n"
    # WHEN they are slugged THEN as GitHub slugs them
    assert slug("The soak (`make soak`)") == "the-soak-make-soak"
    assert slug("photo-publish-{stage}-dead-letters") == "photo-publish-stage-dead-letters"
    assert slug("On the host's network, offline (`make test-aws-local`)") == (
        "on-the-hosts-network-offline-make-test-aws-local"
    )
    assert (
        slug("Changing the variants (recipes and backfill)") == "changing-the-variants-recipes-and-backfill"
    )
    assert slug("photo.published") == "photopublished"
    assert anchors(page) == {
        "a",
        "the-soak-make-soak",
        "photo-publish-stage-dead-letters",
        "on-the-hosts-network",
        "notes",
        "notes-1",
    }
    # AND a heading inside a fenced block is no heading
    assert anchors("```sh\n# a comment\n```\n## Real\n") == {"real"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves_inside_the_repository(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # https://, mailto: ... (AWS's documentation and the like)
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        # THEN the file is in the repository and exists
        if ROOT not in resolved.parents and resolved != ROOT:
            broken.append(f"{target}: outside the repository")
            continue
        if not resolved.exists():
            broken.append(f"{target}: no such file")
            continue
        # AND its anchor is one of that page's headings
        if anchor and (resolved.suffix != ".md" or anchor not in anchors(resolved.read_text())):
            broken.append(f"{target}: no heading #{anchor} in {resolved.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_names_a_document_outside_the_repository(page: Path) -> None:
    text = page.read_text()
    # the design is said in the project's own words: no "SPEC 16", no ../shared
    assert not re.search(r"\bSPEC\s*\d", text), f"{page.name} refers to a SPEC section"
    assert "../shared" not in text


@pytest.mark.parametrize("page", GUIDES, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_guide_says_first_who_it_is_for(page: Path) -> None:
    # GIVEN the guide's first paragraph after its title
    lines = page.read_text().splitlines()
    assert lines[0].startswith("# "), f"{page.name} starts with its title"
    first = next(line for line in lines[1:] if line.strip())
    # THEN it says who the guide is for
    assert first.startswith("For "), f"{page.name}: its first line says who it is for, not {first!r}"


def test_the_readme_is_a_front_page_whose_first_lines_are_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    # the team's rule: a new machine needs two commands, one runs the main job end to end, one the tests
    assert lines[0].startswith("# ")
    block = lines[lines.index("```sh") + 1 : lines.index("```")]
    assert lines.index("```sh") == 2
    assert [line.split()[:2] for line in block] == [["make", "demo"], ["make", "test"]]
    # and it stays short: the rest lives in the guides it links
    assert len(lines) <= 200, f"README.md has {len(lines)} lines"
    readme_links = set(links(README))
    for guide in GUIDES:
        if guide.parent == ROOT / "docs":
            assert str(guide.relative_to(ROOT)) in readme_links, f"the README does not link {guide.name}"
