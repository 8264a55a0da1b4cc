"""Several training runs' loss curves in one figure: ``shapedtx.plot_runs`` and ``shapedtx
plot`` (issue 39); the training plots are importable from ``shapedtx``."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import shapedtx
from shapedtx.results import save_dataset
from simulations.cli import main


def _run(folder, scale: float):
    step = np.arange(0, 20, 2)
    val = np.where(step % 4 == 0, scale * 3.0 / (1 + step), np.nan)
    log = xr.Dataset(
        {"train_loss": ("step", scale * 3.2 / (1 + step)), "val_loss": ("step", val)},
        coords={"step": step},
    )
    save_dataset(log, folder / "log.nc")
    return folder


def test_training_plots_are_public_names_of_shapedtx():
    for name in ("plot_losses", "plot_collapse", "plot_runs"):
        assert name in shapedtx.__all__
        assert getattr(shapedtx, name).__module__ == "shapedtx.training.plots"


def test_plot_runs_draws_every_run_in_one_axes(tmp_path):
    a, b = _run(tmp_path / "shaped", 1.0), _run(tmp_path / "preln", 1.2)
    fig = shapedtx.plot_runs([a, b / "log.nc"])
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["shaped", "preln"]
    assert len(ax.lines) == 4  # train and validation per run
    labelled = shapedtx.plot_runs({"one": a, "two": b})
    assert [t.get_text() for t in labelled.axes[0].get_legend().get_texts()] == ["one", "two"]
    (tmp_path / "x" / "run").mkdir(parents=True)
    (tmp_path / "y" / "run").mkdir(parents=True)
    same = shapedtx.plot_runs([_run(tmp_path / "x" / "run", 1), _run(tmp_path / "y" / "run", 2)])
    texts = [t.get_text() for t in same.axes[0].get_legend().get_texts()]
    assert texts == [str(tmp_path / "x" / "run"), str(tmp_path / "y" / "run")]
    with pytest.raises(ValueError, match="at least one"):
        shapedtx.plot_runs([])
    with pytest.raises(ValueError, match=r"runs\[1\]: .*not found"):
        shapedtx.plot_runs([a, tmp_path / "missing"])


def test_plot_command_writes_one_figure(tmp_path, capsys):
    a, b = _run(tmp_path / "shaped", 1.0), _run(tmp_path / "preln", 1.2)
    out = tmp_path / "losses.png"
    assert main(["plot", str(a), str(b), "--out", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG" and "2 runs" in capsys.readouterr().out
    for argv, needle in (
        (["plot", str(a), "--out", str(out)], "exists; pass --overwrite"),
        (["plot", str(a), "--out", str(tmp_path / "f.txt")], "--out must end in"),
        (["plot", str(a), str(tmp_path / "none"), "--out", str(tmp_path / "g.png")],
         "RUN[1]"),
        (["plot", str(a), "--label", "x", "--label", "y", "--out", str(tmp_path / "h.png")],
         "--label must be given once per RUN"),
    ):  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "g.png").exists()
