"""Samplers: how one residual block of a random network is drawn (THEORY sections 2 and 5).

The driver (:func:`simulations.simulate`) only needs ``init(V0, samples) -> state``,
``step(state) -> state`` and ``covariance(state) -> V: (samples, m, m)``. The token-based
samplers keep ``X: (samples, m, n)`` and run the library's own block
(:func:`shapedtx.block`); they differ only in how a linear map ``x W / sqrt(fan_in)`` is
applied:

- ``"weights"``: an explicit N(0, 1) matrix per sample (:func:`shapedtx.gaussian_linear`
  semantics), the reference;
- ``"exact"``: THEORY section 5, ``R^T Z / sqrt(fan_in)`` with ``x^T = Q R`` (thin QR) and
  ``Z`` iid N(0, 1): the same joint law, O(m^2 n) work, no n x n matrix.

A new method is one :class:`Sampler` subclass plus one entry in :data:`SAMPLERS`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
from torch import Tensor

from shapedtx import ModelConfig, block, gaussian_linear, initial_tokens
from shapedtx.blocks import scale_standard
from shapedtx.metrics import covariance

from .rng import GroupedNormal


class Sampler(ABC):
    """One chunk's sampler: draws blocks for ``rng.samples`` samples with ``rng``'s groups.

    Subclasses set ``group_size`` (samples per generator; part of the random stream) and
    implement the three methods below and :meth:`memory`.
    """

    group_size: ClassVar[int] = 64

    def __init__(self, config: ModelConfig, rng: GroupedNormal) -> None:
        self.config = config
        self.rng = rng

    @classmethod
    def check(cls, config: ModelConfig) -> None:
        """Raise ValueError if this method cannot simulate ``config`` (default: all can)."""
        del config

    @classmethod
    @abstractmethod
    def memory(cls, config: ModelConfig, m: int, dtype: torch.dtype) -> tuple[int, int]:
        """Rough working memory in bytes: (per sample, fixed per chunk)."""

    @abstractmethod
    def init(self, V0: Tensor, samples: int) -> Any:
        """Initial state of ``samples`` networks with input covariance V0: (m, m)."""

    @abstractmethod
    def step(self, state: Any) -> Any:
        """The state after one more residual block (no host synchronisation)."""

    @abstractmethod
    def covariance(self, state: Any) -> Tensor:
        """V: (samples, m, m) of the state."""


class TokenSampler(Sampler):
    """State ``X: (samples, m, n)``; a block is :func:`shapedtx.block` with :meth:`linear`."""

    def init(self, V0: Tensor, samples: int) -> Tensor:
        """X_0 with ``X_0 X_0^T / n = V0`` exactly, each group from its own generator."""
        n = self.config.width
        rng = self.rng
        return torch.cat(
            [
                initial_tokens(V0, n, s.stop - s.start, gen)
                for gen, s in zip(rng.generators, rng.slices, strict=True)
            ]
        )

    def step(self, X: Tensor) -> Tensor:
        return block(X, self.config, self.linear, fused=True)

    def covariance(self, X: Tensor) -> Tensor:
        return covariance(X)

    @abstractmethod
    def linear(self, x: Tensor, out_features: int, name: str) -> Tensor:
        """``x W / sqrt(fan_in)`` in law; x: (samples, ..., m, fan_in)."""

    @staticmethod
    def _widest(config: ModelConfig) -> int:
        return max(config.mlp_width, config.value_dim, config.heads * config.key_dim)

    @classmethod
    def memory(cls, config: ModelConfig, m: int, dtype: torch.dtype) -> tuple[int, int]:
        # X, the normalised input, q, k, v, attention output, MLP hidden, draws, temporaries.
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 16 * m * cls._widest(config) * itemsize, 0


class WeightsSampler(TokenSampler):
    """Explicit N(0, 1) weight matrices, one per sample and per use (the reference):
    :func:`shapedtx.gaussian_linear` with each group's generator."""

    group_size = 4

    def linear(self, x: Tensor, out_features: int, name: str) -> Tensor:
        config = self.config
        return self.rng.per_group(
            lambda x_g, gen: gaussian_linear(gen, config)(x_g, out_features, name), x
        )

    @classmethod
    def memory(cls, config: ModelConfig, m: int, dtype: torch.dtype) -> tuple[int, int]:
        per_sample, _ = super().memory(config, m, dtype)
        itemsize = torch.empty((), dtype=dtype).element_size()
        widest = cls._widest(config)
        return per_sample, cls.group_size * widest * widest * itemsize


class ExactSampler(TokenSampler):
    """THEORY section 5: ``x W / sqrt(fan_in)`` drawn as ``R^T Z / sqrt(fan_in)``.

    ``x^T = Q R`` (R: (k, m), k = min(fan_in, m)); Z: (k, out) iid N(0, 1). The factor R is
    reused while the same input tensor is passed (query, key and value share it).
    """

    group_size = 64

    def __init__(self, config: ModelConfig, rng: GroupedNormal) -> None:
        super().__init__(config, rng)
        self._x: Tensor | None = None
        self._R: Tensor | None = None

    def step(self, X: Tensor) -> Tensor:
        X = super().step(X)
        self._x = self._R = None  # release the cached factor
        return X

    def linear(self, x: Tensor, out_features: int, name: str) -> Tensor:
        if x is not self._x:
            self._x, self._R = x, torch.linalg.qr(x.mT, mode="r").R
        R = self._R
        drawn = self.rng.map(
            lambda R_g, Z_g: R_g.mT @ Z_g, R, (*R.shape[1:-2], R.shape[-2], out_features)
        )
        return scale_standard(drawn, self.config, name, x.shape[-1])


SAMPLERS: dict[str, type[Sampler]] = {"exact": ExactSampler, "weights": WeightsSampler}
"""Simulation methods by name."""
