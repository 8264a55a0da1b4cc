"""Parameter sweeps on Dask: one task per grid point, one resumable zarr store.

Every (grid point, source) runs :func:`simulations.simulate` (``source="network"``) or
:func:`sde.solve` (``source="sde"``) as a ``dask.distributed`` task; the worker writes its
result straight into the store, so only small records travel back to the client.

Where it runs: by default an embedded ``LocalCluster`` (``workers`` processes of
``threads_per_worker`` threads, torch limited to as many threads). Pass ``client=`` (a
``distributed.Client``) or a scheduler address to run the same sweep on any Dask cluster, e.g.
``dask_jobqueue.SLURMCluster`` / ``PBSCluster`` (``cluster.scale(jobs=10)``,
``Client(cluster)``) or ``dask_kubernetes.operator.KubeCluster``; those packages are not
dependencies of shapedtx. Workers must see the store path (a shared file system) and have
shapedtx installed.

Store layout (a zarr v2 directory store that ``xr.open_zarr(store)`` reads as one Dataset):

* dimensions: the grid dimensions in grid order (coordinates = their values), ``source``
  (``network`` / ``sde``), then ``sample``, ``step``, ``token_a``, ``token_b``. Points differ
  in samples, saved times and tokens, so these are padded to the largest point with NaN;
* ``V (*grid, source, sample, step, token_a, token_b)``; coordinate ``t (*grid, source,
  step)``, the point's depth times (NaN padding); ``exploded`` / ``t_explode (*grid, source,
  sample)`` from the SDE (False / NaN for networks); ``seed (*grid, source)``, the derived
  per-point seed; ``status (*grid, source)``: 0 pending, 1 done, 2 failed;
* ``_sweep/<point>.json``: the point's record: status, error and traceback, parameters,
  timings, the id of the run that computed it, and the full attrs of its Dataset (config,
  method, seed, dtype, ...). Root attrs ``sweep.*`` identify the grid, kind and dtype.

Data count only where ``status == 1``: :func:`open_sweep` masks the rest and
:func:`open_point` returns one point as the usual covariance Dataset (``shapedtx.results``).

Safety: each array is chunked one point per chunk along the grid and source dimensions, so
workers never share a chunk, and zarr writes every chunk file atomically (temporary file,
then rename). A task first sets its status to pending, overwrites its whole padded region,
writes its record (temporary file, then rename) and sets ``status = 1`` last: a worker killed
at any moment leaves a point that reads as pending and is recomputed on restart, and a
finished point is never recomputed. A point that raises is recorded as failed (status 2, the
error in its record) and the other points go on; failed points are retried by the next run.
The store itself is created in a temporary directory and renamed into place. Run one sweep
process per store at a time.

Seeds: the point's seed is :func:`simulations.grid.point_seed` of its parameters (SHA-256 of
the base ``seed`` and the other parameters except ``samples``), stored in ``seed``. A direct
call ``simulate(config, equicorrelated(tokens, rho0, scale), samples, method=method,
seed=seed)`` (or ``sde.solve(..., T=T, dt=dt, method=sde_method, save_every=save_every,
seed=seed)``) on the same device reproduces the point's numbers exactly.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import sys
import time
import traceback
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from shapedtx._validation import check_int
from shapedtx.config import ModelConfig
from shapedtx.covariance import equicorrelated
from shapedtx.files import write_json
from shapedtx.results import covariance_dataset

from .grid import Grid, Point, make_grid

PENDING, DONE, FAILED = 0, 1, 2
STATUS = ("pending", "done", "failed")
"""Meaning of the ``status`` codes 0, 1, 2."""

_RECORDS = "_sweep"
_LAYOUT = 1
_CHUNK_BYTES = 64 * 2**20
_DTYPES = {"float64": torch.float64, "float32": torch.float32}


@dataclass
class SweepSummary:
    """What a :func:`sweep` call did.

    ``total`` points (grid points x sources), ``computed`` finished in this call,
    ``skipped`` already finished before it, ``failed`` (label -> error) failed after it.
    """

    store: Path
    total: int
    computed: int = 0
    skipped: int = 0
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether every point is done."""
        return not self.failed and self.computed + self.skipped == self.total


# --------------------------------------------------------------------------------------------
# Store
# --------------------------------------------------------------------------------------------
def _padded_sizes(points: list[Point]) -> tuple[int, int, int]:
    valid = [p for p in points if p.config is not None]
    if not valid:
        return 1, 1, 2
    return (
        max(p.params["samples"] for p in valid),
        max(p.n_t for p in valid),
        max(p.params["tokens"] for p in valid),
    )


def _template(grid: Grid, points: list[Point], dtype: torch.dtype) -> tuple[xr.Dataset, dict]:
    """The empty store as a lazy Dataset (nothing but coordinates, seeds and status is written)."""
    import dask.array as da

    S, NT, M = _padded_sizes(points)
    shape = grid.shape
    ones = (1,) * len(shape)
    np_dtype = torch.empty((), dtype=dtype).numpy().dtype
    sample_chunk = int(max(1, min(S, _CHUNK_BYTES // (NT * M * M * np_dtype.itemsize))))
    dims = (*grid.dims, "source")
    seeds = np.zeros(shape, dtype=np.int64)
    for p in points:
        seeds[p.index] = p.seed
    chunks = {
        "V": (*ones, sample_chunk, NT, M, M),
        "t": (*ones, NT),
        "exploded": (*ones, S),
        "t_explode": (*ones, S),
        "seed": ones,
        "status": ones,
    }
    ds = xr.Dataset(
        {
            "V": (
                (*dims, "sample", "step", "token_a", "token_b"),
                da.full((*shape, S, NT, M, M), np.nan, dtype=np_dtype, chunks=chunks["V"]),
            ),
            "exploded": (
                (*dims, "sample"),
                da.zeros((*shape, S), dtype=bool, chunks=chunks["exploded"]),
            ),
            "t_explode": (
                (*dims, "sample"),
                da.full((*shape, S), np.nan, chunks=chunks["t_explode"]),
            ),
            "seed": (dims, seeds),
            "status": (
                dims,
                np.zeros(shape, dtype=np.int8),
                {"flag_values": [PENDING, DONE, FAILED], "flag_meanings": " ".join(STATUS)},
            ),
        },
        coords={
            **{name: list(values) for name, values in grid.dims.items()},
            "source": list(grid.sources),
            "sample": np.arange(S),
            "step": np.arange(NT),
            "token_a": np.arange(M),
            "token_b": np.arange(M),
            "t": ((*dims, "step"), da.full((*shape, NT), np.nan, chunks=chunks["t"])),
        },
        attrs={
            "sweep.grid": grid.to_json(),
            "sweep.kind": grid.kind,
            "sweep.dtype": str(dtype).removeprefix("torch."),
            "sweep.layout": _LAYOUT,
            "sweep.status": "status 0 pending, 1 done, 2 failed; data valid where status == 1",
        },
    )
    encoding: dict[str, dict[str, Any]] = {name: {"chunks": c} for name, c in chunks.items()}
    for name in ("exploded", "seed", "status"):
        encoding[name]["_FillValue"] = None  # no masking: read back as bool / int
    return ds, encoding


def _open_store(path: Path, grid: Grid, points: list[Point], dtype: torch.dtype):
    """The store's zarr group, created atomically if absent; ValueError if it holds another
    sweep."""
    import zarr

    template, encoding = _template(grid, points, dtype)
    if not path.exists() or (path.is_dir() and not any(path.iterdir())):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex}"
        try:
            template.to_zarr(
                tmp, mode="w-", compute=False, encoding=encoding, consolidated=True, zarr_format=2
            )
            zarr.open_group(tmp / _RECORDS, mode="w", zarr_format=2)
            os.rename(tmp, path)  # also replaces an empty directory
        except OSError:
            if not path.exists():  # not a concurrent creator winning the race
                raise
        finally:
            if tmp.exists():
                import shutil

                shutil.rmtree(tmp)
    try:
        group = zarr.open_group(path, mode="r+", zarr_format=2)
        attrs = dict(group.attrs)
        shape = group["V"].shape
    except Exception as err:  # any unreadable store is the same user error
        raise ValueError(f"store {str(path)!r} exists and is not a sweep store ({err})") from None
    keys = ("sweep.grid", "sweep.kind", "sweep.dtype", "sweep.layout")
    expected = {k: template.attrs[k] for k in keys}
    found = {k: attrs.get(k) for k in expected}
    if found != expected or tuple(shape) != template["V"].shape:
        diff = [k for k in expected if found[k] != expected[k]] or ["padded shape"]
        raise ValueError(
            f"store {str(path)!r} holds a different sweep ({', '.join(diff)} differ); "
            f"use a new store path"
        )
    return group


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Atomic JSON write (temporary file in the same folder, then rename)."""
    write_json(data, path, default=_json_default, indent=1)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot store {type(value).__name__} in a sweep record")


def _record(point: Point, status: str, run_id: str, started: float, **extra: Any) -> dict:
    return {
        "key": point.key,
        "label": point.label,
        "status": status,
        "source": point.source,
        "coords": point.coords,
        "params": point.params,
        "seed": point.seed,
        "n_t": point.n_t,
        "run_id": run_id,
        "started": started,
        "finished": time.time(),
        **extra,
    }


def _finish(path: Path, group, point: Point, record: dict) -> dict:
    """Write the record, then the status (last: the marker that the point is complete)."""
    _write_json(path / _RECORDS / f"{point.key}.json", record)
    group["status"][point.index] = DONE if record["status"] == "done" else FAILED
    return record


def read_records(store: str | os.PathLike) -> dict[str, dict]:
    """The per-point records of a sweep store (key -> record); temporary files are ignored."""
    out = {}
    for file in sorted((Path(store) / _RECORDS).glob("p*.json")):
        out[file.stem] = json.loads(file.read_text())
    return out


# --------------------------------------------------------------------------------------------
# One point (runs on a worker)
# --------------------------------------------------------------------------------------------
def run_point(point: Point, dtype: torch.dtype, device: str | None = None) -> xr.Dataset:
    """The Dataset of one point: exactly the direct ``simulate`` / ``sde.solve`` call."""
    if point.config is None:
        raise ValueError(point.error)
    p = point.params
    V0 = equicorrelated(p["tokens"], p["rho0"], p["scale"], dtype=dtype, device=device)
    if point.source == "network":
        from .driver import simulate

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
    group["status"][point.index] = PENDING
    started = time.time()
    try:
        ds = run_point(point, _DTYPES[dtype_name], device)
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


# --------------------------------------------------------------------------------------------
# The sweep (client side)
# --------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _connect(client, workers, threads_per_worker, processes) -> Iterator[tuple[Any, int | None]]:
    """(client, torch threads per task) for a given client, an address or a LocalCluster."""
    from distributed import Client, LocalCluster

    if client is not None:
        if isinstance(client, str):
            with Client(client, timeout="20s", set_as_default=False) as own:
                yield own, None
        else:
            yield client, None
        return
    with (
        LocalCluster(
            n_workers=workers,
            threads_per_worker=threads_per_worker,
            processes=processes,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster, set_as_default=False) as own,
    ):
        yield own, threads_per_worker if processes else None


def sweep(
    grid: Mapping[str, Any],
    *,
    store: str | os.PathLike,
    kind: str = "network",
    client: Any = None,
    workers: int | None = None,
    threads_per_worker: int = 1,
    processes: bool = True,
    dtype: torch.dtype = torch.float64,
    device: str | None = None,
    retry_failed: bool = True,
    progress: bool | None = None,
) -> SweepSummary:
    """Run every point of ``grid`` as a Dask task into the zarr ``store`` (see module doc).

    Args:
        grid: parameter -> value or list of values (lists are grid dimensions, in order);
            ModelConfig fields and the run parameters of :mod:`simulations.grid` (``T``,
            ``tokens``, ``rho0``, ``scale``, ``samples``, ``seed``, ``method``,
            ``sde_method``, ``dt``, ``save_every``).
        store: directory of the zarr store; created if absent, resumed if it holds the same
            sweep (same grid, kind and dtype), ValueError otherwise.
        kind: ``"network"`` (simulate), ``"sde"`` (sde.solve) or ``"both"``.
        client: a ``distributed.Client`` or a scheduler address (``"tcp://host:8786"``) for
            any Dask cluster (SLURM/PBS via dask-jobqueue, Kubernetes via dask-kubernetes);
            default: an embedded LocalCluster (in scripts, call under
            ``if __name__ == "__main__":``, as worker processes re-import the main module).
        workers: worker processes of the embedded cluster (default ``min(2, cpu_count)``).
        threads_per_worker: threads per embedded worker (torch uses as many per task).
        processes: embedded workers as processes (default) or threads of this process.
        dtype, device: passed to every simulate / solve call (device as seen by workers).
        retry_failed: run points recorded as failed again (default True).
        progress: tqdm bar over points and the dashboard link (None: bar when interactive).

    Returns:
        A :class:`SweepSummary`. Failing points do not raise: they are in ``failed``.
    """
    from distributed import as_completed
    from tqdm.auto import tqdm

    dtype_name = str(dtype).removeprefix("torch.")
    if dtype_name not in _DTYPES:
        raise ValueError(f"dtype must be torch.float64 or torch.float32, got {dtype!r}")
    if client is not None and workers is not None:
        raise ValueError("workers sets the embedded cluster; do not pass it with client")
    workers = min(2, os.cpu_count() or 1) if workers is None else workers
    check_int("workers", workers)
    check_int("threads_per_worker", threads_per_worker)
    g = make_grid(grid, kind)
    points = list(g.points())
    if all(p.error for p in points):
        raise ValueError(f"every grid point is invalid, e.g. {points[0].label}: {points[0].error}")
    # A value that is invalid at every point holding it is a typo in the grid, not a failing
    # combination: refuse it before any store exists (a corrected grid must not meet a stale
    # store). Invalid combinations (e.g. heads not dividing one width) are recorded as failed.
    for name, values in g.dims.items():
        for value in values:
            holding = [p for p in points if p.coords[name] == value]
            if all(p.error for p in holding):
                raise ValueError(
                    f"grid value {name} = {value!r} is invalid at every point: {holding[0].error}"
                )
    path = Path(store).absolute()
    group = _open_store(path, g, points, dtype)
    status = group["status"][...]
    run_id = uuid.uuid4().hex
    summary = SweepSummary(path, len(points))
    records = {} if retry_failed else read_records(path)
    todo = []
    for p in points:
        code = status[p.index]
        if code == DONE:
            summary.skipped += 1
        elif p.error is not None:
            _finish(path, group, p, _record(p, "failed", run_id, time.time(), error=p.error))
            summary.failed[p.label] = p.error
        elif code == FAILED and not retry_failed:
            summary.failed[p.label] = records.get(p.key, {}).get("error", "failed")
        else:
            todo.append(p)
    if not todo:
        return summary

    with (
        _connect(client, workers, threads_per_worker, processes) as (dask_client, threads),
        tqdm(total=len(todo), desc="sweep", unit="point", disable=_disable(progress)) as bar,
    ):
        if progress is not False:
            _print_dashboard(dask_client)
        futures = {
            dask_client.submit(
                _task,
                p,
                str(path),
                dtype_name,
                device,
                threads,
                run_id,
                key=f"sweep-point-{p.key}-{run_id}",
                pure=False,
            ): p
            for p in todo
        }
        with dask_client.as_current():  # as_completed looks the client up; never global
            for future in as_completed(futures):
                p = futures[future]
                try:
                    record = future.result()
                except Exception as err:  # e.g. KilledWorker: record and go on
                    error = f"{type(err).__name__}: {err}"
                    record = _finish(
                        path, group, p, _record(p, "failed", run_id, time.time(), error=error)
                    )
                future.release()
                if record["status"] == "done":
                    summary.computed += 1
                else:
                    summary.failed[p.label] = record["error"]
                    bar.set_postfix(failed=len(summary.failed))
                bar.update()
    return summary


def _disable(progress: bool | None) -> bool | None:
    return None if progress is None else not progress


def _print_dashboard(client) -> None:
    link = getattr(client, "dashboard_link", None)
    if not link:
        return
    note = "" if importlib.util.find_spec("bokeh") else " (install bokeh>=3.1 to serve it)"
    print(f"sweep: Dask dashboard at {link}{note}", file=sys.stderr)


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------
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
            errors[(*loc, sources.index(record["source"]))] = record["error"]
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
            raise ValueError(f"source must be one of {sources} for this sweep")
        source = sources[0]
    if set(coords) != set(dims):
        raise ValueError(f"give exactly the grid dimensions {dims}, got {sorted(coords)}")
    try:
        index = (
            *(ds.indexes[d].get_loc(coords[d]) for d in dims),
            sources.index(source),
        )
    except (KeyError, ValueError):
        raise ValueError(f"no point {coords} with source={source!r} in {str(path)!r}") from None
    key = "p" + "_".join(map(str, index))
    point = ds.isel(dict(zip([*dims, "source"], index, strict=True)))
    record = read_records(path).get(key, {})
    code = int(point["status"].values)
    if code != DONE:
        reason = f": {record.get('error')}" if code == FAILED else ""
        raise ValueError(f"point {coords} source={source!r} is {STATUS[code]}{reason}")
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
