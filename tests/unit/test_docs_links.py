"""README.md and docs/*.md render as meant: fences closed, one title, every relative link real.

Every relative link and image (`[text](path)`, `![alt](path)`, `<img src="path">`) outside
code must name a file or folder that exists, relative to the page; a `#anchor` into a
Markdown page must name one of its headings (GitHub's slugs). Web addresses are not fetched.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s<>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMG = re.compile(r"<img\s[^>]*src=\"([^\"]+)\"", re.I)


def _unfenced(text: str) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def _prose(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code, with inline code removed (it holds no links)."""
    return [(number, re.sub(r"`[^`]*`", "``", line)) for number, line in _unfenced(text)]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\*|_(?=\W)|(?<=\W)_", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    slugs: dict[str, int] = {}
    found = set()
    for _, line in _unfenced(page.read_text()):
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            slug = _slug(match.group(1))
            count = slugs.get(slug, 0)
            found.add(slug if count == 0 else f"{slug}-{count}")
            slugs[slug] = count + 1
    return found


def _links(page: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in _prose(page.read_text()):
        for pattern in (LINK, IMG):
            found += [(number, match.group(1)) for match in pattern.finditer(line)]
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_fences_are_closed_and_there_is_one_title(page: Path) -> None:
    text = page.read_text()
    fences = [n for n, line in enumerate(text.splitlines(), 1) if FENCE.match(line)]
    assert len(fences) % 2 == 0, f"{page.name}: a code fence is left open (fences at {fences})"
    titles = [line for _, line in _prose(text) if re.match(r"#\s", line)]
    assert len(titles) == 1, f"{page.name}: one '# title' expected, found {titles}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_images_exist(page: Path) -> None:
    missing = []
    for number, target in _links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):
            continue  # https:, mailto:: not fetched
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            missing.append(f"{page.name}:{number}: {target} (no such file)")
        elif anchor and where.suffix == ".md" and anchor not in _anchors(where):
            missing.append(f"{page.name}:{number}: {target} (no such heading)")
    assert not missing, "\n".join(missing)


def test_the_readme_links_every_docs_page_and_shows_a_picture() -> None:
    readme = {target for _, target in _links(ROOT / "README.md")}
    for page in PAGES[1:]:
        assert any(t.split("#")[0] == f"docs/{page.name}" for t in readme), page.name
    assert any(t.endswith(".png") for t in readme)


def test_the_checker_sees_links_and_skips_code() -> None:
    assert _slug("Checkpoints and resume") == "checkpoints-and-resume"
    assert (
        _slug("The library call: `lbtrain.balanced_loader`")
        == "the-library-call-lbtrainbalanced_loader"
    )
    text = "see [a](docs/x.md#y) and ![p](docs/p.png)\n```\n[not](a/link)\n```\n`[no](t)`"
    lines = _prose(text)
    found = [m.group(1) for _, line in lines for m in LINK.finditer(line)]
    assert found == ["docs/x.md#y", "docs/p.png"]
