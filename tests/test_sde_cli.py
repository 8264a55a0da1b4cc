"""``shapedtx sde``: output, Dataset file, one-line errors with exit code 2."""

from __future__ import annotations

import pytest

from shapedtx import config_of, load_dataset
from simulations.cli import main


def test_sde_cli_writes_dataset_and_prints_exploded_fraction(tmp_path, capsys):
    out = tmp_path / "sde.nc"
    argv = ["sde", "--width", "100", "--depth", "50", "--mlp", "shaped_relu", "--tokens", "3"]
    argv += ["--samples", "8", "--dt", "0.05", "--seed", "2", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "exploded fraction: 0 " in text and "mean rho by t" in text
    ds = load_dataset(out)
    assert ds.attrs["source"] == "sde" and ds.attrs["seed"] == 2
    assert ds.sizes["sample"] == 8 and ds.sizes["token_a"] == 3
    assert config_of(ds).width == 100 and ds["t"].values[-1] == pytest.approx(0.5)


def test_sde_cli_reports_explosions(capsys):
    argv = ["sde", "--tau0", "0.3", "--scale", "4", "--samples", "16", "--no-progress"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    fraction = float(out.split("exploded fraction: ")[1].split()[0])
    assert fraction > 0.5
    assert err == ""  # reported once, in the summary (not again as the library's warning)


def _exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse errors
        return int(exc.code)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--attention", "softmax"], "no covariance SDE limit"),
        (["--norm", "pre"], "norm='pre'"),
        (["--dt", "0"], "dt must be"),
        (["--samples", "0"], "samples must be"),
        (["--rho0", "1.5"], "rho0 must be"),
        (["--out", "x.csv"], "--out must be a .nc file"),
        (["--method", "rk4"], "invalid choice"),
    ],
)
def test_sde_cli_bad_options(extra, message, capsys):
    assert _exit_code(["sde", "--samples", "4", "--no-progress", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
