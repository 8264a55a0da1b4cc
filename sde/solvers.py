"""Time stepping for the covariance SDE: one stepping loop, two explicit schemes.

- :class:`FactoredEuler` (``method="euler"``, the default): PSD-safe Euler scheme. The MLP
  drift is a convex combination ``V + w (J(V) - V)`` with ``J`` the (PSD) arc-cosine kernel,
  ``w = 1 - exp(-k_mlp dt)``; then ``V' = F F^T`` with ``F = (I + H dt + G) L (I + eps N1)``,
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
- :class:`EulerMaruyama` (``method="em"``): plain ``V + b dt + Sigma^{1/2} dB``, symmetrised;
  can leave the PSD cone (such paths are flagged), kept as a reference.

:func:`integrate` freezes and flags paths whose next state is non-finite, exceeds
``bound * max_a V0^{aa}`` in absolute value, or (EM only) is not PSD. All checks are masks on
the device: no host synchronisation inside the loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch
from torch import Tensor
from tqdm.auto import tqdm

from shapedtx._validation import check_int, check_positive
from shapedtx.config import ModelConfig
from shapedtx.covariance import check_covariance_batch

from .coefficients import (
    arccos_kernel,
    attention_auxiliaries,
    attention_drift_factor,
    causal_attention_auxiliaries,
    causal_attention_drift_factor,
    centering,
    drift,
    sde_constants,
)
from .noise import attention_noise_factor, noise_increment, psd_factor
from .time_grid import save_steps

NoiseSource = Callable[[int], Tensor]
"""``noise(step) -> (samples, 2, m, m)`` iid N(0, 1) (N1, N2) for step ``step``."""


class Stepper(Protocol):
    """What :func:`integrate` steps with (:class:`FactoredEulerStep`, :class:`EulerMaruyamaStep`
    or any object with the same two methods)."""

    def init(self, V0: Tensor, /) -> Tensor:
        """The state of ``V0: (B, m, m)``."""
        ...

    def step(
        self, state: Tensor, normals: Tensor, dt: float, /
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """(new state, new V, per-path acceptance (B,) or None) from ``normals: (B, 2, m, m)``."""
        ...


PSD_TOLERANCE = 1e-8
"""EM flags a state whose smallest eigenvalue is below ``-PSD_TOLERANCE * max |eigenvalue|``."""


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
    eye = torch.eye(m, dtype=V.dtype, device=V.device)
    L, info = torch.linalg.cholesky_ex(V + delta[:, None, None] * eye)
    return torch.where((info == 0)[:, None, None], L, torch.full_like(L, math.nan))


class FactoredEulerStep:
    """PSD-safe weak-order-1 Euler step ``V -> F F^T`` (module docstring).

    By default the state is the factor ``F`` itself (``V = F F^T``): any square root gives the
    same noise law (``L R N R^T L^T`` with an adapted rotation R is again driven by iid
    Gaussians), so attention-only configurations need no eigendecomposition. The solution has
    the same law as with the canonical factor ``V^{1/2}``, but is a different pathwise coupling
    with the driving noise; ``canonical=True`` re-factors every step with ``V^{1/2}`` (as
    :class:`EulerMaruyama` and torchsde do) for pathwise (strong) comparisons. An MLP drift step
    always re-factors (by default with a jittered Cholesky factor: no eigendecomposition, no
    GPU synchronisation).
    """

    name = "euler"

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
    """Plain Euler-Maruyama step ``V + b dt + sqrt(dt) Sigma^{1/2} xi`` (not PSD-safe)."""

    name = "em"

    def __init__(self, config: ModelConfig, m: int) -> None:
        self.config, self.m = config, m
        self.const = sde_constants(config, m)

    def init(self, V0: Tensor) -> Tensor:
        """State of ``V0``: V0 itself."""
        return V0

    def step(self, V: Tensor, normals: Tensor, dt: float) -> tuple[Tensor, Tensor, Tensor | None]:
        """V: (B, m, m), normals: (B, 2, m, m) -> (V', V', psd_ok (B,))."""
        L, _ = psd_factor(V)
        const = self.const
        noise = noise_increment(L, V, normals, const.k_lin, const.k_att, causal=const.causal)
        new = _symmetrise(V + drift(self.config, V) * dt + math.sqrt(dt) * noise)
        eye = torch.eye(self.m, dtype=V.dtype, device=V.device)
        finite = torch.isfinite(new).all(-1).all(-1)
        evals = torch.linalg.eigvalsh(torch.where(finite[:, None, None], new, eye))
        ok = evals[:, 0] >= -PSD_TOLERANCE * evals.abs().amax(-1)
        return new, new, ok


STEPPERS = {"euler": FactoredEulerStep, "em": EulerMaruyamaStep}


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
    B, m = V0.shape[0], V0.shape[-1]
    saved = save_steps(steps, save_every)
    out = V0.new_empty(B, len(saved), m, m)
    out[:, 0] = V0
    limit = bound * torch.diagonal(V0, dim1=-2, dim2=-1).amax(-1)
    active = torch.ones(B, dtype=torch.bool, device=V0.device)
    t_explode = torch.full((B,), math.nan, dtype=V0.dtype, device=V0.device)
    state = stepper.init(V0)
    V = V0.clone()
    j = 1
    bar = tqdm(range(steps), disable=None if progress is None else not progress, leave=False)
    for k in bar:
        new_state, new, ok = stepper.step(state, noise(k), dt)
        good = torch.isfinite(new).all(-1).all(-1)
        good = good & (new.abs().amax((-2, -1)) <= limit)
        if ok is not None:
            good = good & ok
        bad = active & ~good
        t_explode = torch.where(bad, (k + 1) * dt, t_explode)
        active = active & good
        V = torch.where(active[:, None, None], new, V)
        state = torch.where(active[:, None, None], new_state, state)
        if k + 1 == saved[j]:
            out[:, j] = V
            j += 1
    return Solution(out, ~active, t_explode, saved)


def gaussian_noise(
    shape: tuple[int, ...], generator: torch.Generator, dtype: torch.dtype, device: torch.device
) -> NoiseSource:
    """Fresh iid N(0, 1) normals of ``shape`` = (B, 2, m, m) at every step."""

    def noise(step: int) -> Tensor:
        return torch.randn(shape, generator=generator, dtype=dtype, device=device)

    return noise
