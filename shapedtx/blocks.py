"""Residual sub-blocks as pure functions of the input and a *linear map* (THEORY section 2).

Every weight matrix enters through ``linear(x, out_features, name)``, which must return
``x W / sqrt(fan_in)`` for a matrix ``W`` with iid N(0, 1) entries (one fresh matrix per
``name``). The ``torch.nn`` modules pass their ``nn.Linear`` layers; the simulators pass
samplers that draw ``x W`` directly (THEORY section 5). So the simulated network *is* the
trained network at initialisation.

Names used: ``"query"``, ``"key"``, ``"value"``, ``"out"`` (attention) and ``"mlp_in"``,
``"mlp_out"`` (MLP).
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
from torch import Tensor

from .activation import relu_slopes, shaped_relu
from .attention import (
    shaped_attention,
    shaped_attention_matrix,
    softmax_attention,
    softmax_attention_matrix,
)
from .config import ModelConfig
from .norm import layer_norm


class Linear(Protocol):
    """``linear(x, out_features, name)``: x: (..., m, fan_in) -> (..., m, out_features)."""

    def __call__(self, x: Tensor, out_features: int, name: str) -> Tensor: ...


def split_heads(x: Tensor, heads: int) -> Tensor:
    """(..., m, h * d) -> (..., h, m, d)."""
    return x.unflatten(-1, (heads, x.shape[-1] // heads)).transpose(-3, -2)


def merge_heads(x: Tensor) -> Tensor:
    """(..., h, m, d) -> (..., m, h * d)."""
    return x.transpose(-3, -2).flatten(-2)


def attention_matrix(q: Tensor, k: Tensor, config: ModelConfig) -> Tensor:
    """The attention matrix A of every head; q, k: (..., h, m, n_k) -> (..., h, m, m)."""
    Y = q @ k.transpose(-1, -2)
    if config.attention == "shaped":
        return shaped_attention_matrix(Y, config.tau, causal=config.causal)
    if config.attention == "softmax":
        return softmax_attention_matrix(Y, config.key_dim, causal=config.causal)
    raise ValueError(f"attention must be 'shaped' or 'softmax', got {config.attention!r}")


def attention_branch(
    X: Tensor, config: ModelConfig, linear: Linear, *, fused: bool = True
) -> Tensor:
    """Attention branch ``A X W^V / sqrt(n)`` (then ``W^O / sqrt(n_h d_p)`` if ``out_proj``).

    X: (..., m, n) -> (..., m, n). ``fused`` uses SDPA and a token mean instead of the explicit
    m x m matrix; both are the same function (tested).
    """
    h, n_k = config.heads, config.key_dim
    q = split_heads(linear(X, h * n_k, "query"), h)
    k = split_heads(linear(X, h * n_k, "key"), h)
    v = split_heads(linear(X, config.value_dim, "value"), h)
    if not fused:
        out = attention_matrix(q, k, config) @ v
    elif config.attention == "shaped":
        out = shaped_attention(q, k, v, config.tau, causal=config.causal)
    elif config.attention == "softmax":
        out = softmax_attention(q, k, v, causal=config.causal)
    else:
        raise ValueError(f"attention must be 'shaped' or 'softmax', got {config.attention!r}")
    out = merge_heads(out)
    return linear(out, config.width, "out") if config.out_proj else out


def mlp_branch(X: Tensor, config: ModelConfig, linear: Linear) -> Tensor:
    """MLP branch ``sqrt(c/n) phi(X W^pre / sqrt(n)) W^post``; X: (..., m, n) -> (..., m, n)."""
    s_plus, s_minus, c = relu_slopes(config)
    hidden = shaped_relu(linear(X, config.width, "mlp_in"), s_plus, s_minus)
    return math.sqrt(c) * linear(hidden, config.width, "mlp_out")


def residual(X: Tensor, branch: Tensor, config: ModelConfig) -> Tensor:
    """``lambda X + gamma branch``."""
    return config.lam * X + config.gamma * branch


def block(X: Tensor, config: ModelConfig, linear: Linear, *, fused: bool = True) -> Tensor:
    """One residual block: attention sub-block then MLP sub-block (either may be ``"none"``).

    X: (..., m, n) -> (..., m, n). With ``norm="pre"`` each branch sees ``layer_norm(X)``.
    """
    pre = layer_norm if config.norm == "pre" else (lambda x: x)
    if config.attention != "none":
        X = residual(X, attention_branch(pre(X), config, linear, fused=fused), config)
    if config.mlp != "none":
        X = residual(X, mlp_branch(pre(X), config, linear), config)
    return X


def gaussian_linear(generator: torch.Generator | None = None) -> Linear:
    """A ``Linear`` that draws a fresh N(0, 1) weight matrix at every call (reference sampler).

    x: (..., m, fan_in): one independent matrix per leading index (per sample).
    """

    def linear(x: Tensor, out_features: int, name: str) -> Tensor:
        fan_in = x.shape[-1]
        shape = (*x.shape[:-2], fan_in, out_features)
        W = torch.randn(shape, generator=generator, dtype=x.dtype, device=x.device)
        return x @ W / math.sqrt(fan_in)

    return linear
