"""The training log: an ``xarray.Dataset`` indexed by optimiser step.

Variables: ``train_loss`` (mean over the steps since the previous row), ``val_loss`` (NaN on
rows without evaluation), ``lr``, ``grad_norm`` (global, before clipping) and
``grad_norm_block(step, block)``, and the token-covariance metrics of ``shapedtx.metrics.METRICS``
measured on a fixed validation batch after every block (docs/theory.md#rank-collapse):
``mean_rho(step, layer)``, ``stable_rank(step, layer)``, ``centred_stable_rank(step,
layer)``, ``eigenvalue_ratio(step, layer)``,
``residual(step, layer)`` (layer 0 = embedding output), and the monitor's metrics of the same
batch (``shapedtx.Monitor``, docs/guide/monitor.md): ``activation_rms(step, layer)``,
``kurtosis(step, layer)``, ``attention_entropy(step, block, head)``, ``max_logit(step, block,
head)``, ``entropy_reference(step, block)`` and ``update_size(step, block, weight)`` (relative
change of each weight matrix since the previous row). Step 0 is the initialisation.
``attrs`` hold the model config (``config.*``), the training config (``train.*``), the corpus,
seed, device, dtype, version and ``status`` (``"running"``, ``"finished"``, ``"diverged"``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from .._validation import ParameterError
from ..config import ModelConfig
from ..diagnostics.monitor import monitor_variables
from ..metrics import METRICS
from .config import TrainConfig


def log_dataset(
    rows: Sequence[Mapping[str, Any]],
    model_config: ModelConfig,
    train_config: TrainConfig,
    attrs: Mapping[str, Any] | None = None,
    *,
    weights: Sequence[str] = (),
    gains: Sequence[str] = (),
) -> xr.Dataset:
    """Assemble log rows (dicts of scalars and arrays, one per logged step) into the Dataset;
    ``weights``: the names of the ``weight`` coordinate of ``update_size`` and ``gains`` of
    the ``gain`` coordinate of ``shape_gain`` (the monitor's)."""
    if not rows:
        raise ParameterError("rows", "rows must hold at least one logged step")
    depth = model_config.depth
    data: dict[str, Any] = {}
    for name in ("train_loss", "val_loss", "lr", "grad_norm"):
        data[name] = ("step", np.array([r[name] for r in rows], dtype=np.float64))
    data["grad_norm_block"] = (
        ("step", "block"),
        np.stack([r["grad_norm_block"] for r in rows]).astype(np.float64),
    )
    for name in METRICS:
        data[name] = (("step", "layer"), np.stack([r[name] for r in rows]).astype(np.float64))
    extra, extra_coords = monitor_variables(rows, weights, depth, gains=gains)
    data.update(extra)
    coords = {
        **extra_coords,
        "step": np.array([r["step"] for r in rows], dtype=np.int64),
        "block": np.arange(depth),
        "layer": np.arange(depth + 1),
    }
    ds = xr.Dataset(data, coords=coords)
    ds["step"].attrs["long_name"] = "optimiser step"
    ds["train_loss"].attrs["units"] = "nats per byte"
    ds["val_loss"].attrs["units"] = "nats per byte"
    ds.attrs.update(model_config.to_attrs())
    ds.attrs.update(train_config.to_attrs())
    ds.attrs.update(attrs or {})
    return ds


def final_val_loss(ds: xr.Dataset) -> float:
    """The last finite validation loss of a log (NaN if none)."""
    val = ds["val_loss"].values
    finite = val[np.isfinite(val)]
    return float(finite[-1]) if finite.size else float("nan")
