"""The documentation site reads offline and links what it cites (issue 36, item 5).

- Formulas become MathML at build time (``docs/_tools/mathml.py``): every formula of the docs
  converts, a formula that does not stops the build, and the site loads nothing from a CDN.
- The docstrings' theory citations become links to the anchors of ``docs/theory.md``
  (``docs/_tools/theory_links.py``), and each cited anchor exists.
- The built API pages hold no literal Sphinx role and no unlinked theory citation
  (``test_built_site``: one strict build into a temporary folder, marked slow).
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# mkdocs, pymdownx, griffe and latex2mathml come with the `docs` extra
pytest.importorskip("mkdocs")
pytest.importorskip("latex2mathml")
griffe = pytest.importorskip("griffe")
markdown = pytest.importorskip("markdown")
yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PACKAGES = ("shapedtx", "sde", "simulations")
CDN = re.compile(r"https?://(?:cdn\.|cdnjs\.|unpkg\.|fonts\.g|[\w.-]*jsdelivr)", re.IGNORECASE)
ROLE = re.compile(r":(?:func|class|mod|data|meth|attr|exc|obj):(?:`|<code>)")


@pytest.fixture(scope="module")
def tools():
    sys.path.insert(0, str(DOCS / "_tools"))
    try:
        yield importlib.import_module("mathml"), importlib.import_module("theory_links")
    finally:
        sys.path.pop(0)


def theory_anchors() -> set[str]:
    text = (DOCS / "theory.md").read_text()
    return set(re.findall(r"^#+ .*\{#([\w-]+)\}\s*$", text, re.MULTILINE))


# --- math -------------------------------------------------------------------------------------


def test_config_loads_nothing_from_a_cdn():
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    for key in ("extra_javascript", "extra_css"):
        for entry in config.get(key) or []:
            assert not re.match(r"https?:", str(entry)), (key, entry)
    assert config["theme"].get("font") == "false"  # no Google Fonts
    assert "docs/_tools/mathml.py" in config["hooks"]
    assert not CDN.search((ROOT / "mkdocs.yml").read_text())


def test_every_formula_of_the_docs_converts(tools):
    mathml, _ = tools
    pages = sorted(DOCS.rglob("*.md"))
    count = 0
    for page in pages:
        md = markdown.Markdown(
            extensions=["pymdownx.arithmatex", "attr_list", "tables"],
            extension_configs={"pymdownx.arithmatex": {"generic": True}},
        )
        html = md.convert(page.read_text())
        count += len(mathml.FORMULA.findall(html))
        converted = mathml.convert_html(html, str(page))  # PluginError if one does not convert
        assert not re.search(r'class="arithmatex">\\[(\[]', converted), page
    assert count > 300  # docs/theory.md alone has hundreds


@pytest.mark.parametrize(
    "tex",
    [
        r"\foo{x}",  # unknown macro: latex2mathml keeps it as <mi>\foo</mi>
        r"\frac{1}{",  # unbalanced
        r"\begin{aligned} a &= b \end{aligned}",  # environment it does not align
    ],
)
def test_a_formula_that_does_not_convert_stops_the_build(tools, tex):
    mathml, _ = tools
    from mkdocs.exceptions import PluginError

    with pytest.raises(PluginError, match="does not convert"):
        mathml.convert_html(f'<p><span class="arithmatex">\\({tex}\\)</span></p>', "page.md")


def test_formulas_become_mathml(tools):
    mathml, _ = tools
    html = mathml.convert_html(
        '<div class="arithmatex">\\[\\mathbb{1}[W^O] + \\mathcal N &lt; \\tfrac1m\\]</div>'
    )
    assert '<math xmlns="http://www.w3.org/1998/Math/MathML" display="block">' in html
    assert "\\" not in html and "mathvariant" not in html  # Unicode letters instead
    assert "\U0001d7d9" in html and "\U0001d4a9" in html and "&#x0003C;" in html  # 𝟙, 𝒩, <
    assert mathml.styled_char("R", "double-struck") == "\u211d"  # ℝ, outside the math block
    assert mathml.styled_char("x", "bold") == "\U0001d431"
    assert mathml.convert_title("Noise without an \\(m^2\\) root").startswith(
        "Noise without an <math"
    )


# --- theory links -----------------------------------------------------------------------------


def test_citations_become_autorefs(tools):
    _, links = tools
    assert links.link_citations("(docs/theory.md#sde and #causal-sde).") == (
        "([docs/theory.md#sde][docs/theory.md#sde] and [#causal-sde][docs/theory.md#causal-sde])."
    )
    assert links.link_citations("docs/theory.md#notation, #layers and\n#sde") == (
        "[docs/theory.md#notation][docs/theory.md#notation], [#layers][docs/theory.md#layers] and"
        "\n[#sde][docs/theory.md#sde]"
    )
    assert links.link_citations("docs/theory.md's table") == (
        "[docs/theory.md][docs/theory.md]'s table"
    )
    already = "[docs/theory.md#sde](../theory.md#sde) and `docs/theory.md#sde`"
    assert links.link_citations(already) == already


def test_every_docstring_citation_links_to_an_existing_anchor(tools):
    """What the API pages render: every theory citation of every docstring is a reference to an
    anchor of docs/theory.md (the build registers exactly those; any other fails it)."""
    _, links = tools
    known = theory_anchors()
    reference = re.compile(r"\[[^\]]*\]\[docs/theory\.md(?:#(?P<anchor>[\w-]+))?\]")
    bad, count = [], 0
    for package in PACKAGES:
        loader = griffe.GriffeLoader(
            search_paths=[str(ROOT)], extensions=griffe.load_extensions(links.TheoryLinks())
        )
        for obj in links._walk(loader.load(package)):
            text = obj.docstring.value if obj.docstring else ""
            assert "docs/theory.md" not in reference.sub("", text), (obj.path, text)
            for match in reference.finditer(text):
                count += 1
                if match["anchor"] is not None and match["anchor"] not in known:
                    bad.append(f"{obj.path}: #{match['anchor']}")
    assert not bad, "docstrings cite anchors docs/theory.md does not have:\n" + "\n".join(bad)
    assert count >= 50


# --- the built site ---------------------------------------------------------------------------


@pytest.mark.slow
def test_built_site(tmp_path):
    """One strict build (about 10 s on a quiet machine, up to a minute under load)."""
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]

    for path in sorted(site.rglob("*")):
        if path.suffix in {".html", ".css"}:
            text = path.read_text()
            loads = re.findall(r"<(?:script|link)\b[^>]*(?:src|href)=\"https?://[^\"]*\"", text)
            assert not loads, (path, loads[:3])
            assert not re.search(r"(?:url\(|@import)\s*[\"']?https?://", text), path
            assert not CDN.search(text), path
            if path.suffix == ".html":
                assert not re.search(r'class="arithmatex">\s*\\[(\[]', text), path  # raw TeX

    theory = (site / "theory" / "index.html").read_text()
    assert theory.count('<math xmlns="http://www.w3.org/1998/Math/MathML"') > 300

    links = 0
    for package in PACKAGES:
        page = (site / "api" / package / "index.html").read_text()
        roles = ROLE.findall(page)
        assert not roles, (package, roles[:5])
        cited = re.findall(r'href="\.\./\.\./theory/#([\w-]+)"', page)
        assert set(cited) <= theory_anchors(), package
        links += len(cited)
        # every citation is inside a link: none is left as plain text
        outside = re.sub(r"<a\b[^>]*>.*?</a>", "", page, flags=re.DOTALL)
        assert "docs/theory.md" not in outside, package
    assert links >= 30
