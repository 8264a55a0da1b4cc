"""Sampler choices as objects (as diffrax does): a choice is its algorithm.

``simulate(config, V0, samples, method=Exact(), seed=1)`` is
``simulate(config, V0, samples, method="exact", seed=1)``. Each choice names its
sampler class (``Exact.sampler_class`` is :class:`simulations.ExactSampler`, which the driver
instantiates for every chunk of samples); :class:`Auto` picks one for the config
(:meth:`SamplerChoice.resolve`). A name means the class of that ``name`` in
:data:`SAMPLERS`, the one table (the command line maps its strings onto it).

A new sampler is a :class:`simulations.Sampler` subclass (in :mod:`simulations.samplers` or
its own module) and a choice class here that names it, added to :data:`SAMPLERS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shapedtx import ModelConfig
from shapedtx._validation import ParameterError

from .gram import GramSampler
from .samplers import ExactSampler, Sampler, WeightsSampler

__all__ = [
    "SAMPLERS",
    "Auto",
    "Exact",
    "Gram",
    "SamplerChoice",
    "Weights",
    "as_sampler",
]


@dataclass(frozen=True)
class SamplerChoice:
    """Base of the sampler choices: ``name`` is the key of :data:`SAMPLERS`,
    ``sampler_class`` the :class:`simulations.Sampler` the driver runs."""

    name: ClassVar[str]
    sampler_class: ClassVar[type[Sampler]]

    def resolve(self, config: ModelConfig) -> SamplerChoice:
        """The choice that simulates ``config``: itself (:class:`Auto` picks one)."""
        del config
        return self


@dataclass(frozen=True)
class Exact(SamplerChoice):
    """Every ``x W`` drawn as ``R^T Z`` from a factor of ``x x^T`` (docs/theory.md#samplers;
    :class:`simulations.ExactSampler`)."""

    name: ClassVar[str] = "exact"
    sampler_class: ClassVar[type[Sampler]] = ExactSampler


@dataclass(frozen=True)
class Weights(SamplerChoice):
    """Explicit Gaussian weight matrices (the reference; :class:`simulations.WeightsSampler`)."""

    name: ClassVar[str] = "weights"
    sampler_class: ClassVar[type[Sampler]] = WeightsSampler


@dataclass(frozen=True)
class Gram(SamplerChoice):
    """The width-free Markov chain on V (supported configurations only;
    :class:`simulations.GramSampler`)."""

    name: ClassVar[str] = "gram"
    sampler_class: ClassVar[type[Sampler]] = GramSampler


@dataclass(frozen=True)
class Auto(SamplerChoice):
    """The fastest exact-in-law sampler that supports the config: the first of
    :attr:`order` whose sampler class accepts it, else :class:`Exact` (which simulates every
    config): gram where it applies, else exact. It has no sampler class of its own:
    :meth:`resolve` picks the choice."""

    name: ClassVar[str] = "auto"
    order: ClassVar[tuple[type[SamplerChoice], ...]] = (Gram,)
    """Faster exact-in-law choices than :class:`Exact`, fastest first."""

    def resolve(self, config: ModelConfig) -> SamplerChoice:
        for choice in self.order:
            try:
                choice.sampler_class.check(config)
            except ValueError:
                continue
            return choice()
        return Exact()


SAMPLERS: dict[str, type[SamplerChoice]] = {c.name: c for c in (Auto, Exact, Weights, Gram)}
"""Sampler choices by name: the one table of the names :func:`simulations.simulate` accepts."""


def as_sampler(method: str | SamplerChoice | None) -> SamplerChoice:
    """The choice object of ``method``: itself, :class:`Auto` for None, or for a name of
    :data:`SAMPLERS` that class. ParameterError (``method``, listing the names) otherwise."""
    if method is None:
        return Auto()
    if isinstance(method, SamplerChoice):
        return method
    if isinstance(method, str) and method in SAMPLERS:
        return SAMPLERS[method]()
    raise ParameterError(
        "method",
        f"method must be one of {', '.join(map(repr, SAMPLERS))} or a sampler object "
        f"(simulations.Exact, ...), got {method!r}",
    )
