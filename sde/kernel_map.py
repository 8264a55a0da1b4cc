"""The exact one-step mean of an MLP sub-block: its kernel map (docs/theory.md#kernel-map).

For the MLP branch ``g phi(X W_1) W_2`` at residual weight gamma (``residual="scaled"``,
``init="fan_in"``) the token covariance after the sub-block has, at any width,

    E[V' | V] = V + gamma^2 (K(V) - V),    K(V) = g^2 E[phi(h) phi(h)^T],  h ~ N(0, V).

For a ReLU with slopes s_+, s_- (shaped, plain, or trained), ``K = V + kappa (J(V) - V)`` with
J the arc-cosine kernel (:func:`sde.arccos_kernel`) and ``kappa = (s_+ - s_-)^2 / (2 (s_+^2 +
s_-^2))``; for the shaped ReLU ``n kappa -> (c_+ - c_-)^2 / 4``, the drift of the SDE; for a
plain ReLU ``kappa = 1/2`` at every width, so the drift in SDE time ``n gamma^2 kappa (J - V)``
has no limit. GELU's K has no closed form and is computed by Gauss-Hermite quadrature.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import Tensor

from shapedtx._validation import ParameterError
from shapedtx.activation import relu_slopes
from shapedtx.config import ModelConfig, check_config

from .coefficients import arccos_kernel

GELU_NODES = 48
"""Gauss-Hermite nodes per dimension of the GELU kernel (smooth integrand: far below float64
rounding of the one-step means it is compared with)."""


def kernel_nonlinearity(s_plus: float | Tensor, s_minus: float | Tensor) -> float | Tensor:
    """``kappa = (s_+ - s_-)^2 / (2 (s_+^2 + s_-^2))``: how far a ReLU with slopes s_+, s_- is
    from linear in its kernel map ``K = V + kappa (J - V)`` (0: linear, 1/2: plain ReLU, 1:
    the absolute value); numbers or tensors of any shape (e.g. trained per-channel slopes)."""
    return (s_plus - s_minus) ** 2 / (2 * (s_plus**2 + s_minus**2))


def _check(config: ModelConfig, V: Tensor) -> None:
    check_config(config)
    if config.mlp == "none":
        raise ParameterError("mlp", "mlp must be 'shaped_relu', 'relu' or 'gelu', got 'none'")
    if config.init != "fan_in":
        raise ParameterError(
            "init",
            f"init must be 'fan_in' for the kernel map (weights N(0, 1/fan_in)), got "
            f"{config.init!r}",
        )
    if config.residual != "scaled":
        raise ParameterError(
            "residual",
            f"residual must be 'scaled' (lambda X + gamma f(X)), got {config.residual!r}",
        )
    if V.dim() < 2 or V.shape[-1] != V.shape[-2]:
        raise ParameterError("V", f"V must have shape (..., m, m), got {tuple(V.shape)}")


def mlp_kernel(config: ModelConfig, V: Tensor) -> Tensor:
    """``K(V) = g^2 E[phi(h) phi(h)^T]``, ``h ~ N(0, V)``, of ``config``'s MLP activation and
    branch gain (docs/theory.md#kernel-map); V: (..., m, m) -> (..., m, m).

    ReLU (shaped or plain): ``V + kappa (J(V) - V)``, :func:`kernel_nonlinearity` of the
    slopes of :func:`shapedtx.activation.relu_slopes` (the initial slopes: trained slopes
    give their own kappa). GELU (``g = 1``): two-dimensional Gauss-Hermite quadrature of
    every pair of tokens.
    """
    _check(config, V)
    if config.mlp == "gelu":
        return _gelu_kernel(V)
    s_plus, s_minus, _ = relu_slopes(config)
    return V + kernel_nonlinearity(s_plus, s_minus) * (arccos_kernel(V) - V)


def mlp_block_mean(config: ModelConfig, V: Tensor) -> Tensor:
    """``E[V' | V] = V + gamma^2 (K(V) - V)``: the exact mean token covariance after one MLP
    sub-block at any width (docs/theory.md#kernel-map); V: (..., m, m) -> (..., m, m)."""
    return V + config.gamma**2 * (mlp_kernel(config, V) - V)


@functools.lru_cache(maxsize=4)
def _hermite(k: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights of ``E f(z)``, z ~ N(0, 1) (probabilists' Gauss-Hermite)."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(k)
    return nodes, weights / np.sqrt(2 * np.pi)


def _gelu_kernel(V: Tensor) -> Tensor:
    """``E[gelu(h_a) gelu(h_b)]`` for every pair; V: (..., m, m), computed in float64."""
    nodes, weights = _hermite(GELU_NODES)
    z = torch.as_tensor(nodes, dtype=torch.float64, device=V.device)
    w = torch.as_tensor(weights, dtype=torch.float64, device=V.device)
    V64 = V.to(torch.float64)
    d = torch.diagonal(V64, dim1=-2, dim2=-1).clamp(min=0)
    sa = d.sqrt()[..., :, None]  # (..., m, 1): token a's scale
    safe = sa.clamp(min=torch.finfo(torch.float64).tiny)
    slope = V64 / safe  # (..., m, m): b = slope z1 + rest z2
    rest = (d[..., None, :] - slope**2).clamp(min=0).sqrt()
    a = sa[..., None, None] * z[:, None]  # (..., m, 1, k, 1)
    b = slope[..., None, None] * z[:, None] + rest[..., None, None] * z[None, :]
    gelu = torch.nn.functional.gelu
    values = gelu(a) * gelu(b)  # (..., m, m, k, k)
    K = torch.einsum("...ij,i,j->...", values, w, w)
    return K.to(V.dtype)


__all__ = ["kernel_nonlinearity", "mlp_block_mean", "mlp_kernel"]
