"""Every link between the project's Markdown files resolves: the file exists, and an ``#anchor``
names a heading of it as GitHub spells heading anchors.  README's link to its executors' section
pointed at ``#running-on-an-executor-mscclpp-...``, where GitHub drops the ``+`` of ``MSCCL++``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("*/README.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose(page: Path) -> list[str]:
    """The page's lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of the page's headings: lower case, punctuation dropped but ``-`` and
    ``_``, spaces as ``-``; a repeated heading's anchor numbered ``-1``, ``-2``..."""
    found: set[str] = set()
    for line in prose(page):
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading is None:
            continue
        base = re.sub(r"[^\w\- ]", "", heading[1].lower()).replace(" ", "-")
        anchor, n = base, 0
        while anchor in found:
            n += 1
            anchor = f"{base}-{n}"
        found.add(anchor)
    return found


def test_the_anchor_rule_is_github_s() -> None:
    page = ROOT / "README.md"
    assert "running-on-an-executor-msccl-plans-current-or-msccl-xml-legacy" in anchors(page)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_between_pages_resolves(page: Path) -> None:
    broken = []
    for line in prose(page):
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{target}: no such file")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{target}: no such heading in {file.name}")
    assert broken == []
