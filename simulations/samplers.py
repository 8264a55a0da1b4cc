"""Samplers: how one residual block of a random network is drawn (docs/theory.md#layers and
#samplers).

The driver (:func:`simulations.simulate`) only needs ``init(V0, samples) -> state``,
``step(state) -> state`` and ``covariance(state) -> V: (samples, m, m)``. The token-based
samplers keep ``X: (samples, m, n)`` and run the library's own block
(:func:`shapedtx.block`); they differ only in how a linear map ``x W / sqrt(fan_in)`` is
applied:

- ``"weights"``: an explicit N(0, 1) matrix per sample (:func:`shapedtx.gaussian_linear`
  semantics), the reference;
- ``"exact"``: docs/theory.md#samplers, ``R^T Z / sqrt(fan_in)`` with ``x^T = Q R`` (thin QR, or
  the Cholesky factor of ``x x^T``) and ``Z`` iid N(0, 1): the same joint law, O(m^2 n) work,
  no n x n matrix; queries and keys as m x m Bartlett products with the same logits in law,
  and every draw of a block from one bulk fill per generator group (:class:`ExactSampler`).

A new method is one :class:`Sampler` subclass plus the choice object that names it
(:mod:`simulations.options`, listed in :data:`simulations.SAMPLERS`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
from torch import Tensor

from shapedtx import ModelConfig, block, gaussian_linear, initial_tokens
from shapedtx._matmul import small_matmul
from shapedtx.blocks import attention_matrix, scale_standard
from shapedtx.metrics import covariance

from .rng import Draw, GroupedNormal, PendingDraw
from .wishart import bartlett, bartlett_dof

FUSED_TOKENS = 32
"""The exact sampler uses the fused attention path (SDPA + token mean) above this many tokens
and the explicit m x m attention matrix up to it."""


FAST_ATTENTION = True
"""The exact sampler's direct attention sub-block for one head without W^O or LayerNorm
(:meth:`ExactSampler._attention_sub_block`); False runs :func:`shapedtx.block` throughout."""


class Sampler(ABC):
    """One chunk's sampler: draws blocks for ``rng.samples`` samples with ``rng``'s groups.

    Subclasses set ``group_size`` (samples per generator; part of the random stream) and
    implement the three methods below and :meth:`memory`.
    """

    group_size: ClassVar[int] = 64
    parallel_parts: ClassVar[bool] = False
    """On CPU with several threads, split each chunk into one sampler per thread, each with
    its own groups (the numbers stay those of one sampler: per-group streams and per-sample
    operations); otherwise one sampler per chunk whose random numbers use the threads."""
    chunk_bytes: ClassVar[int | None] = None
    """If set, the default chunk holds about this many bytes per (m, widest) tensor (at least
    one group): small enough for the CPU caches, where elementwise passes are memory-bound."""

    def __init__(
        self, config: ModelConfig, rng: GroupedNormal, *, huge_pages: bool = False
    ) -> None:
        """``huge_pages``: large CPU work tensors may use huge pages
        (:func:`shapedtx._memory.empty`; the driver asks for them on one thread)."""
        self.config = config
        self.rng = rng
        self.huge_pages = huge_pages

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
        """The state after one more residual block (no host synchronisation on accelerators,
        except the one a sampler documents: the gram MLP's singular check)."""

    @abstractmethod
    def covariance(self, state: Any) -> Tensor:
        """V: (samples, m, m) of the state."""


class TokenSampler(Sampler):
    """State ``X: (samples, m, n)``; a block is :func:`shapedtx.block` with :meth:`linear`."""

    _layer: int = 0
    """Blocks begun so far (the first block of a simplified network differs: ``first``)."""

    def init(self, V0: Tensor, samples: int) -> Tensor:
        """X_0 with ``X_0 X_0^T / n = V0`` exactly (:func:`shapedtx.initial_tokens`), each
        group's frame from its own fast stream (:meth:`GroupedNormal.fill_normal`)."""
        n, m = self.config.width, V0.shape[-1]
        self._layer = 0
        G = V0.new_empty((samples, n, m))
        return initial_tokens(V0, n, samples, normals=self.rng.fill_normal(G))

    def step(self, X: Tensor) -> Tensor:
        self._layer += 1
        return self.block(X)

    def block(self, X: Tensor) -> Tensor:
        """One block of the library (:func:`shapedtx.block`) with this sampler's linear maps
        (the simplified attention at initialisation: the identity, no draws)."""
        return block(X, self.config, self.linear, fused=True, first=self._layer == 1)

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
    """docs/theory.md#samplers: ``x W / sqrt(fan_in)`` drawn as ``R^T Z / sqrt(fan_in)``.

    ``x^T = Q R`` (R: (k, m), k = min(fan_in, m)); Z: (k, out) iid N(0, 1). The factor R is
    reused while the same input tensor is passed (query, key and value share it).

    Queries and keys enter only through the logits ``q k^T = R^T Z_Q Z_K^T R / fan_in`` of
    each head. Given Z_K the rows of ``Z_Q Z_K^T`` (k x k) are iid N(0, Z_K Z_K^T), so
    ``Z_Q Z_K^T = N C^T`` in law with N: (k, k) iid N(0, 1) and C the Bartlett factor of
    Wishart(n_k, I_k) (:mod:`simulations.wishart`); if n_k < k, N = Z_Q and C = Z_K. The
    "query" and "key" maps therefore return ``R^T N`` and ``R^T C`` (scaled): (m, min(n_k, k))
    per head instead of (m, n_k), the same logits in law with O(m^2) numbers per head instead
    of 2 m n_k (the attention functions take their scale from the config, not from q's size).

    Draws: at each block, one buffer holding every N(0, 1) number of the block (all linear
    maps), then the Bartlett chi-square variables, with one call each per generator group
    (:meth:`GroupedNormal.start`); the next block's are started as soon as this block's are
    taken, so that helper threads fill them while this block is computed. The products are
    batched over the whole chunk. The numbers depend only on (seed, group), never on the
    chunking or the number of threads.
    """

    group_size = 64
    chunk_bytes = 2**23

    def __init__(
        self, config: ModelConfig, rng: GroupedNormal, *, huge_pages: bool = False
    ) -> None:
        super().__init__(config, rng, huge_pages=huge_pages)  # not used: no gain measured
        self._pending: PendingDraw[Draw] | None = None  # the next block's draws, under way
        self._blocks = 0  # blocks whose draws were taken
        self._x: Tensor | None = None
        self._R: Tensor | None = None
        self._gram: tuple[Tensor | None, Tensor | None] = (None, None)
        self._buffers: list[Tensor | None] = [None, None]
        self._draws: dict[str, Tensor] = {}

    @classmethod
    def memory(cls, config: ModelConfig, m: int, dtype: torch.dtype) -> tuple[int, int]:
        per_sample, fixed = super().memory(config, m, dtype)
        itemsize = torch.empty((), dtype=dtype).element_size()
        drawn = sum(r * c for r, c in cls._layout(config, m).values())
        return per_sample + drawn * itemsize, fixed  # the block drawn ahead

    @staticmethod
    def _layout(cfg: ModelConfig, m: int) -> dict[str, tuple[int, int]]:
        """(rows, columns) of the N(0, 1) draws of every linear map of one block."""
        n = cfg.width
        k = min(n, m)
        parts: dict[str, tuple[int, int]] = {}
        if cfg.attention not in ("none", "simplified"):  # simplified: A = I, no weights
            kk = min(cfg.key_dim, k)
            parts.update(query=(k, cfg.heads * kk), key=(k, cfg.heads * kk))
            parts["value"] = (k, cfg.value_dim)
            if cfg.out_proj:
                parts["out"] = (min(cfg.value_dim, m), n)
        if cfg.mlp != "none":
            parts.update(mlp_in=(k, cfg.mlp_width), mlp_out=(min(cfg.mlp_width, m), n))
        return parts

    def step(self, X: Tensor) -> Tensor:
        self._draw(X)
        X = super().step(X)
        self._x = self._R = None  # release the cached factor
        self._draws = {}
        return X

    def _draw(self, X: Tensor) -> None:
        """This block's draws by linear map (begun at the previous block or now); then the
        next block's are started, if blocks remain, so that helper threads fill them while
        this block is computed (:meth:`GroupedNormal.start`). Only after this block's are
        taken: each generator sees the same calls in the same order."""
        samples, m = X.shape[0], X.shape[-2]
        pending = self._pending or self._start_block(samples, m, X.dtype, X.device)
        (normals,), chi = pending.result()
        self._blocks += 1
        more = self._blocks < self.config.depth
        self._pending = self._start_block(samples, m, X.dtype, X.device) if more else None
        draws, offset = {}, 0
        for name, (rows, cols) in self._layout(self.config, m).items():
            draws[name] = normals[:, offset : offset + rows * cols].view(samples, rows, cols)
            offset += rows * cols
        if chi is not None:
            draws["key"] = self._bartlett(draws["key"], chi)
        self._draws = draws

    def _start_block(
        self, samples: int, m: int, dtype: torch.dtype, device: torch.device
    ) -> PendingDraw[Draw]:
        """Start drawing every N(0, 1) number of block ``self._blocks`` into one of two
        alternating buffers (a block drawn ahead never overwrites the one in use), and the
        Bartlett chi-square variables of the keys."""
        cfg = self.config
        layout = self._layout(cfg, m)
        total = sum(r * c for r, c in layout.values())
        slot = self._blocks % 2
        buf = self._buffers[slot]
        if buf is None or buf.shape != (samples, total):
            buf = self._buffers[slot] = torch.empty((samples, total), dtype=dtype, device=device)
        return self.rng.start([buf], self._chi2_dof(layout))

    def _chi2_dof(self, layout: dict[str, tuple[int, int]]) -> Tensor | None:
        """Degrees of freedom of the keys' Bartlett chi-square variables, one factor per head
        (None when the keys are not Bartlett factors)."""
        cfg = self.config
        if "key" not in layout or cfg.key_dim < layout["key"][0]:
            return None
        return bartlett_dof(cfg.key_dim, layout["key"][0], cfg.heads)

    def _bartlett(self, Z: Tensor, chi: Tensor) -> Tensor:
        """Per head, the Bartlett factor C (k x k) of Wishart(n_k, I_k) from the normals Z:
        (samples, k, heads * k) (strictly lower part) and the chi-square draws chi:
        (samples, heads * k) (squared diagonal)."""
        samples, k = Z.shape[0], Z.shape[1]
        h = self.config.heads
        diag = chi.sqrt().view(samples, h, k).to(Z.device)
        C = bartlett(Z.view(samples, k, h, k).transpose(1, 2), diag)
        return C.transpose(1, 2).reshape(samples, k, h * k)

    def block(self, X: Tensor) -> Tensor:
        cfg = self.config
        fused = X.shape[-2] > FUSED_TOKENS
        if FAST_ATTENTION and not fused and self._fast_attention_applies():
            X = self._attention_sub_block(X)
            if cfg.mlp == "none":
                return X
            cfg = cfg.replace(attention="none")
        # explicit attention matrix for few tokens: A v is one small matmul instead of the
        # fused path's SDPA, token mean and additions over (m, n) tensors (the same function)
        return block(X, cfg, self.linear, fused=fused, first=self._layer == 1)

    def _fast_attention_applies(self) -> bool:
        cfg = self.config
        return (
            cfg.attention in ("shaped", "softmax")
            and cfg.norm == "none"
            and cfg.heads == 1
            and not cfg.out_proj
        )

    def _attention_sub_block(self, X: Tensor) -> Tensor:
        """One head, no W^O, no LayerNorm: ``X' = lambda X + gamma A (F s Z_V)`` computed as
        ``lambda X + (gamma s A F) Z_V``: one (m, m) x (m, n) product and one fused add over
        the (m, n) tensors (the block function's value, attention product and residual sum
        are three). Same draws and the same function as :func:`shapedtx.block`, so the same
        numbers up to rounding (tested)."""
        cfg, n = self.config, X.shape[-1]
        q = self.linear(X, cfg.key_dim, "query")
        k = self.linear(X, cfg.key_dim, "key")
        A = attention_matrix(q[:, None], k[:, None], cfg)[:, 0]
        F = scale_standard(self._factor_of(X), cfg, "value", n) * cfg.branch_weight
        update = small_matmul(small_matmul(A, F), self._draws["value"])
        return update.add_(X, alpha=cfg.lam)

    def covariance(self, X: Tensor) -> Tensor:
        V = covariance(X)
        self._gram = (X, V)  # the next block's first factor, when its input is X
        return V

    def _factor(self, x: Tensor) -> Tensor:
        """F: (..., m, k) with ``F F^T = x x^T`` (then ``F Z`` has the law of ``x W``).

        ``F = R^T`` from the thin QR ``x^T = Q R``; on CPU, when ``fan_in >= m``, the Cholesky
        factor of the Gram matrix ``x x^T`` instead (cheaper: benchmarks/HISTORY.md, "Gram
        sampler"; the Gram is reused from :meth:`covariance` when x is the state), and the QR
        for the samples whose Gram matrix is numerically singular (a per-sample choice: the
        numbers do not depend on the chunking; one host check, CPU only).
        """
        m, fan_in = x.shape[-2], x.shape[-1]
        if x.device.type == "cpu" and fan_in >= m:
            X, V = self._gram
            gram = V * fan_in if x is X and V is not None else small_matmul(x, x.mT)
            F, info = torch.linalg.cholesky_ex(gram)
            bad = info != 0
            if bool(bad.any()):  # per sample, so that the numbers do not depend on the chunk
                F[bad] = torch.linalg.qr(x[bad].mT, mode="r").R.mT
            return F
        return torch.linalg.qr(x.mT, mode="r").R.mT

    def _factor_of(self, x: Tensor) -> Tensor:
        """:meth:`_factor` of ``x``, cached for the last ``x`` (the linear maps of one input)."""
        if x is not self._x or self._R is None:
            self._x, self._R = x, self._factor(x)
        return self._R

    def linear(self, x: Tensor, out_features: int, name: str) -> Tensor:
        R = self._factor_of(x)
        Z = self._draws[name]
        if name not in ("query", "key") and Z.shape[-1] != out_features:
            raise RuntimeError(f"linear {name!r}: {out_features} outputs, drew {Z.shape[-1]}")
        # the weight scale on the small factor (m, k), not on the (m, out) product
        return small_matmul(scale_standard(R, self.config, name, x.shape[-1]), Z)
