"""Every relative link and ``#anchor`` in README.md and docs/*.md resolves, and every docs page is reachable.

Anchors are computed as GitHub renders them: the heading's text without its markup, lower-cased, stripped of
punctuation other than ``-`` and ``_``, spaces turned into ``-``, and ``-1``, ``-2`` ... added to repeats. Links in
code blocks and code spans are not links, and are skipped; so are absolute URLs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t#]*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_INLINE_LINK_TEXT = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def prose_lines(text: str) -> Iterable[tuple[int, str]]:
    """``(line number, line)`` of the lines outside fenced code blocks."""
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        m = _FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None:
            yield number, line


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading's text (before duplicates are numbered)."""
    text = _INLINE_LINK_TEXT.sub(r"\1", heading)
    text = _CODE_SPAN.sub(lambda m: m.group(2), text)
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a Markdown page defines through its headings."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in prose_lines(text):
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(text: str) -> Iterable[tuple[int, str]]:
    """``(line number, target)`` of every inline link outside code."""
    for number, line in prose_lines(text):
        for m in _LINK.finditer(_CODE_SPAN.sub("", line)):
            yield number, m.group(1)


def broken_links(pages: Iterable[Path], root: Path) -> list[str]:
    """One line per link in ``pages`` whose file or anchor does not exist (``page:line: target: why``)."""
    problems: list[str] = []
    cache: dict[Path, set[str]] = {}
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for number, target in links(text):
            if not target or _SCHEME.match(target) or target.startswith("//"):
                continue
            where = f"{page.relative_to(root)}:{number}: {target}"
            path_part, _, anchor = target.partition("#")
            dest = (page.parent / path_part).resolve() if path_part else page
            if not dest.exists():
                problems.append(f"{where}: no such file")
                continue
            if root.resolve() not in (dest, *dest.parents):
                problems.append(f"{where}: outside the repository")
                continue
            if not anchor:
                continue
            if dest.suffix != ".md" or not dest.is_file():
                problems.append(f"{where}: an anchor into a file that is not Markdown")
                continue
            if dest not in cache:
                cache[dest] = anchors(dest.read_text(encoding="utf-8"))
            if anchor not in cache[dest]:
                problems.append(f"{where}: no heading with anchor #{anchor} in {dest.relative_to(root.resolve())}")
    return problems


def doc_pages() -> list[Path]:
    """README.md and every page under docs/."""
    return [README, *sorted(DOCS.glob("*.md"))]


def test_every_relative_link_and_anchor_in_the_readme_and_docs_resolves() -> None:
    assert len(doc_pages()) > 1, "docs/ holds no page"
    assert broken_links(doc_pages(), ROOT) == []


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {
        (README.parent / target.partition("#")[0]).resolve()
        for _, target in links(README.read_text(encoding="utf-8"))
        if target and not _SCHEME.match(target) and not target.startswith("#")
    }
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert unlinked == []


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "# Page A\n\n## `flexmig status` and `flexmig plan`\n\n## Repeat\n\n## Repeat\n\n"
        "```sh\n# not a heading\n[not a link](gone.md)\n```\n",
        encoding="utf-8",
    )
    (tmp_path / "README.md").write_text(
        "# Top\n\n"
        "[ok](docs/a.md#flexmig-status-and-flexmig-plan) [ok](docs/a.md#repeat-1) [self](#top)\n"
        "[web](https://example.com/x#y) `[code](nowhere.md)`\n"
        "[missing file](docs/b.md) [missing anchor](docs/a.md#not-a-heading) [second repeat](docs/a.md#repeat-2)\n"
        "[outside](../elsewhere.md)\n",
        encoding="utf-8",
    )
    problems = broken_links([tmp_path / "README.md", tmp_path / "docs" / "a.md"], tmp_path)
    assert [p.split(": ", 2)[1] for p in problems] == [
        "docs/b.md",
        "docs/a.md#not-a-heading",
        "docs/a.md#repeat-2",
        "../elsewhere.md",
    ], problems


def test_slugs_follow_github() -> None:
    assert slug("The simulated NVIDIA driver (`flexmig.sim`)") == "the-simulated-nvidia-driver-flexmigsim"
    assert slug("Running the daemon: `flexmigd`") == "running-the-daemon-flexmigd"
    assert slug("The queue discipline (shared by every policy)") == "the-queue-discipline-shared-by-every-policy"
    assert slug("A [link](x.md) and *emphasis*") == "a-link-and-emphasis"
