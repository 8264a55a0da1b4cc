"""mkdocs hook: the pages' TeX becomes MathML when the site is built, so formulas render offline.

``pymdownx.arithmatex`` (generic mode) leaves each formula as TeX in
``<span class="arithmatex">\\(...\\)</span>`` (inline) or
``<div class="arithmatex">\\[...\\]</div>`` (display). This hook converts each one with
``latex2mathml`` (pure Python, in the ``docs`` extra) into a ``<math>`` element, which browsers
render natively (MathML Core): the site needs no script and no network. Formulas in
table-of-contents titles are converted too. Styled single characters (``\\mathbf 1``,
``\\mathcal N``, ``\\mathbb 1``) become their Unicode mathematical letters: MathML Core (Chromium)
ignores ``mathvariant`` other than ``normal``.

A formula that does not convert stops the build (``mkdocs.exceptions.PluginError``, strict or
not): ``latex2mathml`` raising, or its output still holding a TeX command (an unknown macro
becomes ``<mi>\\foo</mi>`` instead of raising) or a bare alignment ``&`` (an unsupported
environment). ``tests/test_docs_site.py`` checks the built site.
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections.abc import Iterable, Iterator
from typing import Any

from latex2mathml.converter import convert
from mkdocs.exceptions import PluginError

FORMULA = re.compile(r'<(?P<tag>span|div) class="arithmatex">(?P<tex>.*?)</(?P=tag)>', re.DOTALL)
"""One formula as arithmatex writes it (generic mode; the TeX is HTML-escaped)."""

TOC_FORMULA = re.compile(r"\\\((?P<tex>.*?)\\\)", re.DOTALL)
"""An inline formula in a table-of-contents title (the heading's text, tags stripped)."""

_UNCONVERTED = re.compile(r"\\[A-Za-z]+|\\.|>&<|>&amp;<")
"""What a faithful conversion never leaves: a TeX command, or an alignment ``&`` as a token."""


_STYLED = re.compile(
    r'<(?P<tag>mi|mn) mathvariant="(?P<variant>[a-z-]+)">(?P<char>[^<&])</(?P=tag)>'
)
"""A single styled letter or digit of latex2mathml's output."""

_VARIANT_NAMES = {
    "bold": ("MATHEMATICAL BOLD",),
    "italic": ("MATHEMATICAL ITALIC",),
    "bold-italic": ("MATHEMATICAL BOLD ITALIC",),
    "double-struck": ("MATHEMATICAL DOUBLE-STRUCK", "DOUBLE-STRUCK"),
    "script": ("MATHEMATICAL SCRIPT", "SCRIPT"),
    "bold-script": ("MATHEMATICAL BOLD SCRIPT",),
    "fraktur": ("MATHEMATICAL FRAKTUR", "BLACK-LETTER"),
    "sans-serif": ("MATHEMATICAL SANS-SERIF",),
    "monospace": ("MATHEMATICAL MONOSPACE",),
}
_DIGITS = ("ZERO", "ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN", "EIGHT", "NINE")


def styled_char(char: str, variant: str) -> str | None:
    """The Unicode mathematical alphanumeric symbol of ``char`` in ``variant`` (None if
    Unicode has none): ``styled_char("R", "double-struck") == "\u211d"``."""
    if char.isdigit() and char.isascii():
        suffix = f"DIGIT {_DIGITS[int(char)]}"
    elif char.isascii() and char.isalpha():
        suffix = f"{'CAPITAL' if char.isupper() else 'SMALL'} {char.upper()}"
    else:
        return None
    for prefix in _VARIANT_NAMES.get(variant, ()):
        try:
            return unicodedata.lookup(f"{prefix} {suffix}")
        except KeyError:
            continue
    return None


def _unicode_styles(mathml: str) -> str:
    def replace(match: re.Match[str]) -> str:
        char = styled_char(match["char"], match["variant"])
        if char is None:
            return match[0]
        return f"<{match['tag']}>{char}</{match['tag']}>"

    return _STYLED.sub(replace, mathml)


def _strip_delimiters(tex: str) -> tuple[str, bool | None]:
    """The TeX without its ``\\(..\\)`` / ``\\[..\\]`` delimiters, and whether it is display
    math (None: no delimiters, e.g. a bare environment)."""
    tex = tex.strip()
    if tex.startswith("\\(") and tex.endswith("\\)"):
        return tex[2:-2], False
    if tex.startswith("\\[") and tex.endswith("\\]"):
        return tex[2:-2], True
    return tex, None


def to_mathml(tex: str, *, display: bool) -> str:
    """The MathML of one formula (TeX without delimiters); ValueError if it does not convert."""
    try:
        mathml = convert(tex, display="block" if display else "inline")
    except Exception as error:  # latex2mathml raises many types (its own, IndexError, ...)
        raise ValueError(f"formula does not convert to MathML: {tex!r} ({error!r})") from error
    bad = _UNCONVERTED.search(mathml)
    if bad:
        raise ValueError(
            f"formula does not convert to MathML: {tex!r} (left {bad.group(0)!r} in the output)"
        )
    return _unicode_styles(mathml)


def convert_html(text: str, where: str = "page") -> str:
    """``text`` with every arithmatex formula replaced by MathML (PluginError naming ``where``
    and the formula if one does not convert)."""

    def replace(match: re.Match[str]) -> str:
        tex, display = _strip_delimiters(html.unescape(match["tex"]))
        block = match["tag"] == "div"
        try:
            mathml = to_mathml(tex, display=block if display is None else display)
        except ValueError as error:
            raise PluginError(f"{where}: {error}") from error
        return f'<{match["tag"]} class="arithmatex">{mathml}</{match["tag"]}>'

    return FORMULA.sub(replace, text)


def convert_title(title: str, where: str = "page") -> str:
    """A table-of-contents title with its inline formulas as MathML."""

    def replace(match: re.Match[str]) -> str:
        try:
            return to_mathml(html.unescape(match["tex"]), display=False)
        except ValueError as error:
            raise PluginError(f"{where} (table of contents): {error}") from error

    return TOC_FORMULA.sub(replace, title)


def _toc_items(items: Iterable[Any]) -> Iterator[Any]:
    for item in items:
        yield item
        yield from _toc_items(item.children)


def on_page_content(html_text: str, page: Any, **_: Any) -> str:
    """mkdocs hook: convert the page's formulas and its table of contents' formulas."""
    where = page.file.src_uri
    for item in _toc_items(page.toc or []):
        item.title = convert_title(item.title, where)
    return convert_html(html_text, where)
