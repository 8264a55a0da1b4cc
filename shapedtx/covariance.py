"""Initial covariances and their validation (docs/theory.md#notation)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._validation import (
    ParameterError,
    check_device,
    check_dtype,
    check_int,
    check_number,
    check_positive,
)
from .metrics import _as_dataarray


def equicorrelated(
    m: int,
    rho0: float,
    scale: float = 1.0,
    *,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> Tensor:
    """``scale ((1 - rho0) I + rho0 11^T)``: m tokens of squared norm/n ``scale``, correlation
    ``rho0``; returns (m, m). Positive definite for -1/(m-1) < rho0 < 1."""
    check_int("m (number of tokens)", m, 2)
    rho0 = check_correlation(rho0, m)
    check_positive("scale", scale)
    check_dtype(dtype)
    if device is not None:  # None: torch's default device
        check_device(device)
    eye = torch.eye(m, dtype=dtype, device=device)
    return scale * ((1 - rho0) * eye + rho0 * torch.ones_like(eye))


def check_correlation(rho0: Any, m: int, name: str = "rho0") -> float:
    """``float(rho0)`` if m equicorrelated tokens with correlation rho0 have a positive
    definite covariance, ``-1/(m-1) < rho0 < 1``; else ValueError naming ``name``."""
    low = -1.0 / (m - 1)
    try:
        return check_number(name, rho0, low, 1.0, low_open=True, high_open=True)
    except ValueError:
        raise ParameterError(
            name,
            f"{name} must be in (-1/(m-1), 1) = ({low:.4g}, 1) for m = {m} tokens, got {rho0!r}",
        ) from None


def check_covariance(V0: Tensor, name: str = "V0") -> Tensor:
    """Validate an initial covariance: a real (m, m) matrix (tensor, array or nested
    sequence), m >= 2, finite, symmetric, positive definite.

    Returns V0 symmetrised exactly (float32 and float64 tensors keep their dtype, other real
    ones become float64); raises ValueError naming ``name`` otherwise. An ``xarray.DataArray``
    counts as its values.
    """
    if (labelled := _as_dataarray(V0)) is not None and not _is_dataset_like(V0):
        V0 = labelled.values
    if not isinstance(V0, Tensor):
        try:
            V0 = torch.as_tensor(V0)
        except (TypeError, ValueError, RuntimeError):
            raise ParameterError(
                name,
                f"{name} must be a real (m, m) matrix (tensor or array), got {type(V0).__name__}",
            ) from None
    if V0.is_complex() or V0.dtype == torch.bool:
        raise ParameterError(name, f"{name} must be a real (m, m) matrix, got dtype {V0.dtype}")
    if V0.dtype not in (torch.float32, torch.float64):
        V0 = V0.to(torch.float64)
    if V0.dim() != 2 or V0.shape[0] != V0.shape[1]:
        raise ParameterError(
            name, f"{name} must be a square (m, m) matrix, got shape {tuple(V0.shape)}"
        )
    m = V0.shape[0]
    if m < 2:
        raise ParameterError(name, f"{name} must have m >= 2 tokens, got m = {m}")
    if not torch.isfinite(V0).all():
        raise ParameterError(name, f"{name} must be finite")
    scale = V0.abs().max().clamp(min=torch.finfo(V0.dtype).tiny)
    if (V0 - V0.T).abs().max() > 1e-8 * scale:
        raise ParameterError(name, f"{name} must be symmetric")
    V0 = V0 / 2 + V0.T / 2  # (V0 + V0^T) / 2 exactly, without overflow near the float max
    try:  # scaled to max |V0^ab| = 1: entries near the float max would overflow eigh
        smallest = torch.linalg.eigvalsh(V0 / scale)[0]
    except torch.linalg.LinAlgError:
        raise ParameterError(
            name, f"{name} must be positive definite (its eigenvalues could not be computed)"
        ) from None
    if smallest <= 0:
        raise ParameterError(name, f"{name} must be positive definite (smallest eigenvalue <= 0)")
    return V0


def check_covariance_batch(V: Any, name: str = "V0") -> Tensor:
    """Validate a batch of covariances ``V: (B, m, m)``, B >= 1, m >= 2, float32 or float64,
    finite; returns V. ValueError naming ``name`` otherwise. (Positive definiteness is left
    to the solvers, which flag a path that leaves the PSD cone.) An ``xarray.DataArray`` of V,
    or a Dataset's ``V`` at one time (``ds["V"].isel(t=-1)``), counts as its values."""
    if (labelled := _as_dataarray(V)) is not None and not _is_dataset_like(V):
        V = torch.from_numpy(np.ascontiguousarray(labelled.values))
    if not isinstance(V, Tensor) or V.dtype not in (torch.float32, torch.float64):
        what = f"dtype {V.dtype}" if isinstance(V, Tensor) else type(V).__name__
        raise ParameterError(name, f"{name} must be a float32 or float64 tensor, got {what}")
    if V.dim() != 3 or V.shape[-1] != V.shape[-2] or V.shape[0] < 1 or V.shape[-1] < 2:
        raise ParameterError(
            name, f"{name} must have shape (B, m, m), B >= 1, m >= 2, got {tuple(V.shape)}"
        )
    if not bool(torch.isfinite(V).all()):
        raise ParameterError(name, f"{name} must be finite")
    return V


def _is_dataset_like(value: Any) -> bool:
    """A whole Dataset (time included) is not one initial covariance: left to the checks."""
    return hasattr(value, "data_vars")


def initial_tokens(
    V0: Tensor,
    width: int,
    samples: int,
    generator: torch.Generator | None = None,
    *,
    normals: Tensor | None = None,
) -> Tensor:
    """Token matrices X_0 (samples, m, n) with ``X_0 X_0^T / n = V0`` exactly.

    ``X_0 = sqrt(n) L B^T`` with ``L L^T = V0`` (Cholesky) and B a Haar-random n x m
    orthonormal frame per sample, so the law of everything downstream depends on V0 only
    (even with LayerNorm, which is not rotation invariant). B is the orthonormalised
    ``G: (samples, n, m)`` iid N(0, 1), drawn from ``generator``, or ``normals`` if given
    (e.g. from a faster generator; not together with ``generator``).
    """
    V0 = check_covariance(V0)
    m = V0.shape[-1]
    check_int("width", width, m)
    check_int("samples", samples, 1)
    if normals is None:
        G = torch.randn(samples, width, m, generator=generator, dtype=V0.dtype, device=V0.device)
    elif generator is not None:
        raise ParameterError("normals", "give generator or normals, not both")
    elif normals.shape != (samples, width, m):
        raise ParameterError(
            "normals",
            f"normals must have shape (samples, width, m) = {(samples, width, m)}, "
            f"got {tuple(normals.shape)}",
        )
    elif normals.dtype != V0.dtype or normals.device != V0.device:
        raise ParameterError(
            "normals",
            f"normals must have V0's dtype and device ({V0.dtype}, {V0.device}), "
            f"got {normals.dtype}, {normals.device}",
        )
    else:
        G = normals
    basis, r = torch.linalg.qr(G)
    basis = basis * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[..., None, :]  # Haar
    return math.sqrt(width) * torch.linalg.cholesky(V0) @ basis.transpose(-1, -2)
