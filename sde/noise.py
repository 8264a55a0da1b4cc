"""Structured noise of the covariance SDE without an (m^2 x m^2) square root (docs/theory.md#sde).

With ``L L^T = V`` and iid N(0, 1) m x m matrices N1, N2:
``Xi = L (N1 + N1^T) L^T / sqrt(2)`` has covariance ``Sigma_lin`` and
``Yh P V + V P Yh^T`` with ``Yh = L N2 L^T`` has covariance the attention term, so
``sqrt(k_lin) Xi + sqrt(k_att) (Yh P V + V P Yh^T)`` has covariance ``Sigma(V)``.

Causal shaped attention (docs/theory.md#causal-sde): ``Yh P / m`` becomes the row-wise R (row a:
``Yh^{a,:} P_a / a``), and ``sqrt(k_att) (R V + V R^T)`` (causal ``k_att``) has covariance the
causal attention term.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from shapedtx.config import ModelConfig

from .coefficients import _check_V, causal_centerings, centering, sde_constants


def psd_factor(V: Tensor) -> tuple[Tensor, Tensor]:
    """``(L, eigenvalues)``: the symmetric square root ``L = V^{1/2}`` after clipping negative
    eigenvalues to 0 (continuous in V, unlike a factor with eigenvector sign ambiguity).

    V: (..., m, m) symmetric -> L (..., m, m), eigenvalues (..., m) before clipping (ascending).
    Uses ``eigh`` (Cholesky fails near rank collapse).
    """
    evals, evecs = torch.linalg.eigh(V)
    L = (evecs * evals.clamp(min=0).sqrt()[..., None, :]) @ evecs.transpose(-1, -2)
    return L, evals


def attention_noise_factor(Yh: Tensor, *, causal: bool) -> Tensor:
    """The attention perturbation driven by ``Yh = L N2 L^T``: ``Yh P`` (non-causal,
    docs/theory.md#sde ) or the row-wise causal R with row a ``Yh^{a,:} P_a / a``
    (docs/theory.md#causal-sde).

    Yh: (..., m, m) -> (..., m, m). (The non-causal ``1/m`` sits in ``k_att``.)
    """
    m = Yh.shape[-1]
    if causal:
        Ps = causal_centerings(m, dtype=Yh.dtype, device=Yh.device)
        return torch.einsum("...ak,akj->...aj", Yh, Ps)
    return Yh @ centering(m, dtype=Yh.dtype, device=Yh.device)


def noise_increment(
    L: Tensor, V: Tensor, normals: Tensor, k_lin: float, k_att: float, *, causal: bool = False
) -> Tensor:
    """Unit-time noise ``sqrt(k_lin) Xi + sqrt(k_att) (Yh P V + V P Yh^T)``; with ``causal``
    ``sqrt(k_lin) Xi + sqrt(k_att) (R V + V R^T)`` (docs/theory.md#causal-sde).

    L, V: (..., m, m); normals: (..., 2, m, m) iid N(0, 1) (N1, N2) -> (..., m, m), symmetric.
    """
    N1, N2 = normals[..., 0, :, :], normals[..., 1, :, :]
    Lt = L.transpose(-1, -2)
    sym = N1 + N1.transpose(-1, -2)
    out = math.sqrt(k_lin / 2) * (L @ sym @ Lt)
    if k_att:
        YPV = attention_noise_factor(L @ N2 @ Lt, causal=causal) @ V
        out = out + math.sqrt(k_att) * (YPV + YPV.transpose(-1, -2))
    return out


def sample_noise(
    config: ModelConfig,
    V: Tensor,
    generator: torch.Generator | None = None,
    *,
    normals: Tensor | None = None,
) -> Tensor:
    """One draw of ``Sigma(V)^{1/2} xi`` (unit time): mean 0, covariance ``diffusion(config, V)``.

    V: (..., m, m) PSD -> (..., m, m) symmetric. ``normals`` (..., 2, m, m) overrides the draw.
    """
    m = _check_V(V)
    const = sde_constants(config, m)
    if normals is None:
        normals = torch.randn(
            (*V.shape[:-2], 2, m, m), generator=generator, dtype=V.dtype, device=V.device
        )
    L, _ = psd_factor(V)
    return noise_increment(L, V, normals, const.k_lin, const.k_att, causal=const.causal)
