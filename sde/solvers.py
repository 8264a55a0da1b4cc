"""Time stepping for the covariance SDE: one stepping loop, two explicit schemes.

- :class:`FactoredEulerStep` (the stepper of :class:`sde.FactoredEuler`, ``method="euler"``,
  the default): PSD-safe Euler scheme. The MLP drift is a convex combination
  ``V + w (J(V) - V)`` with ``J`` the (PSD) arc-cosine kernel, ``w = 1 - exp(-k_mlp dt)``;
  then ``V' = F F^T`` with ``F = (I + H dt + G) L (I + eps N1)``,
  ``L L^T = V``, ``eps = sqrt(k_lin dt / 2)``, ``G = sqrt(k_att dt) L N2 L^T P`` and ``H`` the
  attention drift factor (``H V + V H^T = b_att``) minus the Ito corrections
  ``(eps^2 m + k_att dt Q) / (2 dt) I``. Every step is PSD by construction; mean and covariance
  of an increment match ``b dt`` and ``Sigma dt`` up to O(dt^2), odd moments vanish: weak order 1.
  Causal attention (docs/theory.md#causal-sde): ``G = sqrt(k_att dt) R`` with the row-wise R of
  ``L N2 L^T``, ``H`` the causal factor (row a: ``a_att V^{aa} u^(a) / (2a)``), and the
  Hadamard part of the drift together with the Ito correction is the PSD matrix
  ``(a_att - k_att) dt (M o V)`` (``E[G V G^T] = k_att dt M o V``; ``a_att >= k_att`` since
  ``gamma^2 <= n_h``), added after the factored step: ``V' = F F^T + (a_att - k_att) dt M o V``,
  then re-factored (jittered Cholesky, no synchronisation). Still PSD by construction.
- :class:`EulerMaruyamaStep` (of :class:`sde.EulerMaruyama`, ``method="em"``): plain
  ``V + b dt + Sigma^{1/2} dB``, symmetrised; can leave the PSD cone (such paths are
  flagged), kept as a reference.

:func:`integrate` freezes and flags paths whose next state is non-finite, exceeds
``bound * max_a V0^{aa}`` in absolute value, or (EM only) is not PSD. All checks are masks on
the device: no host synchronisation inside the loop (on the CPU, where it costs nothing, one
check skips the freezing while every path is active).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from shapedtx._validation import check_int, check_positive
from shapedtx.config import ModelConfig
from shapedtx.covariance import check_covariance_batch

from .coefficients import (
    SDEConstants,
    _drift,
    arccos_kernel,
    attention_auxiliaries,
    attention_drift_factor,
    causal_attention_auxiliaries,
    causal_attention_drift_factor,
    centering,
    sde_constants,
)
from .noise import attention_noise_factor, noise_increment, psd_factor
from .time_grid import save_steps

NoiseSource = Callable[[int], Tensor]
"""``noise(step) -> (samples, 2, m, m)`` iid N(0, 1) (N1, N2) for step ``step``."""


State = Tensor | tuple[Tensor, ...]
"""A stepper's state: a (B, ...) tensor or a tuple of them (e.g. the factor and V)."""


class Stepper(Protocol):
    """What :func:`integrate` steps with (:class:`FactoredEulerStep`, :class:`EulerMaruyamaStep`
    or any object with the same two methods)."""

    def init(self, V0: Tensor, /) -> Any:
        """The state of ``V0: (B, m, m)`` (a :data:`State`)."""
        ...

    def step(self, state: Any, normals: Tensor, dt: float, /) -> tuple[Any, Tensor, Tensor | None]:
        """(new state, new V, per-path acceptance (B,) or None) from ``normals: (B, 2, m, m)``."""
        ...


PSD_TOLERANCE = 1e-8
"""EM flags a state whose smallest eigenvalue is below ``-PSD_TOLERANCE * max |eigenvalue|``."""


def _select(mask: Tensor, new: State, old: State) -> State:
    """``new`` where ``mask: (B,)`` is True, else ``old`` (tensors or tuples of them)."""
    if isinstance(new, tuple) and isinstance(old, tuple):
        return tuple(_select_tensor(mask, a, b) for a, b in zip(new, old, strict=True))
    assert isinstance(new, Tensor) and isinstance(old, Tensor)  # same structure
    return _select_tensor(mask, new, old)


def _select_tensor(mask: Tensor, new: Tensor, old: Tensor) -> Tensor:
    return torch.where(mask.view(-1, *(1,) * (new.dim() - 1)), new, old)


def _symmetrise(V: Tensor) -> Tensor:
    return (V + V.transpose(-1, -2)) / 2


def _jittered_cholesky(V: Tensor) -> Tensor:
    """A factor ``L L^T = V + delta I`` of a PSD ``V: (B, m, m)`` without host synchronisation.

    ``cholesky_ex`` (unlike ``eigh``) does not synchronise a GPU; the jitter ``delta = m eps
    tr(V) / m`` (eps: the dtype's machine epsilon) makes near-singular V (rank collapse) safe,
    a relative perturbation of about 1e-15 in float64. A path whose factorisation still fails
    gets a NaN factor, so it is flagged by :func:`integrate`, never returned silently.
    """
    m = V.shape[-1]
    eps = torch.finfo(V.dtype).eps
    delta = (
        m * eps * torch.diagonal(V, dim1=-2, dim2=-1).mean(-1).clamp(min=torch.finfo(V.dtype).tiny)
    )
    jittered = V.clone()
    jittered.diagonal(dim1=-2, dim2=-1).add_(delta[:, None])
    L, info = torch.linalg.cholesky_ex(jittered)
    return L.masked_fill((info != 0)[:, None, None], math.nan)


def _scalar(x: float | Tensor, fn: Callable[[Tensor], Tensor], mfn: Callable[[float], float]):
    """``fn(x)`` for a (B, 1, 1) tensor of per-path constants, ``mfn(x)`` for a float."""
    return fn(x) if isinstance(x, Tensor) else mfn(x)


def _causal_row_centring(Y: Tensor) -> Tensor:
    """The causal attention noise factor R of ``Y`` (row a: ``Y^{a,:} P_a / a``) in O(m^2):
    ``R^{aj} = (Y^{aj} - mean_{k <= a} Y^{ak}) / a`` for j <= a, else 0 (P_1 = 0: row 1 is 0).
    Y: (..., m, m) -> (..., m, m); equals :func:`sde.noise.attention_noise_factor` (causal)."""
    m = Y.shape[-1]
    sizes = torch.arange(1, m + 1, dtype=Y.dtype, device=Y.device)
    inside = torch.ones(m, m, dtype=torch.bool, device=Y.device).tril()
    means = (torch.cumsum(Y, -1).diagonal(dim1=-2, dim2=-1) / sizes)[..., :, None]
    R = torch.where(inside, (Y - means) / sizes[:, None], Y.new_zeros(()))
    return R


def _causal_auxiliaries_cumsum(V: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`sde.coefficients.causal_attention_auxiliaries` ``(M, U)`` in O(m^2) instead of
    O(m^4), from cumulative sums (docs/theory.md#causal-sde).

    ``tr(P_a V P_c V)`` is the squared Frobenius norm of the double-centred top-left a x c
    block B of V (V symmetric): ``|B|^2 - c |r|^2 - a |s|^2 + a c g^2`` with r, s, g its row,
    column and grand means; ``(P_a V P_a)^{ii} = V^{ii} - 2 r_i + g`` (the a x a block).
    V is shifted by its mean entry first (the centring removes constants) so that a nearly
    collapsed V (all entries close) loses no precision to cancellation.
    """
    m = V.shape[-1]
    sizes = torch.arange(1, m + 1, dtype=V.dtype, device=V.device)
    X = V - V.mean((-2, -1), keepdim=True)
    row = torch.cumsum(X, -1)  # row[i, c] = sum_{j <= c} X_ij
    S = torch.cumsum(row, -2)  # S[a, c] = sum_{i <= a, j <= c} X_ij
    S2 = torch.cumsum(torch.cumsum(X * X, -1), -2)
    E = torch.cumsum(row * row, -2)  # E[a, c] = sum_{i <= a} row[i, c]^2
    ac = sizes[:, None] * sizes[None, :]
    tr = S2 - E / sizes[None, :] - E.transpose(-1, -2) / sizes[:, None] + S * S / ac
    M = tr / ac
    # d[a, i] = (P_a X P_a)^{ii} for i <= a (equal to that of V: constants drop out)
    g = S.diagonal(dim1=-2, dim2=-1) / sizes**2  # (..., a)
    rows_a = row.transpose(-1, -2) / sizes[:, None]  # rows_a[a, i] = r_i of the a x a block
    d = X.diagonal(dim1=-2, dim2=-1)[..., None, :] - 2 * rows_a + g[..., :, None]
    inside = torch.ones(m, m, dtype=torch.bool, device=V.device).tril()
    d = torch.where(inside, d, d.new_zeros(()))
    U = torch.where(inside, d - (d.sum(-1) / sizes)[..., :, None], d.new_zeros(()))
    return M, U


class _Constants(NamedTuple):
    """The step's constants: floats, or (B, 1, 1) tensors of per-path values (advise's batch
    of configurations)."""

    k_lin: float | Tensor
    k_att: float | Tensor
    a_att: float | Tensor
    k_mlp: float | Tensor


def _arccos_blend(V: Tensor, w: float | Tensor) -> Tensor:
    """``V + w (J(V) - V)`` with J the arc-cosine kernel, the formula of
    :func:`sde.coefficients.arccos_kernel` in fewer, fused passes."""
    d = torch.diagonal(V, dim1=-2, dim2=-1).clamp(min=0).sqrt()
    norms = d[..., :, None] * d[..., None, :]
    rho = torch.div(V, norms.clamp(min=torch.finfo(V.dtype).tiny)).clamp_(-1.0, 1.0)
    one = torch.ones((), dtype=V.dtype, device=V.device)
    J = torch.addcmul(one, rho, rho, value=-1).clamp_(min=0).sqrt_()  # sqrt(1 - rho^2)
    J.addcmul_(rho, torch.asin(rho)).mul_(norms)
    if isinstance(w, Tensor):
        return J.mul_(w * (2 / math.pi)).add_(V * (1 - w))
    return J.mul_(w * (2 / math.pi)).add_(V, alpha=1 - w)


def _refactor(factor: Tensor, old: Tensor, term: float | Tensor) -> Tensor:
    """The new ``factor``, except on rows whose per-path constant ``term`` is 0: there the
    ``old`` one (a batch of configurations re-factors only the rows whose own configuration
    would, so each row is its configuration's path; one mask, no synchronisation)."""
    if isinstance(term, Tensor):
        return torch.where(term > 0, factor, old)
    return factor


def _symmetrise_(X: Tensor) -> Tensor:
    """``(X + X^T) / 2``, bitwise symmetric; X is consumed."""
    return torch.add(X, X.transpose(-1, -2)).mul_(0.5)


def _factored_euler_step(
    state: Tensor | tuple[Tensor, Tensor],
    normals: Tensor,
    dt: float,
    const: _Constants,
    *,
    attention: bool,
    mlp: bool,
    causal: bool,
    canonical: bool = False,
) -> tuple[tuple[Tensor, Tensor], Tensor]:
    """One factored Euler step (module docstring) with the fewest m x m products:
    ``((factor, V'), V')``.

    ``state``: ``(L, V)`` with ``L L^T = V`` (what the previous step returned: V is reused, not
    recomputed) or a bare factor L. Per path: 5 m x m products (``K = L (I + eps N1)``,
    ``L (s N2)``, ``(s L N2) L^T``, ``F = (alpha I + D) K``, ``F F^T``; 2 without attention)
    and, with an MLP drift or causal attention, one Cholesky factorisation; everything else is
    O(m^2) in a few fused passes (the centrings by means, the attention auxiliaries by
    cumulative sums, the drift factor). The first implementation
    (:class:`_ReferenceFactoredEulerStep`) needs 9 products non-causal, and O(m^4) work
    causal. Same formula, so the same law and, for the same normals, the same V' up to
    rounding.

    ``alpha = 1 - eps^2 m / 2`` (plus, non-causal, the ``Q`` terms of the drift factor and of
    the Ito correction) and D the rest of the left factor: non-causal
    ``a_att dt v u^T / (2m) + sqrt(k_att dt) Yh P``, causal ``dt H + sqrt(k_att dt) R``
    (``Yh = L N2 L^T``).
    """
    if isinstance(state, tuple):
        L, V = state
    else:
        L = state
        V = L @ L.transpose(-1, -2)
    m = V.shape[-1]
    if mlp:
        w = _scalar(const.k_mlp * dt, lambda x: -torch.expm1(-x), lambda x: -math.expm1(-x))
        V = _arccos_blend(V, w)
    if canonical:
        L = psd_factor(V)[0]
    elif mlp:
        L = _refactor(_jittered_cholesky(V), L, const.k_mlp)
    eps = _scalar(const.k_lin * dt / 2, torch.sqrt, math.sqrt)
    alpha = 1 - eps * eps * m / 2
    N1 = normals[:, 0] * eps
    N1.diagonal(dim1=-2, dim2=-1).add_(1.0)
    K = L @ N1  # L (I + eps N1)
    if not attention:
        F = K.mul_(alpha)
        new = _symmetrise_(F @ F.transpose(-1, -2))
        return (F, new), new
    s = _scalar(const.k_att * dt, torch.sqrt, math.sqrt)
    Yh = (L @ (normals[:, 1] * s)) @ L.transpose(-1, -2)  # sqrt(k_att dt) L N2 L^T
    v = torch.diagonal(V, dim1=-2, dim2=-1)
    if causal:
        M, U = _causal_auxiliaries_cumsum(V)
        sizes = torch.arange(1, m + 1, dtype=V.dtype, device=V.device)
        D = _causal_row_centring(Yh)
        D.addcmul_((const.a_att * dt) * (v / (2 * sizes))[..., :, None], U)
        D.diagonal(dim1=-2, dim2=-1).add_(alpha if isinstance(alpha, float) else alpha[..., 0])
        F = D @ K
        hadamard = M.mul_(V).mul_((const.a_att - const.k_att) * dt)
        new = _symmetrise_(torch.baddbmm(hadamard, F, F.transpose(-1, -2)))
        factor = (
            psd_factor(new)[0] if canonical else _refactor(_jittered_cholesky(new), F, const.a_att)
        )
        return (factor, new), new
    # diag(P V P), Q = tr(P V P V) = |V|^2 - 2 m |r|^2 + m^2 g^2 (r: row means, g: their
    # mean; V symmetric) and u, by means (docs/theory.md#sde): no products
    r = V.mean(-1)
    g = r.mean(-1, keepdim=True)
    Q = torch.linalg.vector_norm(V, dim=(-2, -1)) ** 2 - 2 * m * (r * r).sum(-1)
    Q = Q + m**2 * g[..., 0] ** 2
    dbar = v - 2 * r + g
    u = dbar - dbar.mean(-1, keepdim=True)
    D = Yh.sub_(Yh.mean(-1, keepdim=True))  # sqrt(k_att dt) Yh P
    D.addcmul_((const.a_att * dt / (2 * m)) * v[..., :, None], u[..., None, :])
    diag = alpha + dt * Q[:, None, None] * (const.a_att / (2 * m**2) - const.k_att / 2)
    D.diagonal(dim1=-2, dim2=-1).add_(diag[..., 0])
    F = D @ K
    new = _symmetrise_(F @ F.transpose(-1, -2))
    return (F, new), new


CHUNK_BYTES: int | None = None
"""If set, the factored Euler step runs on the CPU over chunks of paths whose (rows, m, m)
tensors hold about this many bytes (so that the step's temporaries stay in cache). Off by
default: on the 2-core test machine under load, one batch was as fast or faster at m = 128
(chunks of 128 KB-1 MB: 1.1-1.4x slower); re-measure on another machine before setting it."""


def _chunked_step(
    state: Tensor | tuple[Tensor, Tensor],
    normals: Tensor,
    dt: float,
    const: _Constants,
    canonical: bool,
    kw: dict[str, Any],
) -> tuple[tuple[Tensor, Tensor], Tensor]:
    """:func:`_factored_euler_step`, over chunks of rows on the CPU if :data:`CHUNK_BYTES` is
    set (one batch otherwise and on other devices); ``const`` may hold (B, 1, 1) per-path
    tensors."""
    B, m = normals.shape[0], normals.shape[-1]
    rows = B if CHUNK_BYTES is None else max(1, CHUNK_BYTES // (m * m * normals.element_size()))
    if normals.device.type != "cpu" or rows >= B:
        return _factored_euler_step(state, normals, dt, const, canonical=canonical, **kw)
    factor, new = torch.empty_like(normals[:, 0]), torch.empty_like(normals[:, 0])
    for i in range(0, B, rows):
        sl = slice(i, i + rows)
        sub = (state[0][sl], state[1][sl]) if isinstance(state, tuple) else state[sl]
        sub_const = _Constants(*(x[sl] if isinstance(x, Tensor) else x for x in const))
        (f, _), v = _factored_euler_step(sub, normals[sl], dt, sub_const, canonical=canonical, **kw)
        factor[sl], new[sl] = f, v
    return (factor, new), new


class FactoredEulerStep:
    """PSD-safe weak-order-1 Euler step ``V -> F F^T`` (module docstring).

    The state is the pair ``(F, V)`` with ``V = F F^T`` (:func:`_factored_euler_step`: V is
    carried, not recomputed; a bare factor is accepted too). By default F is the factor the
    previous step built: any square root gives the
    same noise law (``L R N R^T L^T`` with an adapted rotation R is again driven by iid
    Gaussians), so attention-only configurations need no eigendecomposition. The solution has
    the same law as with the canonical factor ``V^{1/2}``, but is a different pathwise coupling
    with the driving noise; ``canonical=True`` re-factors every step with ``V^{1/2}`` (as
    :class:`EulerMaruyamaStep` and torchsde do) for pathwise (strong) comparisons. An MLP drift step
    or a causal step always re-factors (by default with a jittered Cholesky factor: no
    eigendecomposition, no GPU synchronisation).

    Many configurations in one batch: ``config`` a sequence of configurations and ``paths``
    the number of rows (paths) of each, in order (row i belongs to the configuration whose
    block holds it). The step is the same formula with each row's own constants, held as
    (B, 1, 1) tensors on the state's device (built once per dtype and device, so the loop
    stays free of host synchronisation); the configurations must be all causal or all
    non-causal. :func:`sde.solve_batch` integrates such a batch.

    ``constants``: one configuration's ``sde_constants(config, m)`` if already computed
    (trusted: :func:`sde.solve` computes them once), else computed here.
    """

    def __init__(
        self,
        config: ModelConfig | Sequence[ModelConfig],
        m: int,
        *,
        canonical: bool = False,
        paths: Sequence[int] | None = None,
        constants: SDEConstants | None = None,
    ) -> None:
        self.m, self.canonical = m, canonical
        self.config: ModelConfig | tuple[ModelConfig, ...]
        self.const: SDEConstants | None  # None for a batch of configurations
        self._consts: _Constants | None  # floats of one configuration; None for a batch
        if isinstance(config, ModelConfig):
            if paths is not None:
                raise ValueError("paths is for a sequence of configurations, not one config")
            self.config = config
            self.const = sde_constants(config, m) if constants is None else constants
            c = self.const
            self._consts = _Constants(c.k_lin, c.k_att, c.a_att, c.k_mlp)
            self._kw = dict(attention=bool(c.a_att), mlp=bool(c.k_mlp), causal=c.causal)
            return
        configs = tuple(config)
        if paths is None or len(paths) != len(configs) or not configs:
            raise ValueError(
                "paths must give the number of paths of each configuration (one int each)"
            )
        for n in paths:
            check_int("paths", n, 1)
        consts = [sde_constants(c, m) for c in configs]
        causal = {k.causal for k in consts}
        if len(causal) > 1:
            raise ValueError("the configurations must all be causal or all non-causal")
        self.config = configs
        self.const = None
        self._rows = {
            name: [float(getattr(k, name)) for k, n in zip(consts, paths, strict=True)
                   for _ in range(n)]
            for name in _Constants._fields
        }  # fmt: skip
        self._device_consts: dict[tuple[torch.dtype, torch.device], _Constants] = {}
        self._consts = None
        self._kw = dict(
            attention=any(k.a_att for k in consts),
            mlp=any(k.k_mlp for k in consts),
            causal=causal.pop(),
        )

    def _constants(self, like: Tensor) -> _Constants:
        """The step's constants: floats, or (B, 1, 1) tensors with ``like``'s dtype and
        device (made once, not inside the loop)."""
        if self._consts is not None:
            return self._consts
        key = (like.dtype, like.device)
        if key not in self._device_consts:
            self._device_consts[key] = _Constants(
                *(
                    torch.tensor(values, dtype=like.dtype, device=like.device)[:, None, None]
                    for values in self._rows.values()
                )
            )
        return self._device_consts[key]

    def init(self, V0: Tensor) -> tuple[Tensor, Tensor]:
        """State of ``V0: (B, m, m)``: ``(L, V0)`` with ``L L^T = V0``."""
        self._constants(V0)
        return psd_factor(V0)[0], _symmetrise(V0)

    def step(
        self, state: Tensor | tuple[Tensor, Tensor], normals: Tensor, dt: float
    ) -> tuple[tuple[Tensor, Tensor], Tensor, Tensor | None]:
        """state ``(L, V)`` (or a factor L), normals: (B, 2, m, m) -> (new state, new V, None)."""
        consts = self._constants(normals)
        new_state, new = _chunked_step(state, normals, dt, consts, self.canonical, self._kw)
        return new_state, new, None


class _ReferenceFactoredEulerStep:
    """The factored Euler step as first written (9 m x m products per path-step non-causal,
    O(m^4) causal auxiliaries): the reference that :class:`FactoredEulerStep` is tested and
    benchmarked against (same formula, same law). State: the factor L.

    By default the state is the factor ``F`` itself (``V = F F^T``): any square root gives the
    same noise law (``L R N R^T L^T`` with an adapted rotation R is again driven by iid
    Gaussians), so attention-only configurations need no eigendecomposition. The solution has
    the same law as with the canonical factor ``V^{1/2}``, but is a different pathwise coupling
    with the driving noise; ``canonical=True`` re-factors every step with ``V^{1/2}`` (as
    :class:`EulerMaruyamaStep` and torchsde do) for pathwise (strong) comparisons. An MLP drift step
    always re-factors (by default with a jittered Cholesky factor: no eigendecomposition, no
    GPU synchronisation).
    """

    def __init__(self, config: ModelConfig, m: int, *, canonical: bool = False) -> None:
        self.config, self.m, self.canonical = config, m, canonical
        self.const = sde_constants(config, m)

    def init(self, V0: Tensor) -> Tensor:
        """State of ``V0: (B, m, m)``: a factor L with ``L L^T = V0``."""
        return psd_factor(V0)[0]

    def step(self, L: Tensor, normals: Tensor, dt: float) -> tuple[Tensor, Tensor, Tensor | None]:
        """L: (B, m, m) factor, normals: (B, 2, m, m) -> (new factor, new V, None)."""
        const, m = self.const, self.m
        V = L @ L.transpose(-1, -2)
        if const.k_mlp:
            V = V + (-math.expm1(-const.k_mlp * dt)) * (arccos_kernel(V) - V)
        if self.canonical:
            L, _ = psd_factor(V)
        elif const.k_mlp:
            L = _jittered_cholesky(V)
        eye = torch.eye(m, dtype=V.dtype, device=V.device)
        eps2 = const.k_lin * dt / 2
        left = eye.expand_as(V) * (1 - eps2 * m / 2)
        if const.a_att and const.causal:
            return self._causal_step(L, V, left, normals, dt)
        if const.a_att:
            aux = attention_auxiliaries(V)
            Q = aux[1]
            P = centering(m, dtype=V.dtype, device=V.device)
            G = math.sqrt(const.k_att * dt) * (L @ normals[:, 1] @ L.transpose(-1, -2) @ P)
            ito = (const.k_att * dt / 2) * Q[:, None, None] * eye
            left = left + dt * attention_drift_factor(V, const.a_att, aux) + G - ito
        F = left @ L @ (eye + math.sqrt(eps2) * normals[:, 0])
        return F, _symmetrise(F @ F.transpose(-1, -2)), None

    def _causal_step(
        self, L: Tensor, V: Tensor, left: Tensor, normals: Tensor, dt: float
    ) -> tuple[Tensor, Tensor, None]:
        """Causal attention step (docs/theory.md#causal-sde, module docstring): factor, noise and
        the PSD Hadamard term ``(a_att - k_att) dt M o V``; returns the re-factored state."""
        const, m = self.const, self.m
        eye = torch.eye(m, dtype=V.dtype, device=V.device)
        M, U = causal_attention_auxiliaries(V)
        Yh = L @ normals[:, 1] @ L.transpose(-1, -2)
        G = math.sqrt(const.k_att * dt) * attention_noise_factor(Yh, causal=True)
        left = left + dt * causal_attention_drift_factor(V, const.a_att, U) + G
        F = left @ L @ (eye + math.sqrt(const.k_lin * dt / 2) * normals[:, 0])
        hadamard = (const.a_att - const.k_att) * dt * (M * V)
        new = _symmetrise(F @ F.transpose(-1, -2) + hadamard)
        factor = psd_factor(new)[0] if self.canonical else _jittered_cholesky(new)
        return factor, new, None


class EulerMaruyamaStep:
    """Plain Euler-Maruyama step ``V + b dt + sqrt(dt) Sigma^{1/2} xi`` (not PSD-safe);
    ``constants`` as for :class:`FactoredEulerStep`."""

    def __init__(
        self, config: ModelConfig, m: int, *, constants: SDEConstants | None = None
    ) -> None:
        self.config, self.m = config, m
        self.const = sde_constants(config, m) if constants is None else constants

    def init(self, V0: Tensor) -> Tensor:
        """State of ``V0``: V0 itself."""
        return V0

    def step(self, V: Tensor, normals: Tensor, dt: float) -> tuple[Tensor, Tensor, Tensor | None]:
        """V: (B, m, m), normals: (B, 2, m, m) -> (V', V', psd_ok (B,))."""
        L, _ = psd_factor(V)
        const = self.const
        noise = noise_increment(L, V, normals, const.k_lin, const.k_att, causal=const.causal)
        new = _symmetrise(V + _drift(self.config, const, V) * dt + math.sqrt(dt) * noise)
        eye = torch.eye(self.m, dtype=V.dtype, device=V.device)
        finite = torch.isfinite(new).all(-1).all(-1)
        evals = torch.linalg.eigvalsh(torch.where(finite[:, None, None], new, eye))
        ok = evals[:, 0] >= -PSD_TOLERANCE * evals.abs().amax(-1)
        return new, new, ok


def _rows(state: State, rows: slice) -> State:
    """Rows ``rows`` of a stepper state (a tensor or a tuple of them)."""
    if isinstance(state, tuple):
        return tuple(x[rows] for x in state)
    return state[rows]


def _cat(a: State, b: State) -> State:
    """Two stepper states stacked along the rows."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return tuple(torch.cat([x, y]) for x, y in zip(a, b, strict=True))
    assert isinstance(a, Tensor) and isinstance(b, Tensor)  # same structure
    return torch.cat([a, b])


class PairedStep:
    """The same paths at step ``dt`` (rows ``:B``) and ``dt / 2`` (rows ``B:``), driven by the
    same Brownian paths (docs/theory.md#step-error), for :func:`integrate` on ``2B`` rows.

    ``normals: (B, 4, m, m)`` holds the coarse step's normals ``Z`` (``[:, :2]``) and
    independent ones ``W`` (``[:, 2:]``); the two half steps get ``(Z + W) / sqrt 2`` and
    ``(Z - W) / sqrt 2``, iid N(0, 1) whose sum is ``sqrt 2 Z``: the half steps' Brownian
    increments add up to the coarse step's. So the coarse rows are exactly the paths of
    ``base`` driven by ``Z`` alone (the solve without the pair, same seed).
    A path is checked for blow-up at the coarse times only.
    """

    def __init__(self, base: Stepper) -> None:
        self.base = base

    def init(self, V0: Tensor) -> Any:
        """State of ``V0: (2B, m, m)`` (coarse rows, then fine rows)."""
        return self.base.init(V0)

    def step(self, state: Any, normals: Tensor, dt: float) -> tuple[Any, Tensor, Tensor | None]:
        """One coarse step and two half steps: (state, V (2B, m, m), acceptance or None)."""
        B = normals.shape[0]
        Z, W = normals[:, :2], normals[:, 2:]
        coarse, Vc, ok_c = self.base.step(_rows(state, slice(0, B)), Z, dt)
        mid, _, ok_1 = self.base.step(_rows(state, slice(B, None)), (Z + W) * _SQRT_HALF, dt / 2)
        fine, Vf, ok_2 = self.base.step(mid, (Z - W) * _SQRT_HALF, dt / 2)
        oks = [ok_c, ok_1, ok_2]
        ok = None
        if any(o is not None for o in oks):
            ones = torch.ones(B, dtype=torch.bool, device=normals.device)
            c, f1, f2 = (ones if o is None else o for o in oks)
            ok = torch.cat([c, f1 & f2])
        return _cat(coarse, fine), torch.cat([Vc, Vf]), ok


_SQRT_HALF = math.sqrt(0.5)


class Solution(NamedTuple):
    """Output of :func:`integrate`: ``V (B, S, m, m)`` at the saved steps, ``exploded (B,)``
    bool, ``t_explode (B,)`` (NaN where not exploded), ``steps`` the saved step indices."""

    V: Tensor
    exploded: Tensor
    t_explode: Tensor
    steps: list[int]


def integrate(
    stepper: Stepper,
    V0: Tensor,
    *,
    steps: int,
    dt: float,
    save_every: int,
    noise: NoiseSource,
    bound: float,
    progress: bool | None = None,
) -> Solution:
    """Advance ``V0: (B, m, m)`` by ``steps`` steps of size ``dt`` (the one stepping loop).

    A path is frozen (kept at its last accepted state) and flagged at ``t = (k + 1) dt`` when
    its step-``k`` candidate is non-finite, exceeds ``bound * max_a V0^{aa}`` in absolute value
    or is rejected by the stepper (EM: not PSD).
    """
    check_covariance_batch(V0)
    check_int("steps", steps, 0)
    check_int("save_every", save_every, 1)
    check_positive("dt", dt)
    check_positive("bound", bound)
    return _integrate(
        stepper, V0, steps=steps, dt=dt, save_every=save_every, noise=noise, bound=bound,
        progress=progress,
    )  # fmt: skip


def _integrate(
    stepper: Stepper,
    V0: Tensor,
    *,
    steps: int,
    dt: float,
    save_every: int,
    noise: NoiseSource,
    bound: float,
    progress: bool | None,
) -> Solution:
    """:func:`integrate` on validated arguments (the solvers' :meth:`sde.Solver.paths` and
    :func:`sde.solve_batch`, whose callers checked them)."""
    B, m = V0.shape[0], V0.shape[-1]
    saved = save_steps(steps, save_every)
    out = V0.new_empty(B, len(saved), m, m)
    out[:, 0] = V0
    limit = bound * torch.diagonal(V0, dim1=-2, dim2=-1).amax(-1)
    active = torch.ones(B, dtype=torch.bool, device=V0.device)
    t_explode = torch.full((B,), math.nan, dtype=V0.dtype, device=V0.device)
    state = stepper.init(V0)
    V = V0.clone()
    cpu = V0.device.type == "cpu"
    j = 1
    bar = tqdm(range(steps), disable=None if progress is None else not progress, leave=False)
    for k in bar:
        new_state, new, ok = stepper.step(state, noise(k), dt)
        # one pass: aminmax propagates NaN, and NaN <= limit is False (non-finite is bad)
        low, high = torch.aminmax(new.flatten(-2), dim=-1)
        good = (high <= limit) & (-low <= limit)
        if ok is not None:
            good = good & ok
        bad = active & ~good
        t_explode = torch.where(bad, (k + 1) * dt, t_explode)
        active = active & good
        if cpu and bool(active.all()):  # the usual case; no host sync elsewhere
            V, state = new, new_state
        else:
            V = torch.where(active[:, None, None], new, V)
            state = _select(active, new_state, state)
        if k + 1 == saved[j]:
            out[:, j] = V
            j += 1
    return Solution(out, ~active, t_explode, saved)


def gaussian_noise(
    shape: tuple[int, ...], generator: torch.Generator, dtype: torch.dtype, device: torch.device
) -> NoiseSource:
    """Fresh iid N(0, 1) normals of ``shape`` = (B, 2, m, m) at every step.

    On the CPU (float32 or float64) from numpy's SFC64 ziggurat, seeded by one draw from
    ``generator``: faster than ``torch.randn`` in float64, where the normals are a large part of
    a step (the figures: benchmarks/RESULTS.md, "Lean factored Euler step"); elsewhere
    ``torch.randn`` with ``generator``.
    Either way the stream is a function of the generator's state.
    """
    device = torch.device(device)
    if device.type == "cpu" and dtype in (torch.float32, torch.float64):
        seed = int(torch.randint(0, 2**62, (), generator=generator))
        rng = np.random.Generator(np.random.SFC64(seed))
        np_dtype = np.float64 if dtype == torch.float64 else np.float32

        def numpy_noise(step: int) -> Tensor:
            return torch.from_numpy(rng.standard_normal(shape, dtype=np_dtype))

        return numpy_noise

    def noise(step: int) -> Tensor:
        return torch.randn(shape, generator=generator, dtype=dtype, device=device)

    return noise
