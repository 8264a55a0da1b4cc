"""Every public name (``__all__``) of the three packages has a docstring and is in the API
reference, which ``docs/_tools/api.py`` generates from ``__all__`` at build time."""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import types
from pathlib import Path

import pytest

# griffe comes with the `docs` extra (mkdocstrings); without it the module is skipped, as the
# `transformers` tests are without `hf`
griffe = pytest.importorskip("griffe")

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("shapedtx", "sde", "simulations")
# Constants whose attribute docstring has yet to be written in the code (owned by other
# branches). Remove a name once it is documented: the second test below insists.
PENDING: set[str] = set()


@pytest.fixture(scope="module")
def api():
    sys.path.insert(0, str(ROOT / "docs" / "_tools"))
    try:
        yield importlib.import_module("api")
    finally:
        sys.path.pop(0)


def docstring(package: str, name: str, static: griffe.Object) -> str | None:
    if name == "__version__":
        return "version string"  # documented by the generator
    obj = getattr(importlib.import_module(package), name)
    if isinstance(obj, types.ModuleType) or inspect.isclass(obj) or inspect.isroutine(obj):
        return inspect.getdoc(obj)
    member = static[name]  # constants: the attribute docstring, read statically
    return member.docstring.value if member.docstring else None


def undocumented() -> set[str]:
    missing = set()
    for package in PACKAGES:
        static = griffe.load(package, search_paths=[str(ROOT)], resolve_aliases=False)
        for name in importlib.import_module(package).__all__:
            if not (docstring(package, name, static) or "").strip():
                missing.add(f"{package}.{name}")
    return missing


def test_public_names_have_docstrings():
    missing = undocumented() - PENDING
    assert not missing, f"public names without a docstring: {sorted(missing)}"


def test_pending_list_is_current():
    fixed = PENDING - undocumented()
    assert not fixed, f"documented now, remove from PENDING: {sorted(fixed)}"


@pytest.mark.parametrize("package", PACKAGES)
def test_api_page_renders_all_public_names(api, package):
    page = (ROOT / "docs" / "api" / f"{package}.md").read_text()
    assert f"<!-- api: {package} -->" in page
    rendered = api.on_page_markdown(page)
    for name in importlib.import_module(package).__all__:
        if name == "__version__":
            assert f"{package}.__version__" in rendered
            continue
        path = api.definition_path(package, name)
        assert path.rsplit(".", 1)[-1] == name
        assert f"::: {path}\n" in rendered, f"{package}.{name} missing from the API reference"


def test_api_pages_are_in_the_nav():
    config = (ROOT / "mkdocs.yml").read_text()
    for package in PACKAGES:
        assert f"api/{package}.md" in config


def test_no_sphinx_role_reaches_the_api_pages():
    """The griffe extension of the docs build turns every Sphinx role of the docstrings into a
    cross-reference to a rendered object, or plain code: none is printed literally, and every
    link it makes points at an object the API pages render (so the strict build resolves it)."""
    sys.path.insert(0, str(ROOT / "docs" / "_tools"))
    try:
        roles = importlib.import_module("sphinx_roles")
    finally:
        sys.path.pop(0)
    extension = roles.SphinxRoles()
    link = re.compile(r"\[`[^`]+`\]\[(?P<path>[\w.]+)\]")
    links = 0
    for package in PACKAGES:
        loader = griffe.GriffeLoader(
            search_paths=[str(ROOT)], extensions=griffe.load_extensions(extension)
        )
        pkg = loader.load(package)
        for obj in roles._walk(pkg):
            text = obj.docstring.value if obj.docstring else ""
            assert not roles.ROLE.search(text), (obj.path, roles.ROLE.search(text)[0])
            for match in link.finditer(text):
                assert extension.is_rendered(match["path"], loader), (obj.path, match[0])
                links += 1
    assert links >= 50  # the docstrings cite each other: most roles do become links
