"""Figures of training logs: loss curves and rank collapse over training.

Figures are ``matplotlib.figure.Figure`` objects built without pyplot (no global backend
state; ``fig.savefig`` renders with Agg).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import xarray as xr
from matplotlib.figure import Figure

from .._validation import ParameterError


def plot_losses(logs: Mapping[str, xr.Dataset]) -> Figure:
    """Train (thin) and validation (markers) loss against step, one colour per labelled log."""
    if not logs:
        raise ParameterError("logs", "logs must hold at least one labelled training log")
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.subplots()
    for i, (label, ds) in enumerate(logs.items()):
        colour = f"C{i % 10}"
        ax.plot(ds["step"], ds["train_loss"], color=colour, lw=0.8, alpha=0.6)
        val = ds["val_loss"].dropna("step")
        ax.plot(val["step"], val, "o-", color=colour, ms=3, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats / byte)")
    ax.set_title("training (thin) and validation (markers) loss")
    ax.legend(fontsize="small")
    return fig


def plot_runs(
    runs: Sequence[str | os.PathLike] | Mapping[str, str | os.PathLike],
) -> Figure:
    """Loss curves of several training runs in one figure (:func:`plot_losses` of their logs).

    Args:
        runs: run folders of ``shapedtx train`` / ``train(out_dir=...)`` (their ``log.nc``)
            or ``log.nc`` files; a mapping gives the labels, else each run is labelled by its
            folder name (its path where names repeat).

    Raises:
        ValueError: no runs, or a run without a readable ``log.nc``.
    """
    from shapedtx.results import load_dataset

    if isinstance(runs, (str, os.PathLike)):
        runs = [runs]
    items = list(runs.items()) if isinstance(runs, Mapping) else [(None, r) for r in runs]
    if not items:
        raise ParameterError("runs", "runs must name at least one run folder or log.nc file")
    paths = []
    for i, (_, run) in enumerate(items):
        path = Path(run)
        log = path / "log.nc" if path.is_dir() else path
        if not log.is_file():
            raise ParameterError(
                "runs", f"runs[{i}]: {log} not found (give a training run folder or log.nc)"
            )
        paths.append(log)
    names = [p.parent.name or str(p.parent) for p in paths]
    if len(set(names)) < len(names):
        names = [str(p.parent) for p in paths]
    logs: dict[str, xr.Dataset] = {}
    for (label, _), name, log in zip(items, names, paths, strict=True):
        try:
            ds = load_dataset(log)
        except (OSError, ValueError) as err:
            raise ParameterError("runs", f"runs: {log} is not a training log ({err})") from None
        if "train_loss" not in ds or "val_loss" not in ds:
            raise ParameterError(
                "runs", f"runs: {log} is not a training log (no train_loss / val_loss)"
            )
        logs[str(label) if label is not None else name] = ds
    return plot_losses(logs)


def plot_collapse(ds: xr.Dataset, metric: str = "mean_rho") -> Figure:
    """Token-covariance metric (default mean correlation) over layers and training steps.

    Left: heat map (step x layer); right: the last layer's value against step.
    """
    if metric not in ds:
        raise ParameterError("metric", f"metric must be a variable of the log, got {metric!r}")
    fig = Figure(figsize=(9.6, 3.8), layout="constrained")
    left, right = fig.subplots(1, 2)
    value = ds[metric].values
    mesh = left.pcolormesh(
        ds["step"].values, ds["layer"].values, value.T, shading="nearest", cmap="viridis"
    )
    fig.colorbar(mesh, ax=left, label=metric)
    left.set_xlabel("step")
    left.set_ylabel("layer (0 = embedding)")
    right.plot(ds["step"], value[:, -1], ".-", label="last layer")
    right.plot(ds["step"], value[:, 0], ":", color="grey", label="embedding")
    right.set_xlabel("step")
    right.set_ylabel(metric)
    right.legend(fontsize="small")
    finite = value[np.isfinite(value)]
    if metric == "mean_rho" and finite.size:
        right.set_ylim(min(0.0, finite.min()) - 0.02, 1.02)
    config = ", ".join(f"{k}={ds.attrs[f'config.{k}']}" for k in ("attention", "norm", "depth"))
    fig.suptitle(f"{metric} of the fixed batch during training ({config})")
    return fig
