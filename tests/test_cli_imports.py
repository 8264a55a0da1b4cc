"""``shapedtx CMD --help`` and argument errors load no torch (issue #39, defect 8): the parsers
are built from torch-free modules, the heavy imports happen when the command runs."""

import subprocess
import sys

import pytest

from simulations.cli import SUBCOMMANDS

# argv after `shapedtx CMD` -> an argument error of CMD, reported before torch loads
ERRORS = {
    "simulate": [["--width", "-3"], ["--dtype", "float16"], ["--method", "nope"]],
    "sde": [["--width", "-3"], ["--method", "nope"], ["--rho0", "x"]],
    "train": [["--width", "-3"], ["--dtype", "float16"], ["--steps", "0"]],
    "plot": [[]],  # RUN is required
    "probe": [[]],  # RUN is required
    "design": [["--params", "x"]],
    "advise": [["--width", "x"]],
    "sweep": [["grid.toml"], ["grid.toml", "--store", "s", "--kind", "nope"]],
    "compare": [["--width", "8"], ["--out", "o", "--width", "-3"], ["--out", "o", "--preset", "x"]],
    "stability": [["--width", "-3"], ["--gammas", "x"], ["--method", "nope"]],
}

_WRAPPER = """
import sys
sys.argv = ["shapedtx", *sys.argv[1:]]
from simulations.cli import main
try:
    code = main()
except SystemExit as exit:
    code = exit.code
heavy = [m for m in ("torch", "xarray", "sde", "simulations.experiment") if m in sys.modules]
print("EXIT", code, "LOADED", ",".join(heavy), file=sys.stderr)
"""


def _run(argv: list[str], cwd) -> tuple[int, str, str]:
    out = subprocess.run(
        [sys.executable, "-c", _WRAPPER, *argv], capture_output=True, text=True, cwd=cwd
    )
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("EXIT "), out.stderr
    _, code, _, loaded = [*last.split(" ", 3), ""][:4]
    return int(code), loaded, out.stderr


def test_every_subcommand_has_its_error_cases():
    assert set(ERRORS) == set(SUBCOMMANDS)


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_help_loads_no_torch(command, tmp_path):
    code, loaded, err = _run([command, "--help"], tmp_path)
    assert code == 0, err
    assert loaded == "", f"shapedtx {command} --help imported {loaded}"


@pytest.mark.parametrize(
    "argv", [[command, *args] for command, cases in ERRORS.items() for args in cases], ids=str
)
def test_argument_errors_load_no_torch(argv, tmp_path):
    code, loaded, err = _run(argv, tmp_path)
    assert code == 2, err
    assert "error:" in err and "Traceback" not in err, err
    assert loaded == "", f"shapedtx {' '.join(argv)} imported {loaded}"
    assert not any(tmp_path.iterdir())  # nothing was written


def test_the_parsers_names_are_the_libraries():
    """The parsers offer plain names (simulations.cli._common) so as not to load the tables that
    hold torch objects; they must be those tables' keys."""
    from sde import SOLVERS
    from shapedtx.options import DTYPES
    from simulations import SAMPLERS
    from simulations.cli import _common, train

    assert tuple(DTYPES) == _common.DTYPE_NAMES
    assert tuple(SOLVERS) == _common.SDE_METHODS
    assert tuple(SAMPLERS) == _common.SAMPLER_METHODS
    dtypes = [train.torch_dtype(name) for name in train.DTYPES]
    assert dtypes[:2] == list(DTYPES.values()) and str(dtypes[2]) == "torch.bfloat16"


def test_the_presets_are_their_plain_data():
    from simulations.presets import PRESET_MODELS, PRESETS

    assert list(PRESETS) == list(PRESET_MODELS)
    for name, (config, description) in PRESET_MODELS.items():
        assert (PRESETS[name].name, PRESETS[name].config) == (name, config)
        assert PRESETS[name].description == description
