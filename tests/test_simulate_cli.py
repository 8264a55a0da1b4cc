"""``shapedtx simulate``: output file, summary, one-line errors with exit code 2."""

import numpy as np
import pytest

from shapedtx import load_dataset
from simulations.cli import main


def test_simulate_writes_dataset_and_summary(tmp_path, capsys):
    out = tmp_path / "sim.nc"
    argv = ["simulate", "--width", "16", "--depth", "4", "--tokens", "3", "--rho0", "0.3"]
    argv += ["--samples", "5", "--method", "weights", "--mlp", "shaped_relu", "--seed", "2"]
    assert main([*argv, "--dtype", "float32", "--no-progress", "--out", str(out)]) == 0
    text = capsys.readouterr()
    assert "mean rho by layer {0: 0.3000" in text.out and "wrote" in text.out
    assert text.err == ""
    ds = load_dataset(out)
    assert ds["V"].shape == (5, 5, 3, 3) and ds["V"].dtype == np.float32
    assert (ds.attrs["method"], ds.attrs["seed"], ds.attrs["config.mlp"]) == (
        "weights",
        2,
        "shaped_relu",
    )


@pytest.mark.parametrize(("options", "method"), [([], "gram"), (["--norm", "pre"], "exact")])
def test_default_method_is_the_library_default(options, method, capsys, tmp_path):
    """Without --method the CLI does what ``simulate`` does without one: the fastest exact
    method for the config ("auto"), named in the summary and the attrs."""
    out = tmp_path / "sim.nc"
    argv = ["simulate", "--width", "16", "--depth", "2", "--samples", "4", "--no-progress"]
    assert main([*argv, *options, "--out", str(out)]) == 0
    assert f"simulate[{method}] width=16" in capsys.readouterr().out
    attrs = load_dataset(out).attrs
    assert (attrs["method"], attrs["method_requested"]) == (method, "auto")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--samples", "0"], "samples must be an integer >= 1"),
        (["--rho0", "1.5"], "rho0 must be in"),
        (["--tokens", "1"], "--tokens must be an integer >= 2"),
        (["--scale", "-1"], "scale must be a finite number > 0"),
        (["--method", "gram0"], "invalid choice"),
        (["--dtype", "float16"], "invalid choice"),
        (["--out", "sim.csv"], "--out must be a .nc file"),
        (["--width", "3"], "--tokens: width must be >= the number of tokens m = 4"),
        (["--gamma", "2"], "gamma must be in (0, 1]"),
        (["--threads", "0"], "--threads must be in [1, "),
        (["--device", "nowhere"], "--device"),
    ],
)
def test_bad_options_exit_2_with_one_line(options, message, capsys):
    with pytest.raises(SystemExit) as info:
        code = main(["simulate", "--depth", "2", "--samples", "2", "--no-progress", *options])
        raise SystemExit(code)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_library_warnings_are_one_line_naming_the_command(capsys):
    argv = ["simulate", "--width", "8", "--depth", "2", "--tokens", "3", "--samples", "3"]
    # V doubles per block from 1e308: overflows float64 (and V0 itself is still accepted)
    assert main([*argv, "--scale", "1e308", "--residual", "unit", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert err == (
        "shapedtx simulate: warning: simulate: 3 of 3 samples have non-finite covariances "
        "(method='gram', dtype=torch.float64); see the 'nonfinite' attribute\n"
    )
