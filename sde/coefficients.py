"""Drift and diffusion of the neural covariance SDE (docs/theory.md#sde and #causal-sde).

``dV = b(V) dt + Sigma(V)^{1/2} dB`` with ``E[dV^{ab} dV^{cd}] = Sigma^{ab,cd} dt``. Every
supported configuration has

- diffusion ``k_lin Sigma_lin(V) + k_att [V^{ac} W^{bd} + V^{ad} W^{bc} + V^{bc} W^{ad}
  + V^{bd} W^{ac}]`` with ``W = V P V P V``;
- drift ``b_att(V)`` (shaped attention, scaled by ``gamma^2 / tau0^2``) plus
  ``gamma^2 beta (J(V) - V)`` (shaped ReLU MLP), where ``beta = (c_+ - c_-)^2 / 4`` and
  ``J^{ab} = E|x_a||x_b|`` for ``x ~ N(0, V)`` (the arc-cosine kernel); this equals docs/theory.md's
  ``gamma^2 nu(rho^{ab}) sqrt(V^{aa} V^{bb})``.

The MLP's hidden width ``r n`` (``ModelConfig.mlp_ratio``) enters through ``k_lin`` only: its
share is :func:`mlp_k_lin`, ``2 lambda^2 gamma^2 + gamma^4 (1 + 1/r)``; the drift does not
depend on r (docs/theory.md#sde-mlp-ratio).

The constants (:func:`sde_constants`) follow docs/theory.md's variants table and its general rule;
the cases the table does not list (several heads without ``W^O``, a value size ``n_h d_p != n``
with ``W^O``) were derived with that rule and verified by one-step Monte Carlo on the
project's finite network (``tests/test_sde_onestep.py``).

Causal shaped attention (``config.causal``, docs/theory.md#causal-sde) replaces the centring ``P /
m`` by the row-wise ``P_a / a`` (centring on the first a tokens): see :func:`causal_centerings`,
:func:`causal_attention_drift` and :func:`causal_attention_sigma`. The ``Sigma_lin``
coefficient is unchanged; ``k_att`` is then the factor ``gamma^4 / (tau0^2 n_h)`` in front of
the causal bracket (which carries the ``1 / (a c)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from shapedtx._validation import ParameterError, check_int
from shapedtx.config import ModelConfig, check_config


@dataclass(frozen=True)
class SDEConstants:
    """Scalar coefficients of the SDE of one configuration.

    Attributes:
        k_lin: coefficient of ``Sigma_lin`` in the diffusion (the MLP's share depends on
            ``mlp_ratio``: :func:`mlp_k_lin`).
        k_att: factor of the attention (``V (x) W``) diffusion term, 0 without attention:
            ``gamma^4 / (tau0^2 m^2 n_h)``, or with ``causal`` ``gamma^4 / (tau0^2 n_h)`` (the
            causal bracket of docs/theory.md#causal-sde carries the ``1 / (a c)``).
        a_att: factor ``gamma^2 / tau0^2`` of the attention drift, 0 without attention.
        k_mlp: factor ``gamma^2 (c_+ - c_-)^2 / 4`` of the MLP drift ``J(V) - V``, 0 without MLP.
        heads: n_h (enters through ``k_att`` only).
        causal: causal shaped attention (docs/theory.md#causal-sde); False without attention.
    """

    k_lin: float
    k_att: float
    a_att: float
    k_mlp: float
    heads: int
    causal: bool = False


_THEORY_FIELDS = {"residual": "scaled", "init": "fan_in"}


def _unsupported(config: ModelConfig) -> list[tuple[str, str]]:
    """``(field, why)`` for every field of ``config`` that the derived covariance SDEs
    do not cover (docs/theory.md#sde), in the order of the fields; empty if it has one."""
    problems: list[tuple[str, str]] = []
    if config.attention == "simplified":
        problems.append((
            "attention",
            "attention='simplified' has no derived covariance SDE (He & Hofmann's attention: "
            "trainable gains, no attention skip, docs/theory.md#simplified); use "
            "attention='shaped'",
        ))  # fmt: skip
    if config.attention == "softmax":
        problems.append((
            "attention",
            "attention='softmax' has no covariance SDE limit: standard attention has O(1) "
            "logits, so A is not a perturbation of the identity and tokens collapse in O(1) "
            "layers (docs/theory.md#rank-collapse); use attention='shaped'",
        ))  # fmt: skip
    if config.mlp == "gelu":
        problems.append((
            "mlp",
            "mlp='gelu' has no derived covariance SDE (a GELU is not a shaped activation: it "
            "changes the correlation by O(1) per block); use mlp='shaped_relu'",
        ))  # fmt: skip
    if config.mlp == "relu":
        problems.append((
            "mlp",
            "mlp='relu' has no covariance SDE limit: a standard ReLU changes the correlation by "
            "O(1) per block, so the covariance does not move on the time scale t = layer / "
            "width and collapses (docs/theory.md#layers and #sde); use mlp='shaped_relu'",
        ))  # fmt: skip
    if config.norm != "none":
        problems.append((
            "norm",
            f"norm={config.norm!r} has no derived covariance SDE: docs/theory.md#sde covers "
            "un-normalised shaped blocks only (pre-LN rescales every token at every block); "
            "use norm='none'",
        ))  # fmt: skip
    for name, value in _THEORY_FIELDS.items():
        if getattr(config, name) != value:
            problems.append((
                name,
                f"{name}={getattr(config, name)!r} has no derived covariance SDE "
                f"(docs/theory.md#sde covers {name}={value!r} only); use {name}={value!r}",
            ))  # fmt: skip
    return problems


def sde_constants(config: ModelConfig, m: int | None = None) -> SDEConstants:
    """The :class:`SDEConstants` of ``config`` for ``m`` tokens (``k_att`` needs m).

    Raises ParameterError (a ValueError) for configurations without a (non-degenerate)
    covariance SDE limit, naming every unsupported field at once (e.g. the ``post_ln``
    preset's attention, MLP, norm and residual), each with its reason and the value the SDE
    covers; its ``parameter`` is the field when there is one, else ``"config"``.
    """
    check_config(config)
    if m is not None:
        check_int("m (number of tokens)", m, 2)
    problems = _unsupported(config)
    if len(problems) == 1:
        raise ParameterError(*problems[0])
    if problems:
        fields = ", ".join(f"{field}={getattr(config, field)!r}" for field, _ in problems)
        raise ParameterError(
            "config",
            f"{len(problems)} fields have no derived covariance SDE ({fields}): "
            + "; ".join(f"({k}) {why}" for k, (_, why) in enumerate(problems, 1)),
        )
    g2 = config.gamma**2
    lam2 = 1.0 - g2
    k_lin = k_att = a_att = k_mlp = 0.0
    if config.attention == "shaped":
        # Skip x branch cross term 2 lam^2 gamma^2; W^V fluctuates with weight n / (n_h d_p)
        # (its Gram has n_h d_p columns), W^O (when present) with weight 1.
        value_weight = config.width / config.value_dim
        k_lin += 2 * lam2 * g2 + g2**2 * (value_weight + (1.0 if config.out_proj else 0.0))
        if config.causal:
            k_att = g2**2 / (config.tau0**2 * config.heads)
        elif m is not None:
            k_att = g2**2 / (config.tau0**2 * m**2 * config.heads)
        a_att = g2 / config.tau0**2
    if config.mlp == "shaped_relu":
        k_lin += mlp_k_lin(config.gamma, config.mlp_ratio)
        k_mlp = g2 * (config.c_plus - config.c_minus) ** 2 / 4
    causal = config.causal and config.attention == "shaped"
    return SDEConstants(
        k_lin=k_lin, k_att=k_att, a_att=a_att, k_mlp=k_mlp, heads=config.heads, causal=causal
    )


def mlp_k_lin(gamma: float, mlp_ratio: int) -> float:
    """``Sigma_lin`` coefficient of the shaped ReLU MLP sub-block of hidden width ``r n``
    (docs/theory.md#sde-mlp-ratio): ``2 lambda^2 gamma^2 + gamma^4 (1 + 1/r)``
    ``= 2 gamma^2 - gamma^4 (1 - 1/r)``.

    Skip x branch cross term ``2 lambda^2 gamma^2``; the output matrix ``W^post`` (n columns)
    ``gamma^4``; the average over the ``r n`` hidden units ``gamma^4 / r``. ``r = 1`` gives
    ``2 gamma^2``.
    """
    g2 = gamma**2
    return 2 * (1.0 - g2) * g2 + g2**2 * (1.0 + 1.0 / mlp_ratio)


def _check_V(V: Tensor) -> int:
    if V.dim() < 2 or V.shape[-1] != V.shape[-2] or V.shape[-1] < 2:
        raise ValueError(f"V must have shape (..., m, m) with m >= 2, got {tuple(V.shape)}")
    return V.shape[-1]


def centering(m: int, *, dtype: torch.dtype, device: torch.device | None) -> Tensor:
    """``P = I - 11^T / m``: (m, m)."""
    eye = torch.eye(m, dtype=dtype, device=device)
    return eye - 1.0 / m


def attention_auxiliaries(V: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(Vbar, Q, u, v)`` of docs/theory.md#sde: ``P V P`` (..., m, m), ``tr(P V P V)`` (...),
    ``u_a = Vbar^{aa} - tr(Vbar) / m`` and ``v = diag(V)`` (..., m)."""
    m = V.shape[-1]
    P = centering(m, dtype=V.dtype, device=V.device)
    Vbar = P @ V @ P
    Q = (Vbar * V).sum(dim=(-2, -1))
    dbar = torch.diagonal(Vbar, dim1=-2, dim2=-1)
    u = dbar - dbar.mean(-1, keepdim=True)
    v = torch.diagonal(V, dim1=-2, dim2=-1)
    return Vbar, Q, u, v


def attention_drift_factor(
    V: Tensor, a_att: float, aux: tuple[Tensor, Tensor, Tensor, Tensor] | None = None
) -> Tensor:
    """H with ``H V + V H^T = b_att(V)``: ``a_att [Q / (2 m^2) I + v u^T / (2m)]``; (..., m, m).

    ``aux``: :func:`attention_auxiliaries` of V, if the caller already has them.
    """
    m = V.shape[-1]
    _, Q, u, v = attention_auxiliaries(V) if aux is None else aux
    eye = torch.eye(m, dtype=V.dtype, device=V.device)
    return a_att * (
        Q[..., None, None] / (2 * m**2) * eye + v[..., :, None] * u[..., None, :] / (2 * m)
    )


def causal_centerings(m: int, *, dtype: torch.dtype, device: torch.device | None) -> Tensor:
    """The stack of ``P_a / a`` (docs/theory.md#causal-sde), a = 1..m: (m, m, m), entry ``[a - 1]``.

    ``(P_a)^{ij} = delta^{ij} - 1/a`` for i, j <= a and 0 elsewhere (centring on the first a
    tokens; ``P_1 = 0``, ``P_m = P``).
    """
    sizes = torch.arange(1, m + 1, dtype=dtype, device=device)
    idx = torch.arange(m, device=device)
    inside = (idx[None, :] < idx[:, None] + 1).to(dtype)  # (a, i): i <= a (1-based)
    eye = torch.eye(m, dtype=dtype, device=device)
    P = (eye - 1.0 / sizes[:, None, None]) * inside[:, :, None] * inside[:, None, :]
    return P / sizes[:, None, None]


def causal_attention_auxiliaries(V: Tensor) -> tuple[Tensor, Tensor]:
    """``(M, U)`` of docs/theory.md#causal-sde: ``M^{ac} = tr(P_a V P_c V) / (a c)`` (..., m, m) and
    ``U^{ai} = u^(a)_i = (P_a V P_a)^{ii} - tr(P_a V P_a) / a`` for i <= a, else 0 (..., m, m)."""
    m = V.shape[-1]
    Ps = causal_centerings(m, dtype=V.dtype, device=V.device)
    Z = Ps @ V[..., None, :, :]  # (..., a, m, m): P_a V / a
    M = torch.einsum("...aij,...cji->...ac", Z, Z)
    sizes = torch.arange(1, m + 1, dtype=V.dtype, device=V.device)
    d = torch.diagonal(Z @ Ps, dim1=-2, dim2=-1) * sizes[:, None] ** 2  # diag(P_a V P_a)
    inside = (Ps.diagonal(dim1=-2, dim2=-1) != 0).to(V.dtype)  # i <= a (and a >= 2)
    U = (d - d.sum(-1, keepdim=True) / sizes[:, None]) * inside
    return M, U


def causal_attention_drift_factor(V: Tensor, a_att: float, U: Tensor) -> Tensor:
    """H with ``H V + V H^T`` the non-Hadamard part of the causal drift (docs/theory.md#causal-sde):
    row a of H is ``a_att V^{aa} u^(a) / (2a)``; V, U: (..., m, m) -> (..., m, m)."""
    m = V.shape[-1]
    sizes = torch.arange(1, m + 1, dtype=V.dtype, device=V.device)
    v = torch.diagonal(V, dim1=-2, dim2=-1)
    return a_att * (v / (2 * sizes))[..., :, None] * U


def causal_attention_drift(V: Tensor, a_att: float) -> Tensor:
    """Causal attention drift (docs/theory.md#causal-sde); V: (..., m, m) -> (..., m, m):
    ``b^{ac} = a_att [M^{ac} V^{ac} + (V^{aa}/(2a)) (V u^(a))^c + (V^{cc}/(2c)) (V u^(c))^a]``."""
    M, U = causal_attention_auxiliaries(V)
    HV = causal_attention_drift_factor(V, a_att, U) @ V
    return a_att * M * V + HV + HV.transpose(-1, -2)


def arccos_kernel(V: Tensor) -> Tensor:
    """``J^{ab} = E|x_a||x_b|`` for ``x ~ N(0, V)``:
    ``sqrt(V^{aa} V^{bb}) (2/pi) (sqrt(1 - rho^2) + rho arcsin rho)``; (..., m, m), PSD."""
    d = torch.diagonal(V, dim1=-2, dim2=-1).clamp(min=0).sqrt()
    norms = d[..., :, None] * d[..., None, :]
    tiny = torch.finfo(V.dtype).tiny
    rho = (V / norms.clamp(min=tiny)).clamp(-1.0, 1.0)
    value = (2 / math.pi) * ((1 - rho**2).clamp(min=0).sqrt() + rho * torch.asin(rho))
    return norms * value


def nu(rho: Tensor, c_plus: float, c_minus: float) -> Tensor:
    """``nu(rho) = ((c_+ - c_-)^2 / (2 pi)) (sqrt(1 - rho^2) - rho arccos rho)``; nu(1) = 0."""
    rho = rho.clamp(-1.0, 1.0)
    return ((c_plus - c_minus) ** 2 / (2 * math.pi)) * (
        (1 - rho**2).clamp(min=0).sqrt() - rho * torch.acos(rho)
    )


def drift(config: ModelConfig, V: Tensor) -> Tensor:
    """Drift ``b(V)``; V: (..., m, m) -> (..., m, m) (docs/theory.md#sde and #causal-sde).

    Shaped attention: ``(gamma^2 / tau0^2) [(Q / m^2) V + (v (Vu)^T + (Vu) v^T) / (2m)]``, or
    with ``config.causal`` :func:`causal_attention_drift` (docs/theory.md#causal-sde); shaped ReLU
    MLP: ``gamma^2 nu(rho^{ab}) sqrt(V^{aa} V^{bb})``; a block adds both.
    """
    return _drift(config, sde_constants(config, _check_V(V)), V)


def _drift(config: ModelConfig, const: SDEConstants, V: Tensor) -> Tensor:
    """:func:`drift` with the constants of ``config`` for V's tokens given (not checked: the
    steppers compute them once, not at every step)."""
    out = torch.zeros_like(V)
    if const.a_att and const.causal:
        out = out + causal_attention_drift(V, const.a_att)
    elif const.a_att:
        H = attention_drift_factor(V, const.a_att)
        HV = H @ V
        out = out + HV + HV.transpose(-1, -2)
    if const.k_mlp:
        d = torch.diagonal(V, dim1=-2, dim2=-1).clamp(min=0).sqrt()
        norms = d[..., :, None] * d[..., None, :]
        rho = V / norms.clamp(min=torch.finfo(V.dtype).tiny)
        out = out + config.gamma**2 * nu(rho, config.c_plus, config.c_minus) * norms
    return out


def sigma_lin(V: Tensor) -> Tensor:
    """``Sigma_lin^{ab,cd} = V^{ac} V^{bd} + V^{ad} V^{bc}``; (..., m, m) -> (..., m, m, m, m)."""
    ac_bd = V[..., :, None, :, None] * V[..., None, :, None, :]
    ad_bc = V[..., :, None, None, :] * V[..., None, :, :, None]
    return ac_bd + ad_bc


def attention_sigma(V: Tensor) -> Tensor:
    """``V^{ac} W^{bd} + V^{ad} W^{bc} + V^{bc} W^{ad} + V^{bd} W^{ac}``, ``W = V P V P V``;
    (..., m, m) -> (..., m, m, m, m)."""
    P = centering(V.shape[-1], dtype=V.dtype, device=V.device)
    W = V @ P @ V @ P @ V
    return (
        V[..., :, None, :, None] * W[..., None, :, None, :]
        + V[..., :, None, None, :] * W[..., None, :, :, None]
        + V[..., None, :, :, None] * W[..., :, None, None, :]
        + V[..., None, :, None, :] * W[..., :, None, :, None]
    )


def causal_attention_sigma(V: Tensor) -> Tensor:
    """Causal attention diffusion bracket (docs/theory.md#causal-sde); (..., m, m) -> (..., m, m, m,
    m): ``V^{ac} W(a,c)^{bd}/(ac) + V^{ad} W(a,d)^{bc}/(ad) + V^{bc} W(b,c)^{ad}/(bc)
    + V^{bd} W(b,d)^{ac}/(bd)`` with ``W(a,c) = V P_a V P_c V``."""
    Ps = causal_centerings(V.shape[-1], dtype=V.dtype, device=V.device)
    left = V[..., None, :, :] @ Ps @ V[..., None, :, :]  # (..., a, m, m): V P_a V / a
    right = Ps @ V[..., None, :, :]  # (..., c, m, m): P_c V / c
    Wt = torch.einsum("...aik,...ckj->...acij", left, right)  # W(a, c) / (a c)
    return (
        torch.einsum("...ac,...acbd->...abcd", V, Wt)
        + torch.einsum("...ad,...adbc->...abcd", V, Wt)
        + torch.einsum("...bc,...bcad->...abcd", V, Wt)
        + torch.einsum("...bd,...bdac->...abcd", V, Wt)
    )


def diffusion(config: ModelConfig, V: Tensor) -> Tensor:
    """Increment covariance ``Sigma^{ab,cd}(V)``; V: (..., m, m) -> (..., m, m, m, m).

    ``k_lin Sigma_lin + k_att [V (x) W terms]`` with the constants of :func:`sde_constants`;
    with ``config.causal`` the bracket is :func:`causal_attention_sigma`
    (docs/theory.md#causal-sde).
    """
    m = _check_V(V)
    const = sde_constants(config, m)
    out = const.k_lin * sigma_lin(V)
    if const.k_att:
        bracket = causal_attention_sigma(V) if const.causal else attention_sigma(V)
        out = out + const.k_att * bracket
    return out
