"""``shapedtx stability``: a thin wrapper over simulations.stability_map."""

import xarray as xr

from simulations.cli import main


def test_stability_command_prints_the_map_and_writes_files(tmp_path, capsys):
    out, figure = tmp_path / "map.nc", tmp_path / "map"
    argv = ["stability", "--width", "16", "--gammas", "0.001,0.002", "--tau0s", "1",
            "--T-max", "0.25", "--samples", "4", "--no-progress", "--out", str(out),
            "--figure", str(figure)]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "0.25c / 0.25c" in text and "100% of cells within 10%" in text
    ds = xr.load_dataset(out)
    assert ds["median_exit"].shape == (2, 2, 1) and ds.attrs["depth"] == 4
    assert (tmp_path / "map.png").exists() and (tmp_path / "map.pdf").exists()


def test_bad_grid_is_a_one_line_error_naming_the_option(capsys):
    assert main(["stability", "--gammas", "0,0.5", "--samples", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shapedtx stability: error: --gammas must be"), err
    assert len(err.strip().splitlines()) == 1
    assert main(["stability", "--tau0s", "a,b"]) == 2
    assert "--tau0s must be comma-separated numbers" in capsys.readouterr().err
