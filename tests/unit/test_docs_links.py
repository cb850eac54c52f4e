"""Every relative link in README.md, docs/**/*.md and bench/RESULTS.md leads to a file of this
repository, and no page links outside it by a file path.

Pages link to files, not to anchors inside them (headings move; a link to a page survives), so a
link with a ``#fragment`` fails here too. Links with a scheme (https:, mailto:) are not files and
are left alone.
"""

from __future__ import annotations

import os
import re

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

#: [text](target) and ![alt](target); the target stops at whitespace or ")"
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`[^`]*`")


def _pages() -> list[str]:
    pages = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "bench", "RESULTS.md")]
    for dirpath, _dirs, files in os.walk(os.path.join(ROOT, "docs")):
        pages += [os.path.join(dirpath, f) for f in files if f.endswith(".md")]
    return sorted(p for p in pages if os.path.exists(p))


def _links(path: str) -> list[tuple[int, str]]:
    """(line number, target) of every link outside code blocks and code spans."""
    out = []
    in_code = False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if FENCE.match(line):
                in_code = not in_code
                continue
            if in_code:
                continue
            out += [(n, m.group(1)) for m in LINK.finditer(CODE_SPAN.sub("", line))]
    return out


def _problem(page: str, target: str) -> str | None:
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
        return None  # a URL, not a file
    if "#" in target:
        return "links to an anchor (link to the page instead)"
    if target.startswith("/"):
        return "an absolute path (use a path relative to the page)"
    resolved = os.path.normpath(os.path.join(os.path.dirname(page), target))
    if os.path.commonpath([resolved, ROOT]) != ROOT:
        return "leads outside the repository"
    if not os.path.exists(resolved):
        return "no such file"
    return None


def test_the_pages_exist() -> None:
    pages = [os.path.relpath(p, ROOT) for p in _pages()]
    for expected in ("README.md", "docs/README.md", "bench/RESULTS.md", "docs/reference/cli.md",
                     "docs/reference/maps.md"):
        assert expected in pages


@pytest.mark.parametrize("page", _pages(), ids=lambda p: os.path.relpath(p, ROOT))
def test_every_relative_link_resolves(page: str) -> None:
    bad = [f"{os.path.relpath(page, ROOT)}:{n}: ({target}) {why}"
           for n, target in _links(page) if (why := _problem(page, target))]
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_every_docs_page_is_reachable_from_the_index() -> None:
    """docs/README.md (or a page it links to) links every page under docs/."""
    seen: set[str] = set()
    todo = [os.path.join(ROOT, "docs", "README.md")]
    while todo:
        page = todo.pop()
        if page in seen or not page.endswith(".md") or not os.path.exists(page):
            continue
        seen.add(page)
        todo += [os.path.normpath(os.path.join(os.path.dirname(page), t)) for _n, t in _links(page)
                 if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I)]
    docs = [p for p in _pages() if p.startswith(os.path.join(ROOT, "docs") + os.sep)]
    missing = [os.path.relpath(p, ROOT) for p in docs if p not in seen]
    assert not missing, f"not linked from docs/README.md: {missing}"


def test_readme_stays_short() -> None:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        lines = f.read().count("\n")
    assert lines <= 250, f"README.md has {lines} lines; the rest belongs in docs/"
