"""Solver objects (as diffrax does): a solver is its algorithm.

``solve(config, V0, samples, method=FactoredEuler(dt=0.01))``: each object carries its largest
step ``dt`` and integrates the paths itself (:meth:`Solver.paths`; the explicit schemes through
the stepper they build for a model, :meth:`Solver.stepper`, and :func:`sde.integrate`), so
:func:`sde.solve` and :func:`sde.solve_batch` dispatch on nothing. A name (``"euler"``,
``"em"``, ``"torchsde"``) means the class of that ``name`` in :data:`SOLVERS`, the one table.
A new solver is one subclass here (its stepper in :mod:`sde.solvers`) added to
:data:`SOLVERS`. :func:`sde.solve` hands :meth:`Solver.paths` checked arguments and the
model's constants (:func:`sde.sde_constants`, computed once per solve), on which the
library's solvers build their steppers.

Blow-up bookkeeping is the same for every solver: a path is flagged ``exploded`` at the first
step whose state is non-finite, exceeds the bound or (EM) leaves the PSD cone, and
``t_explode`` is that step's time on the solver's step grid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from shapedtx._validation import ParameterError, check_positive
from shapedtx.config import ModelConfig

from .coefficients import SDEConstants
from .solvers import (
    EulerMaruyamaStep,
    FactoredEulerStep,
    PairedStep,
    Stepper,
    _integrate,
    gaussian_noise,
)
from .time_grid import TimeGrid
from .torchsde_solver import _solve_torchsde

Configs = ModelConfig | Sequence[ModelConfig]
"""One configuration, or several integrated as one batch (:class:`FactoredEulerStep`)."""


@dataclass(frozen=True)
class Solver:
    """Base of the solver objects: ``dt`` is the largest step (the grid is
    :func:`sde.time_grid`); ``name`` is its key in :data:`SOLVERS`."""

    dt: float = 0.01
    name: ClassVar[str] = ""

    def __post_init__(self) -> None:
        check_positive("dt", self.dt)

    def stepper(self, config: Configs, m: int, *, paths: Sequence[int] | None = None) -> Stepper:
        """The stepper that :func:`sde.integrate` advances for ``config`` and ``m`` tokens
        (a sequence of configurations with ``paths`` rows each: one batch, where the scheme
        allows it). ParameterError (``method``) for a solver without one."""
        raise ParameterError(
            "method", f"method {self.name!r} has no stepper for sde.integrate (use sde.solve)"
        )

    def _stepper(self, config: ModelConfig, m: int, constants: SDEConstants) -> Stepper:
        """The stepper of :meth:`paths`: :meth:`stepper`, built on ``config``'s constants
        where the scheme takes them (the library's solvers; a subclass of one's own that
        defines only :meth:`stepper` is run by it)."""
        del constants
        return self.stepper(config, m)

    def paths(
        self,
        config: ModelConfig,
        V0: Tensor,
        grid: TimeGrid,
        *,
        seed: int,
        bound: float,
        progress: bool | None,
        constants: SDEConstants,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``(V (B, S, m, m) at grid.saved, exploded (B,), t_explode (B,))`` from
        ``V0: (B, m, m)`` (validated by the caller, :func:`sde.solve`, as are ``constants``,
        ``config``'s :func:`sde.sde_constants` for m tokens): the stepper over ``grid``,
        driven by normals from a generator seeded with ``seed``
        (:func:`sde.solvers.gaussian_noise`)."""
        B, _, m = V0.shape
        generator = torch.Generator(device=V0.device).manual_seed(seed)
        sol = _integrate(
            self._stepper(config, m, constants),
            V0,
            steps=grid.steps,
            dt=grid.dt,
            save_every=grid.save_every,
            noise=gaussian_noise((B, 2, m, m), generator, V0.dtype, V0.device),
            bound=bound,
            progress=progress,
        )
        return sol.V, sol.exploded, sol.t_explode

    def paired_paths(
        self,
        config: ModelConfig,
        V0: Tensor,
        grid: TimeGrid,
        *,
        seed: int,
        bound: float,
        progress: bool | None,
        constants: SDEConstants,
    ) -> tuple[Tensor, ...]:
        """:meth:`paths` at ``grid.dt`` and at ``grid.dt / 2`` on the same Brownian paths
        (:class:`sde.solvers.PairedStep`; docs/theory.md#step-error):
        ``(V, V_half, exploded, exploded_half, t_explode, t_explode_half)``. The first, third
        and fifth are :meth:`paths`' with the same seed; the half steps' extra normals come
        from a generator seeded with :func:`pair_seed` ``(seed)``."""
        B, _, m = V0.shape
        dtype, device = V0.dtype, V0.device
        shape = (B, 2, m, m)
        coarse = gaussian_noise(
            shape, torch.Generator(device=device).manual_seed(seed), dtype, device
        )
        extra = gaussian_noise(
            shape, torch.Generator(device=device).manual_seed(pair_seed(seed)), dtype, device
        )

        def noise(step: int) -> Tensor:
            return torch.cat([coarse(step), extra(step)], dim=1)

        sol = _integrate(
            PairedStep(self._stepper(config, m, constants)),
            torch.cat([V0, V0]),
            steps=grid.steps,
            dt=grid.dt,
            save_every=grid.save_every,
            noise=noise,
            bound=bound,
            progress=progress,
        )
        V, exploded, t_explode = sol.V, sol.exploded, sol.t_explode
        return V[:B], V[B:], exploded[:B], exploded[B:], t_explode[:B], t_explode[B:]


def pair_seed(seed: int) -> int:
    """The seed of the extra normals of the half steps (:meth:`Solver.paired_paths`): a
    64-bit integer derived from ``seed`` by numpy's ``SeedSequence``, a stream independent of
    the one ``seed`` starts."""
    return int(np.random.SeedSequence([seed, 2]).generate_state(1, np.uint64)[0])


@dataclass(frozen=True)
class FactoredEuler(Solver):
    """``V' = F F^T``: positive semi-definite by construction, weak order 1 (the default;
    :class:`sde.solvers.FactoredEulerStep`, which also steps a batch of configurations)."""

    name: ClassVar[str] = "euler"

    def stepper(
        self, config: Configs, m: int, *, paths: Sequence[int] | None = None
    ) -> FactoredEulerStep:
        return FactoredEulerStep(config, m, paths=paths)

    def _stepper(self, config: ModelConfig, m: int, constants: SDEConstants) -> FactoredEulerStep:
        return FactoredEulerStep(config, m, constants=constants)


@dataclass(frozen=True)
class EulerMaruyama(Solver):
    """Plain Euler-Maruyama on V; a step that leaves the PSD cone flags the path
    (:class:`sde.solvers.EulerMaruyamaStep`, one configuration)."""

    name: ClassVar[str] = "em"

    def stepper(
        self, config: Configs, m: int, *, paths: Sequence[int] | None = None
    ) -> EulerMaruyamaStep:
        if not isinstance(config, ModelConfig) or paths is not None:
            raise ParameterError(
                "method", "method 'em' steps one configuration; a batch needs 'euler'"
            )
        return EulerMaruyamaStep(config, m)

    def _stepper(self, config: ModelConfig, m: int, constants: SDEConstants) -> EulerMaruyamaStep:
        return EulerMaruyamaStep(config, m, constants=constants)


@dataclass(frozen=True)
class TorchSDE(Solver):
    """The same SDE through ``torchsde.sdeint`` (Euler-Maruyama; a reference solver,
    :func:`sde.solve_torchsde`; no stepper)."""

    name: ClassVar[str] = "torchsde"

    def paths(
        self,
        config: ModelConfig,
        V0: Tensor,
        grid: TimeGrid,
        *,
        seed: int,
        bound: float,
        progress: bool | None,
        constants: SDEConstants,
    ) -> tuple[Tensor, Tensor, Tensor]:
        # every step is evaluated (blow-ups are dated on the step grid, as for the other
        # solvers); the saved steps are kept. torchsde draws no progress bar.
        times = torch.arange(grid.steps + 1, dtype=V0.dtype, device=V0.device) * grid.dt
        V, exploded, t_explode = _solve_torchsde(
            config, V0, times, dt=grid.dt, bound=bound, bm=None, seed=seed, constants=constants
        )
        return V[:, list(grid.saved)], exploded, t_explode

    def paired_paths(
        self,
        config: ModelConfig,
        V0: Tensor,
        grid: TimeGrid,
        *,
        seed: int,
        bound: float,
        progress: bool | None,
        constants: SDEConstants,
    ) -> tuple[Tensor, ...]:
        raise ParameterError(
            "step_error",
            "step_error=True needs a solver with a stepper ('euler' or 'em'), not 'torchsde'",
        )


SOLVERS: dict[str, type[Solver]] = {s.name: s for s in (FactoredEuler, EulerMaruyama, TorchSDE)}
"""Solver classes by name: the one table of the names :func:`sde.solve` accepts."""


def as_solver(method: str | Solver, dt: float | None = None) -> Solver:
    """The solver object of ``method``: itself (``dt``, if given, must be its own) or, for a
    name of :data:`SOLVERS`, that class with ``dt`` (default 0.01). ParameterError
    (``method``, listing the names; or ``dt``) otherwise."""
    if isinstance(method, Solver):
        if dt is not None and dt != method.dt:
            raise ParameterError(
                "dt", f"dt={dt!r} conflicts with the solver's dt={method.dt!r}; give one"
            )
        return method
    if isinstance(method, str) and method in SOLVERS:
        return SOLVERS[method]() if dt is None else SOLVERS[method](dt)
    raise ParameterError(
        "method",
        f"method must be one of {', '.join(map(repr, SOLVERS))} or a solver object "
        f"(sde.FactoredEuler, ...), got {method!r}",
    )
