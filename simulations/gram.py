"""The width-independent exact sampler ``method="gram"`` (THEORY section 5).

The state of a sample is a factor ``L: (m, m)`` with ``L L^T = V = X X^T / n``; no token
matrix is ever formed. Write ``X^T = Q R`` (thin QR) so that ``X = sqrt(n) L Q^T`` with
``L = R^T / sqrt(n)``, and complete Q to an orthonormal basis ``[Q, Q_perp]`` of R^n.

**Residual Gaussian update.** Every sub-block has the form ``X' = lambda X + s sqrt(n) B U W``
with W (n x n, iid N(0, 1)) independent of ``(X, B, U)`` and U (m x n) with orthonormal rows:
``U = Q^T`` and ``B = A L`` for attention (``A X W^V / sqrt(n) = A L Q^T W^V``,
s = gamma / sqrt(n)), and for the MLP ``U = Q_phi^T``, ``B B^T = K = phi phi^T / n``
(``phi^T = Q_phi R_phi``, s = gamma sqrt(c / n)). Then ``U W [Q, Q_perp] = [G, H]`` is iid
N(0, 1), G: (m, m), H: (m, n - m), independent of X and B (rotation invariance), so in the
basis [Q, Q_perp]

    X' / sqrt(n) = [lambda L + s B G,  s B H]   and   H H^T ~ Wishart(n - m, I_m),

    V' = lambda^2 V + lambda s (B G L^T + L G^T B^T) + s^2 B (G G^T + H H^T) B^T.

With ``H H^T = F F^T`` (F the Bartlett factor, :func:`simulations.wishart.wishart_factor`) the
new factor is ``L' = R'^T`` with ``[lambda L + s B G, s B F]^T = Q' R'`` (QR of a 2m x m
matrix): V' stays positive semi-definite by construction. Any factor of V gives the same law
(``L -> L O`` is absorbed by rotating G, H).

**Attention** (one head, value only, ``X' = lambda X + gamma A X W^V / sqrt(n)``): q = X W^Q
/ sqrt(n) = L Z_Q and k = L Z_K with Z_Q, Z_K: (m, n_k) iid, independent of W^V. Given Z_K the
rows of ``Z_Q Z_K^T`` are iid N(0, Z_K Z_K^T), so ``Z_Q Z_K^T = N C^T`` in law with N: (m, m)
iid and C the Bartlett factor of Wishart(n_k, I_m) (if n_k < m, N and C are m x n_k Gaussian
matrices, i.e. Z_Q and Z_K themselves). The logits are ``Y = (L N) (L C)^T`` and A is the
library's attention matrix of Y (:func:`shapedtx.blocks.attention_matrix`: shaped or softmax,
causal or not: the update above holds for any A that is a function of the logits).

**MLP** (``X' = lambda X + gamma sqrt(c / n) phi(X W^pre / sqrt(n)) W^post``): the hidden
pre-activations ``X W^pre / sqrt(n) = L (Q^T W^pre)`` have the law of ``L G_pre`` with
G_pre: (m, n) iid, so the hidden Gram matrix ``K = phi(L G_pre) phi(L G_pre)^T / n`` is drawn
exactly with O(m^2 n) work (columns in fixed-size batches, so memory stays bounded) and
B = R_phi^T / sqrt(n) from an incremental QR over the batches (exact also when K is singular,
e.g. a ReLU token that is zero on every hidden unit; no eigendecomposition, whose error check
would synchronise a GPU); W^post is independent of (X, phi), giving the update above with
s = gamma sqrt(c / n).

**Cost per block and sample.** Attention-only networks: O(m^3), independent of the width and
of n_k. With an MLP: O(m^2 n) (the hidden Gram matrix; exact, no approximation).

**Supported configurations.** attention in {shaped, softmax, none} with one head, no W^O
(``out_proj=False``), any key_dim, causal or not; mlp in {shaped_relu, relu, none};
``norm="none"``. Rejected with ValueError: ``norm="pre"`` (LayerNorm centres each token over
its features, which depends on X beyond X X^T), ``heads > 1`` without W^O (each head writes
its own block of residual columns, so X X'^T depends on how X splits over those columns, not
only on V) and ``out_proj=True`` (every fixed head size). With W^O the covariance is still a
Markov chain (the Gram matrix of the concatenated heads is ``sum_h A_h L Wishart(d_p) L^T
A_h^T``, then the update above with W^O), but that is not implemented here.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from shapedtx import ModelConfig, relu_slopes, shaped_relu
from shapedtx.blocks import attention_matrix

from .samplers import SAMPLERS, Sampler
from .wishart import wishart_factor

HIDDEN_ELEMENTS = 2**22
"""Hidden-layer numbers drawn at once per generator group (bounds the MLP's memory); fixes
the column batch ``max(1, HIDDEN_ELEMENTS // (group_size m))`` and so the random stream."""


def residual_update(L: Tensor, B: Tensor, G: Tensor, F: Tensor, lam: float, s: float) -> Tensor:
    """The factor L' of ``V' = lambda^2 V + lambda s (B G L^T + L G^T B^T) + s^2 B (G G^T +
    F F^T) B^T`` (module doc); L, B, G: (..., m, m), F: (..., m, k) -> L': (..., m, m)."""
    factor = torch.cat([lam * L + s * (B @ G), s * (B @ F)], dim=-1)
    return torch.linalg.qr(factor.mT, mode="r").R.mT


class GramSampler(Sampler):
    """``method="gram"``: V is a Markov chain sampled from m x m Gaussian and Wishart matrices
    (module doc). State: ``L: (samples, m, m)`` with ``L L^T = V``."""

    group_size: ClassVar[int] = 256

    @classmethod
    def check(cls, config: ModelConfig) -> None:
        problems = []
        if config.norm != "none":
            problems.append(f"norm={config.norm!r} (LayerNorm is not a function of X X^T)")
        if config.init != "fan_in":
            problems.append(f"init={config.init!r} (only the fan_in initialisation)")
        if config.mlp == "gelu":
            problems.append("mlp='gelu' (only ReLU-type MLPs)")
        if config.mlp != "none" and config.mlp_ratio != 1:
            problems.append(f"mlp_ratio={config.mlp_ratio} (only a hidden width equal to n)")
        if config.attention != "none":
            if config.heads != 1:
                problems.append(f"heads={config.heads} (only one head)")
            if config.out_proj:
                problems.append("out_proj=True (no W^O; this includes fixed head sizes)")
        if problems:
            raise ValueError(
                "method 'gram' does not support " + "; ".join(problems) + ". Supported: one "
                "attention head without W^O (shaped or softmax, any key_dim, causal or not), "
                "shaped_relu/relu/no MLP with mlp_ratio=1, norm='none', init='fan_in', scaled "
                "or unit residual; use method='exact' otherwise"
            )

    @classmethod
    def memory(cls, config: ModelConfig, m: int, dtype: torch.dtype) -> tuple[int, int]:
        itemsize = torch.empty((), dtype=dtype).element_size()
        hidden = 4 * HIDDEN_ELEMENTS * itemsize if config.mlp != "none" else 0
        return 24 * m * m * itemsize, hidden

    def init(self, V0: Tensor, samples: int) -> Tensor:
        return torch.linalg.cholesky(V0).expand(samples, *V0.shape).clone()

    def covariance(self, L: Tensor) -> Tensor:
        return L @ L.mT

    def step(self, L: Tensor) -> Tensor:
        if self.config.attention != "none":
            L = self._attention(L)
        if self.config.mlp != "none":
            L = self._mlp(L)
        return L

    # ----------------------------------------------------------------------------------------
    def _attention(self, L: Tensor) -> Tensor:
        cfg = self.config
        m, n = L.shape[-1], cfg.width
        kq, kv = min(cfg.key_dim, m), min(n - m, m)

        def draw(L_g: Tensor, gen: torch.Generator) -> Tensor:
            g, opts = L_g.shape[0], {"dtype": L_g.dtype, "device": L_g.device}
            C = wishart_factor(cfg.key_dim, m, g, gen, **opts)
            normals = torch.randn((g, m, kq + m), generator=gen, **opts)
            F = wishart_factor(n - m, m, g, gen, **opts)
            return torch.cat([C, normals, F], dim=-1)

        C, N, G, F = self.rng.per_group(draw, L).split([kq, kq, m, kv], dim=-1)
        A = attention_matrix(L @ N, L @ C, cfg)
        return residual_update(L, A @ L, G, F, cfg.lam, cfg.branch_weight / math.sqrt(n))

    def _mlp(self, L: Tensor) -> Tensor:
        cfg = self.config
        m, n = L.shape[-1], cfg.width
        kv = min(n - m, m)
        s_plus, s_minus, c = relu_slopes(cfg)
        cols = min(n, max(1, HIDDEN_ELEMENTS // (self.group_size * m)))

        def draw(L_g: Tensor, gen: torch.Generator) -> Tensor:
            g, opts = L_g.shape[0], {"dtype": L_g.dtype, "device": L_g.device}
            R = torch.zeros((g, m, m), **opts)  # R^T R = phi phi^T of the columns so far
            for start in range(0, n, cols):
                Z = torch.randn((g, m, min(cols, n - start)), generator=gen, **opts)
                phi = shaped_relu(L_g @ Z, s_plus, s_minus)
                R = torch.linalg.qr(torch.cat([R, phi.mT], dim=-2), mode="r").R
            B = R.mT / math.sqrt(n)  # B B^T = K
            G = torch.randn((g, m, m), generator=gen, **opts)
            F = wishart_factor(n - m, m, g, gen, **opts)
            return torch.cat([B, G, F], dim=-1)

        B, G, F = self.rng.per_group(draw, L).split([m, m, kv], dim=-1)
        return residual_update(L, B, G, F, cfg.lam, cfg.branch_weight * math.sqrt(c / n))


SAMPLERS["gram"] = GramSampler

__all__ = ["HIDDEN_ELEMENTS", "GramSampler", "residual_update"]
