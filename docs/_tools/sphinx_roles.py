"""Griffe extension: the docstrings' Sphinx roles become cross-references of the API pages.

The code's docstrings name other objects with Sphinx roles (``:func:`train```,
``:class:`~shapedtx.ModelConfig```), which mkdocstrings' Google-style parser would print
literally. Before rendering, each role is replaced by an autorefs link
(``[`train`][shapedtx.training.trainer.train]``) when its target, resolved in the scope of the
docstring's object, is rendered on an API page (a public name of ``shapedtx``, ``sde`` or
``simulations``, or a member of one of their classes or listed modules), and by the plain name
in code otherwise (a private helper, a name the reference does not show), so the strict build
never meets an unresolvable reference. ``tests/test_api_docs.py`` checks that no role is left.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import griffe

sys.path.insert(0, str(Path(__file__).parent))
from api import PACKAGES, entries, module_members

ROLE = re.compile(r":(?:func|class|mod|data|meth|attr|exc|obj):`(?P<tilde>~?)(?P<target>[^`]+)`")
"""A Sphinx cross-reference role (``~`` shows only the last component)."""


def rendered_targets() -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    """The paths the API pages render (one per public name) and, for public submodules
    rendered with a members list, path -> those members."""
    paths: set[str] = set()
    listed: dict[str, frozenset[str]] = {}
    for package in PACKAGES:
        for _, path in entries(package):
            paths.add(path)
            members = module_members(path) if "." not in path.removeprefix(package) else False
            if isinstance(members, list):
                listed[path] = frozenset(members)
    return frozenset(paths), listed


def _walk(obj: griffe.Object | griffe.Alias) -> Iterator[griffe.Object]:
    if isinstance(obj, griffe.Alias):
        return
    yield obj
    for member in obj.members.values():
        if not isinstance(member, griffe.Alias):
            yield from _walk(member)


class SphinxRoles(griffe.Extension):
    """Rewrites the roles of every docstring of a loaded package (see the module doc)."""

    def __init__(self) -> None:
        self.paths, self.listed = rendered_targets()

    def is_rendered(self, path: str, loader: griffe.GriffeLoader) -> bool:
        if path in self.paths:
            return True
        parent, _, name = path.rpartition(".")
        if name in self.listed.get(parent, ()):
            return True
        if parent not in self.paths:
            return False
        try:
            owner = loader.modules_collection.get_member(parent)
        except (KeyError, ValueError, AttributeError):
            return False
        return bool(getattr(owner, "is_class", False)) and name in owner.members

    def resolve(self, obj: griffe.Object, target: str) -> str | None:
        """The full path of ``target`` as seen from ``obj`` (its members, then its scopes)."""
        head, _, rest = target.partition(".")
        scope: griffe.Object | None = obj
        while scope is not None:
            if head in scope.members:
                found = scope.members[head]
                base = found.target_path if isinstance(found, griffe.Alias) else found.path
                return f"{base}.{rest}" if rest else base
            scope = scope.parent
        try:
            found = obj.modules_collection.get_member(target) if head in PACKAGES else None
        except (KeyError, ValueError, AttributeError):
            found = None
        if found is None:
            return target if head in PACKAGES else None
        try:
            return found.final_target.path if isinstance(found, griffe.Alias) else found.path
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            return found.target_path if isinstance(found, griffe.Alias) else found.path

    def link(self, match: re.Match[str], obj: griffe.Object, loader: griffe.GriffeLoader) -> str:
        target = match["target"].removeprefix(".")
        shown = target.rsplit(".", 1)[-1] if match["tilde"] else target
        path = self.resolve(obj, target)
        if path is not None and self.is_rendered(path, loader):
            return f"[`{shown}`][{path}]"
        return f"`{shown}`"

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **_: Any) -> None:
        for obj in _walk(pkg):
            if obj.docstring is not None and ROLE.search(obj.docstring.value):
                obj.docstring.value = ROLE.sub(
                    lambda m, o=obj: self.link(m, o, loader), obj.docstring.value
                )
