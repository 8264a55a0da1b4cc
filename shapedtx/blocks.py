"""Residual sub-blocks as pure functions of the input and a *linear map* (docs/theory.md#layers).

Every weight matrix enters through ``linear(x, out_features, name)``, which must return
``x W`` for a matrix ``W`` with iid N(0, s^2) entries, ``s = weight_std(config, name,
fan_in)`` (``1/sqrt(fan_in)`` for the theory's ``init="fan_in"``; one fresh matrix per
``name``), and every LayerNorm through ``norm(x, name)``. The ``torch.nn`` modules pass their
``nn.Linear`` and ``nn.LayerNorm`` layers; the simulators pass samplers that draw ``x W``
directly (docs/theory.md#samplers) and the weightless :func:`shapedtx.layer_norm` (the affine
LayerNorm is the identity at initialisation). So the simulated network *is* the trained
network at initialisation.

Names used: ``"query"``, ``"key"``, ``"value"``, ``"out"`` (attention), ``"mlp_in"``,
``"mlp_out"`` (MLP), and the norms ``"attn_norm"``, ``"mlp_norm"`` (``"input_norm"``: the first
skipless block's LayerNorm without ``norm``).

The simplified (He & Hofmann) blocks also have trainable scalar gains, read through
``gain(name)`` (:data:`Gain`); ``gain=None`` is the network at initialisation, where their
attention sub-layer is the identity map (docs/theory.md#simplified).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor

from ._matmul import small_matmul
from ._validation import ParameterError
from .activation import relu_slopes, shaped_relu, trainable_relu
from .attention import (
    _per_head,
    gained_attention_matrix,
    merge_heads,
    shaped_attention_heads,
    shaped_attention_heads_with_gains,
    shaped_attention_matrix,
    simplified_attention,
    simplified_attention_matrix,
    softmax_attention,
    softmax_attention_matrix,
    split_heads,
)
from .config import ModelConfig, weight_std
from .norm import layer_norm, rms_norm


class Linear(Protocol):
    """``linear(x, out_features, name)``: x: (..., m, fan_in) -> (..., m, out_features)."""

    def __call__(self, x: Tensor, out_features: int, name: str) -> Tensor: ...


Norm = Callable[[Tensor, str], Tensor]
"""``norm(x, name)``: a LayerNorm over the last dimension, x: (..., m, n) -> (..., m, n)."""


Gain = Callable[[str], "Tensor | float"]
"""``gain(name)``: a trainable gain: of the simplified blocks (docs/theory.md#simplified) the
per-head (h,) ``"attn_alpha"``, ``"attn_beta"``, ``"attn_gamma"`` of the attention matrix and
the scalars ``"attn_gain"`` (g_A), ``"mlp_gain"`` (g_M), ``"mlp_skip"`` (s_M); of the shaped
blocks with a trainable shape (docs/theory.md#trainable-shape) the same per-head attention
gains, the per-head inverse temperature ``"attn_temperature"`` and the shaped-ReLU slopes
``"mlp_s_plus"``, ``"mlp_s_minus"`` (scalars or (mlp_width,))."""


def initial_gain(config: ModelConfig) -> Gain:
    """The :data:`Gain` at initialisation: every gain 1, ``"mlp_gain"`` ``config.mlp_gain``."""

    def gain(name: str) -> float:
        return config.mlp_gain if name == "mlp_gain" else 1.0

    return gain


def weightless_norm(x: Tensor, name: str) -> Tensor:
    """The ``Norm`` of the simulators: :func:`shapedtx.layer_norm` (no affine parameters)."""
    del name
    return layer_norm(x)


def weightless_rms_norm(x: Tensor, name: str) -> Tensor:
    """The simulators' ``Norm`` of ``norm_kind="rms"``: :func:`shapedtx.norm.rms_norm`, except
    the skipless first block's ``"input_norm"``, a LayerNorm (no affine parameters)."""
    return layer_norm(x) if name == "input_norm" else rms_norm(x)


def default_norm(config: ModelConfig) -> Norm:
    """The weightless ``Norm`` of ``config.norm_kind`` (the affine norms at initialisation)."""
    return weightless_rms_norm if config.norm_kind == "rms" else weightless_norm


def attention_matrix(q: Tensor, k: Tensor, config: ModelConfig) -> Tensor:
    """The attention matrix A of every head; q, k: (..., h, m, n_k) -> (..., h, m, m)."""
    return attention_from_logits(small_matmul(q, k.transpose(-1, -2)), config, overwrite=True)


def attention_from_logits(Y: Tensor, config: ModelConfig, *, overwrite: bool = False) -> Tensor:
    """The configured attention matrix of the logits ``Y = q k^T: (..., m, m)`` (shaped or
    softmax, causal or not); ``overwrite=True`` lets Y be used as scratch memory (ignored
    when autograd needs Y)."""
    if config.attention == "shaped":
        return shaped_attention_matrix(Y, config.tau, causal=config.causal, overwrite=overwrite)
    if config.attention == "softmax":
        return softmax_attention_matrix(
            Y,
            config.key_dim,
            causal=config.causal,
            overwrite=overwrite,
            scale=config.softmax_scale,
        )
    if config.attention == "simplified":  # the gains at initialisation
        return simplified_attention_matrix(Y, config.key_dim, 1.0, 1.0, 1.0, causal=config.causal)
    raise ParameterError(
        "attention",
        f"attention must be 'shaped', 'softmax' or 'simplified', got {config.attention!r}",
    )


def simplified_attention_branch(
    X: Tensor,
    config: ModelConfig,
    linear: Linear,
    gain: Gain | None = None,
    *,
    fused: bool = True,
    first: bool = False,
) -> Tensor:
    """He & Hofmann's attention branch ``A X`` (identity value and output maps; in the
    ``first`` block ``A X W^V`` with a trainable W^V, the identity at initialisation),
    ``A = alpha I + beta Softmax(q k^T / sqrt(n_k)) - gamma C`` per head
    (docs/theory.md#simplified); X: (..., m, n) -> (..., m, n).

    ``gain=None``: at initialisation. There W^Q = 0, so the softmax is the uniform (causal)
    average C, cancelled by ``gamma C`` with beta = gamma = 1, and alpha = 1: A = I and the
    branch is X itself (``linear`` is not called). ``fused`` as in :func:`attention_branch`.
    """
    if gain is None:
        return X
    h, n_k = config.heads, config.key_dim
    q = split_heads(linear(X, h * n_k, "query"), h)
    k = split_heads(linear(X, h * n_k, "key"), h)
    v = split_heads(linear(X, config.width, "value") if first else X, h)
    alpha, beta, gamma = gain("attn_alpha"), gain("attn_beta"), gain("attn_gamma")
    if fused:
        out = simplified_attention(q, k, v, alpha, beta, gamma, causal=config.causal, key_dim=n_k)
    else:
        Y = small_matmul(q, k.transpose(-1, -2))
        A = simplified_attention_matrix(Y, n_k, alpha, beta, gamma, causal=config.causal)
        out = small_matmul(A, v)
    return merge_heads(out)


def attention_branch(
    X: Tensor,
    config: ModelConfig,
    linear: Linear,
    *,
    fused: bool = True,
    gain: Gain | None = None,
    first: bool = False,
) -> Tensor:
    """Attention branch ``A X W^V / sqrt(n)`` (then ``W^O / sqrt(n_h d_p)`` if ``out_proj``);
    softmax logits scaled by ``config.softmax_scale`` (``1 / sqrt(n_k)`` or muP's ``1 / n_k``).

    X: (..., m, n) -> (..., m, n). ``fused`` uses SDPA and a token mean instead of the explicit
    m x m matrix; both are the same function (tested). ``attention="simplified"``:
    :func:`simplified_attention_branch` with ``gain`` and ``first``.
    """
    if config.attention == "simplified":
        return simplified_attention_branch(X, config, linear, gain, fused=fused, first=first)
    h, n_k = config.heads, config.key_dim
    q = split_heads(linear(X, h * n_k, "query"), h)
    k = split_heads(linear(X, h * n_k, "key"), h)
    values = linear(X, config.value_dim, "value")
    v = split_heads(values, h)
    if gain is not None and trainable_attention(config):
        out = _trainable_shaped_attention(q, k, values, config, gain, fused=fused)
    elif not fused:
        out = merge_heads(small_matmul(attention_matrix(q, k, config), v))
    elif config.attention == "shaped":
        out = shaped_attention_heads(q, k, values, config.tau, causal=config.causal)
    elif config.attention == "softmax":
        scale = config.softmax_scale
        out = merge_heads(softmax_attention(q, k, v, causal=config.causal, scale=scale))
    else:
        raise ParameterError(
            "attention", f"attention must be 'shaped' or 'softmax', got {config.attention!r}"
        )
    return linear(out, config.width, "out") if config.out_proj else out


def trainable_attention(config: ModelConfig) -> bool:
    """Whether shaped attention has trainable gains or temperature (then it reads them
    through :data:`Gain`; docs/theory.md#trainable-shape)."""
    return config.attention == "shaped" and (
        config.attention_gains != "fixed" or config.temperature != "fixed"
    )


def _trainable_shaped_attention(
    q: Tensor, k: Tensor, values: Tensor, config: ModelConfig, gain: Gain, *, fused: bool
) -> Tensor:
    """Shaped attention ``alpha I + beta Softmax(t Y / tau) - gamma C`` of every head, the
    gains and inverse temperature t read through ``gain`` where trainable (else 1);
    q, k: (..., h, m, n_k), values: (..., m, h d) -> (..., m, h d)."""
    ones = q.new_ones(config.heads)
    if config.temperature != "fixed":
        q = q * _per_head(gain("attn_temperature"))
    alpha, beta, gamma = (
        gain(name) if config.attention_gains != "fixed" else ones
        for name in ("attn_alpha", "attn_beta", "attn_gamma")
    )
    if fused:
        return shaped_attention_heads_with_gains(
            q,
            k,
            values,
            config.tau,
            alpha,
            beta,
            gamma,
            causal=config.causal,
        )
    Y = small_matmul(q, k.transpose(-1, -2))
    A = gained_attention_matrix(Y, 1.0 / config.tau, alpha, beta, gamma, causal=config.causal)
    return merge_heads(small_matmul(A, split_heads(values, config.heads)))


def mlp_branch(X: Tensor, config: ModelConfig, linear: Linear, gain: Gain | None = None) -> Tensor:
    """MLP branch ``g phi(X W_1) W_2`` with hidden width ``mlp_ratio * n``.

    X: (..., m, n) -> (..., m, n). ``phi`` is the shaped or standard ReLU (gain
    ``g = sqrt(c)``, docs/theory.md#layers, under ``init="fan_in"``; ``g = 1`` under ``"gpt2"``
    and ``"mup"``) or
    the exact erf GELU (``g = 1``). With trainable slopes (``config.mlp_slopes``) and a
    ``gain``, phi's slopes are ``gain("mlp_s_plus")``, ``gain("mlp_s_minus")`` and ``g`` keeps
    its value at initialisation (docs/theory.md#trainable-shape); ``gain=None``: the network
    at initialisation.
    """
    hidden = linear(X, config.mlp_width, "mlp_in")
    if config.mlp == "gelu":
        return linear(torch.nn.functional.gelu(hidden), config.width, "mlp_out")
    s_plus, s_minus, c = relu_slopes(config)
    if gain is not None and config.mlp_slopes != "fixed":
        act = trainable_relu(hidden, gain("mlp_s_plus"), gain("mlp_s_minus"))
    else:
        act = shaped_relu(hidden, s_plus, s_minus)
    out = linear(act, config.width, "mlp_out")
    return math.sqrt(c) * out if config.init == "fan_in" else out


def residual(
    X: Tensor, branch: Tensor, config: ModelConfig, gain: Gain | None = None, part: str = "attn"
) -> Tensor:
    """``lambda X + gamma branch`` (``residual="scaled"``) or ``X + m branch`` (``"unit"``,
    ``m = (depth / base_depth)^(-depth_alpha)``, 1 by default; docs/theory.md#transfer).

    With trainable residual weights (``config.residual_gains``) and a ``gain``, lambda and
    gamma are multiplied by ``gain(f"res_{part}_lambda")`` and ``gain(f"res_{part}_gamma")``,
    ``part`` ``"attn"`` or ``"mlp"`` (docs/theory.md#trainable-shape); ``gain=None``: at
    initialisation."""
    if config.residual == "unit":
        m = config.depth_multiplier
        return X + branch if m == 1.0 else torch.add(X, branch, alpha=m)
    lam: Tensor | float = config.lam
    gamma: Tensor | float = config.gamma
    if gain is not None and config.residual_gains != "fixed":
        lam = lam * gain(f"res_{part}_lambda")
        gamma = gamma * gain(f"res_{part}_gamma")
    if isinstance(gamma, Tensor):  # one fused pass like torch.add's: bit for bit at equal weights
        return torch.addcmul(lam * X, gamma, branch)
    return torch.add(lam * X, branch, alpha=gamma)  # two passes, not three


def sub_block(
    X: Tensor,
    branch: Callable[[Tensor], Tensor],
    config: ModelConfig,
    norm: Norm,
    part: str,
    gain: Gain | None = None,
) -> Tensor:
    """One residual sub-block (``part`` ``"attn"`` or ``"mlp"``, its norm ``f"{part}_norm"``)
    with the configured normalisation; X: (..., m, n).

    ``norm="none"``: ``res(X, f(X))``; ``"pre"``: ``res(X, f(LN X))``; ``"post"``:
    ``LN(res(X, f(X)))``, where ``res`` is :func:`residual` (with ``gain``).
    """
    name = f"{part}_norm"
    if config.norm == "pre":
        return residual(X, branch(norm(X, name)), config, gain, part)
    out = residual(X, branch(X), config, gain, part)
    return norm(out, name) if config.norm == "post" else out


def skipless_block(
    X: Tensor,
    config: ModelConfig,
    linear: Linear,
    norm: Norm,
    gain: Gain | None = None,
    *,
    fused: bool = True,
    first: bool = False,
) -> Tensor:
    """He & Hofmann's block without attention skip (``residual="skipless"``,
    docs/theory.md#simplified); X: (..., m, n) -> (..., m, n).

    Sequential: ``H = g_A A(N X)``, then ``s_M H + g_M MLP(N H)``; parallel: ``g_A A(N X) +
    g_M MLP(N X)`` (one norm, ``"attn_norm"``), N the configured pre-norm or the identity.
    With ``norm="none"`` the ``first`` block reads ``LN(X)`` (``"input_norm"``). ``gain``:
    :data:`Gain` (None: :func:`initial_gain`, the attention branch at initialisation).
    """
    g = initial_gain(config) if gain is None else gain
    if first and config.norm == "none":
        X = norm(X, "input_norm")

    def pre(x: Tensor, name: str) -> Tensor:
        return norm(x, name) if config.norm == "pre" else x

    x = pre(X, "attn_norm")
    attended = attention_branch(x, config, linear, fused=fused, gain=gain, first=first)
    if config.layout == "parallel":
        out = g("attn_gain") * attended
        if config.mlp == "none":
            return out
        return out + g("mlp_gain") * mlp_branch(x, config, linear, gain)
    H = g("attn_gain") * attended
    if config.mlp == "none":
        return H
    mlp = mlp_branch(pre(H, "mlp_norm"), config, linear, gain)
    return g("mlp_skip") * H + g("mlp_gain") * mlp


def block(
    X: Tensor,
    config: ModelConfig,
    linear: Linear,
    *,
    fused: bool = True,
    norm: Norm | None = None,
    gain: Gain | None = None,
    first: bool = False,
) -> Tensor:
    """One residual block: attention sub-block then MLP sub-block (either may be ``"none"``).

    X: (..., m, n) -> (..., m, n); see :func:`sub_block` for the normalisation (``norm=None``:
    the weightless norm of ``config.norm_kind``, :func:`default_norm`) and
    :func:`skipless_block` for ``residual="skipless"``. ``gain`` and ``first`` (the first
    block of a network) matter only for ``attention="simplified"``.
    """
    norm = default_norm(config) if norm is None else norm
    if config.residual == "skipless":
        return skipless_block(X, config, linear, norm, gain, fused=fused, first=first)
    if config.attention != "none":

        def attend(x: Tensor) -> Tensor:
            return attention_branch(x, config, linear, fused=fused, gain=gain, first=first)

        X = sub_block(X, attend, config, norm, "attn", gain)
    if config.mlp != "none":
        X = sub_block(X, lambda x: mlp_branch(x, config, linear, gain), config, norm, "mlp", gain)
    return X


def gaussian_linear(
    generator: torch.Generator | None = None, config: ModelConfig | None = None
) -> Linear:
    """A ``Linear`` that draws a fresh Gaussian weight matrix at every call (reference sampler).

    Entries N(0, s^2) with ``s = weight_std(config, name, fan_in)`` (``1/sqrt(fan_in)`` when
    ``config`` is None). x: (..., m, fan_in): one independent matrix per leading index.
    """

    def linear(x: Tensor, out_features: int, name: str) -> Tensor:
        fan_in = x.shape[-1]
        shape = (*x.shape[:-2], fan_in, out_features)
        W = torch.randn(shape, generator=generator, dtype=x.dtype, device=x.device)
        return scale_standard(x @ W, config, name, fan_in)

    return linear


def scale_standard(y: Tensor, config: ModelConfig | None, name: str, fan_in: int) -> Tensor:
    """``y`` drawn with N(0, 1) weights, rescaled to the init of ``config`` (:func:`weight_std`;
    ``1/sqrt(fan_in)`` when ``config`` is None or ``init="fan_in"``)."""
    if config is None or config.init == "fan_in":
        return y / math.sqrt(fan_in)
    return y * weight_std(config, name, fan_in)
