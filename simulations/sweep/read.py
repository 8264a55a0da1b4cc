"""Reading a sweep store: the whole grid (masked) or one point as the usual Dataset."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from shapedtx._validation import ParameterError
from shapedtx.config import ModelConfig
from shapedtx.results import covariance_dataset

from .store import DONE, FAILED, STATUS, read_records


def open_sweep(store: str | os.PathLike) -> xr.Dataset:
    """The whole sweep as one lazy Dataset: the store with ``V``, ``t`` and ``t_explode``
    masked to NaN (``exploded`` to False) where the point is not done, ``status`` as
    ``"pending"``/``"done"``/``"failed"`` and ``error`` (empty unless failed)."""
    ds = xr.open_zarr(store)
    code = ds["status"].load()
    done = code == DONE
    errors = np.full(code.shape, "", dtype=object)
    sources = list(ds.indexes["source"])
    grid = json.loads(ds.attrs["sweep.grid"])
    for record in read_records(store).values():
        if record["status"] == "failed":
            loc = [ds.indexes[d].get_loc(record["coords"][d]) for d in grid["dims"]]
            # the index in a variable: mypy reads errors[(*loc, i)] as 3.11-only syntax
            index = (*loc, sources.index(record["source"]))
            errors[index] = record["error"]
    errors = np.where(code.values == FAILED, errors, "").astype(str)
    return ds.assign(
        V=ds["V"].where(done),
        t_explode=ds["t_explode"].where(done),
        exploded=ds["exploded"] & done,
        status=(code.dims, np.asarray(STATUS)[code.values]),
        error=(code.dims, errors),
    ).assign_coords(t=ds["t"].where(done))


def open_point(store: str | os.PathLike, *, source: str | None = None, **coords: Any) -> xr.Dataset:
    """One finished point as the covariance Dataset of ``shapedtx.results``.

    ``coords`` give a value for every grid dimension; ``source`` is needed when the sweep
    has both. The result is what the direct simulate / solve call returns (same numbers and
    attrs), plus attr ``sweep.params`` (JSON of the point's parameters). ValueError if the
    point does not exist or is not done (with its error if it failed).
    """
    path = Path(store)
    ds = xr.open_zarr(path)
    dims = list(json.loads(ds.attrs["sweep.grid"])["dims"])
    sources = list(ds.indexes["source"])
    if source is None:
        if len(sources) > 1:
            raise ParameterError("source", f"source must be one of {sources} for this sweep")
        source = sources[0]
    if set(coords) != set(dims):
        raise ParameterError(
            "coords", f"give exactly the grid dimensions {dims}, got {sorted(coords)}"
        )
    try:
        index = (
            *(ds.indexes[d].get_loc(coords[d]) for d in dims),
            sources.index(source),
        )
    except (KeyError, ValueError):
        raise ParameterError(
            "coords", f"no point {coords} with source={source!r} in {str(path)!r}"
        ) from None
    key = "p" + "_".join(map(str, index))
    point = ds.isel(dict(zip([*dims, "source"], index, strict=True)))
    record = read_records(path).get(key, {})
    code = int(point["status"].values)
    if code != DONE:
        reason = f": {record.get('error')}" if code == FAILED else ""
        raise ParameterError(
            "coords", f"point {coords} source={source!r} is {STATUS[code]}{reason}"
        )
    s, nt, m = record["params"]["samples"], record["n_t"], record["params"]["tokens"]
    attrs = record["attrs"]
    data_vars = None
    if source == "sde":
        data_vars = {
            "exploded": (("sample",), point["exploded"].values[:s]),
            "t_explode": (("sample",), point["t_explode"].values[:s]),
        }
    out = covariance_dataset(
        torch.from_numpy(np.ascontiguousarray(point["V"].values[:s, :nt, :m, :m])),
        point["t"].values[:nt],
        ModelConfig.from_attrs(attrs),
        source=attrs["source"],
        method=attrs["method"],
        seed=attrs["seed"],
        layer=np.arange(nt) if source == "network" else None,
        attrs=attrs,
        data_vars=data_vars,
    )
    out.attrs["sweep.params"] = json.dumps(record["params"])
    return out
