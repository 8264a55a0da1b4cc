"""Run choices as objects (as diffrax does): samplers and one run-options object.

``simulate(config, V0, samples, method=Exact(), options=RunOptions(seed=1, dtype=...))`` is
``simulate(config, V0, samples, method="exact", seed=1, dtype=...)``; the string names stay
accepted everywhere (the CLI maps its strings onto them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from shapedtx.options import RunOptions

__all__ = ["Auto", "Exact", "Gram", "RunOptions", "Sampler", "Weights"]


@dataclass(frozen=True)
class Sampler:
    """Base of the sampler choices; ``name`` is the key of :data:`simulations.SAMPLERS`."""

    name: ClassVar[str] = "auto"


@dataclass(frozen=True)
class Auto(Sampler):
    """The fastest exact-in-law sampler that supports the config (gram, else exact)."""

    name: ClassVar[str] = "auto"


@dataclass(frozen=True)
class Exact(Sampler):
    """Every ``x W`` drawn as ``R^T Z`` from a factor of ``x x^T`` (docs/theory.md#samplers)."""

    name: ClassVar[str] = "exact"


@dataclass(frozen=True)
class Weights(Sampler):
    """Explicit Gaussian weight matrices (the reference)."""

    name: ClassVar[str] = "weights"


@dataclass(frozen=True)
class Gram(Sampler):
    """The width-free Markov chain on V (supported configurations only)."""

    name: ClassVar[str] = "gram"
