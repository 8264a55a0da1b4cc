"""The API reference pages, generated from the packages' ``__all__`` at build time.

An API page holds a marker line ``<!-- api: PACKAGE -->``; the mkdocs hook below replaces it with
one mkdocstrings block (``::: path``) per public name, in ``__all__`` order, pointing at the
module that defines the name (``shapedtx`` loads some names lazily, which static analysis
cannot follow through ``__init__``). A name added to ``__all__`` therefore appears in the
reference without editing the docs; ``tests/test_api_docs.py`` checks that it does and that it
has a docstring.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import types
from typing import Any

PACKAGES = ("shapedtx", "sde", "simulations")
MARKER = re.compile(r"^<!-- api: (?P<package>[A-Za-z_][\w.]*) -->$", re.MULTILINE)


def definition_path(package: str, name: str) -> str:
    """Dotted path of the object ``package.name`` where it is defined (for mkdocstrings)."""
    module = importlib.import_module(package)
    obj = getattr(module, name)
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    defined_in = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    is_named = inspect.isclass(obj) or inspect.isfunction(obj)
    if is_named and defined_in and qualname and "<" not in qualname:
        return f"{defined_in}.{qualname}"
    # Constants: mkdocstrings follows the alias of the package's namespace statically.
    return f"{package}.{name}"


def module_members(path: str) -> list[str] | bool:
    """Members to render for a public submodule: its own ``__all__`` if any, else False
    (its public functions are rendered under their own names elsewhere)."""
    module = importlib.import_module(path)
    names = getattr(module, "__all__", None)
    return list(names) if names else False


def entries(package: str) -> list[tuple[str, str]]:
    """``(name, definition path)`` for every name in ``package.__all__``."""
    module = importlib.import_module(package)
    return [(name, definition_path(package, name)) for name in module.__all__]


def render(package: str) -> str:
    """The markdown that replaces ``<!-- api: package -->``."""
    blocks = []
    for name, path in entries(package):
        if name == "__version__":
            blocks.append(
                f"## `{package}.__version__`\n\nThe installed distribution's version string "
                "(`importlib.metadata`).\n"
            )
            continue
        options = [f'        heading: "{package}.{name}"', "        show_root_full_path: false"]
        obj = getattr(importlib.import_module(package), name)
        if isinstance(obj, types.ModuleType):
            members = module_members(path)
            shown = "false" if members is False else json.dumps(members)
            options.append(f"        members: {shown}")
        blocks.append(f"::: {path}\n    options:\n" + "\n".join(options) + "\n")
    return "\n".join(blocks)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """mkdocs hook: expand the API markers of a page."""
    return MARKER.sub(lambda match: render(match.group("package")), markdown)
