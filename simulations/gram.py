"""The width-independent exact sampler ``method="gram"`` (docs/theory.md#samplers).

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

**Multi-head attention with W^O** (``X' = lambda X + gamma O W^O / sqrt(n_h d_p)``,
``O = [A_1 X W^V_1, ..., A_H X W^V_H] / sqrt(n)``, any head size d_p, docs/theory.md#head-size):
``X W^V_h / sqrt(n) = L Z_h`` with ``Z_h = Q^T W^V_h``: (m, d_p) iid, independent over heads,
so ``O = [A_h L Z_h]_h`` and ``O O^T = sum_h A_h L (Z_h Z_h^T) L^T A_h^T`` with
``Z_h Z_h^T = D_h D_h^T ~ Wishart(d_p, I_m)`` (D_h its Bartlett factor, or Z_h itself when
d_p < m). ``O^T = Q_O R_O`` gives ``O W^O = R_O^T (Q_O^T W^O)`` with ``Q_O^T W^O`` iid and
independent of X, which is the residual update above with ``B B^T = O O^T`` (B the Cholesky
factor of ``P P^T``, ``P = [A_h L D_h]_h``, or P itself when ``H min(d_p, m) < m``; then
G: (k, m), F: Wishart(n - m, I_k)) and ``s = gamma / sqrt(n n_h d_p)``. The chain on V stays
Markov. Each head has its own logits ``(L N_h)(L C_h)^T``.

**Factors.** L' is the Cholesky factor of ``V' = M M^T`` (:func:`gram_factor`; the QR of
M^T for the samples where V' is numerically singular). **Draws.** The N(0, 1) numbers of a
block come from one contiguous tensor per kind (N, C, G, F, D), filled with all chi-square
variables (Bartlett diagonals) by one task per generator group
(:meth:`simulations.rng.GroupedNormal.start`); without an MLP the next block's are started
before this block is computed (helper threads fill them meanwhile). The MLP's hidden layer
runs one group per thread (:meth:`simulations.rng.GroupedNormal.map_groups`).

**Cost per block and sample.** Attention-only networks: O(H m^3), independent of the width
and of n_k, d_p. With an MLP: O(m^2 n) (the hidden Gram matrix; exact, no approximation).

**Supported configurations.** attention in {shaped, softmax, none} with one head and no W^O
(any key_dim), or any number of heads and head size with W^O (``out_proj=True``), causal or
not; mlp in {shaped_relu, relu, none} with ``mlp_ratio=1``; ``norm="none"``;
``init="fan_in"``. Rejected with ValueError: ``norm="pre"``/``"post"`` (LayerNorm centres
each token over its features, which depends on X beyond X X^T) and ``heads > 1`` without W^O
(each head writes its own block of residual columns, so X X'^T depends on how X splits over
those columns, not only on V).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import ClassVar

import torch
from torch import Tensor

from shapedtx import ModelConfig, relu_slopes, shaped_relu
from shapedtx._matmul import small_matmul
from shapedtx.blocks import attention_matrix

from .rng import Draw, GroupedNormal, PendingDraw
from .samplers import SAMPLERS, Sampler

HIDDEN_ELEMENTS = 2**22
"""Hidden-layer numbers drawn at once per generator group (bounds the MLP's memory); fixes
the column batch ``max(1, HIDDEN_ELEMENTS // (group_size m))`` and so the random stream."""


def residual_update(L: Tensor, B: Tensor, G: Tensor, F: Tensor, lam: float, s: float) -> Tensor:
    """The factor L' of ``V' = lambda^2 V + lambda s (B G L^T + L G^T B^T) + s^2 B (G G^T +
    F F^T) B^T`` (module doc); L: (..., m, m), B: (..., m, k), G: (..., k, m), F: (..., k, j)
    -> L': (..., m, m) lower triangular with ``L' L'^T = V'``.

    ``V' = P P^T + s^2 (B F)(B F)^T`` with ``P = lambda L + s B G``; L' is the Cholesky factor
    of V' (batched m x m, about 15x cheaper than a QR on CPU), and for the samples whose V' is
    numerically singular ``R^T`` from the QR ``M^T = Q R`` of ``M = [P, s B F]`` (exact also
    for singular V').
    """
    P = small_matmul(B, G).mul_(s).add_(L, alpha=lam)
    BF = small_matmul(B, F)
    V = small_matmul(BF, BF.mT).mul_(s * s).add_(small_matmul(P, P.mT))
    return _factor(V, lambda: torch.cat([P, s * BF], dim=-1))


def gram_factor(M: Tensor) -> Tensor:
    """Lower-triangular L: (..., m, m) with ``L L^T = M M^T``; M: (..., m, j), j >= m.

    The Cholesky factor of ``M M^T``, and ``R^T`` from the QR ``M^T = Q R`` for the samples
    whose ``M M^T`` is numerically singular (on CPU only those samples; on accelerators
    computed for all and selected, with no host synchronisation).
    """
    return _factor(small_matmul(M, M.mT), lambda: M)


def _factor(V: Tensor, M: Callable[[], Tensor]) -> Tensor:
    """The Cholesky factor of ``V = M M^T``: (..., m, m); ``M()`` (built only when needed on
    CPU) gives the QR fallback for the numerically singular samples (:func:`gram_factor`)."""
    out, info = torch.linalg.cholesky_ex(V)
    bad = info != 0
    if bad.device.type == "cpu":
        if bool(bad.any()):
            out[bad] = torch.linalg.qr(M()[bad].mT, mode="r").R.mT
        return out
    return torch.where(bad[..., None, None], torch.linalg.qr(M().mT, mode="r").R.mT, out)


def _triangular(packed: Tensor, diag: Tensor) -> Tensor:
    """Lower-triangular (..., k, k) from the strictly lower entries ``packed: (..., k(k-1)/2)``
    (row-major, as ``torch.tril_indices(k, k, -1)``) and the diagonal ``diag: (..., k)``."""
    k = diag.shape[-1]
    rows, cols = torch.tril_indices(k, k, -1, device=diag.device)
    T = diag.new_zeros((*diag.shape[:-1], k * k))
    T.index_copy_(-1, rows * k + cols, packed)
    T = T.view(*diag.shape, k)
    T.diagonal(dim1=-2, dim2=-1).copy_(diag)
    return T


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
        if config.attention != "none" and config.heads != 1 and not config.out_proj:
            problems.append(
                f"heads={config.heads} without W^O (out_proj=False: each head writes its own "
                "residual columns)"
            )
        if problems:
            raise ValueError(
                "method 'gram' does not support " + "; ".join(problems) + ". Supported: "
                "shaped or softmax attention (any key_dim, causal or not) with one head, or "
                "any number of heads and head size with W^O (out_proj=True); "
                "shaped_relu/relu/no MLP with mlp_ratio=1, norm='none', init='fan_in', scaled "
                "or unit residual; use method='exact' otherwise"
            )

    @classmethod
    def memory(cls, config: ModelConfig, m: int, dtype: torch.dtype) -> tuple[int, int]:
        itemsize = torch.empty((), dtype=dtype).element_size()
        # one group's hidden batch per thread (the MLP's groups run on torch's thread count)
        threads = torch.get_num_threads()
        hidden = 4 * HIDDEN_ELEMENTS * itemsize * threads if config.mlp != "none" else 0
        heads = config.heads if config.attention != "none" else 0
        ahead = 0  # the attention draws of the next block, drawn ahead without an MLP
        if config.attention != "none" and config.mlp == "none":
            parts, _, _ = cls._attention_layout(config, m)
            ahead = sum(math.prod(shape) for shape in parts.values())
        return ((24 + 8 * heads) * m * m + ahead) * itemsize, hidden

    def init(self, V0: Tensor, samples: int) -> Tensor:
        return torch.linalg.cholesky(V0).expand(samples, *V0.shape).clone()

    def covariance(self, L: Tensor) -> Tensor:
        return small_matmul(L, L.mT)

    def step(self, L: Tensor) -> Tensor:
        if self.config.attention != "none":
            L = self._attention(L)
        if self.config.mlp != "none":
            L = self._mlp(L)
        return L

    # ----------------------------------------------------------------------------------------
    def _attention(self, L: Tensor) -> Tensor:
        cfg = self.config
        S, m, n, H = L.shape[0], L.shape[-1], cfg.width, cfg.heads
        kd = min(cfg.head_dim, m)
        parts, chi_dofs, k = self._attention_layout(cfg, m)
        # drawn ahead only without an MLP, whose hidden draws come first from the same
        # generators
        draws = self._block_draws(
            lambda: self._start_draws(S, parts, chi_dofs, L.dtype, L.device),
            ahead=cfg.mlp == "none",
        )
        Z = self._assemble(draws, parts, chi_dofs, L.device)
        Z["F"] = Z["F"][:, 0]
        LN, LC = small_matmul(L[:, None], Z["N"]), small_matmul(L[:, None], Z["C"])
        A = attention_matrix(LN, LC, cfg)  # (S, H, m, m)
        if cfg.out_proj:  # O O^T = sum_h A_h L D_h D_h^T L^T A_h^T with D_h D_h^T ~ Wishart(d_p)
            P = small_matmul(A, small_matmul(L[:, None], Z["D"])).transpose(1, 2)
            P = P.reshape(S, m, H * kd)
            B = gram_factor(P) if k == m else P  # any B with B B^T = O O^T
            s = cfg.branch_weight / math.sqrt(n * cfg.value_dim)
        else:
            B = small_matmul(A[:, 0], L)
            s = cfg.branch_weight / math.sqrt(n)
        return residual_update(L, B, Z["G"], Z["F"], cfg.lam, s)

    @staticmethod
    def _attention_layout(
        cfg: ModelConfig, m: int
    ) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, int, int]], int]:
        """(normal draws per sample: name -> shape, Bartlett factors: name -> (degrees of
        freedom, heads, size), k the columns of the branch factor B) of an attention block."""
        n, H = cfg.width, cfg.heads
        kq, kd = min(cfg.key_dim, m), min(cfg.head_dim, m)
        # the branch factor B: (m, k) and its scale s (module doc)
        k = (m if H * kd >= m else H * kd) if cfg.out_proj else m
        kv = min(n - m, k)
        chi_dofs = {}
        if cfg.key_dim >= m:
            chi_dofs["C"] = (cfg.key_dim, H, m)
        if cfg.out_proj and cfg.head_dim >= m:
            chi_dofs["D"] = (cfg.head_dim, H, m)
        if n - m >= k:
            chi_dofs["F"] = (n - m, 1, k)
        full = {"N": (H, m, kq), "C": (H, m, kq), "G": (k, m), "F": (1, k, kv)}
        if cfg.out_proj:
            full["D"] = (H, m, kd)
        # Bartlett factors draw only their strictly lower triangle
        parts = {
            name: (shape[0], shape[1] * (shape[1] - 1) // 2) if name in chi_dofs else shape
            for name, shape in full.items()
        }
        return parts, chi_dofs, k

    def _start_draws(
        self,
        S: int,
        parts: Mapping[str, tuple[int, ...]],
        dofs: Mapping[str, tuple[int, int, int]],
        dtype: torch.dtype,
        device: torch.device,
    ) -> PendingDraw[Draw]:
        """Start drawing N(0, 1) numbers for all ``parts`` (name -> shape per sample; one
        contiguous tensor each) and the chi-square variables of the Bartlett diagonals
        ``dofs`` (name -> (k, heads, m): chi^2_{k - i}, i < m, per head): one call per group
        and kind (:meth:`GroupedNormal.start`)."""
        buffers = [torch.empty((S, *shape), dtype=dtype, device=device) for shape in parts.values()]
        dof = None
        if dofs:
            dof = torch.cat(
                [(k - torch.arange(m, dtype=torch.float64)).repeat(h) for k, h, m in dofs.values()]
            )
        return self.rng.start(buffers, dof, dtype)

    @staticmethod
    def _assemble(
        draws: Draw,
        parts: Mapping[str, tuple[int, ...]],
        dofs: Mapping[str, tuple[int, int, int]],
        device: torch.device,
    ) -> dict[str, Tensor]:
        """The draws of :meth:`_start_draws` by name, Bartlett factors assembled."""
        buffers, chi = draws
        Z = dict(zip(parts, buffers, strict=True))
        if chi is not None:
            chi = chi.to(device).sqrt()
            offset = 0
            for name, (_, h, m) in dofs.items():
                Z[name] = _triangular(Z[name], chi[:, offset : offset + h * m].view(-1, h, m))
                offset += h * m
        return Z

    def _mlp(self, L: Tensor) -> Tensor:
        cfg = self.config
        m, n = L.shape[-1], cfg.width
        kv = min(n - m, m)
        s_plus, s_minus, c = relu_slopes(cfg)
        cols = min(n, max(1, HIDDEN_ELEMENTS // (self.group_size * m)))

        def factor(rows: slice, rng: GroupedNormal) -> Tensor:
            """B_g: (g, m, m) with B B^T = K for one group; the hidden columns in blocks."""
            L_g = L[rows]
            g = L_g.shape[0]
            R = L_g.new_zeros((g, m, m))  # R^T R = phi phi^T of the columns so far
            for start in range(0, n, cols):
                width = min(cols, n - start)
                Z_g = rng.fill_normal(L_g.new_empty((g, m * width))).view(g, m, width)
                phi = shaped_relu(small_matmul(L_g, Z_g), s_plus, s_minus)
                R = torch.linalg.qr(torch.cat([R, phi.mT], dim=-2), mode="r").R
            return R.mT / math.sqrt(n)

        # one group at a time per thread (bounded memory), the groups over the rng's workers
        factors = self.rng.map_groups(factor)
        B = factors[0] if len(factors) == 1 else torch.cat(factors)
        bartlett = n - m >= m
        parts = {"G": (m, m), "F": (1, m * (m - 1) // 2) if bartlett else (1, m, kv)}
        dofs = {"F": (n - m, 1, m)} if bartlett else {}
        draws = self._start_draws(L.shape[0], parts, dofs, L.dtype, L.device).result()
        Z = self._assemble(draws, parts, dofs, L.device)
        F = Z["F"]
        return residual_update(L, B, Z["G"], F[:, 0], cfg.lam, cfg.branch_weight * math.sqrt(c / n))


SAMPLERS["gram"] = GramSampler

__all__ = ["HIDDEN_ELEMENTS", "GramSampler", "gram_factor", "residual_update"]
