"""The covariance Dataset contract shared by the simulator and the SDE solver (DESIGN.md).

A result is an ``xarray.Dataset`` with data variable ``V`` over
``("sample", "t", "token_a", "token_b")``, coordinate ``t`` (depth time, layer / width),
networks also a ``layer`` coordinate on ``t``, and ``attrs`` holding the full configuration
(``config.<field>``), ``source`` (``"network"`` or ``"sde"``), ``method``, ``seed``,
``dtype``, ``device`` and ``version``. Derived quantities are computed by the functions below.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr
from torch import Tensor

from . import metrics
from ._validation import ParameterError
from .config import ModelConfig, check_config
from .files import atomic_path

DIMS = ("sample", "t", "token_a", "token_b")


def _version() -> str:
    from . import __version__

    return __version__


def covariance_dataset(
    V: Tensor,
    t: Tensor | np.ndarray,
    config: ModelConfig,
    *,
    source: str,
    method: str,
    seed: int,
    layer: Tensor | np.ndarray | None = None,
    attrs: Mapping[str, Any] | None = None,
    data_vars: Mapping[str, tuple[tuple[str, ...], Any]] | None = None,
) -> xr.Dataset:
    """Wrap covariances ``V: (sample, t, m, m)`` recorded at times ``t: (t,)`` in the contract.

    ``attrs`` are added to the standard ones (values must be netCDF-safe: str, int, float);
    ``data_vars`` (e.g. ``exploded``) are added as given.
    """
    check_config(config)
    if not isinstance(V, Tensor) or V.dim() != 4 or V.shape[-1] != V.shape[-2]:
        got = tuple(V.shape) if isinstance(V, Tensor) else type(V).__name__
        raise ParameterError("V", f"V must be a tensor of shape (sample, t, m, m), got {got}")
    t = np.asarray(t.cpu() if isinstance(t, Tensor) else t, dtype=np.float64)
    if t.shape != (V.shape[1],):
        raise ParameterError("t", f"t must have shape ({V.shape[1]},), got {t.shape}")
    m = V.shape[-1]
    coords: dict[str, Any] = {
        "sample": np.arange(V.shape[0]),
        "t": t,
        "token_a": np.arange(m),
        "token_b": np.arange(m),
    }
    if layer is not None:
        coords["layer"] = ("t", np.asarray(layer.cpu() if isinstance(layer, Tensor) else layer))
    all_attrs: dict[str, Any] = {
        **config.to_attrs(),
        "source": source,
        "method": method,
        "seed": int(seed),
        "dtype": str(V.dtype).removeprefix("torch."),
        "device": str(V.device),
        "version": _version(),
    }
    all_attrs.update(attrs or {})
    variables: dict[str, Any] = {"V": (DIMS, V.detach().cpu().numpy())}
    variables.update(data_vars or {})
    ds = xr.Dataset(variables, coords=coords, attrs=all_attrs)
    for name, (long_name, units) in VARIABLE_ATTRS.items():
        if name in ds.variables:
            ds[name].attrs.update(long_name=long_name, units=units)
    return ds


VARIABLE_ATTRS: dict[str, tuple[str, str]] = {
    "V": ("token covariance V = X X^T / n", "squared activation"),
    "t": ("depth time t = layer / width", "1"),
    "layer": ("number of residual blocks applied", "1"),
    "sample": ("independent network or SDE path", "1"),
    "token_a": ("token index (0-based)", "1"),
    "token_b": ("token index (0-based)", "1"),
    "exploded": ("path flagged as blown up (non-finite or beyond the bound)", "1"),
    "t_explode": ("depth time of the blow-up (NaN if none)", "1"),
}
"""``long_name`` and ``units`` of every variable of the covariance Dataset contract."""


def config_of(ds: xr.Dataset) -> ModelConfig:
    """The ModelConfig stored in a result's attrs."""
    return ModelConfig.from_attrs(ds.attrs)


def rho(ds: xr.Dataset) -> xr.DataArray:
    """Correlation ``rho^{ab}`` over ``("sample", "t", "token_a", "token_b")``."""
    with np.errstate(all="ignore"):
        value = metrics.correlation(torch.from_numpy(np.ascontiguousarray(ds["V"].values)))
    return xr.DataArray(value.numpy(), coords=ds["V"].coords, dims=DIMS, name="rho")


def with_rho(ds: xr.Dataset) -> xr.Dataset:
    """A copy of ``ds`` with the correlation ``rho`` added."""
    return ds.assign(rho=rho(ds))


def with_metrics(ds: xr.Dataset) -> xr.Dataset:
    """A copy of ``ds`` with per-(sample, t) metrics: ``mean_rho``, ``stable_rank``,
    ``eigenvalue_ratio`` and ``residual`` (``||X - 1 xbar^T|| / ||X||`` from V)."""
    fns = {
        "mean_rho": metrics.mean_correlation,
        "stable_rank": metrics.stable_rank,
        "eigenvalue_ratio": metrics.eigenvalue_ratio,
        "residual": metrics.covariance_residual,
    }
    finite = np.isfinite(ds["V"].values).all(axis=(-2, -1))
    V = torch.from_numpy(
        np.where(finite[..., None, None], ds["V"].values, np.eye(ds.sizes["token_a"]))
    )
    out = {}
    for name, fn in fns.items():
        with np.errstate(all="ignore"):
            value = fn(V).numpy()
        out[name] = (("sample", "t"), np.where(finite, value, np.nan))
    return ds.assign(out)


def save_dataset(ds: xr.Dataset, path: str | os.PathLike) -> Path:
    """Write ``ds`` to netCDF atomically (temporary file in the same folder, then rename)."""
    with atomic_path(path) as tmp:
        ds.to_netcdf(tmp)
    return Path(path)


def load_dataset(path: str | os.PathLike) -> xr.Dataset:
    """Read a result written by :func:`save_dataset` fully into memory."""
    with xr.open_dataset(path) as ds:
        return ds.load()
