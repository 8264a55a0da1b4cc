"""The covariance SDE through ``torchsde.sdeint`` (``method="torchsde"``, a reference solver).

State: the upper triangle of V (m (m + 1) / 2 entries); general noise with a 2 m^2-dimensional
Brownian motion (N1 then N2 of :mod:`sde.noise`, row-major), so that the same Brownian
increments drive :class:`sde.solvers.FactoredEulerStep` when read as ``dW / sqrt(dt)``.
Paths that are non-finite or exceed the bound get zero drift and diffusion (frozen). Causal
shaped attention uses the row-wise noise R of docs/theory.md#causal-sde.
"""

from __future__ import annotations

import math

import torch
import torchsde
from torch import Tensor

from shapedtx._validation import ParameterError, check_int, check_positive
from shapedtx.config import ModelConfig, check_config
from shapedtx.covariance import check_covariance_batch

from .coefficients import SDEConstants, _drift, causal_centerings, centering, sde_constants
from .noise import psd_factor


def pack(V: Tensor) -> Tensor:
    """Upper triangle: (..., m, m) -> (..., m (m + 1) / 2)."""
    i, j = torch.triu_indices(V.shape[-1], V.shape[-1], device=V.device)
    return V[..., i, j]


def unpack(y: Tensor, m: int) -> Tensor:
    """Inverse of :func:`pack`: (..., m (m + 1) / 2) -> symmetric (..., m, m)."""
    i, j = torch.triu_indices(m, m, device=y.device)
    U = y.new_zeros((*y.shape[:-1], m, m))
    U[..., i, j] = y
    return U + U.transpose(-1, -2) - torch.diag_embed(torch.diagonal(U, dim1=-2, dim2=-1))


class CovarianceSDE(torch.nn.Module):
    """``torchsde`` SDE object (Ito, general noise) of ``config`` for m tokens.

    ``limit: (B,)`` per-path bound on max |V^{ab}|; beyond it (or non-finite) f = g = 0.
    ``constants``: ``sde_constants(config, m)`` if already computed (trusted), else computed.
    """

    sde_type = "ito"
    noise_type = "general"

    def __init__(
        self, config: ModelConfig, m: int, limit: Tensor, *, constants: SDEConstants | None = None
    ) -> None:
        super().__init__()
        self.config, self.m, self.limit = config, m, limit
        self.const = sde_constants(config, m) if constants is None else constants

    def _state(self, y: Tensor) -> tuple[Tensor, Tensor]:
        V = unpack(y, self.m)
        ok = torch.isfinite(y).all(-1) & (y.abs().amax(-1) <= self.limit)
        eye = torch.eye(self.m, dtype=y.dtype, device=y.device)
        return torch.where(ok[:, None, None], V, eye), ok

    def f(self, t: Tensor, y: Tensor) -> Tensor:
        """Drift: (B, D) -> (B, D)."""
        V, ok = self._state(y)
        return torch.where(ok[:, None], pack(_drift(self.config, self.const, V)), 0.0)

    def g(self, t: Tensor, y: Tensor) -> Tensor:
        """Diffusion matrix: (B, D) -> (B, D, 2 m^2)."""
        V, ok = self._state(y)
        L, _ = psd_factor(V)
        m, B = self.m, y.shape[0]
        # N1 basis E_ij: sqrt(k_lin / 2) (L_ai L_bj + L_aj L_bi)
        outer = L[:, :, None, :, None] * L[:, None, :, None, :]  # (B, a, b, i, j) = L_ai L_bj
        g1 = math.sqrt(self.const.k_lin / 2) * (outer + outer.transpose(-1, -2))
        cols = [g1]
        if self.const.k_att and self.const.causal:
            # N2 basis E_ij: R V has entries L_ai K[a]_bj with K[a] = V (P_a / a) L (row-wise R)
            Ps = causal_centerings(m, dtype=V.dtype, device=V.device)
            K = V[:, None] @ Ps @ L[:, None]  # (B, a, b, j)
            lm = L[:, :, None, :, None] * K[:, :, :, None, :]
            cols.append(math.sqrt(self.const.k_att) * (lm + lm.permute(0, 2, 1, 3, 4)))
        elif self.const.k_att:
            # N2 basis E_ij: sqrt(k_att) (L_ai M_bj + M_aj L_bi), M = V P L
            M = V @ centering(m, dtype=V.dtype, device=V.device) @ L
            lm = L[:, :, None, :, None] * M[:, None, :, None, :]
            cols.append(math.sqrt(self.const.k_att) * (lm + lm.permute(0, 2, 1, 3, 4)))
        else:
            cols.append(torch.zeros_like(g1))
        i, j = torch.triu_indices(m, m, device=y.device)
        G = torch.cat([c[:, i, j].reshape(B, -1, m * m) for c in cols], dim=-1)
        return torch.where(ok[:, None, None], G, 0.0)


def solve_torchsde(
    config: ModelConfig,
    V0: Tensor,
    ts: Tensor,
    *,
    dt: float,
    bound: float,
    bm: torchsde.BrownianInterval | None = None,
    seed: int = 0,
) -> tuple[Tensor, Tensor, Tensor]:
    """Euler-Maruyama through ``torchsde.sdeint``; V0: (B, m, m), ts: (S,) save times.

    Returns ``V (B, S, m, m)`` (non-finite saved states replaced by the last finite one),
    ``exploded (B,)`` and ``t_explode (B,)`` (first saved time with a bad state, NaN if none).
    """
    check_config(config)
    check_covariance_batch(V0)
    check_positive("dt", dt)
    check_positive("bound", bound)
    check_int("seed", seed, 0)
    _check_times(ts)
    constants = sde_constants(config, V0.shape[-1])
    return _solve_torchsde(
        config, V0, ts, dt=dt, bound=bound, bm=bm, seed=seed, constants=constants
    )


def _solve_torchsde(
    config: ModelConfig,
    V0: Tensor,
    ts: Tensor,
    *,
    dt: float,
    bound: float,
    bm: torchsde.BrownianInterval | None,
    seed: int,
    constants: SDEConstants,
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`solve_torchsde` on validated arguments, with ``config``'s constants for V0's
    tokens (:meth:`sde.TorchSDE.paths`, called by :func:`sde.solve`, which checked them)."""
    B, m = V0.shape[0], V0.shape[-1]
    limit = bound * torch.diagonal(V0, dim1=-2, dim2=-1).amax(-1)
    sde = CovarianceSDE(config, m, limit, constants=constants)
    if bm is None:
        bm = torchsde.BrownianInterval(
            t0=float(ts[0]),
            t1=float(ts[-1]),
            size=(B, 2 * m * m),
            dtype=V0.dtype,
            device=V0.device,
            entropy=seed,
        )
    with torch.no_grad():
        ys = torchsde.sdeint(sde, pack(V0), ts, bm=bm, method="euler", dt=dt)  # (S, B, D)
    ys = ys.transpose(0, 1)
    good = torch.isfinite(ys).all(-1) & (ys.abs().amax(-1) <= limit[:, None])
    index = torch.arange(ys.shape[1], device=ys.device).expand(B, -1)
    last_good = torch.where(good, index, 0).cummax(dim=1).values
    ys = torch.gather(ys, 1, last_good[..., None].expand_as(ys))
    exploded = ~good.all(-1)
    first_bad = (~good).to(torch.int64).argmax(-1)
    t_explode = torch.where(exploded, ts.to(V0.dtype)[first_bad], math.nan)
    return unpack(ys, m), exploded, t_explode


def _check_times(ts: Tensor) -> None:
    """ValueError unless ``ts`` is a 1-D tensor of at least two finite, increasing times."""
    ok = isinstance(ts, Tensor) and ts.dim() == 1 and ts.numel() >= 2 and ts.is_floating_point()
    if not (ok and bool(torch.isfinite(ts).all()) and bool((ts[1:] > ts[:-1]).all())):
        raise ParameterError(
            "ts",
            "ts must be a 1-D floating-point tensor of at least two finite, strictly "
            f"increasing times, got {ts!r}",
        )
