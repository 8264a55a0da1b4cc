"""Thin ``torch.nn`` wrappers over the functional core (for training).

Inputs are batch-first ``(B, m, n)``. Weights are initialised N(0, s^2) with
``s = weight_std(config, name, fan_in)`` (N(0, 1/fan_in) for the theory's ``init="fan_in"``)
and used as ``x W^T`` by ``nn.Linear``, which equals the ``x W / sqrt(fan_in)`` of
docs/theory.md#notation in law. LayerNorms are ``nn.LayerNorm`` (affine, identity at
initialisation).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ._validation import check_bool
from .activation import relu_slopes, shaped_relu
from .blocks import attention_branch, attention_matrix, block, mlp_branch, split_heads
from .config import ModelConfig, check_config, weight_std
from .metrics import covariance
from .norm import LN_EPS


def init_linear(
    fan_in: int, fan_out: int, *, bias: bool = False, std: float | None = None
) -> nn.Linear:
    """``nn.Linear`` with N(0, std^2) weights (default ``1/sqrt(fan_in)``, docs/theory.md#notation)
    and zero bias."""
    layer = nn.Linear(fan_in, fan_out, bias=bias)
    nn.init.normal_(layer.weight, std=1.0 / math.sqrt(fan_in) if std is None else std)
    if bias:
        nn.init.zeros_(layer.bias)
    return layer


def _linear(config: ModelConfig, name: str, fan_in: int, fan_out: int, bias: bool) -> nn.Linear:
    return init_linear(fan_in, fan_out, bias=bias, std=weight_std(config, name, fan_in))


class _Projected(nn.Module):
    """A module whose weights are named linear layers handed to the functional core."""

    layers: nn.ModuleDict

    def linear(self, x: Tensor, out_features: int, name: str) -> Tensor:
        return self.layers[name](x)


class Attention(_Projected):
    """Multi-head attention branch ``A X W^V`` (+ ``W^O``), kind given by ``config.attention``.

    Supports a causal mask, ``out_proj`` and a fixed head size (``head_dim`` independent of
    ``heads``). ``fused=True`` never forms the m x m attention matrix.
    """

    def __init__(
        self, config: ModelConfig, *, bias: bool | None = None, fused: bool = True
    ) -> None:
        super().__init__()
        if config.attention == "none":
            raise ValueError("attention must be 'shaped' or 'softmax' for an Attention module")
        self.config, self.fused = config, fused
        bias = config.bias if bias is None else bias
        n, keys, values = config.width, config.heads * config.key_dim, config.value_dim
        self.layers = nn.ModuleDict(
            {
                "query": _linear(config, "query", n, keys, bias),
                "key": _linear(config, "key", n, keys, bias),
                "value": _linear(config, "value", n, values, bias),
            }
        )
        if config.out_proj:
            self.layers["out"] = _linear(config, "out", values, n, bias)

    def forward(self, X: Tensor) -> Tensor:
        """X: (B, m, n) -> (B, m, n)."""
        return attention_branch(X, self.config, self.linear, fused=self.fused)

    def attention_matrix(self, X: Tensor) -> Tensor:
        """Explicit attention matrices of every head: X: (B, m, n) -> (B, h, m, m)."""
        h = self.config.heads
        q = split_heads(self.layers["query"](X), h)
        k = split_heads(self.layers["key"](X), h)
        return attention_matrix(q, k, self.config)


class ShapedAttention(Attention):
    """Shaped attention ``A = I + Softmax(Y/tau) - 11^T/m`` (docs/theory.md#layers)."""

    def __init__(self, config: ModelConfig, **kwargs) -> None:
        super().__init__(config.replace(attention="shaped"), **kwargs)


class SoftmaxAttention(Attention):
    """Standard attention ``A = Softmax(Y / sqrt(n_k))``."""

    def __init__(self, config: ModelConfig, **kwargs) -> None:
        super().__init__(config.replace(attention="softmax"), **kwargs)


class ShapedReLU(nn.Module):
    """``phi(x) = s_+ max(x, 0) + s_- min(x, 0)``."""

    def __init__(self, s_plus: float, s_minus: float) -> None:
        super().__init__()
        self.s_plus, self.s_minus = s_plus, s_minus

    @classmethod
    def from_config(cls, config: ModelConfig) -> ShapedReLU:
        s_plus, s_minus, _ = relu_slopes(config)
        return cls(s_plus, s_minus)

    def forward(self, x: Tensor) -> Tensor:
        return shaped_relu(x, self.s_plus, self.s_minus)

    def extra_repr(self) -> str:
        return f"s_plus={self.s_plus:.6g}, s_minus={self.s_minus:.6g}"


class MLP(_Projected):
    """MLP branch ``g phi(X W_1) W_2`` (shaped or standard ReLU, or GELU), hidden width
    ``mlp_ratio * n`` (see :func:`shapedtx.mlp_branch`)."""

    def __init__(self, config: ModelConfig, *, bias: bool | None = None) -> None:
        super().__init__()
        if config.mlp == "none":
            raise ValueError("mlp must be 'shaped_relu', 'relu' or 'gelu' for an MLP module")
        self.config = config
        bias = config.bias if bias is None else bias
        n, k = config.width, config.mlp_width
        self.layers = nn.ModuleDict(
            {
                "mlp_in": _linear(config, "mlp_in", n, k, bias),
                "mlp_out": _linear(config, "mlp_out", k, n, bias),
            }
        )

    def forward(self, X: Tensor) -> Tensor:
        """X: (B, m, n) -> (B, m, n)."""
        return mlp_branch(X, self.config, self.linear)


def layer_norm_module(width: int) -> nn.LayerNorm:
    """Affine ``nn.LayerNorm`` with the library's epsilon (equals :func:`shapedtx.layer_norm`
    at initialisation)."""
    return nn.LayerNorm(width, eps=LN_EPS)


class Block(nn.Module):
    """Residual block: attention sub-block then MLP sub-block, each with the configured
    residual (scaled or unit) and normalisation (none, pre- or post-LN)."""

    def __init__(
        self, config: ModelConfig, *, bias: bool | None = None, fused: bool = True
    ) -> None:
        super().__init__()
        self.config, self.fused = config, fused
        self.attention = (
            Attention(config, bias=bias, fused=fused) if config.attention != "none" else None
        )
        self.mlp = MLP(config, bias=bias) if config.mlp != "none" else None
        self.norms = nn.ModuleDict()
        if config.norm != "none":
            if self.attention is not None:
                self.norms["attn_norm"] = layer_norm_module(config.width)
            if self.mlp is not None:
                self.norms["mlp_norm"] = layer_norm_module(config.width)
        self._layers: dict[str, nn.Module] = {}
        for part in (self.attention, self.mlp):
            if part is not None:
                self._layers.update(part.layers.items())

    def _linear(self, x: Tensor, out_features: int, name: str) -> Tensor:
        return self._layers[name](x)

    def _norm(self, x: Tensor, name: str) -> Tensor:
        return self.norms[name](x)

    def forward(self, X: Tensor) -> Tensor:
        """X: (B, m, n) -> (B, m, n)."""
        return block(X, self.config, self._linear, fused=self.fused, norm=self._norm)


class Transformer(nn.Module):
    """``config.depth`` residual blocks acting on token representations (no embeddings)."""

    def __init__(
        self, config: ModelConfig, *, bias: bool | None = None, fused: bool = True
    ) -> None:
        super().__init__()
        self.config = check_config(config)
        if bias is not None:
            check_bool("bias", bias)
        check_bool("fused", fused)
        self.blocks = nn.ModuleList(
            [Block(config, bias=bias, fused=fused) for _ in range(config.depth)]
        )

    def forward(
        self, X: Tensor, *, return_hidden: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """X: (B, m, n) -> (B, m, n); with ``return_hidden`` also the list of the depth + 1
        hidden states (input first)."""
        hidden = [X]
        for layer in self.blocks:
            X = layer(X)
            if return_hidden:
                hidden.append(X)
        return (X, hidden) if return_hidden else X

    @torch.no_grad()
    def covariances(self, X: Tensor) -> Tensor:
        """Token covariance after every block: X: (B, m, n) -> (B, depth + 1, m, m)."""
        _, hidden = self.forward(X, return_hidden=True)
        return torch.stack([covariance(h) for h in hidden], dim=1)
