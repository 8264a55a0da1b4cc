"""Per-token LayerNorm and RMSNorm without affine parameters (docs/theory.md#layers, pre-LN
baseline)."""

from __future__ import annotations

from torch import Tensor

LN_EPS = 1e-6
"""LayerNorm epsilon of every LayerNorm in the library (functional and ``nn``)."""


def layer_norm(X: Tensor, eps: float = LN_EPS) -> Tensor:
    """Normalise each token over its features: X: (..., m, n) -> (..., m, n).

    Subtracts the token's feature mean and divides by its (population) feature std, so that
    every output token has squared norm / n = 1 (up to ``eps``).
    """
    centred = X - X.mean(dim=-1, keepdim=True)
    return centred / (centred.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()


def rms_norm(X: Tensor, eps: float = LN_EPS) -> Tensor:
    """RMSNorm: divide each token by its root mean square over features (no centring);
    X: (..., m, n) -> (..., m, n), every output token with squared norm / n = 1 (up to
    ``eps``). The ``norm_kind="rms"`` normalisation (docs/theory.md#simplified)."""
    return X * (X.pow(2).mean(dim=-1, keepdim=True) + eps).rsqrt()
