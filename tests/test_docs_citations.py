"""The code and the docs cite facts that live in the repository: no document outside it (the old notes file),
and every citation of a section of docs/engines.md (by its title, or a link to its anchor) names one that
exists."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ROOT

OUTSIDE = "REFERENCE" + ".md"  # spelt apart so that this file does not cite it
TREES = ("prefixscan", "tests", "bench", "conformance", "docs")


def _texts() -> list[tuple[Path, str]]:
    files = [ROOT / "README.md"]
    for tree in TREES:
        files += [p for p in (ROOT / tree).rglob("*") if p.suffix in (".py", ".md", ".sql") and "out" not in p.parts]
    return [(p, p.read_text(encoding="utf-8", errors="replace")) for p in files if p.is_file()]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _sections(page: Path) -> set[str]:
    return {m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+)$", page.read_text(), re.M)}


def test_nothing_cites_a_document_outside_the_repository() -> None:
    hits = [f"{p.relative_to(ROOT)}:{n}" for p, text in _texts() for n, line in enumerate(text.splitlines(), 1)
            if OUTSIDE in line]
    assert hits == []


def test_every_engines_citation_names_a_section_of_the_page() -> None:
    sections = _sections(ROOT / "docs" / "engines.md")
    anchors = {_slug(s) for s in sections}
    named, linked = set(), set()
    for _, text in _texts():
        flat = " ".join(text.split())  # citations may wrap across lines
        named |= set(re.findall(r"docs/engines\.md, '([^']+)'", flat))
        linked |= set(re.findall(r"\(engines\.md#([\w\-]+)\)", flat))
    assert named and linked
    assert named - sections == set()
    assert linked - anchors == set()


def test_the_slug_rule() -> None:
    assert _slug("SGLang `cache_aware`") == "sglang-cache_aware"
    assert _slug("Consistent hashing with bounded loads") == "consistent-hashing-with-bounded-loads"
