"""The docs a newcomer reads: every relative link in README.md, CONTRIBUTING.md, CHANGELOG.md and docs/ resolves to
a file or folder of the repository, and the pinned set installs the versions the compatibility page names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)  # code blocks hold no links
    return [target for target in LINK.findall(text) if not re.match(r"[a-z]+:|#", target)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    missing = [t for t in relative_links(page) if not (page.parent / t.split("#")[0]).exists()]
    assert missing == []


def test_the_compatibility_page_names_the_pinned_transformers():
    pins = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    page = (ROOT / "docs" / "compatibility.md").read_text()
    assert f"| transformers | >= 5.17, < 6 | {pins['transformers']} |" in page
    assert f"| torch | 2.11.x | {pins['torch']} |" in page
