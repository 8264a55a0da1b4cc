"""One grid point, run on a worker: compute it and write it into the store."""

from __future__ import annotations

import time
import traceback
from pathlib import Path

import numpy as np
import torch
import xarray as xr

from shapedtx.covariance import equicorrelated
from shapedtx.options import DTYPES

from ..grid import Point
from .store import (
    PENDING,
    _finish,
    _record,
)


def run_point(point: Point, dtype: torch.dtype, device: str | None = None) -> xr.Dataset:
    """The Dataset of one point: exactly the direct ``simulate`` / ``sde.solve`` call."""
    if point.config is None:
        raise ValueError(point.error)
    p = point.params
    V0 = equicorrelated(p["tokens"], p["rho0"], p["scale"], dtype=dtype, device=device)
    if point.source == "network":
        from ..driver import simulate

        return simulate(
            point.config,
            V0,
            p["samples"],
            method=p["method"],
            seed=point.seed,
            device=device,
            dtype=dtype,
            progress=False,
        )
    from sde import solve

    return solve(
        point.config,
        V0,
        p["samples"],
        T=point.T,
        dt=p["dt"],
        method=p["sde_method"],
        seed=point.seed,
        device=device,
        dtype=dtype,
        save_every=p.get("save_every"),
        progress=False,
    )


def _write_point(group, point: Point, ds: xr.Dataset) -> None:
    """Overwrite the point's whole padded region with ``ds``."""
    S, NT, M = group["V"].shape[-4:-1]
    V = ds["V"].values
    s, nt, m = V.shape[:3]
    if nt != point.n_t:
        raise RuntimeError(
            f"{point.source} returned {nt} saved times, the store layout expected {point.n_t} "
            f"(sde.solve's step rule changed?)"
        )
    padded = np.full((S, NT, M, M), np.nan, dtype=group["V"].dtype)
    padded[:s, :nt, :m, :m] = V
    group["V"][point.index] = padded
    t = np.full(NT, np.nan)
    t[:nt] = ds["t"].values
    group["t"][point.index] = t
    exploded = np.zeros(S, dtype=bool)
    t_explode = np.full(S, np.nan)
    if "exploded" in ds:
        exploded[:s] = ds["exploded"].values
        t_explode[:s] = ds["t_explode"].values
    group["exploded"][point.index] = exploded
    group["t_explode"][point.index] = t_explode


def _task(
    point: Point,
    store: str,
    dtype_name: str,
    device: str | None,
    torch_threads: int | None,
    run_id: str,
) -> dict:
    """A Dask task: compute one point, write it, record it; errors are recorded, not raised."""
    import zarr

    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    path = Path(store)
    group = zarr.open_group(path, mode="r+", zarr_format=2)
    status = group["status"]
    assert isinstance(status, zarr.Array)  # the store's layout (_open_store): arrays only
    status[point.index] = PENDING
    started = time.time()
    try:
        ds = run_point(point, DTYPES[dtype_name], device)
        _write_point(group, point, ds)
    except Exception as err:  # every failure is recorded with its point
        record = _record(
            point,
            "failed",
            run_id,
            started,
            error=f"{type(err).__name__}: {err}",
            traceback=traceback.format_exc(),
        )
        return _finish(path, group, point, record)
    return _finish(path, group, point, _record(point, "done", run_id, started, attrs=ds.attrs))
