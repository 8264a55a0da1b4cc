"""References to the theory page point at sections that exist; no old THEORY citation remains.

Code, docstrings, error messages and markdown cite the theory as ``docs/theory.md#anchor``
(further anchors of the same citation as ``, #anchor`` / ``and #anchor``). Every anchor must be
the ``{#anchor}`` of a heading of ``docs/theory.md``. The old form ("THEORY section N") is
rewritten by ``docs/_tools/replace_theory_refs.py``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE_PATH = ROOT / "docs" / "theory.md"
SKIP_DIRS = {"build", "site", "dist", "venv", "runs", "_tools"}  # and hidden folders (.git, .venv)
CITATION = re.compile(r"docs/theory\.md((?:#[\w-]+)(?:(?:,\s*|\s+and\s+)#[\w-]+)*)")
LINK = re.compile(r"\]\((?:\.\./)*theory\.md#([\w-]+)\)")


def anchors() -> set[str]:
    return set(re.findall(r"^#+ .*\{#([\w-]+)\}\s*$", PAGE_PATH.read_text(), re.MULTILINE))


def sources() -> list[Path]:
    found = []
    for path in sorted(ROOT.rglob("*")):
        rel = path.relative_to(ROOT)
        folders = rel.parts[:-1]
        if any(p in SKIP_DIRS or p.startswith(".") or p.endswith(".egg-info") for p in folders):
            continue
        if path.is_file() and path.suffix in {".py", ".md"} and path != Path(__file__):
            found.append(path)
    return found


def test_theory_page_has_every_old_section():
    sys.path.insert(0, str(ROOT / "docs" / "_tools"))
    try:
        from replace_theory_refs import ANCHORS
    finally:
        sys.path.pop(0)
    missing = set(ANCHORS.values()) - anchors()
    assert not missing, f"anchors of the mapping table missing from docs/theory.md: {missing}"


def test_every_theory_reference_exists():
    known = anchors()
    bad = []
    count = 0
    for path in sources():
        text = path.read_text()
        found = [m.group(1) for m in CITATION.finditer(text)]
        cited = [a for group in found for a in re.findall(r"#([\w-]+)", group)]
        cited += LINK.findall(text)
        count += len(cited)
        bad += [f"{path.relative_to(ROOT)}: #{a}" for a in cited if a not in known]
    assert not bad, "references to sections docs/theory.md does not have:\n" + "\n".join(bad)
    assert count > 0


def test_no_old_theory_citation_remains():
    """Enforced after ``python docs/_tools/replace_theory_refs.py`` has run on the tree."""
    old = re.compile(r"(?<![\w/])THEORY(?:\.md)?(?![\w])")
    left = []
    for path in sources():
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if old.search(line):
                left.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not left, (
        "old THEORY citations (run python docs/_tools/replace_theory_refs.py):\n" + "\n".join(left)
    )
