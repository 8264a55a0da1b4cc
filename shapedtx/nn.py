"""Thin ``torch.nn`` wrappers over the functional core (for training).

Inputs are batch-first ``(B, m, n)``. Weights are initialised N(0, 1/fan_in) and used as
``x W^T`` by ``nn.Linear``, which equals the ``x W / sqrt(fan_in)`` of THEORY section 1 in law.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .activation import relu_slopes, shaped_relu
from .blocks import attention_branch, attention_matrix, block, mlp_branch, split_heads
from .config import ModelConfig
from .metrics import covariance


def init_linear(fan_in: int, fan_out: int, *, bias: bool = False) -> nn.Linear:
    """``nn.Linear`` with N(0, 1/fan_in) weights and zero bias (THEORY section 1)."""
    layer = nn.Linear(fan_in, fan_out, bias=bias)
    nn.init.normal_(layer.weight, std=1.0 / math.sqrt(fan_in))
    if bias:
        nn.init.zeros_(layer.bias)
    return layer


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

    def __init__(self, config: ModelConfig, *, bias: bool = False, fused: bool = True) -> None:
        super().__init__()
        if config.attention == "none":
            raise ValueError("attention must be 'shaped' or 'softmax' for an Attention module")
        self.config, self.fused = config, fused
        n, keys, values = config.width, config.heads * config.key_dim, config.value_dim
        self.layers = nn.ModuleDict(
            {
                "query": init_linear(n, keys, bias=bias),
                "key": init_linear(n, keys, bias=bias),
                "value": init_linear(n, values, bias=bias),
            }
        )
        if config.out_proj:
            self.layers["out"] = init_linear(values, n, bias=bias)

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
    """Shaped attention ``A = I + Softmax(Y/tau) - 11^T/m`` (THEORY section 2)."""

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
    """MLP branch ``sqrt(c/n) phi(X W^pre / sqrt(n)) W^post`` (shaped or standard ReLU)."""

    def __init__(self, config: ModelConfig, *, bias: bool = False) -> None:
        super().__init__()
        if config.mlp == "none":
            raise ValueError("mlp must be 'shaped_relu' or 'relu' for an MLP module")
        self.config = config
        n = config.width
        self.layers = nn.ModuleDict(
            {"mlp_in": init_linear(n, n, bias=bias), "mlp_out": init_linear(n, n, bias=bias)}
        )

    def forward(self, X: Tensor) -> Tensor:
        """X: (B, m, n) -> (B, m, n)."""
        return mlp_branch(X, self.config, self.linear)


class Block(nn.Module):
    """Residual block: attention sub-block then MLP sub-block, same (lambda, gamma)."""

    def __init__(self, config: ModelConfig, *, bias: bool = False, fused: bool = True) -> None:
        super().__init__()
        self.config, self.fused = config, fused
        self.attention = (
            Attention(config, bias=bias, fused=fused) if config.attention != "none" else None
        )
        self.mlp = MLP(config, bias=bias) if config.mlp != "none" else None
        self._layers: dict[str, nn.Module] = {}
        for part in (self.attention, self.mlp):
            if part is not None:
                self._layers.update(part.layers.items())

    def _linear(self, x: Tensor, out_features: int, name: str) -> Tensor:
        return self._layers[name](x)

    def forward(self, X: Tensor) -> Tensor:
        """X: (B, m, n) -> (B, m, n)."""
        return block(X, self.config, self._linear, fused=self.fused)


class Transformer(nn.Module):
    """``config.depth`` residual blocks acting on token representations (no embeddings)."""

    def __init__(self, config: ModelConfig, *, bias: bool = False, fused: bool = True) -> None:
        super().__init__()
        self.config = config
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
