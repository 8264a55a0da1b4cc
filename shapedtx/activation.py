"""Shaped ReLU (docs/theory.md#layers, [LNR])."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ._validation import ParameterError
from .attention import _may_overwrite
from .config import ModelConfig, shaped_relu_slope


def shaped_relu(x: Tensor, s_plus: float, s_minus: float, *, overwrite: bool = False) -> Tensor:
    """phi(x) = s_+ max(x, 0) + s_- min(x, 0), elementwise; x: (...). Slopes must be >= 0.

    Computed as ``s_+ leaky_relu(x, s_- / s_+)``: one fused kernel, faster than the two-clamp
    form in forward + backward on CPU (benchmarks/HISTORY.md, "Training throughput").
    ``overwrite=True`` computes phi in x's
    memory (ignored when autograd needs x, as for the attention matrices).
    """
    if _may_overwrite(x, overwrite):
        if s_plus > 0:
            return F.leaky_relu_(x, s_minus / s_plus).mul_(s_plus)
        return x.clamp_(max=0).mul_(s_minus)
    if s_plus > 0:
        return s_plus * F.leaky_relu(x, s_minus / s_plus)
    return s_minus * torch.clamp(x, max=0)


def trainable_relu(x: Tensor, s_plus: Tensor | float, s_minus: Tensor | float) -> Tensor:
    """:func:`shaped_relu` with trainable slopes (0-d, or one per channel of x's last
    dimension; docs/theory.md#trainable-shape); x: (..., k). The same numbers as
    :func:`shaped_relu` at equal slopes when s_+ = 1 (every shaped preset: ``c_plus=0``)."""
    return s_plus * torch.where(x > 0, x, x * (s_minus / s_plus))


def relu_slopes(config: ModelConfig) -> tuple[float, float, float]:
    """(s_plus, s_minus, c) of the configured MLP activation.

    ``shaped_relu``: s_pm = 1 + c_pm / sqrt(n) and the exact normaliser c = 2 / (s_+^2 + s_-^2)
    (docs/theory.md#layers); ``relu``: s_+ = 1, s_- = 0, c = 2.
    """
    if config.mlp == "relu":
        return 1.0, 0.0, 2.0
    if config.mlp != "shaped_relu":
        raise ParameterError(
            "mlp", f"mlp must be 'shaped_relu' or 'relu' to have slopes, got {config.mlp!r}"
        )
    s_plus = shaped_relu_slope(config.c_plus, config.width)
    s_minus = shaped_relu_slope(config.c_minus, config.width)
    return s_plus, s_minus, 2.0 / (s_plus**2 + s_minus**2)
