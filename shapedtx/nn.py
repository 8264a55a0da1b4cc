"""Thin ``torch.nn`` wrappers over the functional core (for training).

Inputs are batch-first ``(B, m, n)``. Weights are initialised N(0, s^2) with
``s = weight_std(config, name, fan_in)`` (N(0, 1/fan_in) for the theory's ``init="fan_in"``)
and used as ``x W^T`` by ``nn.Linear``, which equals the ``x W / sqrt(fan_in)`` of
docs/theory.md#notation in law. LayerNorms are ``nn.LayerNorm`` and RMSNorms ``nn.RMSNorm``
(affine, identity at initialisation). The simplified (He & Hofmann) blocks keep their
trainable gains as ``nn.Parameter``s in ``gains`` (docs/theory.md#simplified).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._validation import ParameterError, check_bool
from .activation import relu_slopes, shaped_relu
from .attention import gained_attention_matrix, simplified_attention_matrix
from .blocks import (
    attention_branch,
    attention_matrix,
    block,
    mlp_branch,
    split_heads,
    trainable_attention,
)
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


class _Gains(nn.Module):
    """A module with trainable gains: parameters in ``gains``, read through :meth:`gain`.

    A gain added with ``log=True`` (``ModelConfig.log_gains``) is stored as theta, initialised
    to 0, and read as ``initial * exp(theta)`` (docs/theory.md#trainable-shape); any other is
    the parameter itself, initialised to ``initial``.
    """

    gains: nn.ParameterDict
    _log_initial: dict[str, float]

    def _new_gains(self) -> None:
        self.gains, self._log_initial = nn.ParameterDict(), {}

    def _add_gain(
        self, name: str, initial: float, shape: tuple[int, ...] = (), *, log: bool = False
    ) -> None:
        self.gains[name] = nn.Parameter(torch.full(shape, 0.0 if log else initial))
        if log:
            self._log_initial[name] = initial

    def gain(self, name: str) -> Tensor:
        """The gain ``name`` (``shapedtx.blocks.Gain``): its value, whatever its storage."""
        p = self.gains[name]
        return self._log_initial[name] * p.exp() if name in self._log_initial else p


class _Projected(nn.Module):
    """A module whose weights are named linear layers handed to the functional core."""

    layers: nn.ModuleDict

    def linear(self, x: Tensor, out_features: int, name: str) -> Tensor:
        return self.layers[name](x)


class Attention(_Projected, _Gains):
    """Multi-head attention branch ``A X W^V`` (+ ``W^O``), kind given by ``config.attention``.

    Supports a causal mask, ``out_proj`` and a fixed head size (``head_dim`` independent of
    ``heads``). ``fused=True`` never forms the m x m attention matrix.

    ``attention="simplified"``: W^Q zero-initialised, no W^V (identity) except in the
    ``first`` block, where it is trainable and identity-initialised, no W^O, and the
    per-head gains ``gains["attn_alpha"]``, ``["attn_beta"]``, ``["attn_gamma"]`` (h,),
    initialised to 1 (docs/theory.md#simplified).
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        bias: bool | None = None,
        fused: bool = True,
        first: bool = False,
    ) -> None:
        super().__init__()
        if config.attention == "none":
            raise ParameterError(
                "attention",
                "attention must be 'shaped', 'softmax' or 'simplified' for an Attention module",
            )
        check_bool("first", first)
        self.config, self.fused, self.first = config, fused, first
        bias = config.bias if bias is None else bias
        n, keys, values = config.width, config.heads * config.key_dim, config.value_dim
        query = _linear(config, "query", n, keys, bias or config.query_bias)
        self.layers = nn.ModuleDict({"query": query, "key": _linear(config, "key", n, keys, bias)})
        self._new_gains()
        if config.attention == "simplified":
            nn.init.zeros_(query.weight)
            if first and config.first_value == "reparametrised":
                self.layers["value"] = SkipLinear(n)
            elif first:
                value = self.layers["value"] = nn.Linear(n, n, bias=False)
                with torch.no_grad():
                    value.weight.copy_(torch.eye(n))
            for name in ("attn_alpha", "attn_beta", "attn_gamma"):
                self._add_gain(name, 1.0, (config.heads,))
            return
        self.layers["value"] = _linear(config, "value", n, values, bias)
        if config.out_proj:
            self.layers["out"] = _linear(config, "out", values, n, bias)
        if config.attention == "shaped":
            names = ("attn_alpha", "attn_beta", "attn_gamma")
            trainable: tuple[str, ...] = names if config.attention_gains != "fixed" else ()
            if config.temperature != "fixed":
                trainable += ("attn_temperature",)
            for name in trainable:
                self._add_gain(name, 1.0, (config.heads,), log=config.log_gains)

    def forward(self, X: Tensor) -> Tensor:
        """X: (B, m, n) -> (B, m, n)."""
        return attention_branch(
            X, self.config, self.linear, fused=self.fused, gain=self.gain, first=self.first
        )

    def attention_matrix(self, X: Tensor) -> Tensor:
        """Explicit attention matrices of every head: X: (B, m, n) -> (B, h, m, m)."""
        cfg, h = self.config, self.config.heads
        q = split_heads(self.layers["query"](X), h)
        k = split_heads(self.layers["key"](X), h)
        if cfg.attention == "simplified":
            Y = q @ k.transpose(-1, -2)
            alpha, beta, gamma = (self.gain(f"attn_{g}") for g in ("alpha", "beta", "gamma"))
            return simplified_attention_matrix(
                Y, cfg.key_dim, alpha, beta, gamma, causal=cfg.causal
            )
        if trainable_attention(cfg):
            if "attn_temperature" in self.gains:
                q = q * self.gain("attn_temperature")[:, None, None]
            gains = {
                name: self.gain(name) if name in self.gains else 1.0
                for name in ("attn_alpha", "attn_beta", "attn_gamma")
            }
            Y = q @ k.transpose(-1, -2)
            return gained_attention_matrix(
                Y,
                1.0 / cfg.tau,
                gains["attn_alpha"],
                gains["attn_beta"],
                gains["attn_gamma"],
                causal=cfg.causal,
            )
        return attention_matrix(q, k, cfg)


class SkipLinear(nn.Module):
    """``x (r W + s I)^T``: a square linear map reparametrised around the identity, W
    zero-initialised, trainable scalars r = s = 1 (He & Hofmann's first value map;
    docs/theory.md#simplified); x: (..., n) -> (..., n)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n, n))
        self.r = nn.Parameter(torch.ones(()))
        self.s = nn.Parameter(torch.ones(()))

    def forward(self, x: Tensor) -> Tensor:
        return self.r * F.linear(x, self.weight) + self.s * x


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


class MLP(_Projected, _Gains):
    """MLP branch ``g phi(X W_1) W_2`` (shaped or standard ReLU, or GELU), hidden width
    ``mlp_ratio * n`` (see :func:`shapedtx.mlp_branch`)."""

    def __init__(self, config: ModelConfig, *, bias: bool | None = None) -> None:
        super().__init__()
        if config.mlp == "none":
            raise ParameterError(
                "mlp", "mlp must be 'shaped_relu', 'relu' or 'gelu' for an MLP module"
            )
        self.config = config
        bias = config.bias if bias is None else bias
        n, k = config.width, config.mlp_width
        self.layers = nn.ModuleDict(
            {
                "mlp_in": _linear(config, "mlp_in", n, k, bias),
                "mlp_out": _linear(config, "mlp_out", k, n, bias),
            }
        )
        self._new_gains()
        if config.mlp_slopes != "fixed":  # the shaped slopes, trainable
            shape = (k,) if config.mlp_slopes == "channel" else ()
            s_plus, s_minus, _ = relu_slopes(config)
            self._add_gain("mlp_s_plus", s_plus, shape, log=config.log_gains)
            self._add_gain("mlp_s_minus", s_minus, shape, log=config.log_gains)

    def forward(self, X: Tensor) -> Tensor:
        """X: (B, m, n) -> (B, m, n)."""
        return mlp_branch(X, self.config, self.linear, self.gain)


def layer_norm_module(width: int) -> nn.LayerNorm:
    """Affine ``nn.LayerNorm`` with the library's epsilon (equals :func:`shapedtx.layer_norm`
    at initialisation)."""
    return nn.LayerNorm(width, eps=LN_EPS)


def norm_module(config: ModelConfig) -> nn.Module:
    """The affine norm of ``config.norm_kind``: :func:`layer_norm_module` or ``nn.RMSNorm``
    (equals :func:`shapedtx.norm.rms_norm` at initialisation)."""
    if config.norm_kind == "rms":
        return nn.RMSNorm(config.width, eps=LN_EPS)
    return layer_norm_module(config.width)


class Block(_Gains):
    """Residual block: attention sub-block then MLP sub-block, each with the configured
    residual (scaled, unit or skipless) and normalisation (none, pre- or post-norm).

    ``first``: the first block of a network (the simplified blocks' trainable W^V and, with
    ``residual="skipless"`` and ``norm="none"``, input LayerNorm ``norms["input_norm"]``).
    ``residual="skipless"`` keeps its trainable gains g_A, g_M (and s_M when sequential)
    in ``gains`` (docs/theory.md#simplified).
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        bias: bool | None = None,
        fused: bool = True,
        first: bool = False,
    ) -> None:
        super().__init__()
        check_bool("first", first)
        self.config, self.fused, self.first = config, fused, first
        self.attention = (
            Attention(config, bias=bias, fused=fused, first=first)
            if config.attention != "none"
            else None
        )
        self.mlp = MLP(config, bias=bias) if config.mlp != "none" else None
        self.norms = nn.ModuleDict()
        parallel = config.layout == "parallel"
        if config.norm != "none":
            if self.attention is not None:
                self.norms["attn_norm"] = norm_module(config)
            if self.mlp is not None and not parallel:
                self.norms["mlp_norm"] = norm_module(config)
        self._new_gains()
        if config.residual == "skipless":
            if first and config.norm == "none":
                self.norms["input_norm"] = layer_norm_module(config.width)
            self._add_gain("attn_gain", 1.0)
            if self.mlp is not None:
                self._add_gain("mlp_gain", config.mlp_gain)
                if not parallel:
                    self._add_gain("mlp_skip", 1.0)
        if config.residual_gains != "fixed":  # multipliers of each sub-block's lambda, gamma
            for name, sub in (("attn", self.attention), ("mlp", self.mlp)):
                if sub is not None:
                    self._add_gain(f"res_{name}_lambda", 1.0, log=config.log_gains)
                    self._add_gain(f"res_{name}_gamma", 1.0, log=config.log_gains)
        self._layers: dict[str, nn.Module] = {}
        for part in (self.attention, self.mlp):
            if part is not None:
                self._layers.update(part.layers.items())

    def _linear(self, x: Tensor, out_features: int, name: str) -> Tensor:
        return self._layers[name](x)

    def _norm(self, x: Tensor, name: str) -> Tensor:
        return self.norms[name](x)

    def _gain(self, name: str) -> Tensor:
        for part in (self, self.attention, self.mlp):
            if part is not None and name in part.gains:
                return part.gain(name)
        raise KeyError(f"block has no trainable gain {name!r}")

    def forward(self, X: Tensor) -> Tensor:
        """X: (B, m, n) -> (B, m, n)."""
        return block(
            X,
            self.config,
            self._linear,
            fused=self.fused,
            norm=self._norm,
            gain=self._gain,
            first=self.first,
        )


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
            [Block(config, bias=bias, fused=fused, first=i == 0) for i in range(config.depth)]
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
