"""Parameter sweeps on Dask (simulations.sweep): same numbers as direct calls, resumable after a
kill without recomputing finished points, failing points recorded while the others complete."""

import importlib
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import xarray as xr
import zarr
from distributed import Client, LocalCluster

import sde
from shapedtx import ModelConfig
from simulations import equicorrelated, open_point, open_sweep, simulate, sweep
from simulations.grid import make_grid, point_seed
from simulations.sweep import read_records

sweep_module = importlib.import_module("simulations.sweep.run")  # where sweep() looks up _task


@pytest.fixture(scope="module")
def client():
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


def _direct(config, params, source, seed):
    V0 = equicorrelated(params["tokens"], params.get("rho0", 0.2), params.get("scale", 1.0))
    if source == "network":
        return simulate(
            config,
            V0,
            params["samples"],
            method=params.get("method", "auto"),
            seed=seed,
            progress=False,
        )
    return sde.solve(
        config,
        V0,
        params["samples"],
        T=params.get("T"),
        dt=params["dt"],
        save_every=params.get("save_every"),
        seed=seed,
        progress=False,
    )


def _without_sweep_attrs(ds):
    ds = ds.copy()
    ds.attrs.pop("sweep.params")
    return ds


# --------------------------------------------------------------------------------------------
# Grid validation and seeds
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("grid", "kind", "message"),
    [
        ({"width": [8], "colour": 1}, "network", "unknown parameter 'colour'"),
        ({"width": []}, "network", "grid['width'] must be a non-empty list"),
        ({"tau0": [1, 1.0]}, "network", "grid['tau0'] has repeated values"),
        ({"width": [8.5]}, "network", "grid['width'] values must be integers"),
        ({"width": True}, "network", "grid['width'] values must be integers"),
        ({"tau0": float("nan")}, "network", "grid['tau0'] values must be finite numbers"),
        ({"attention": [1]}, "network", "grid['attention'] values must be strings"),
        ({"causal": 1}, "network", "grid['causal'] values must be true/false"),
        ({"depth": 4, "T": 0.5}, "network", "depth or T, not both"),
        ({"dt": 0.1}, "network", "grid['dt'] is only used with kind='sde'"),
        ({"method": "weights"}, "sde", "grid['method'] is only used with kind='network'"),
        (
            {"method": ["gram", "bogus"]},
            "network",
            "grid['method'] must be one of 'auto', 'exact', 'weights', 'gram', got 'bogus'",
        ),
        ({"sde_method": "milstein"}, "sde", "grid['sde_method'] must be one of 'euler', 'em'"),
        ({"width": 8}, "neither", "kind must be one of"),
        ({}, "network", "grid must be a non-empty mapping"),
    ],
)
def test_bad_grids_raise_naming_the_parameter(grid, kind, message):
    with pytest.raises(ValueError, match=None) as info:
        make_grid(grid, kind)
    assert message in str(info.value)


def test_point_seeds_are_deterministic_distinct_and_type_normalised():
    points = list(make_grid({"tau0": [1, 2], "width": [8, 16], "seed": 3}).points())
    seeds = [p.seed for p in points]
    assert len(set(seeds)) == 4 and all(0 <= s < 2**63 for s in seeds)
    # the seed is a function of the point's parameters only (ints given for floats agree)
    again = next(make_grid({"width": 8, "tau0": 1.0, "seed": 3}).points())
    assert again.seed == seeds[0] == point_seed(points[0].params)
    # samples do not enter the seed (more samples extend, not redraw, a network run)
    more = next(make_grid({"width": 8, "tau0": 1.0, "seed": 3, "samples": 999}).points())
    assert more.seed == seeds[0]
    other = next(make_grid({"width": 8, "tau0": 1.0, "seed": 4}).points())
    assert other.seed != seeds[0]


SEED_BASE = {"width": 8, "T": 0.5, "tokens": 3, "rho0": 0.2, "scale": 1.0, "tau0": 1.0, "seed": 3}


@pytest.mark.parametrize(
    ("name", "value"),
    [("T", 0.75), ("tokens", 4), ("rho0", 0.3), ("scale", 2.0), ("width", 16), ("tau0", 0.5),
     ("seed", 4), ("heads", 2), ("mlp", "relu"), ("causal", True), ("key_dim", 4)],
)  # fmt: skip
def test_point_seed_depends_on_every_parameter_defining_the_model_and_input(name, value):
    """Two points differing in one model or input parameter never share a random stream."""
    base = point_seed(SEED_BASE)
    assert point_seed({**SEED_BASE, name: value}) != base
    # also through the grid: the points of a dimension over that parameter differ
    if name in SEED_BASE:
        points = list(make_grid({**SEED_BASE, name: [SEED_BASE[name], value]}).points())
        assert points[0].seed == base != points[1].seed
    else:
        assert next(make_grid({**SEED_BASE, name: [value]}).points()).seed != base


@pytest.mark.parametrize(
    ("name", "value", "kind"),
    [("samples", 7, "network"), ("method", "weights", "network"), ("dt", 0.02, "sde"),
     ("sde_method", "em", "sde"), ("save_every", 3, "sde")],
)  # fmt: skip
def test_point_seed_ignores_sample_count_and_solver(name, value, kind):
    base = next(make_grid(SEED_BASE, kind).points()).seed
    assert next(make_grid({**SEED_BASE, name: value}, kind).points()).seed == base
    assert [p.seed for p in make_grid(SEED_BASE, "both").points()] == [base, base]


# --------------------------------------------------------------------------------------------
# Same numbers as direct calls, one readable store
# --------------------------------------------------------------------------------------------
GRID = {
    "width": [8, 12],
    "T": [0.25, 0.5],
    "tokens": [2, 3],
    "samples": 3,
    "mlp": "shaped_relu",
    "dt": 0.05,
    "save_every": 2,
    "seed": 5,
}


def test_sweep_matches_direct_calls_and_reads_as_one_store(client, tmp_path):
    store = tmp_path / "grid.zarr"
    summary = sweep(GRID, store=store, kind="both", client=client, progress=False)
    assert summary.ok and (summary.total, summary.computed, summary.skipped) == (16, 16, 0)

    raw = xr.open_zarr(store)  # the documented plain-xarray access
    assert list(raw["V"].dims) == [
        *("width", "T", "tokens", "source", "sample", "step", "token_a", "token_b")
    ]
    checked = 0
    for width in GRID["width"]:
        for T in GRID["T"]:
            for m in GRID["tokens"]:
                params = {**GRID, "width": width, "T": T, "tokens": m}
                seed = point_seed({**params, "rho0": 0.2, "scale": 1.0})
                config = ModelConfig(width=width, depth=round(T * width), mlp="shaped_relu")
                for source in ("network", "sde"):
                    cell = raw.sel(width=width, T=T, tokens=m, source=source)
                    assert int(cell["seed"]) == seed and int(cell["status"]) == 1
                    direct = _direct(config, params, source, seed)
                    nt = direct.sizes["t"]
                    V = cell["V"].values
                    np.testing.assert_array_equal(V[:, :nt, :m, :m], direct["V"].values)
                    assert np.isnan(V[:, nt:]).all() and np.isnan(V[:, :, m:]).all()
                    np.testing.assert_array_equal(cell["t"].values[:nt], direct["t"].values)
                    point = open_point(store, width=width, T=T, tokens=m, source=source)
                    xr.testing.assert_identical(_without_sweep_attrs(point), direct)
                    assert json.loads(point.attrs["sweep.params"])["tokens"] == m
                    checked += 1
    assert checked == 16
    # the SDE ran to exactly T (depth time), the network to depth = T * width blocks
    sde_t = raw["t"].sel(source="sde", width=8, tokens=2).max("step")
    np.testing.assert_allclose(sde_t.values, GRID["T"], rtol=1e-12)


def test_embedded_cluster_and_scheduler_address_give_the_same_store(client, tmp_path):
    grid = {"width": [8, 16], "depth": 3, "tokens": 2, "samples": 2}
    embedded = sweep(grid, store=tmp_path / "a.zarr", workers=1, processes=False, progress=False)
    address = sweep(
        grid, store=tmp_path / "b.zarr", client=client.scheduler.address, progress=False
    )
    assert embedded.computed == address.computed == 2
    a, b = open_sweep(tmp_path / "a.zarr"), open_sweep(tmp_path / "b.zarr")
    xr.testing.assert_identical(a.load(), b.load())


# --------------------------------------------------------------------------------------------
# Resumable and safe
# --------------------------------------------------------------------------------------------
def _finished(store):
    return {k: (r["run_id"], r["finished"]) for k, r in read_records(store).items()}


def test_restart_recomputes_only_a_half_written_point(client, tmp_path):
    store = tmp_path / "resume.zarr"
    grid = {"width": [8, 16], "tau0": [0.5, 1.0], "depth": 4, "tokens": 3, "samples": 4}
    assert sweep(grid, store=store, client=client, progress=False).computed == 4
    before = _finished(store)

    # What a worker killed while writing point (width=16, tau0=0.5) leaves behind: status back
    # to pending (set before writing), part of its region overwritten, a stray temporary record.
    group = zarr.open_group(store, mode="r+")
    group["status"][1, 0, 0] = 0
    group["V"][1, 0, 0, :2] = 1e30
    (store / "_sweep" / ".p1_0_0.json.dead.tmp").write_text("{trunc")
    view = open_sweep(store)
    assert view["status"].sel(width=16, tau0=0.5).item() == "pending"
    assert view["V"].sel(width=16, tau0=0.5).isnull().all()  # never reads as valid
    with pytest.raises(ValueError, match="is pending"):
        open_point(store, width=16, tau0=0.5)

    again = sweep(grid, store=store, client=client, progress=False)
    assert (again.computed, again.skipped, again.failed) == (1, 3, {})
    after = _finished(store)
    assert {k: v for k, v in after.items() if k != "p1_0_0"} == {
        k: v for k, v in before.items() if k != "p1_0_0"
    }
    assert after["p1_0_0"][0] != before["p1_0_0"][0]  # recomputed by the second run
    config = ModelConfig(width=16, depth=4, tau0=0.5)
    direct = _direct(config, {"tokens": 3, "samples": 4}, "network", int(view["seed"][1, 0, 0]))
    xr.testing.assert_identical(_without_sweep_attrs(open_point(store, width=16, tau0=0.5)), direct)

    third = sweep(grid, store=store, client=client, progress=False)
    assert (third.computed, third.skipped) == (0, 4) and _finished(store) == after


KILL_GRID = {"width": [16, 32, 48], "depth": 20, "tokens": 4, "samples": [100, 200]}
KILL_SCRIPT = f"""
import sys
import time
from distributed import Client, LocalCluster
from simulations import sweep
import simulations.driver as driver

_simulate = driver.simulate


def _slow(*args, **kwargs):  # a second per point: the kill lands between two points
    time.sleep(1.0)
    return _simulate(*args, **kwargs)


driver.simulate = _slow  # the worker runs in this process (processes=False)

if __name__ == "__main__":
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        sweep({KILL_GRID!r}, store=sys.argv[1], client=client, progress=False)
"""


def test_killed_sweep_loses_nothing_and_recomputes_nothing_finished(client, tmp_path):
    store = tmp_path / "killed.zarr"
    script = tmp_path / "run.py"
    script.write_text(KILL_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(store)], start_new_session=True)
    try:  # SIGKILL the whole sweep (client and workers) as soon as one point is finished
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if (store / "status").exists() and (zarr.open_group(store)["status"][...] == 1).any():
                break
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    status = zarr.open_group(store)["status"][..., 0]
    done_before = _finished(store)
    done_keys = {f"p{i}_{j}_0" for i, j in zip(*np.nonzero(status == 1), strict=True)}
    assert 1 <= len(done_keys) < 6, "the kill should land mid-sweep"

    summary = sweep(KILL_GRID, store=store, client=client, progress=False)
    assert summary.ok and summary.skipped == len(done_keys)
    assert summary.computed == 6 - len(done_keys)
    after = _finished(store)
    for key in done_keys:
        assert after[key] == done_before[key]  # finished points were not recomputed
    ds = open_sweep(store)
    assert (ds["status"] == "done").all()
    for width in KILL_GRID["width"]:  # nothing lost: every point equals the direct call
        for samples in KILL_GRID["samples"]:
            point = open_point(store, width=width, samples=samples)
            config = ModelConfig(width=width, depth=20)
            seed = int(ds["seed"].sel(width=width, samples=samples, source="network"))
            direct = simulate(
                config, equicorrelated(4, 0.2), samples, method="auto", seed=seed, progress=False
            )
            xr.testing.assert_identical(_without_sweep_attrs(point), direct)


def test_failing_points_are_recorded_and_the_others_complete(client, tmp_path):
    store = tmp_path / "fail.zarr"
    # width 2 < 3 tokens raises inside simulate (on the worker); heads 4 does not divide 2
    # (an invalid combination, recorded without running); the other points must complete.
    grid = {"width": [2, 8], "heads": [1, 4], "depth": 2, "tokens": 3, "samples": 2}
    summary = sweep(grid, store=store, client=client, progress=False)
    assert summary.computed == 2 and not summary.ok
    assert set(summary.failed) == {
        "width=2, heads=1, source=network",
        "width=2, heads=4, source=network",
    }
    assert (
        "width must be >= the number of tokens"
        in summary.failed["width=2, heads=1, source=network"]
    )
    assert "heads must divide width" in summary.failed["width=2, heads=4, source=network"]
    ds = open_sweep(store)
    assert ds["status"].values.ravel().tolist() == ["failed", "failed", "done", "done"]
    assert "ParameterError: V0: width must be >= the number" in ds["error"].values[0, 0, 0]
    assert ds["error"].values[1, 0, 0] == ""
    assert np.isfinite(ds["V"].sel(width=8, heads=1).values[:, :, :, :3, :3]).all()
    record = read_records(store)["p0_0_0"]
    assert record["status"] == "failed" and "Traceback" in record["traceback"]
    with pytest.raises(ValueError, match=r"is failed: ParameterError: V0: width"):
        open_point(store, width=2, heads=1)

    kept = sweep(grid, store=store, client=client, retry_failed=False, progress=False)
    assert (kept.computed, kept.skipped, len(kept.failed)) == (0, 2, 2)
    assert read_records(store)["p0_0_0"]["run_id"] == record["run_id"]  # not rerun
    retried = sweep(grid, store=store, client=client, progress=False)
    assert (retried.computed, retried.skipped, len(retried.failed)) == (0, 2, 2)
    assert read_records(store)["p0_0_0"]["run_id"] != record["run_id"]  # rerun, fails again


def test_a_store_of_another_sweep_is_refused(client, tmp_path):
    store = tmp_path / "s.zarr"
    grid = {"width": [8], "depth": 2, "tokens": 2, "samples": 2}
    sweep(grid, store=store, client=client, progress=False)
    with pytest.raises(ValueError, match="holds a different sweep"):
        sweep({**grid, "width": [8, 16]}, store=store, client=client, progress=False)
    with pytest.raises(ValueError, match="kind"):
        sweep(grid, store=store, kind="both", client=client, progress=False)
    # the same padded shape is not enough: other grid values or another dtype are refused
    with pytest.raises(ValueError, match=r"\(sweep.grid differ\)"):
        sweep({**grid, "width": [12]}, store=store, client=client, progress=False)
    with pytest.raises(ValueError, match=r"\(sweep.dtype differ\)"):
        sweep(grid, store=store, dtype=torch.float32, client=client, progress=False)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("not a store")
    with pytest.raises(ValueError, match="is not a sweep store"):
        sweep(grid, store=tmp_path / "plain", client=client, progress=False)
    with pytest.raises(ValueError, match="every grid point is invalid"):
        sweep({**grid, "gamma": 2.0}, store=tmp_path / "x.zarr", client=client, progress=False)
    # a value invalid wherever it appears is refused before any store is created
    with pytest.raises(ValueError, match="grid value width = -3 is invalid"):
        sweep({**grid, "width": [8, -3]}, store=tmp_path / "y.zarr", client=client,
              progress=False)  # fmt: skip
    assert not (tmp_path / "y.zarr").exists()
    with pytest.raises(ValueError, match="do not pass it with client"):
        sweep(grid, store=store, client=client, workers=2)
    cores = os.cpu_count() or 1
    for workers in (0, cores + 1):  # a process per worker: more than the cores only costs
        with pytest.raises(ValueError, match=rf"workers must be an integer in \[1, {cores}\]"):
            sweep(grid, store=store, workers=workers)
    with pytest.raises(ValueError, match="give exactly the grid dimensions"):
        open_point(store, width=8, tau0=1.0)
    with pytest.raises(ValueError, match="no point"):
        open_point(store, width=9)


def test_overwrite_replaces_a_sweep_store_and_nothing_else(client, tmp_path):
    """``overwrite=True`` starts afresh: the other sweep's store is gone (no stale point or
    record survives) and the new grid is complete; a directory that is not a sweep store is
    never deleted, and an invalid grid is refused before the old store is touched."""
    store = tmp_path / "s.zarr"
    old = {"width": [8, 16], "depth": 2, "tokens": 2, "samples": 2}
    sweep(old, store=store, client=client, progress=False)
    new = {**old, "width": [12]}
    with pytest.raises(ValueError, match="--overwrite"):
        sweep(new, store=store, client=client, progress=False)
    with pytest.raises(ValueError, match="grid value width = -3 is invalid"):
        sweep({**new, "width": [12, -3]}, store=store, client=client, overwrite=True,
              progress=False)  # fmt: skip
    assert open_sweep(store).width.values.tolist() == [8, 16]  # untouched
    summary = sweep(new, store=store, client=client, overwrite=True, progress=False)
    assert (summary.total, summary.computed, summary.skipped) == (1, 1, 0)
    assert open_sweep(store).width.values.tolist() == [12]
    assert [r["params"]["width"] for r in read_records(store).values()] == [12]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no leftovers
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a sweep store"):
        sweep(new, store=tmp_path / "plain", client=client, overwrite=True, progress=False)
    assert (tmp_path / "plain" / "notes.txt").read_text() == "mine"


def test_a_task_lost_on_the_cluster_is_recorded_by_the_client(client, tmp_path, monkeypatch):
    # e.g. distributed.KilledWorker after a worker died repeatedly: the task raises on the
    # client side, which records the point as failed and finishes the others
    real = sweep_module._task

    def flaky(point, *args):
        if point.coords["width"] == 16:
            raise RuntimeError("worker lost")
        return real(point, *args)

    monkeypatch.setattr(sweep_module, "_task", flaky)
    store = tmp_path / "lost.zarr"
    store.mkdir()  # an empty directory is a fine place for a new store
    grid = {"width": [8, 16], "depth": 2, "tokens": 2, "samples": 2}
    summary = sweep(grid, store=store, client=client, progress=False)
    assert summary.computed == 1
    assert summary.failed == {"width=16, source=network": "RuntimeError: worker lost"}
    assert open_sweep(store)["status"].values.tolist() == [["done"], ["failed"]]
    monkeypatch.setattr(sweep_module, "_task", real)
    again = sweep(grid, store=store, client=client, progress=False)
    assert (again.computed, again.skipped, again.failed) == (1, 1, {})


def test_no_retry_still_runs_points_that_never_finished(client, tmp_path):
    """retry_failed=False keeps *failed* points as they are; a pending point (never finished,
    e.g. its worker was killed) is computed all the same."""
    store = tmp_path / "pending.zarr"
    grid = {"width": [2, 8, 16], "depth": 2, "tokens": 3, "samples": 2}  # width 2 fails
    first = sweep(grid, store=store, client=client, progress=False)
    assert (first.computed, len(first.failed)) == (2, 1)
    failed_run = read_records(store)["p0_0"]["run_id"]
    zarr.open_group(store, mode="r+")["status"][2, 0] = 0  # width 16 back to pending
    again = sweep(grid, store=store, client=client, retry_failed=False, progress=False)
    assert (again.computed, again.skipped, list(again.failed)) == (
        1, 1, ["width=2, source=network"]
    )  # fmt: skip
    assert open_sweep(store)["status"].values.ravel().tolist() == ["failed", "done", "done"]
    assert read_records(store)["p0_0"]["run_id"] == failed_run


@pytest.mark.parametrize(
    ("T", "width", "depth"), [(0.26, 10, 3), (0.24, 10, 2), (1.0, 8, 8), (0.5, 3, 2)]
)
def test_grid_T_gives_depth_round_T_width_and_sde_save_times(T, width, depth):
    """depth = round(T * width) for a network point (depth + 1 saved times); the SDE point
    runs to T exactly with ceil(T / dt) steps, saving every save_every steps and at T."""
    grid = {"T": T, "width": width, "dt": 0.1, "save_every": 2}
    net, sde_point = make_grid(grid, "both").points()
    assert net.config.depth == depth == sde_point.config.depth
    assert net.n_t == depth + 1 and sde_point.T == T
    steps = math.ceil(T / 0.1 - 1e-9)
    assert sde_point.n_t == len(range(0, steps + 1, 2)) + (steps % 2 != 0)
    # default stride: steps // 200 (at least 1): 300 steps -> every step, 500 -> every 2nd
    assert next(make_grid({"T": 3.0, "width": 8, "dt": 0.01}, "sde").points()).n_t == 301
    assert next(make_grid({"T": 5.0, "width": 8, "dt": 0.01}, "sde").points()).n_t == 251
    bad = next(make_grid({"T": 0.04, "width": 10}).points())
    assert bad.config is None and "depth >= 1" in bad.error


@pytest.mark.parametrize(
    ("grid", "kind", "error"),
    [({"samples": 1}, "network", None), ({"samples": 0}, "network", "samples must be"),
     ({"T": 0.125}, "network", None), ({"T": 0.05}, "network", "depth >= 1"),
     ({"T": 0.125, "dt": 0.0}, "sde", "dt must be a finite number > 0"),
     ({"T": 0.125, "dt": 0.125}, "sde", None)],
)  # fmt: skip
def test_point_validity_boundaries(grid, kind, error):
    """samples >= 1, depth = round(T width) >= 1 and dt > 0 are the limits of a valid point
    (width 8: T = 0.125 is exactly one block)."""
    point = next(make_grid({"width": 8, **grid}, kind).points())
    if error is None:
        assert point.error is None and point.config is not None
    else:
        assert point.config is None and error in point.error


def test_run_point_is_the_direct_call_without_progress_bars(capfd):
    """A worker's point runs quietly (no tqdm bar per point) and returns the direct call's
    Dataset."""
    from simulations.sweep.point import run_point

    grid = {"width": 8, "depth": 2, "tokens": 2, "samples": 2, "dt": 0.1, "seed": 1}
    for p in make_grid(grid, "both").points():
        ds = run_point(p, torch.float64)
        direct = _direct(p.config, {**grid, "T": p.T}, p.source, p.seed)
        np.testing.assert_array_equal(ds["V"].values, direct["V"].values)
    assert capfd.readouterr().err == ""


def test_embedded_cluster_defaults_progress_and_chunks(client, tmp_path, monkeypatch, capfd):
    """The embedded cluster has ``min(2, cpu_count)`` workers (no more than the points to
    run) and never becomes the global default client; ``progress=False`` prints nothing,
    ``progress=True`` a bar and the dashboard link; a point's samples are one chunk, never
    larger than the samples."""
    import distributed

    seen = {}
    real = distributed.LocalCluster

    def recording(**kw):
        seen.update(kw)
        return real(**kw)

    monkeypatch.setattr(distributed, "LocalCluster", recording)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    grid = {"width": 8, "depth": 2, "tokens": 2, "samples": 1}
    assert sweep(grid, store=tmp_path / "one.zarr", processes=False, progress=False).ok
    assert seen["n_workers"] == 1  # one point
    grid["width"] = [8, 10]
    assert sweep(grid, store=tmp_path / "a.zarr", processes=False, progress=False).ok
    assert seen["n_workers"] == 2
    assert distributed.default_client() is client  # the caller's default is untouched
    assert capfd.readouterr().err == ""
    assert zarr.open_group(tmp_path / "a.zarr")["V"].chunks[-4] == 1
    assert sweep({**grid, "samples": 3}, store=tmp_path / "b.zarr", client=client).ok
    assert zarr.open_group(tmp_path / "b.zarr")["V"].chunks[-4] == 3
    capfd.readouterr()
    assert sweep({**grid, "width": 12}, store=tmp_path / "c.zarr", client=client, progress=True).ok
    err = capfd.readouterr().err
    assert f"Dask dashboard at {client.dashboard_link}" in err and "sweep" in err and "1/1" in err


def test_sde_points_read_back_with_their_own_sample_count_and_masked_explosions(client, tmp_path):
    """An SDE sweep whose points differ in sample count (padded store) and with one failing
    combination: open_point gives each point's own samples (``exploded`` included), exactly the
    direct call; open_sweep's ``exploded`` is the point's where done and False elsewhere."""
    store = tmp_path / "sde.zarr"
    grid = {"width": [8, 12], "heads": [1, 3], "T": 0.25, "tokens": 2, "samples": [2, 3],
            "dt": 0.05, "gamma": 0.9, "seed": 2}  # fmt: skip
    summary = sweep(grid, store=store, kind="sde", client=client, progress=False)
    assert summary.computed == 6 and len(summary.failed) == 2  # heads 3 does not divide 8
    view = open_sweep(store).load()
    for width, heads, samples in itertools.product([8, 12], [1, 3], [2, 3]):
        cell = view.sel(width=width, heads=heads, samples=samples, source="sde")
        if width == 8 and heads == 3:
            assert str(cell["status"].values) == "failed" and not cell["exploded"].any()
            continue
        point = open_point(store, width=width, heads=heads, samples=samples)
        params = {**grid, "width": width, "heads": heads, "samples": samples}
        config = ModelConfig(width=width, depth=2 if width == 8 else 3, heads=heads, gamma=0.9)
        direct = _direct(config, params, "sde", int(cell["seed"]))
        xr.testing.assert_identical(_without_sweep_attrs(point), direct)
        padded = np.zeros(3, dtype=bool)
        padded[:samples] = direct["exploded"].values
        np.testing.assert_array_equal(cell["exploded"].values, padded)
