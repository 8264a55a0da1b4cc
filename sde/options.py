"""Solver choices as objects (as diffrax does): ``solve(config, V0, samples,
method=FactoredEuler(dt=0.01))``. Each carries its step size; the string names
(``"euler"``, ``"em"``, ``"torchsde"``) remain accepted and mean the defaults below.

Blow-up bookkeeping is the same for every solver: a path is flagged ``exploded`` at the first
step whose state is non-finite, exceeds the bound or (EM) leaves the PSD cone, and
``t_explode`` is that step's time on the solver's step grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shapedtx._validation import check_positive


@dataclass(frozen=True)
class Solver:
    """Base of the solver objects: ``dt`` is the largest step (the grid is
    :func:`sde.time_grid`)."""

    dt: float = 0.01
    name: ClassVar[str] = ""

    def __post_init__(self) -> None:
        check_positive("dt", self.dt)


@dataclass(frozen=True)
class FactoredEuler(Solver):
    """``V' = F F^T``: positive semi-definite by construction, weak order 1 (the default)."""

    name: ClassVar[str] = "euler"


@dataclass(frozen=True)
class EulerMaruyama(Solver):
    """Plain Euler-Maruyama on V; a step that leaves the PSD cone flags the path."""

    name: ClassVar[str] = "em"


@dataclass(frozen=True)
class TorchSDE(Solver):
    """The same SDE through ``torchsde.sdeint`` (Euler-Maruyama; a reference solver)."""

    name: ClassVar[str] = "torchsde"


SOLVERS: dict[str, type[Solver]] = {s.name: s for s in (FactoredEuler, EulerMaruyama, TorchSDE)}
"""Solver classes by name."""
