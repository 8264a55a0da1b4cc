"""The docstrings' citations of the theory page become links of the API reference.

Docstrings cite the theory as plain text, readable in ``help()``: ``docs/theory.md#samplers``,
``docs/theory.md#sde and #causal-sde`` (further anchors after ``,`` or ``and``), or the bare
page ``docs/theory.md``. Two pieces turn them into links on the API pages:

- the griffe extension :class:`TheoryLinks` (mkdocstrings' ``extensions``) rewrites each
  citation, before rendering, into autorefs references whose identifiers are the cited text:
  ``[docs/theory.md#sde][docs/theory.md#sde] and [#causal-sde][docs/theory.md#causal-sde]``;
- the mkdocs hook :func:`on_page_content` (``hooks``) registers those identifiers when the
  theory page renders: ``docs/theory.md#ANCHOR`` for every heading anchor of the page, and
  ``docs/theory.md`` for the page itself.

autorefs resolves the references into relative links once every page is rendered. A citation
of an anchor the theory page does not have stays unresolved, and autorefs' warning fails the
strict build (``tests/test_docs_site.py`` checks this, and that every citation in the
docstrings is linked to an existing anchor).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

import griffe

PAGE = "docs/theory.md"
"""How the docstrings name the theory page (also the prefix of the autorefs identifiers)."""

PAGE_SOURCE = "theory.md"
"""The theory page, relative to ``docs_dir``."""

CITATION = re.compile(
    r"(?<![\w/\[`#.-])docs/theory\.md(?![\w/])"
    r"(?P<first>#[\w-]+)?(?P<more>(?:(?:,[ \t]*|\s+and\s+)#[\w-]+)*)"
)
"""A citation: the page, an optional anchor, further anchors after ``,`` or ``and``."""

_MORE = re.compile(r"(?P<sep>,[ \t]*|\s+and\s+)#(?P<anchor>[\w-]+)")


def identifier(anchor: str | None = None) -> str:
    """The autorefs identifier of the theory page (``anchor=None``) or of one of its anchors."""
    return PAGE if anchor is None else f"{PAGE}#{anchor}"


def link_citations(text: str) -> str:
    """``text`` with every theory citation rewritten as autorefs references (module doc)."""

    def replace(match: re.Match[str]) -> str:
        first = match["first"]
        if first is None:
            return f"[{PAGE}][{identifier()}]" + (match["more"] or "")
        out = f"[{PAGE}{first}][{identifier(first[1:])}]"
        out += _MORE.sub(
            lambda m: f"{m['sep']}[#{m['anchor']}][{identifier(m['anchor'])}]", match["more"]
        )
        return out

    return CITATION.sub(replace, text)


def _walk(obj: griffe.Object | griffe.Alias) -> Iterator[griffe.Object]:
    if isinstance(obj, griffe.Alias):
        return
    yield obj
    for member in obj.members.values():
        if not isinstance(member, griffe.Alias):
            yield from _walk(member)


class TheoryLinks(griffe.Extension):
    """Rewrites the theory citations of every docstring of a loaded package."""

    def on_package(self, *, pkg: griffe.Module, **_: Any) -> None:
        for obj in _walk(pkg):
            if obj.docstring is not None and PAGE in obj.docstring.value:
                obj.docstring.value = link_citations(obj.docstring.value)


def _toc_anchors(items: Iterable[Any]) -> Iterator[str]:
    for item in items:
        yield item.id
        yield from _toc_anchors(item.children)


def on_page_content(html: str, page: Any, config: Any, **_: Any) -> str:
    """mkdocs hook: on the theory page, register the identifiers the citations use."""
    if page.file.src_uri != PAGE_SOURCE:
        return html
    autorefs = config.plugins["autorefs"]
    anchors = list(_toc_anchors(page.toc or []))
    if anchors:
        autorefs.register_anchor(page, identifier(), anchor=anchors[0], primary=True)
    for anchor in anchors:
        autorefs.register_anchor(page, identifier(anchor), anchor=anchor, primary=True)
    return html
