"""``shapedtx sweep``: TOML grid file, summary, exit codes (0 done, 1 failed points, 2 usage)."""

import numpy as np
import pytest
import xarray as xr
from distributed import LocalCluster

from simulations.cli import main

GRID = """
kind = "both"
[grid]
width = [8, 16]
depth = 3
tokens = 2
samples = 2
dt = 0.1
"""


@pytest.fixture(scope="module")
def scheduler():
    with LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
    ) as cluster:
        yield cluster.scheduler_address


def _toml(tmp_path, text, name="grid.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_sweep_command_runs_and_resumes(tmp_path, scheduler, capsys):
    store = tmp_path / "out.zarr"
    argv = ["sweep", _toml(tmp_path, GRID), "--store", str(store), "--scheduler", scheduler]
    assert main([*argv, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "sweep[both] 4 points: 4 computed, 0 already done, 0 failed" in out
    ds = xr.open_zarr(store)
    assert (ds["status"].values == 1).all()
    # width 16: T = 3/16 in 2 SDE steps (3 saved times), padded to width 8's 5 with NaN
    V = ds["V"].sel(width=16, source="sde").values
    assert np.isfinite(V[:, :3]).all() and np.isnan(V[:, 3:]).all()
    assert main([*argv, "--no-progress"]) == 0
    assert "0 computed, 4 already done" in capsys.readouterr().out


def test_another_sweep_into_a_used_store_needs_overwrite(tmp_path, scheduler, capsys):
    store = str(tmp_path / "out.zarr")
    first = _toml(tmp_path, GRID.replace("[8, 16]", "[8]"), "first.toml")
    second = _toml(tmp_path, GRID.replace("[8, 16]", "[16]"), "second.toml")
    common = ["--store", store, "--scheduler", scheduler, "--no-progress"]
    assert main(["sweep", first, *common]) == 0
    assert main(["sweep", second, *common]) == 2
    err = capsys.readouterr().err
    assert "--overwrite" in err and len(err.splitlines()) == 1
    assert main(["sweep", second, *common, "--overwrite"]) == 0
    assert xr.open_zarr(store).width.values.tolist() == [16]


def test_embedded_cluster_worker_processes(tmp_path, capsys):
    store = tmp_path / "out.zarr"
    toml = _toml(tmp_path, "[grid]\nwidth = [8, 12]\ndepth = 2\ntokens = 2\nsamples = 2\n")
    argv = ["sweep", toml, "--store", str(store), "--workers", "1", "--dtype", "float32"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "2 computed" in captured.out and "Dask dashboard at http" in captured.err
    assert xr.open_zarr(store)["V"].dtype == np.float32


def test_failed_points_exit_1_and_are_listed(tmp_path, scheduler, capsys):
    toml = _toml(tmp_path, "[grid]\nwidth = [2, 8]\ndepth = 2\ntokens = 3\nsamples = 2\n")
    argv = ["sweep", toml, "--store", str(tmp_path / "s.zarr"), "--scheduler", scheduler]
    assert main([*argv, "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "1 computed, 0 already done, 1 failed" in out
    assert "failed: width=2, source=network: ParameterError: V0: width must be >=" in out


@pytest.mark.parametrize(
    ("toml", "options", "message"),
    [
        (None, [], "cannot read"),
        ("[grid\nwidth = 1", [], "is not valid TOML"),
        ("colour = 1\n[grid]\nwidth = 8", [], "unknown keys ['colour']"),
        ("kind = 'sde'", [], "needs a non-empty [grid] table"),
        ("kind = 'all'\n[grid]\nwidth = 8", [], "kind must be one of"),
        ("[grid]\nwidth = [8, 8]", [], "grid['width'] has repeated values"),
        ("[grid]\nwisth = 8", [], "unknown parameter 'wisth'"),
        ("[grid]\ngamma = 2.0", [], "gamma must be in (0, 1]"),
        ("[grid]\nwidth = 8", ["--kind", "sde", "--workers", "0"], "--workers must be >= 1"),
        ("[grid]\nwidth = 8", ["--threads-per-worker", "0"], "--threads-per-worker must be"),
        ("[grid]\nwidth = 8", ["--kind", "other"], "invalid choice"),
        ("[grid]\nwidth = 8", ["--scheduler", "nosuch://x:1"], "unknown address scheme"),
        ("[grid]\nwidth = 8", ["--scheduler", "bogus"], "missing port number"),
        ("[grid]\nwidth = 8", ["--scheduler", "tcp://x:1", "--workers", "2"], "omit it with"),
        ("[grid]\nwidth = 8", ["--store", "FILE"], "--store must be a directory"),
        ("[grid]\nwidth = 8", ["--device", "nowhere"], "--device"),
    ],
)
def test_bad_input_exit_2_with_one_line(tmp_path, toml, options, message, capsys):
    path = str(tmp_path / "missing.toml") if toml is None else _toml(tmp_path, toml)
    (tmp_path / "FILE").write_text("x")
    options = [str(tmp_path / "FILE") if o == "FILE" else o for o in options]
    with pytest.raises(SystemExit) as info:
        raise SystemExit(main(["sweep", path, "--store", str(tmp_path / "s.zarr"), *options]))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "s.zarr").exists()


def test_a_binary_grid_file_is_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "grid.toml"
    path.write_bytes(b"\xb5\x00\xff binary")
    assert main(["sweep", str(path), "--store", str(tmp_path / "s.zarr")]) == 2
    err = capsys.readouterr().err
    assert "is not valid TOML" in err and err.count("\n") == 1


def test_failed_scheduler_connection_leaves_no_default_client(tmp_path, capsys):
    """A client that failed to connect must not become dask's global default (xarray would
    then take distributed locks from it when writing netCDF, and fail)."""
    from distributed.client import _get_global_client

    path = _toml(tmp_path, "[grid]\nwidth = 8")
    code = main(["sweep", path, "--store", str(tmp_path / "s.zarr"), "--scheduler", "nosuch://x:1"])
    assert code == 2 and "unknown address scheme" in capsys.readouterr().err
    assert _get_global_client() is None


def test_shutdown_comm_closed_errors_are_silenced_and_others_kept(capsys):
    """Issue 39: a `CommClosedError` traceback at shutdown (results complete, exit 0) is not
    printed; any other error of distributed still is."""
    import logging
    import sys

    from distributed.comm.core import CommClosedError

    from simulations.cli.sweep import quiet_shutdown

    handler = logging.StreamHandler(sys.stderr)
    logger = logging.getLogger("distributed.client")
    logging.getLogger("distributed").addHandler(handler)
    try:
        with quiet_shutdown():
            try:
                raise CommClosedError("in <TCP (closed)>: Stream is closed")
            except CommClosedError:
                logger.exception("Failed to reconnect to scheduler")
            try:
                try:
                    raise CommClosedError("closed")
                except CommClosedError as err:
                    raise OSError("wrapped") from err
            except OSError:
                logging.getLogger("tornado.application").exception("Exception in callback")
            logger.error("a real problem")
        err = capsys.readouterr().err
        assert "CommClosedError" not in err and "Failed to reconnect" not in err
        assert "Exception in callback" not in err
        assert "a real problem" in err
        logger.exception("after the block")  # removed again
        assert "after the block" in capsys.readouterr().err
    finally:
        logging.getLogger("distributed").removeHandler(handler)
