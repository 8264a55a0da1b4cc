"""The low-rank bottleneck of attention heads [BH] (docs/theory.md#head-size).

Convention (docs/theory.md#layers): tokens ``X: (m, n)`` (rows), ``q = X W^Q / sqrt(n)``,
``k = X W^K / sqrt(n)`` with ``W^Q, W^K: (n, d_p)``, attention
``A = Softmax(q k^T / sqrt(d_p))`` row-wise (row = query). A head's logit matrix
``X W^Q W^K^T X^T`` has rank <= min(d_p, rank X).

* :func:`realise_attention` is the constructive proof of [BH] Theorem 1: for full-rank X
  (rank m) and head size d_p >= m, any positive row-stochastic P is reached exactly.
  :func:`realise_attention_low_rank` does it with head size ``logit_rank(P)`` (m - 1 for a
  generic P): the softmax discards per-row constants, so one dimension is free.
* :func:`fit_attention` finds the best reachable attention by optimisation (batched restarts);
  :func:`rank_lower_bound` and :func:`rank_one_lower_bound` are provable lower bounds on
  ``||A - P||_F`` used to show that small heads stay away from P.
* The counterexample of docs/theory.md#head-size: d_p = 1, m = 3, X = I (:func:`counterexample_x`)
  cannot reach P with rows (.8, .1, .1), (.1, .8, .1), (.1, .1, .8) (:func:`counterexample_p`):
  every softmax row is ``softmax(s_i b)`` for one vector b, so at most two rows peak on their
  own token (:func:`rank_one_lower_bound`: distance >= 0.7 / sqrt(2)); d_p = 2 = m - 1 reaches
  it exactly. X = [[1], [0]] is no head-size counterexample (rank 1; its zero token's row is
  uniform for any d_p): :func:`zero_token_distance`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ._validation import ParameterError, check_int, check_positive
from .attention import softmax_attention_matrix


def _check_matrix(name: str, value: Tensor) -> None:
    if not isinstance(value, Tensor) or value.ndim < 2:
        raise ParameterError(name, f"{name} must be a tensor of shape (..., rows, cols)")
    if not bool(torch.isfinite(value).all()):
        raise ParameterError(name, f"{name} must be finite")


def check_stochastic(P: Tensor, *, atol: float = 1e-10) -> None:
    """Raise ValueError unless P: (..., m, m) is positive and row-stochastic (rows sum to 1)."""
    _check_matrix("P", P)
    if P.shape[-1] != P.shape[-2]:
        raise ParameterError("P", f"P must be square (..., m, m), got shape {tuple(P.shape)}")
    if not bool((P > 0).all()):
        raise ParameterError(
            "P", "P must have strictly positive entries (softmax outputs are positive)"
        )
    err = (P.sum(-1) - 1).abs().max()
    if float(err) > atol:
        raise ParameterError(
            "P", f"P must be row-stochastic: rows sum to 1 within {atol:g}, off by {err:g}"
        )


def attention_of(X: Tensor, W_Q: Tensor, W_K: Tensor) -> Tensor:
    """``Softmax((X W^Q)(X W^K)^T / (n sqrt(d_p)))``; X: (..., m, n), W: (..., n, d_p)."""
    n = X.shape[-1]
    q = X @ W_Q / math.sqrt(n)
    k = X @ W_K / math.sqrt(n)
    return softmax_attention_matrix(q @ k.transpose(-1, -2), W_Q.shape[-1])


def realise_attention(
    X: Tensor, P: Tensor, head_size: int, *, row_scale: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Query/key weights with ``attention_of(X, W_Q, W_K) == P`` exactly [BH, Theorem 1].

    X: (..., m, n) of rank m (so n >= m); P: (..., m, m) positive row-stochastic;
    ``head_size`` d_p >= m. With the pseudo-inverse ``X^+ = X^T (X X^T)^{-1}`` (so
    ``X X^+ = I_m``) and target logits ``M = n sqrt(d_p) log(D0 P)``:
    ``W^Q = X^+ M E``, ``W^K = X^+ E`` with ``E = [I_m, 0]`` (m x d_p), hence
    ``X W^Q W^K^T X^T = M``. ``D0 = diag(row_scale)`` (default I) is any positive diagonal
    acting on the rows; the softmax removes it (a per-row constant in the logits).
    Returns ``(W_Q, W_K)``, each (..., n, d_p). Use float64 for exactness.
    """
    _check_matrix("X", X)
    check_stochastic(P)
    m, n = X.shape[-2], X.shape[-1]
    if P.shape[-1] != m:
        raise ParameterError(
            "P", f"P must be (m, m) with m = X.shape[-2] = {m}, got {tuple(P.shape)}"
        )
    if isinstance(head_size, bool) or not isinstance(head_size, int) or head_size < m:
        raise ParameterError(
            "head_size",
            f"head_size must be an integer >= m = {m} (sequence length) for the exact "
            f"construction, got {head_size!r}",
        )
    if n < m or bool((torch.linalg.matrix_rank(X) < m).any()):
        raise ParameterError(
            "X", f"X must have full row rank m = {m} (needs width n >= m, got n = {n})"
        )
    log_target = P.log()
    if row_scale is not None:
        if row_scale.shape[-1] != m or not bool((row_scale > 0).all()):
            raise ParameterError(
                "row_scale", f"row_scale must be a positive vector of length m = {m}"
            )
        log_target = log_target + row_scale.log().unsqueeze(-1)
    M = n * math.sqrt(head_size) * log_target
    X_pinv = torch.linalg.pinv(X)  # (..., n, m)
    E = torch.zeros(m, head_size, dtype=X.dtype, device=X.device)
    E[:, :m] = torch.eye(m, dtype=X.dtype, device=X.device)
    return X_pinv @ M @ E, X_pinv @ E


def logit_rank(P: Tensor, *, rtol: float = 1e-10) -> Tensor:
    """Numerical rank of the row-centred log target ``log(P) C``, ``C = I - 11^T/m``
    (singular values above ``rtol * ||log P||_F``).

    P: (..., m, m) -> (...) integers in [0, m - 1]. Softmax removes per-row constants, so for
    full-rank X this is the smallest head size that reaches P exactly: smaller heads cannot
    (:func:`rank_lower_bound` is then positive) and this many can
    (:func:`realise_attention_low_rank`). For a generic P it is m - 1, one below the
    ``d_p >= m`` of [BH] Theorem 1.
    """
    check_stochastic(P)
    m = P.shape[-1]
    C = torch.eye(m, dtype=P.dtype, device=P.device) - 1.0 / m
    log_p = P.log()
    s = torch.linalg.svdvals(log_p @ C)
    # relative to the size of log(P), not to s_1: a P whose centred log is zero up to
    # round-off (uniform rows) has rank 0, not 1
    scale = torch.linalg.matrix_norm(log_p).clamp(min=torch.finfo(P.dtype).tiny)
    return (s > rtol * scale[..., None]).sum(-1)


def realise_attention_low_rank(
    X: Tensor, P: Tensor, head_size: int, *, rtol: float = 1e-10
) -> tuple[Tensor, Tensor]:
    """Query/key weights reaching P exactly with the smallest possible head size.

    X: (..., m, n) of rank m; P: (..., m, m) positive row-stochastic; ``head_size`` >=
    ``logit_rank(P)`` (m - 1 for a generic P). The logits ``n sqrt(d_p) log(P) C`` (row-centred:
    a per-row constant, removed by the softmax) have rank ``logit_rank(P)``; with their SVD
    ``U S V^T``: ``W^Q = n sqrt(d_p) X^+ U S``, ``W^K = X^+ V`` (truncated to ``head_size``
    columns, zero-padded). Returns ``(W_Q, W_K)``, each (..., n, d_p).
    """
    _check_matrix("X", X)
    m, n = X.shape[-2], X.shape[-1]
    if P.ndim < 2 or P.shape[-1] != m:
        raise ParameterError(
            "P", f"P must be (m, m) with m = X.shape[-2] = {m}, got {tuple(P.shape)}"
        )
    rank = int(logit_rank(P, rtol=rtol).max())
    if isinstance(head_size, bool) or not isinstance(head_size, int) or head_size < max(rank, 1):
        raise ParameterError(
            "head_size",
            f"head_size must be an integer >= logit_rank(P) = {rank} (no smaller head reaches "
            f"P), got {head_size!r}",
        )
    if n < m or bool((torch.linalg.matrix_rank(X) < m).any()):
        raise ParameterError(
            "X", f"X must have full row rank m = {m} (needs width n >= m, got n = {n})"
        )
    m_centre = torch.eye(m, dtype=P.dtype, device=P.device) - 1.0 / m
    U, S, Vh = torch.linalg.svd(P.log() @ m_centre)
    k = min(head_size, m)
    pad = (0, head_size - k)
    X_pinv = torch.linalg.pinv(X)
    W_Q = n * math.sqrt(head_size) * X_pinv @ (U[..., :k] * S[..., None, :k])
    W_K = X_pinv @ Vh[..., :k, :].transpose(-1, -2)
    return torch.nn.functional.pad(W_Q, pad), torch.nn.functional.pad(W_K, pad)


# Lower bounds -----------------------------------------------------------------------------------
#: The head-size counterexample of docs/theory.md#head-size: d_p = 1, m = 3, X = I (rank 3), and the
#: target P with 0.8 on the diagonal and 0.1 elsewhere.
COUNTEREXAMPLE_P = ((0.8, 0.1, 0.1), (0.1, 0.8, 0.1), (0.1, 0.1, 0.8))


def counterexample_x(*, dtype: torch.dtype = torch.float64, device=None) -> Tensor:
    """X = I: m = 3 tokens of width 3, full rank (docs/theory.md#head-size)."""
    return torch.eye(len(COUNTEREXAMPLE_P), dtype=dtype, device=device)


def counterexample_p(*, dtype: torch.dtype = torch.float64, device=None) -> Tensor:
    """The target P of docs/theory.md#head-size: rows (.8, .1, .1), (.1, .8, .1), (.1, .1, .8)."""
    return torch.tensor(COUNTEREXAMPLE_P, dtype=dtype, device=device)


def rank_one_lower_bound(P: Tensor) -> Tensor:
    """A provable lower bound on ``||A - P||_F`` over all attention matrices whose logits have
    rank <= 1 (head size d_p = 1, or rank X = 1); P: (..., m, m) -> (...).

    Rank-1 logits are ``Y = s b^T``, so row i of A is ``softmax(s_i b)``: its largest entries
    sit at ``u = argmax b`` (s_i > 0), at ``v = argmin b`` (s_i < 0), or the row is uniform.
    So for every row i, ``a_{ik} <= max(a_{iu}, a_{iv})`` for all k, in particular for the
    argmax ``k_i`` of P's row i, and moving two entries to meet costs at least their gap over
    sqrt(2): ``||a_i - p_i|| >= max(0, p_{ik_i} - max(p_{iu}, p_{iv})) / sqrt(2)``. Minimising
    over the unknown pair (u, v) gives the bound. For the section-8 P (m = 3): at most two rows
    can peak on their own token, so the bound is ``0.7 / sqrt(2)``. (The rank bound
    :func:`rank_lower_bound` gives only ``p_min / 2 = 0.05`` there.)
    """
    check_stochastic(P)
    top = P.amax(-1, keepdim=True)  # (..., m, 1): p_{i k_i}
    other = torch.maximum(P[..., :, :, None], P[..., :, None, :])  # (..., i, u, v)
    gaps = (top[..., None] - other).clamp(min=0)
    per_pair = gaps.square().sum(-3) / 2  # (..., u, v)
    return per_pair.amin(dim=(-2, -1)).sqrt()


def zero_token_distance(P: Tensor) -> Tensor:
    """Exact ``inf ||A - P||_F`` over all heads for X = [[1], [0]] (m = 2, width 1).

    Not a head-size counterexample (docs/theory.md#head-size): X has rank 1 and its second token is
    the zero vector, so that token's logits are constant and its row is [1/2, 1/2] for every
    head size. The first row is ``[sigmoid(w), 1 - sigmoid(w)]``, which reaches any positive
    row, so the infimum is ``||P[1] - [1/2, 1/2]||_2``, attained. P: (..., 2, 2) -> (...).
    """
    check_stochastic(P)
    if P.shape[-1] != 2:
        raise ParameterError("P", f"P must be (..., 2, 2) for X = [[1], [0]], got {tuple(P.shape)}")
    return torch.linalg.vector_norm(P[..., 1, :] - 0.5, dim=-1)


def rank_lower_bound(P: Tensor, rank: int) -> Tensor:
    """A provable lower bound on ``||A - P||_F`` over all attention matrices A whose logits
    have rank <= ``rank`` (one head: rank = min(d_p, rank X)). P: (..., m, m) -> (...).

    Let ``C = I - 11^T/m``, ``p = min P`` and ``e = sqrt(sum_{k > rank} s_k^2)`` with s_k the
    singular values of ``log(P) C``. Any reachable A has ``log(A) C = Y C`` (softmax removes
    per-row constants) with rank <= rank, so ``||log(A) C - log(P) C||_F >= e``
    (Eckart-Young). If ``max|A - P| < p/2`` then every entry of A is > p/2 and
    ``|log a - log p| <= 2 |a - p| / p``, so ``||A - P||_F >= p e / 2``; otherwise
    ``||A - P||_F >= p / 2``. Hence ``||A - P||_F >= (p / 2) min(1, e)``. Positive exactly when
    the centred log-target has rank > ``rank``; zero for every 2 x 2 P (rank(log(P) C) <= 1).
    """
    check_stochastic(P)
    m = P.shape[-1]
    check_int("rank", rank, 0)
    C = torch.eye(m, dtype=P.dtype, device=P.device) - 1.0 / m
    s = torch.linalg.svdvals(P.log() @ C)
    tail = torch.linalg.vector_norm(s[..., rank:], dim=-1)
    return 0.5 * P.amin(dim=(-2, -1)) * tail.clamp(max=1.0)


# Optimisation ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionFit:
    """Best attention found by :func:`fit_attention` (best of the restarts)."""

    distance: float  # ||A - P||_F of the best restart
    attention: Tensor  # (m, m)
    W_Q: Tensor  # (n, d_p)
    W_K: Tensor  # (n, d_p)
    distances: Tensor  # (restarts,) final distance of every restart


def fit_attention(
    X: Tensor,
    P: Tensor,
    head_size: int,
    *,
    restarts: int = 16,
    steps: int = 2000,
    lr: float = 0.05,
    init_scale: float = 1.0,
    seed: int = 0,
) -> AttentionFit:
    """Minimise ``||attention_of(X, W_Q, W_K) - P||_F`` over W_Q, W_K: (n, d_p) with Adam.

    X: (m, n), P: (m, m). Restarts run in parallel on a leading batch dimension (no Python
    loop over them; no host synchronisation inside the step loop). Same seed -> same result.
    Raises ValueError if the optimisation produces non-finite values.
    """
    _check_matrix("X", X)
    check_stochastic(P)
    if X.ndim != 2 or P.shape != (X.shape[0], X.shape[0]):
        raise ParameterError(
            "X", f"X must be (m, n) and P (m, m); got {tuple(X.shape)}, {tuple(P.shape)}"
        )
    check_int("head_size", head_size)
    check_int("restarts", restarts)
    check_int("steps", steps, 0)
    check_positive("lr", lr)
    check_positive("init_scale", init_scale)
    n = X.shape[1]
    gen = torch.Generator(device=X.device).manual_seed(seed)
    shape = (restarts, n, head_size)
    W_Q = (
        init_scale * torch.randn(shape, generator=gen, dtype=X.dtype, device=X.device)
    ).requires_grad_()
    W_K = (
        init_scale * torch.randn(shape, generator=gen, dtype=X.dtype, device=X.device)
    ).requires_grad_()
    opt = torch.optim.Adam([W_Q, W_K], lr=lr)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = (attention_of(X, W_Q, W_K) - P).square().sum()
        loss.backward()
        opt.step()
    with torch.no_grad():
        A = attention_of(X, W_Q, W_K)
        distances = torch.linalg.matrix_norm(A - P)
        if not bool(torch.isfinite(distances).all()):
            raise ValueError("fit_attention diverged (non-finite attention); lower lr")
        best = int(distances.argmin())
        return AttentionFit(
            distance=float(distances[best]),
            attention=A[best],
            W_Q=W_Q[best].detach(),
            W_K=W_K[best].detach(),
            distances=distances,
        )
