"""The import graph: ``shapedtx`` <- ``sde`` <- ``simulations`` <- the CLI
(``simulations.cli``, on top); inside ``shapedtx`` its core modules <- ``shapedtx.diagnostics``
<- ``shapedtx.training``; no import circle anywhere; and a light ``import shapedtx``.

The graph is read with ``ast`` from every module of the three packages: absolute and relative
imports, at module level and inside functions (only ``if TYPE_CHECKING:`` blocks, which never
run, are left out of the circle check)."""

import ast
import functools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PACKAGES = ("shapedtx", "sde", "simulations")
# package -> packages it must never import (higher in the graph)
HIGHER = {"shapedtx": ("sde", "simulations"), "sde": ("simulations",)}
# the layers inside shapedtx, lowest first (the package's own __init__, its facade, is above all)
SHAPEDTX_LAYERS = ("core", "diagnostics", "training")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST, type_checking: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, also inside functions and classes; those under
    ``if TYPE_CHECKING:`` only if ``type_checking``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test) and not type_checking:
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


@functools.cache
def _tree(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text())


@functools.cache
def _imported(name: str, type_checking: bool = True) -> frozenset[str]:
    """The absolute names module ``name`` imports (relative imports resolved); for ``from M
    import x`` the submodule ``M.x`` where there is one, else ``M``."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _import_nodes(_tree(name), type_checking):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
            continue
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            up = parts[: len(parts) - (node.level - 1)]
            base = ".".join(up + ([node.module] if node.module else []))
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            found.add(sub if sub in MODULES else base)
    return frozenset(found)


def _project(names: frozenset[str]) -> set[str]:
    """The project modules among imported names (``a.b.c`` -> its longest known prefix)."""
    out = set()
    for name in names:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name:
            out.add(name)
    return out


def _imports(path: Path) -> set[str]:
    """The top-level packages a file imports, relative imports resolved."""
    return {name.split(".")[0] for name in _imported(_module_name(path))}


def _graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports when run (TYPE_CHECKING blocks left out)."""
    return {name: _project(_imported(name, type_checking=False)) - {name} for name in MODULES}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _shapedtx_layer(name: str) -> str | None:
    """core, diagnostics or training for a module of shapedtx (None for its __init__)."""
    if name == "shapedtx":
        return None
    for layer in SHAPEDTX_LAYERS[1:]:
        if name == f"shapedtx.{layer}" or name.startswith(f"shapedtx.{layer}."):
            return layer
    return "core"


@pytest.mark.parametrize("package", sorted(HIGHER))
def test_lower_packages_never_import_higher_ones(package):
    bad = {
        str(path.relative_to(ROOT)): sorted(_imports(path) & set(HIGHER[package]))
        for path in (ROOT / package).rglob("*.py")
    }
    assert not {k: v for k, v in bad.items() if v}


def test_import_shapedtx_is_light():
    code = (
        "import sys, shapedtx\n"
        "heavy = ('torchsde', 'xarray', 'matplotlib', 'scipy', 'shapedtx.training', 'sde',"
        " 'simulations')\n"
        "print(','.join(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_lazy_packages_keep_the_gram_sampler_and_the_public_functions():
    """The packages load their names on first use: "gram" must still be a method wherever the
    samplers are read, and loading a submodule named like a public function
    (simulations.compare; the module of shapedtx.probe) must leave the package attribute the
    function."""
    code = (
        "from simulations import SAMPLERS\n"
        "assert 'gram' in SAMPLERS, SAMPLERS\n"
        "import simulations.compare, simulations.sweep, shapedtx.diagnostics.probing\n"
        "import simulations, shapedtx\n"
        "assert callable(simulations.compare) and callable(simulations.sweep)\n"
        "assert callable(shapedtx.probe) and not isinstance(shapedtx.probe, type(simulations))\n"
        "assert shapedtx.diagnostics.probe is shapedtx.probe\n"
        "from simulations import plots\n"
        "assert plots.__name__ == 'simulations.plots'\n"
    )
    subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)


def test_the_graph_sees_relative_and_function_level_imports():
    """The reader itself: a relative import at module level, one inside a function, and a
    ``from package import submodule`` each give their edge."""
    graph = _graph()
    assert "shapedtx.diagnostics.monitor" in graph["shapedtx.training.log"]
    assert "shapedtx.results" in graph["shapedtx.diagnostics.probing"]  # inside a function
    assert "shapedtx.metrics" in graph["shapedtx.diagnostics.monitor"]  # from .. import metrics
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_anywhere():
    assert _circles(_graph()) == []


def test_shapedtx_layers_core_diagnostics_training():
    """A core module of shapedtx imports neither diagnostics nor training, diagnostics does not
    import training (imports inside functions and under TYPE_CHECKING included)."""
    bad = []
    for name in MODULES:
        layer = _shapedtx_layer(name) if name.split(".")[0] == "shapedtx" else None
        if layer is None:
            continue
        rank = SHAPEDTX_LAYERS.index(layer)
        for target in _project(_imported(name)):
            other = _shapedtx_layer(target) if target.split(".")[0] == "shapedtx" else None
            if other is not None and SHAPEDTX_LAYERS.index(other) > rank:
                bad.append(f"{name} ({layer}) imports {target} ({other})")
    assert not bad, bad


def test_every_import_of_a_project_module_names_one_that_exists():
    """An import of a removed or misspelt module (``from ..probe import probe`` after probe
    moved) fails only when its function runs: every imported project name must be a module
    or a name of one (``from M import x``: ``M`` is a module)."""
    missing = []
    for name in MODULES:
        for imported in _imported(name):
            if imported.split(".")[0] in PACKAGES and imported not in MODULES:
                missing.append(f"{name}: {imported}")
    assert missing == []
