"""Token-covariance metrics and rank-collapse detection (docs/theory.md#notation and
#rank-collapse).

All functions act on the trailing dimensions and batch over the leading ones:
``V: (..., m, m)`` token covariance, ``X: (..., m, n)`` token representations.

Besides tensors they take the library's own results: NumPy arrays, an ``xarray.DataArray`` of
V (the result is a DataArray over its leading named dimensions and their coordinates) and a
covariance ``xarray.Dataset`` (its ``V`` variable, e.g. from ``simulations.simulate``,
``sde.solve`` or ``shapedtx.probe``).

"Never collapsed" is :data:`NEVER` (-1) everywhere: in :func:`detect_collapse`, in
``simulations.collapse_report``, in ``summary.json`` and in the command line's tables.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, cast, overload

import numpy as np
import torch
from torch import Tensor

from ._validation import ParameterError, check_number

if TYPE_CHECKING:
    import xarray as xr

NEVER = -1
"""The marker of "never collapsed": :func:`detect_collapse`'s ``first_index``, the median
collapse layer and time of ``simulations.collapse_report``, ``summary.json`` and the CLI."""


def _is_dataset(value: Any) -> bool:
    return hasattr(value, "data_vars") and hasattr(value, "dims")


def _is_dataarray(value: Any) -> bool:
    return hasattr(value, "dims") and hasattr(value, "coords") and not _is_dataset(value)


def as_tensor(value: Any, name: str = "V") -> Tensor:
    """``value`` as a tensor: a tensor as is, a NumPy array or sequence, an
    ``xarray.DataArray`` (its values) or a covariance ``xarray.Dataset`` (its ``V``
    variable). ValueError naming ``name`` otherwise."""
    if isinstance(value, Tensor):
        return value
    if _is_dataset(value):
        if "V" not in value.data_vars:
            raise ParameterError(
                name,
                f"{name}: a Dataset must hold the covariance variable 'V', got variables "
                f"{sorted(map(str, value.data_vars))}",
            )
        value = value["V"]
    if _is_dataarray(value):
        value = value.values
    try:
        return torch.from_numpy(np.ascontiguousarray(value))
    except (TypeError, ValueError, RuntimeError):
        raise ParameterError(
            name,
            f"{name} must be a tensor, array, xarray DataArray or covariance Dataset, "
            f"got {type(value).__name__}",
        ) from None


def _as_dataarray(value: Any) -> Any:
    """The DataArray of an xarray input (a Dataset's ``V``), else None."""
    if _is_dataset(value) and "V" in value.data_vars:
        return value["V"]
    return value if _is_dataarray(value) else None


def _labelled(result: Tensor, source: Any, kept: int) -> Any:
    """``result`` as a DataArray over the first ``kept`` dimensions of the DataArray
    ``source``, with the coordinates that live on them."""
    import xarray as xr

    dims = tuple(source.dims[:kept])
    coords = {k: c for k, c in source.coords.items() if set(c.dims) <= set(dims)}
    return xr.DataArray(result.detach().cpu().numpy(), dims=dims, coords=coords)


class _Metric(Protocol):
    @overload
    def __call__(self, V: Tensor) -> Tensor: ...
    @overload
    def __call__(self, V: xr.DataArray | xr.Dataset) -> xr.DataArray: ...
    @overload
    def __call__(self, V: Any) -> Any: ...


def _xarray_aware(drop: int) -> Callable[[Callable[[Tensor], Tensor]], _Metric]:
    """Let a metric of ``V: (..., m, m)`` take arrays and xarray objects; xarray gives a
    DataArray without the last ``drop`` dimensions."""

    def wrap(fn: Callable[[Tensor], Tensor]) -> _Metric:
        @functools.wraps(fn)
        def metric(V: Any) -> Any:
            labelled = _as_dataarray(V)
            result = fn(as_tensor(V))
            if labelled is None:
                return result
            return _labelled(result, labelled, labelled.ndim - drop)

        return cast(_Metric, metric)  # the overloads of _Metric describe it

    return wrap


def covariance(X: Tensor) -> Tensor:
    """``V = X X^T / n``; X: (..., m, n) -> (..., m, m)."""
    return X @ X.transpose(-1, -2) / X.shape[-1]


@_xarray_aware(drop=0)
def correlation(V: Tensor) -> Tensor:
    """``rho^{ab} = V^{ab} / sqrt(V^{aa} V^{bb})``; V: (..., m, m) -> (..., m, m)."""
    d = torch.diagonal(V, dim1=-2, dim2=-1).sqrt()
    return V / (d[..., :, None] * d[..., None, :])


@_xarray_aware(drop=2)
def mean_correlation(V: Tensor) -> Tensor:
    """Mean off-diagonal correlation; V: (..., m, m) -> (...). Equals 1 at rank collapse."""
    m = V.shape[-1]
    rho = correlation(V)
    total = rho.sum(dim=(-2, -1)) - torch.diagonal(rho, dim1=-2, dim2=-1).sum(-1)
    return total / (m * (m - 1))


@_xarray_aware(drop=2)
def stable_rank(V: Tensor) -> Tensor:
    """``||V||_F^2 / ||V||_2^2`` in [1, m]; V: (..., m, m) symmetric PSD -> (...)."""
    eig = torch.linalg.eigvalsh(V)
    return eig.pow(2).sum(-1) / eig[..., -1].pow(2)


@_xarray_aware(drop=2)
def centred_stable_rank(V: Tensor) -> Tensor:
    """Stable rank of the centred covariance ``P V P`` (``P = I - 11^T/m``), in [1, m - 1];
    V: (..., m, m) -> (...). Removes the mean-token direction, which after training carries
    most of the variance of every model (plain stable rank is then about 1 even without
    collapse); NaN where ``P V P = 0`` (complete collapse)."""
    m = V.shape[-1]
    P = torch.eye(m, dtype=V.dtype, device=V.device) - 1.0 / m
    return stable_rank(P @ V @ P)


@_xarray_aware(drop=2)
def eigenvalue_ratio(V: Tensor) -> Tensor:
    """``lambda_min(V) / lambda_max(V)`` in [0, 1]; V: (..., m, m) -> (...). 0 at collapse."""
    eig = torch.linalg.eigvalsh(V)
    return eig[..., 0] / eig[..., -1]


def token_residual(X: Tensor) -> Tensor:
    """``||X - 1 xbar^T||_F / ||X||_F`` with xbar the mean token; X: (..., m, n) -> (...)."""
    centred = X - X.mean(dim=-2, keepdim=True)
    return torch.linalg.matrix_norm(centred) / torch.linalg.matrix_norm(X)


@_xarray_aware(drop=2)
def covariance_residual(V: Tensor) -> Tensor:
    """:func:`token_residual` computed from ``V = X X^T / n``: ``sqrt(tr(P V P) / tr(V))``."""
    m = V.shape[-1]
    trace = torch.diagonal(V, dim1=-2, dim2=-1).sum(-1)
    centred_trace = trace - V.sum(dim=(-2, -1)) / m
    return (centred_trace.clamp(min=0) / trace).sqrt()


class Collapse(NamedTuple):
    """Result of :func:`detect_collapse`, per sample.

    collapsed: bool (...); first_index: int64 (...), index along the time axis of the first
    step whose mean correlation exceeds the threshold, :data:`NEVER` (-1) where it never
    does. Tensors for tensor or array input; DataArrays over the leading named dimensions
    (e.g. ``sample``) for xarray input.
    """

    collapsed: Any
    first_index: Any


def detect_collapse(V: Any, threshold: float = 0.99) -> Collapse:
    """First time at which the mean off-diagonal correlation exceeds ``threshold``.

    Args:
        V: (..., t, m, m), time on the third-to-last axis: a tensor or array, an
            ``xarray.DataArray`` of V, or a covariance ``xarray.Dataset`` (its ``V``, e.g.
            ``simulations.simulate``'s result: dims ``(sample, t, token_a, token_b)``).
        threshold: in (0, 1).

    Returns:
        :class:`Collapse`; ``first_index`` is :data:`NEVER` (-1) for a sample that never
        collapses, the one marker of "never collapsed" across the library (also in
        ``simulations.collapse_report``, ``summary.json`` and the command line). Non-finite
        covariances count as collapsed (the representation has degenerated).

    Raises:
        ValueError: ``threshold`` outside (0, 1), or V not of shape (..., t, m, m).
    """
    check_number("threshold", threshold, 0.0, 1.0, low_open=True, high_open=True)
    labelled = _as_dataarray(V)
    V = as_tensor(V)
    if V.dim() < 3 or V.shape[-1] != V.shape[-2]:
        raise ParameterError("V", f"V must have shape (..., t, m, m), got {tuple(V.shape)}")
    rho = mean_correlation(V)
    above = (rho > threshold) | ~torch.isfinite(rho)
    collapsed = above.any(dim=-1)
    first = torch.where(collapsed, above.to(torch.int8).argmax(dim=-1), NEVER)
    if labelled is None:
        return Collapse(collapsed, first)
    kept = labelled.ndim - 3
    return Collapse(_labelled(collapsed, labelled, kept), _labelled(first, labelled, kept))


METRICS: dict[str, Callable[[Tensor], Tensor]] = {
    "mean_rho": mean_correlation,
    "stable_rank": stable_rank,
    "centred_stable_rank": centred_stable_rank,
    "eigenvalue_ratio": eigenvalue_ratio,
    "residual": covariance_residual,
}
"""The token-covariance metrics of the training log, the monitor and the covariance probe:
variable name -> metric of ``V: (..., m, m)``."""


@torch.no_grad()
def metric_tensors(V: Tensor) -> dict[str, Tensor]:
    """Batch-averaged :data:`METRICS` of covariances ``V: (B, L, m, m)`` -> {name: (L,)},
    computed in V's dtype on V's device (no host transfer); non-finite covariances give NaN."""
    finite = torch.isfinite(V).all(dim=(-2, -1))
    eye = torch.eye(V.shape[-1], dtype=V.dtype, device=V.device)
    V = torch.where(finite[..., None, None], V, eye)
    return {name: torch.where(finite, fn(V), torch.nan).mean(0) for name, fn in METRICS.items()}


@torch.no_grad()
def covariance_metrics(hidden: Sequence[Tensor]) -> dict[str, np.ndarray]:
    """Batch-averaged :data:`METRICS` of every hidden state (B, m, n) -> {name: (depth + 1,)}.

    Computed in float64 on the hidden states' device; non-finite states give NaN.
    """
    V = torch.stack([covariance(h.double()) for h in hidden], dim=1)  # (B, L, m, m)
    return {name: value.cpu().numpy() for name, value in metric_tensors(V).items()}
