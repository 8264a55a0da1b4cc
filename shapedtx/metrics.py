"""Token-covariance metrics and rank-collapse detection (docs/theory.md#notation and
#rank-collapse).

All functions act on the trailing dimensions and batch over the leading ones:
``V: (..., m, m)`` token covariance, ``X: (..., m, n)`` token representations.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ._validation import check_number


def covariance(X: Tensor) -> Tensor:
    """``V = X X^T / n``; X: (..., m, n) -> (..., m, m)."""
    return X @ X.transpose(-1, -2) / X.shape[-1]


def correlation(V: Tensor) -> Tensor:
    """``rho^{ab} = V^{ab} / sqrt(V^{aa} V^{bb})``; V: (..., m, m) -> (..., m, m)."""
    d = torch.diagonal(V, dim1=-2, dim2=-1).sqrt()
    return V / (d[..., :, None] * d[..., None, :])


def mean_correlation(V: Tensor) -> Tensor:
    """Mean off-diagonal correlation; V: (..., m, m) -> (...). Equals 1 at rank collapse."""
    m = V.shape[-1]
    rho = correlation(V)
    total = rho.sum(dim=(-2, -1)) - torch.diagonal(rho, dim1=-2, dim2=-1).sum(-1)
    return total / (m * (m - 1))


def stable_rank(V: Tensor) -> Tensor:
    """``||V||_F^2 / ||V||_2^2`` in [1, m]; V: (..., m, m) symmetric PSD -> (...)."""
    eig = torch.linalg.eigvalsh(V)
    return eig.pow(2).sum(-1) / eig[..., -1].pow(2)


def centred_stable_rank(V: Tensor) -> Tensor:
    """Stable rank of the centred covariance ``P V P`` (``P = I - 11^T/m``), in [1, m - 1];
    V: (..., m, m) -> (...). Removes the mean-token direction, which after training carries
    most of the variance of every model (plain stable rank is then about 1 even without
    collapse); NaN where ``P V P = 0`` (complete collapse)."""
    m = V.shape[-1]
    P = torch.eye(m, dtype=V.dtype, device=V.device) - 1.0 / m
    return stable_rank(P @ V @ P)


def eigenvalue_ratio(V: Tensor) -> Tensor:
    """``lambda_min(V) / lambda_max(V)`` in [0, 1]; V: (..., m, m) -> (...). 0 at collapse."""
    eig = torch.linalg.eigvalsh(V)
    return eig[..., 0] / eig[..., -1]


def token_residual(X: Tensor) -> Tensor:
    """``||X - 1 xbar^T||_F / ||X||_F`` with xbar the mean token; X: (..., m, n) -> (...)."""
    centred = X - X.mean(dim=-2, keepdim=True)
    return torch.linalg.matrix_norm(centred) / torch.linalg.matrix_norm(X)


def covariance_residual(V: Tensor) -> Tensor:
    """:func:`token_residual` computed from ``V = X X^T / n``: ``sqrt(tr(P V P) / tr(V))``."""
    m = V.shape[-1]
    trace = torch.diagonal(V, dim1=-2, dim2=-1).sum(-1)
    centred_trace = trace - V.sum(dim=(-2, -1)) / m
    return (centred_trace.clamp(min=0) / trace).sqrt()


class Collapse(NamedTuple):
    """Result of :func:`detect_collapse`, per sample.

    collapsed: bool (...); first_index: int64 (...), index along the time axis of the first
    step whose mean correlation exceeds the threshold, -1 where it never does.
    """

    collapsed: Tensor
    first_index: Tensor


def detect_collapse(V: Tensor, threshold: float = 0.99) -> Collapse:
    """First time at which the mean off-diagonal correlation exceeds ``threshold``.

    V: (..., t, m, m), time on the third-to-last axis. Non-finite covariances count as
    collapsed (the representation has degenerated).
    """
    check_number("threshold", threshold, 0.0, 1.0, low_open=True, high_open=True)
    if V.dim() < 3:
        raise ValueError(f"V must have shape (..., t, m, m), got {tuple(V.shape)}")
    rho = mean_correlation(V)
    above = (rho > threshold) | ~torch.isfinite(rho)
    collapsed = above.any(dim=-1)
    first = torch.where(collapsed, above.to(torch.int8).argmax(dim=-1), -1)
    return Collapse(collapsed, first)
