"""The zarr store of a sweep: its layout, creation, per-point records and status."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from shapedtx._validation import ParameterError
from shapedtx.files import write_json

from ..grid import Grid, Point

PENDING, DONE, FAILED = 0, 1, 2
STATUS = ("pending", "done", "failed")
"""Meaning of the ``status`` codes 0, 1, 2."""

_RECORDS = "_sweep"
_LAYOUT = 1
_CHUNK_BYTES = 64 * 2**20


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


def _absent_or_empty(path: Path) -> bool:
    """No store at ``path`` yet: nothing there, or an empty directory."""
    return not path.exists() or (path.is_dir() and not any(path.iterdir()))


def _remove_store(path: Path) -> None:
    """Delete the sweep store at ``path`` (for ``overwrite``); ValueError if ``path`` is a
    non-empty directory that is not a sweep store (never deleted)."""
    import shutil

    import zarr

    if _absent_or_empty(path):
        return
    try:
        is_sweep = "sweep.grid" in zarr.open_group(path, mode="r", zarr_format=2).attrs
    except Exception:  # not a zarr group
        is_sweep = False
    if not is_sweep:
        raise ParameterError(
            "store",
            f"store {str(path)!r} exists and is not a sweep store; overwrite only replaces a "
            "sweep store: choose another path",
        )
    old = path.with_name(f".{path.name}.old-{uuid.uuid4().hex}")
    os.rename(path, old)  # the store disappears at once; then its files
    shutil.rmtree(old)


def _open_store(path: Path, grid: Grid, points: list[Point], dtype: torch.dtype):
    """The store's zarr group, created atomically if absent; ValueError if it holds another
    sweep."""
    import zarr

    template, encoding = _template(grid, points, dtype)
    if _absent_or_empty(path):
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
        V = group["V"]
        if not isinstance(V, zarr.Array):
            raise TypeError("'V' is not an array")
        shape = V.shape
    except Exception as err:  # any unreadable store is the same user error
        raise ParameterError(
            "store", f"store {str(path)!r} exists and is not a sweep store ({err})"
        ) from None
    keys = ("sweep.grid", "sweep.kind", "sweep.dtype", "sweep.layout")
    expected = {k: template.attrs[k] for k in keys}
    found = {k: attrs.get(k) for k in expected}
    if found != expected or tuple(shape) != template["V"].shape:
        diff = [k for k in expected if found[k] != expected[k]] or ["padded shape"]
        raise ParameterError(
            "store",
            f"store {str(path)!r} holds a different sweep ({', '.join(diff)} differ); "
            f"use a new store path, or overwrite=True (CLI: --overwrite) to replace it",
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
