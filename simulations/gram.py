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
exactly with O(m^2 n) work (columns in fixed-size batches, so memory stays bounded, their
Gram matrices summed) and B is its Cholesky factor (for the samples where K is numerically
singular, e.g. a ReLU token that is zero on every hidden unit, the symmetric square root of
those samples; on a GPU this check is one host synchronisation per MLP block); W^post is
independent of (X, phi), giving the update above with
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

**Factors.** L' is the Cholesky factor of ``V' = M M^T`` (:func:`residual_update`; the QR
of M^T for the samples where V' is numerically singular). **Draws.** The N(0, 1) numbers of
a block are drawn into one contiguous tensor per kind (N, C, D, G, F; only the entries below
the diagonal of a Bartlett factor), then all chi-square variables (Bartlett diagonals), by
one call per generator group (:meth:`simulations.rng.GroupedNormal.start`). **Speed (CPU).**
The block loop reuses its tensors (:class:`Workspace`; a fresh large tensor costs page
faults) and keeps the factors of every batched product on contiguous stacks of matrices
(numpy's stacked ``matmul`` is several times slower on strided ones; its outputs may be
strided: ``(L C)^T`` is written through a transposed view, no copy); with several threads
the driver runs one sampler per thread on its own groups (``parallel_parts``), the same
numbers for any thread count.

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

import functools
import math
from collections.abc import Callable, Sequence
from typing import ClassVar

import torch
from torch import Tensor

from sde import psd_factor
from shapedtx import ModelConfig, relu_slopes, shaped_relu
from shapedtx._matmul import small_matmul, transpose_into
from shapedtx._memory import empty, zeros
from shapedtx._validation import ParameterError
from shapedtx.blocks import attention_from_logits

from . import _compiled_cholesky as compiled_cholesky
from .rng import GroupedNormal
from .samplers import Sampler
from .wishart import bartlett_dof

HIDDEN_ELEMENTS = 2**22
"""Hidden-layer numbers drawn at once per generator group (bounds the MLP's memory); fixes
the column batch ``max(1, HIDDEN_ELEMENTS // (group_size m))`` and so the random stream."""


class Workspace:
    """Tensors reused from block to block by name, zero-filled when created: the block loop
    allocates (almost) nothing, where each fresh large CPU tensor costs page faults (fewer
    with ``huge_pages``, :func:`shapedtx._memory.empty`). With
    ``keep=False`` every request is a fresh tensor (one-off calls)."""

    def __init__(self, keep: bool = True, huge_pages: bool = False) -> None:
        self._keep = keep
        self._huge_pages = huge_pages
        self._tensors: dict[str, Tensor] = {}

    def get(self, name: str, shape: Sequence[int], like: Tensor) -> Tensor:
        """The tensor ``name`` of ``shape`` with ``like``'s dtype and device."""
        t = self._tensors.get(name)
        if t is None or t.shape != tuple(shape) or t.dtype != like.dtype or t.device != like.device:
            t = zeros(shape, like.dtype, like.device, huge_pages=self._huge_pages)
            if self._keep:
                self._tensors[name] = t
        return t

    def flat(self, name: str, shape: Sequence[int], like: Tensor) -> Tensor:
        """A contiguous tensor of ``shape`` at the start of the flat tensor ``name`` (which
        grows to the largest size asked for): for shapes that vary from call to call."""
        size = math.prod(shape)
        t = self._tensors.get(name)
        if t is None or t.numel() < size or t.dtype != like.dtype or t.device != like.device:
            t = empty((size,), like.dtype, like.device, huge_pages=self._huge_pages)
            if self._keep:
                self._tensors[name] = t
        return t[:size].view(tuple(shape))

    def other(self, name: str, x: Tensor) -> Tensor:
        """One of two tensors ``name`` of x's shape, the one that is not x (used in turn)."""
        a = self.get(name + "0", x.shape, x)
        return self.get(name + "1", x.shape, x) if a.data_ptr() == x.data_ptr() else a


def residual_update(
    L: Tensor,
    B: Tensor,
    G: Tensor,
    F: Tensor,
    lam: float,
    s: float,
    work: Workspace | None = None,
) -> tuple[Tensor, Tensor]:
    """``(L', V')`` after a residual block (module doc); L: (..., m, m), B: (..., m, k), G:
    (..., k, m), F: (..., k, j) -> L': (..., m, m) lower triangular with ``L' L'^T = V'``,
    V': (..., m, m); ``work``: where the results and temporaries go (default: fresh tensors).

    ``V' = M M^T`` with ``M = [P, s B F]``, ``P = lambda L + s B G`` (``= lambda^2 V + lambda
    s (B G L^T + L G^T B^T) + s^2 B (G G^T + F F^T) B^T``); L' is the Cholesky factor of V' (batched
    m x m, much cheaper than a QR on CPU: benchmarks/HISTORY.md, "Gram sampler"), and for
    the samples whose V' is numerically singular ``R^T`` from the QR ``M^T = Q R`` (exact also
    for singular V').
    """
    work = work or Workspace(keep=False)
    m = L.shape[-1]
    M = work.get("M", (*L.shape[:-1], m + F.shape[-1]), L)  # [P, s B F] side by side
    small_matmul(B, G, out=M[..., :m])
    small_matmul(B, F, out=M[..., m:])
    M.mul_(s)[..., :m].add_(L, alpha=lam)
    # V' = M M^T; numpy multiplies contiguous matrices faster than transposed ones
    Mt = transpose_into(M, work.get("Mt", M.mT.shape, L))
    V = small_matmul(M, Mt, out=work.get("V", L.shape, L))
    return _factor(V, lambda: M, work.other("L", L)), V


def gram_factor(M: Tensor) -> Tensor:
    """Lower-triangular L: (..., m, m) with ``L L^T = M M^T``; M: (..., m, j), j >= m.

    The Cholesky factor of ``M M^T``, and ``R^T`` from the QR ``M^T = Q R`` for the samples
    whose ``M M^T`` is numerically singular (on CPU only those samples; on accelerators
    computed for all and selected, with no host synchronisation).
    """
    return _factor(small_matmul(M, transpose_into(M, M.new_empty(M.mT.shape))), lambda: M)


def _cholesky(V: Tensor, out: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(L, bad): the lower Cholesky factor of V: (..., m, m), C-contiguous (into ``out`` if
    given), and where it failed (bool, (...)). On CPU for m <= 32 compiled
    (:mod:`simulations._compiled_cholesky`, faster than LAPACK's batched call there);
    otherwise computed as the upper factor ``U = L^T`` into the transposed view of L:
    LAPACK's column-major output is then L row by row, so torch copies nothing (faster than
    asking for L on CPU, benchmarks/HISTORY.md, "Gram sampler"; and numpy's products take
    L without a copy)."""
    if out is None:
        out = V.new_empty(V.shape)
    if compiled_cholesky.applies(V):
        return out, compiled_cholesky.cholesky(V, out)
    info = V.new_empty(V.shape[:-2], dtype=torch.int32)
    torch.linalg.cholesky_ex(V, upper=True, out=(out.mT, info))
    return out, info != 0


def _factor(V: Tensor, M: Callable[[], Tensor], out: Tensor | None = None) -> Tensor:
    """The Cholesky factor of ``V = M M^T``: (..., m, m), into ``out`` if given; ``M()``
    (built only when needed on CPU) gives the QR fallback for the numerically singular
    samples (:func:`gram_factor`)."""
    out, bad = _cholesky(V, out)
    if bad.device.type == "cpu":
        if bool(bad.any()):
            out[bad] = torch.linalg.qr(M()[bad].mT, mode="r").R.mT
        return out
    return torch.where(bad[..., None, None], torch.linalg.qr(M().mT, mode="r").R.mT, out)


def _hidden_factor(K: Tensor) -> Tensor:
    """B: (..., m, m) with ``B B^T = K`` (the hidden Gram matrix, symmetric PSD): its Cholesky
    factor, and for the samples where K is numerically singular (e.g. a ReLU token that is
    zero on every hidden unit) the symmetric square root after clipping rounding-negative
    eigenvalues (:func:`sde.psd_factor`), for those samples only (one host check, also on
    accelerators, where ``eigh`` would synchronise anyway)."""
    B, bad = _cholesky(K)
    if bool(bad.any()):
        B[bad] = psd_factor(K[bad])[0]
    return B


@functools.lru_cache(maxsize=16)
def _below_diagonal(k: int, device: torch.device) -> Tensor:
    """(1, k (k - 1) / 2): flat indices ``i k + j`` of the entries ``j < i`` of a k x k
    matrix, row by row (where the packed numbers of a Bartlett factor go)."""
    rows, cols = torch.tril_indices(k, k, -1, device=device)
    return (rows * k + cols)[None]


class _Layout:
    """The random matrices of a block by name, each one contiguous workspace tensor
    ``(samples, batch, rows, cols)`` (numpy's batched products are several times slower on
    strided stacks): iid N(0, 1) matrices, filled directly, and lower-triangular Bartlett
    factors, whose numbers below the diagonal are drawn packed and placed in a zero-filled
    tensor with ``sqrt(chi^2)`` on the diagonal. Drawn in the order the names were added,
    then all chi-square variables (:meth:`GroupedNormal.start`)."""

    def __init__(self) -> None:
        self._shapes: dict[str, tuple[int, int, int]] = {}  # name -> (batch, rows, cols)
        self._dof: dict[str, int] = {}  # Bartlett factors: name -> degrees of freedom

    def factor(self, name: str, batch: int, rows: int, cols: int, dof: int | None = None) -> None:
        """``batch`` iid N(0, 1) matrices (rows, cols), or with ``dof``, factors F with ``F
        F^T ~ Wishart(dof, I_rows)``: Bartlett (cols = rows) if ``dof >= rows``, else iid
        (rows, dof) matrices."""
        self._shapes[name] = (batch, rows, cols)
        if dof is not None and dof >= rows:
            self._dof[name] = dof

    @functools.cached_property
    def _chi2_dof(self) -> Tensor | None:
        """Degrees of freedom of the Bartlett diagonals, in draw order (None without
        Bartlett factors); fixed once the layout is drawn from."""
        if not self._dof:
            return None
        return torch.cat(
            [
                bartlett_dof(d, self._shapes[name][1], self._shapes[name][0])
                for name, d in self._dof.items()
            ]
        )

    def draw(self, rng: GroupedNormal, work: Workspace, like: Tensor) -> dict[str, Tensor]:
        """This block's matrices, ``(samples, batch, rows, cols)`` workspace tensors by name,
        drawn by one call per generator group."""
        S, buffers = like.shape[0], []
        for name, (h, k, cols) in self._shapes.items():
            per_sample = (h, k * (k - 1) // 2) if name in self._dof else (h, k, cols)
            buffers.append(work.get(name + ".drawn", (S, *per_sample), like))
        drawn, chi = rng.start(buffers, self._chi2_dof, like.dtype).result()
        out = dict(zip(self._shapes, drawn, strict=True))
        if chi is None:
            return out
        diagonals = chi.to(like.device).sqrt_()
        start = 0
        for name in self._dof:
            h, k, _ = self._shapes[name]
            T = work.get(name, (S, h, k, k), like)  # stays zero above the diagonal
            below = _below_diagonal(k, like.device).expand(S * h, -1)  # row by row
            T.view(S * h, k * k).scatter_(1, below, out[name].view(S * h, -1))
            T.diagonal(dim1=-2, dim2=-1).copy_(diagonals[:, start : start + h * k].view(S, h, k))
            out[name], start = T, start + h * k
        return out


class GramSampler(Sampler):
    """``method="gram"``: V is a Markov chain sampled from m x m Gaussian and Wishart matrices
    (module doc). State: ``(L, V)``, L: (samples, m, m) lower triangular with ``L L^T = V``."""

    group_size: ClassVar[int] = 256
    parallel_parts: ClassVar[bool] = True

    def __init__(
        self, config: ModelConfig, rng: GroupedNormal, *, huge_pages: bool = False
    ) -> None:
        super().__init__(config, rng, huge_pages=huge_pages)
        self._work = Workspace(huge_pages=self.huge_pages)
        self._layouts: dict[str, _Layout] = {}

    @classmethod
    def check(cls, config: ModelConfig) -> None:
        problems = []
        if config.attention == "simplified":
            problems.append("attention='simplified' (He & Hofmann's blocks)")
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
            raise ParameterError(
                "method",
                "method 'gram' does not support " + "; ".join(problems) + ". Supported: "
                "shaped or softmax attention (any key_dim, causal or not) with one head, or "
                "any number of heads and head size with W^O (out_proj=True); "
                "shaped_relu/relu/no MLP with mlp_ratio=1, norm='none', init='fan_in', scaled "
                "or unit residual; use method='exact' otherwise",
            )

    @classmethod
    def memory(cls, config: ModelConfig, m: int, dtype: torch.dtype) -> tuple[int, int]:
        itemsize = torch.empty((), dtype=dtype).element_size()
        # one group's hidden batch (normals and activations) per thread
        threads = torch.get_num_threads()
        hidden = 2 * HIDDEN_ELEMENTS * itemsize * threads if config.mlp != "none" else 0
        heads = config.heads if config.attention != "none" else 0
        return (24 + 8 * heads) * m * m * itemsize, hidden

    def init(self, V0: Tensor, samples: int) -> tuple[Tensor, Tensor]:
        shape = (samples, *V0.shape)
        L = self._work.get("L0", shape, V0).copy_(torch.linalg.cholesky(V0))
        return L, V0.expand(shape)

    def covariance(self, state: tuple[Tensor, Tensor]) -> Tensor:
        return state[1]

    def step(self, state: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        if self.config.attention != "none":
            state = self._attention(state[0])
        if self.config.mlp != "none":
            state = self._mlp(state[0])
        return state

    # ----------------------------------------------------------------------------------------
    def _attention_shapes(self, m: int) -> tuple[int, int, int, int]:
        """(kq, kd, k, kv): columns of the query/key factors N, C, of the head factors D, of
        the branch factor B: (m, k), and of F (module doc)."""
        cfg = self.config
        kq, kd = min(cfg.key_dim, m), min(cfg.head_dim, m)
        k = (m if cfg.heads * kd >= m else cfg.heads * kd) if cfg.out_proj else m
        return kq, kd, k, min(cfg.width - m, k)

    def _layout(self, name: str, m: int) -> _Layout:
        """The matrices of an attention or MLP block (module doc), created on first use."""
        if name in self._layouts:
            return self._layouts[name]
        cfg, H, n = self.config, self.config.heads, self.config.width
        layout = _Layout()
        if name == "attention":
            kq, kd, k, kv = self._attention_shapes(m)
            layout.factor("N", H, m, kq)
            layout.factor("C", H, m, kq, cfg.key_dim)
            if cfg.out_proj:
                layout.factor("D", H, m, kd, cfg.head_dim)
        else:
            k, kv = m, min(n - m, m)
        layout.factor("G", 1, k, m)
        layout.factor("F", 1, k, kv, n - m)
        self._layouts[name] = layout
        return layout

    def _attention(self, L: Tensor) -> tuple[Tensor, Tensor]:
        cfg, work = self.config, self._work
        S, m, n, H = L.shape[0], L.shape[-1], cfg.width, cfg.heads
        kq, kd, k, _ = self._attention_shapes(m)
        Z = self._layout("attention", m).draw(self.rng, work, L)
        LN = small_matmul(L[:, None], Z["N"], out=work.get("LN", (S, H, m, kq), L))
        LCt = work.get("LCt", (S, H, kq, m), L)  # (L C)^T, written transposed: no copy
        small_matmul(L[:, None], Z["C"], out=LCt.mT)
        Y = small_matmul(LN, LCt, out=work.get("Y", (S, H, m, m), L))
        A = attention_from_logits(Y, cfg, overwrite=True)  # (S, H, m, m)
        if cfg.out_proj:  # O O^T = sum_h A_h L D_h D_h^T L^T A_h^T with D_h D_h^T ~ Wishart(d_p)
            P = small_matmul(A, small_matmul(L[:, None], Z["D"])).transpose(1, 2)
            P = P.reshape(S, m, H * kd)
            B = gram_factor(P) if k == m else P  # any B with B B^T = O O^T
            s = cfg.branch_weight / math.sqrt(n * cfg.value_dim)
        else:
            B = small_matmul(A[:, 0], L, out=work.get("B", L.shape, L))
            s = cfg.branch_weight / math.sqrt(n)
        return residual_update(L, B, Z["G"][:, 0], Z["F"][:, 0], cfg.lam, s, work)

    def _mlp(self, L: Tensor) -> tuple[Tensor, Tensor]:
        cfg, work = self.config, self._work
        m, n = L.shape[-1], cfg.width
        s_plus, s_minus, c = relu_slopes(cfg)
        cols = min(n, max(1, HIDDEN_ELEMENTS // (self.group_size * m)))
        K = work.get("K", L.shape, L)  # the hidden Gram matrices phi phi^T
        for rows, rng in self.rng.split():  # one group at a time: bounded memory
            L_g, K_g = L[rows], K[rows]
            g = L_g.shape[0]
            for start in range(0, n, cols):  # the hidden columns in batches
                width = min(cols, n - start)
                Z_g = rng.fill_normal(work.flat("hidden.normals", (g, m * width), L))
                pre = small_matmul(
                    L_g, Z_g.view(g, m, width), out=work.flat("hidden", (g, m, width), L)
                )
                phi = shaped_relu(pre, s_plus, s_minus, overwrite=True)
                gram = small_matmul(phi, phi.mT)
                if start == 0:
                    K_g.copy_(gram)
                else:
                    K_g.add_(gram)
        B = _hidden_factor(K.div_(n))
        Z = self._layout("mlp", m).draw(self.rng, work, L)
        s = cfg.branch_weight * math.sqrt(c / n)
        return residual_update(L, B, Z["G"][:, 0], Z["F"][:, 0], cfg.lam, s, work)


__all__ = ["HIDDEN_ELEMENTS", "GramSampler", "Workspace", "gram_factor", "residual_update"]
