"""The import graph: ``shapedtx`` <- ``sde`` <- ``simulations`` <- the CLI
(``simulations.cli``, on top), and a light ``import shapedtx``."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
# package -> packages it must never import (higher in the graph)
HIGHER = {"shapedtx": ("sde", "simulations"), "sde": ("simulations",)}


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


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
    samplers are read, and loading a submodule named like a public
    function (simulations.compare, shapedtx.probe) must leave the package attribute the
    function."""
    code = (
        "from simulations import SAMPLERS\n"
        "assert 'gram' in SAMPLERS, SAMPLERS\n"
        "import simulations.compare, simulations.sweep, shapedtx.probe\n"
        "import simulations, shapedtx\n"
        "assert callable(simulations.compare) and callable(simulations.sweep)\n"
        "assert callable(shapedtx.probe) and not isinstance(shapedtx.probe, type(simulations))\n"
        "from simulations import plots\n"
        "assert plots.__name__ == 'simulations.plots'\n"
    )
    subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
