"""Low-rank bottleneck of attention heads [BH] (docs/theory.md#head-size)."""

import math

import numpy as np
import pytest
import torch

from shapedtx import ModelConfig
from shapedtx.bottleneck import (
    attention_of,
    check_stochastic,
    counterexample_p,
    counterexample_x,
    fit_attention,
    logit_rank,
    rank_lower_bound,
    rank_one_lower_bound,
    realise_attention,
    realise_attention_low_rank,
    zero_token_distance,
)
from shapedtx.nn import SoftmaxAttention

F64 = torch.float64


def _random_problem(m, n, seed, batch=()):
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(*batch, m, n, generator=gen, dtype=F64)
    P = torch.softmax(2.0 * torch.randn(*batch, m, m, generator=gen, dtype=F64), dim=-1)
    return X, P


# Construction (Theorem 1) ---------------------------------------------------------------------
@pytest.mark.parametrize(("m", "n", "head_size"), [(2, 2, 2), (3, 5, 3), (5, 8, 7), (8, 8, 8)])
def test_construction_reproduces_P(m, n, head_size):
    for seed in range(3):
        X, P = _random_problem(m, n, seed)
        W_Q, W_K = realise_attention(X, P, head_size)
        assert W_Q.shape == W_K.shape == (n, head_size)
        assert (attention_of(X, W_Q, W_K) - P).abs().max() < 1e-8


def test_construction_batched_and_any_row_scale():
    X, P = _random_problem(4, 6, seed=7, batch=(3,))
    row_scale = torch.tensor([0.1, 1.0, 5.0, 40.0], dtype=F64)
    for scale in (None, row_scale):
        W_Q, W_K = realise_attention(X, P, 4, row_scale=scale)
        assert (attention_of(X, W_Q, W_K) - P).abs().max() < 1e-8


def test_diagonal_must_act_on_rows():
    # softmax removes per-row constants (D0 P), not per-column ones (P D0): a column scaling
    # changes the attention, so log(P D0) in docs/theory.md#head-size must be read as log(D0 P).
    _, P = _random_problem(4, 4, seed=1)
    d = torch.tensor([0.5, 1.0, 2.0, 4.0], dtype=F64)
    assert torch.allclose(torch.softmax(P.log() + d.log()[:, None], -1), P, atol=1e-12)
    assert (torch.softmax(P.log() + d.log()[None, :], -1) - P).abs().max() > 1e-2


def test_realised_weights_work_in_the_library_layer():
    m, n, head_size = 4, 6, 5
    X, P = _random_problem(m, n, seed=3)
    W_Q, W_K = realise_attention(X, P, head_size)
    layer = SoftmaxAttention(ModelConfig(width=n, depth=1, heads=1, key_dim=head_size)).double()
    with torch.no_grad():  # nn.Linear computes x W^T: weight = (W / sqrt(n))^T
        layer.layers["query"].weight.copy_((W_Q / math.sqrt(n)).T)
        layer.layers["key"].weight.copy_((W_K / math.sqrt(n)).T)
    A = layer.attention_matrix(X[None])[0, 0]
    assert (A - P).abs().max() < 1e-8


@pytest.mark.parametrize(("m", "n"), [(2, 2), (3, 4), (5, 5), (8, 11)])
def test_head_size_m_minus_1_suffices_for_full_rank_X(m, n):
    # the softmax removes per-row constants, so the centred log P (rank m - 1) is enough
    X, P = _random_problem(m, n, seed=m)
    assert int(logit_rank(P)) == m - 1
    W_Q, W_K = realise_attention_low_rank(X, P, m - 1)
    assert W_Q.shape == (n, m - 1)
    assert (attention_of(X, W_Q, W_K) - P).abs().max() < 1e-8
    W_Q, W_K = realise_attention_low_rank(X, P, m + 2)  # larger heads: zero-padded
    assert (attention_of(X, W_Q, W_K) - P).abs().max() < 1e-8
    if m > 2:
        assert float(rank_lower_bound(P, m - 2)) > 0  # and m - 2 cannot reach it
        with pytest.raises(ValueError, match="head_size"):
            realise_attention_low_rank(X, P, m - 2)


def test_low_rank_target_needs_only_its_rank():
    gen = torch.Generator().manual_seed(4)
    m = 6
    u, v = torch.randn(2, m, 1, generator=gen, dtype=F64)
    P = torch.softmax(u @ v.T, dim=-1)  # rank-1 logits
    assert int(logit_rank(P)) == 1 and float(rank_lower_bound(P, 1)) < 1e-12
    X = torch.randn(m, m, generator=gen, dtype=F64)
    W_Q, W_K = realise_attention_low_rank(X, P, 1)
    assert (attention_of(X, W_Q, W_K) - P).abs().max() < 1e-8


# Counterexample of docs/theory.md#head-size: d_p = 1, m = 3, X = I
# ----------------------------------
def test_section_8_counterexample_is_unreachable_with_head_size_1():
    """Every row of a d_p = 1 head is softmax(s_i b): at most two rows peak on their own token,
    so ||A - P||_F >= 0.7 / sqrt(2) for P = 0.7 I + 0.1 11^T. Random heads and the optimiser
    respect the bound (a positive distance), while d_p = 2 = m - 1 reaches P exactly."""
    X, P = counterexample_x(), counterexample_p()
    assert torch.linalg.matrix_rank(X) == 3
    bound = float(rank_one_lower_bound(P))
    assert bound == pytest.approx(0.7 / math.sqrt(2))
    assert float(rank_lower_bound(P, 1)) == pytest.approx(0.05)  # the generic bound is weaker
    gen = torch.Generator().manual_seed(0)
    W_Q = 5 * torch.randn(5000, 3, 1, generator=gen, dtype=F64)
    W_K = 5 * torch.randn(5000, 3, 1, generator=gen, dtype=F64)
    dist = torch.linalg.matrix_norm(attention_of(X, W_Q, W_K) - P)
    assert float(dist.min()) >= bound
    fit = fit_attention(X, P, 1, restarts=8, steps=400, lr=0.1)
    assert fit.distance >= bound and float(fit.distances.min()) >= bound
    own_peak = fit.attention.argmax(-1) == torch.arange(3)
    assert int(own_peak.sum()) <= 2  # at most two rows peak on their own token
    # d_p = m - 1 suffices (docs/theory.md#head-size): exact construction and optimisation
    W_Q, W_K = realise_attention_low_rank(X, P, 2)
    assert (attention_of(X, W_Q, W_K) - P).abs().max() < 1e-10
    assert fit_attention(X, P, 2, restarts=8, steps=400, lr=0.1).distance < 0.1 * bound


def test_rank_one_bound_is_zero_when_reachable_and_holds_for_random_targets():
    # a P realised by a rank-1 head has bound 0; random targets: every rank-1 head respects it
    gen = torch.Generator().manual_seed(3)
    X = torch.randn(4, 4, generator=gen, dtype=F64)
    w = torch.randn(2, 4, 1, generator=gen, dtype=F64)
    assert float(rank_one_lower_bound(attention_of(X, w[0], w[1]))) < 1e-12
    _, P = _random_problem(4, 4, seed=5, batch=(20,))
    bounds = rank_one_lower_bound(P)
    W_Q = 4 * torch.randn(500, 1, 4, 1, generator=gen, dtype=F64)
    W_K = 4 * torch.randn(500, 1, 4, 1, generator=gen, dtype=F64)
    dist = torch.linalg.matrix_norm(attention_of(X, W_Q, W_K) - P)  # (500, 20)
    assert bool((dist >= bounds - 1e-12).all()) and float(bounds.max()) > 0.05


# X = [[1], [0]]: rank 1, no head-size counterexample (docs/theory.md#head-size)
# ----------------------
def test_zero_token_row_is_fixed_for_every_head():
    X = torch.tensor([[1.0], [0.0]], dtype=F64)
    gen = torch.Generator().manual_seed(0)
    for head_size in (1, 2, 3):
        W_Q = 10 * torch.randn(500, 1, head_size, generator=gen, dtype=F64)
        W_K = 10 * torch.randn(500, 1, head_size, generator=gen, dtype=F64)
        A = attention_of(X, W_Q, W_K)
        assert torch.equal(A[:, 1], torch.full((500, 2), 0.5, dtype=F64))
        w = (W_Q * W_K).sum(-1)[:, 0] / math.sqrt(head_size)  # logit of token 1 on itself
        assert torch.allclose(A[:, 0, 0], torch.sigmoid(w), atol=1e-14)
    P = torch.tensor([[0.9, 0.1], [0.2, 0.8]], dtype=F64)
    bound = float(zero_token_distance(P))
    assert bound == pytest.approx(math.sqrt(2) * 0.3)
    # larger heads do not help: the distance is the same for d_p = 1 and d_p = 2
    for head_size in (1, 2):
        fit = fit_attention(X, P, head_size, restarts=8, steps=300, lr=0.1)
        assert bound - 1e-12 <= fit.distance < bound + 1e-3
    with pytest.raises(ValueError, match="X must have full row rank"):
        realise_attention(X, P, 2)


# Rank lower bound for full-rank X -------------------------------------------------------------
def test_rank_lower_bound_holds_and_small_heads_stay_away():
    m = 4
    X, P = _random_problem(m, m, seed=11)
    bound = float(rank_lower_bound(P, 1))
    assert bound > 1e-3
    assert float(rank_lower_bound(P, m - 1)) < 1e-12  # centred log P has rank m - 1
    # the bound holds for many random rank-1 heads
    gen = torch.Generator().manual_seed(1)
    W_Q = 3 * torch.randn(2000, m, 1, generator=gen, dtype=F64)
    W_K = 3 * torch.randn(2000, m, 1, generator=gen, dtype=F64)
    dist = torch.linalg.matrix_norm(attention_of(X, W_Q, W_K) - P)
    assert float(dist.min()) >= bound
    # optimisation: head size 1 stalls well above zero, head size m gets close to P
    small = fit_attention(X, P, 1, restarts=8, steps=400, lr=0.1)
    full = fit_attention(X, P, m, restarts=8, steps=400, lr=0.1)
    assert small.distance >= bound
    assert small.distance > 0.05
    assert full.distance < 0.1 * small.distance


def test_fit_is_reproducible():
    X, P = _random_problem(3, 3, seed=2)
    a = fit_attention(X, P, 1, restarts=2, steps=20, seed=5)
    b = fit_attention(X, P, 1, restarts=2, steps=20, seed=5)
    assert torch.equal(a.distances, b.distances)


# Bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda X, P: realise_attention(X, P, 2), "head_size"),
        (lambda X, P: realise_attention(X, P, 3.0), "head_size"),
        (lambda X, P: realise_attention(X[:, :2], P, 3), "X must have full row rank"),
        (lambda X, P: realise_attention(X * float("nan"), P, 3), "X must be finite"),
        (lambda X, P: realise_attention(X, P[:2], 3), "P must be square"),
        (lambda X, P: realise_attention(X, P[:2, :2] / P[:2, :2].sum(-1, True), 3), "P must be"),
        (lambda X, P: realise_attention(X, P * 1.1, 3), "row-stochastic"),
        (lambda X, P: realise_attention(X, P, 3, row_scale=-torch.ones(3)), "row_scale"),
        (lambda X, P: check_stochastic(torch.eye(3, dtype=F64)), "positive"),
        (lambda X, P: rank_lower_bound(P, -1), "rank"),
        (lambda X, P: zero_token_distance(P), r"\(\.\.\., 2, 2\)"),
        (lambda X, P: fit_attention(X, P, 0), "head_size"),
        (lambda X, P: realise_attention_low_rank(X, P, 1), "head_size"),
        (lambda X, P: realise_attention_low_rank(X[:, :2], P, 2), "X must have full row rank"),
        (lambda X, P: fit_attention(X, P, 1, steps=-1), "steps"),
        (lambda X, P: fit_attention(X, P, 1, lr=0.0), "lr"),
        (lambda X, P: fit_attention(X, P, 1, init_scale=float("inf")), "init_scale"),
    ],
)
def test_invalid_inputs(call, match):
    X, P = _random_problem(3, 4, seed=0)
    with pytest.raises(ValueError, match=match):
        call(X, P)


# Independent values (numpy / scipy, hand-computed) ---------------------------------------------
def test_attention_of_is_the_scaled_softmax_by_hand():
    from scipy.special import softmax

    g = torch.Generator().manual_seed(4)
    X, W_Q, W_K = (torch.randn(s, generator=g, dtype=torch.float64) for s in
                   ((3, 5), (5, 2), (5, 2)))  # fmt: skip
    x, wq, wk = X.numpy(), W_Q.numpy(), W_K.numpy()
    logits = (x @ wq / np.sqrt(5)) @ (x @ wk / np.sqrt(5)).T / np.sqrt(2)
    np.testing.assert_allclose(attention_of(X, W_Q, W_K).numpy(), softmax(logits, axis=1),
                               rtol=1e-12)  # fmt: skip


def test_counterexample_distance_and_rank_bound_by_hand():
    P = torch.tensor([[0.7, 0.3], [0.2, 0.8]], dtype=torch.float64)
    assert zero_token_distance(P).item() == pytest.approx(np.sqrt(0.09 + 0.09), rel=1e-12)
    # m = 3: the bound is (min P / 2) min(1, ||tail of the singular values of log(P) C||)
    g = torch.Generator().manual_seed(5)
    P3 = torch.softmax(3 * torch.randn(2, 3, 3, generator=g, dtype=torch.float64), dim=-1)
    C = np.eye(3) - 1 / 3
    for b in range(2):
        s = np.linalg.svd(np.log(P3[b].numpy()) @ C, compute_uv=False)
        assert s[2] < 1e-12 * s[0]  # rank(log(P) C) <= m - 1
        for rank, tail in ((0, np.hypot(s[0], s[1])), (1, s[1]), (2, 0.0)):
            expected = 0.5 * P3[b].min().item() * min(1.0, tail)
            got = rank_lower_bound(P3, rank)[b].item()
            assert got == pytest.approx(expected, rel=1e-9, abs=1e-15)
        assert logit_rank(P3)[b].item() == 2
    assert logit_rank(torch.full((3, 3), 1 / 3, dtype=torch.float64)).item() == 0


def test_logit_rank_tolerance_is_relative_to_log_p():
    """Singular values of log(P) C below rtol * ||log P||_F count as zero."""
    u, v = torch.tensor([1.0, -1.0, 0.0], dtype=F64), torch.tensor([1.0, 0.0, -1.0], dtype=F64)
    w, z = torch.tensor([1.0, 1.0, -2.0], dtype=F64), torch.tensor([1.0, -2.0, 1.0], dtype=F64)
    for eps, rank in ((1e-11, 1), (1e-6, 2)):
        P = torch.softmax(10 * torch.outer(u, v) + eps * torch.outer(w, z), dim=-1)
        assert logit_rank(P).item() == rank


def test_rank_deficient_X_is_refused_and_batches_work():
    gen = torch.Generator().manual_seed(8)
    X = torch.randn(3, 5, generator=gen, dtype=F64)
    X[2] = X[0] + X[1]  # n >= m but rank 2
    P = torch.softmax(torch.randn(3, 3, generator=gen, dtype=F64), dim=-1)
    with pytest.raises(ValueError, match="full row rank"):
        realise_attention(X, P, 3)
    with pytest.raises(ValueError, match="full row rank"):
        realise_attention_low_rank(X, P, 2)
    Xb = torch.randn(2, 3, 5, generator=gen, dtype=F64)
    Pb = torch.softmax(torch.randn(2, 3, 3, generator=gen, dtype=F64), dim=-1)
    W_Q, W_K = realise_attention_low_rank(Xb, Pb, 2)
    assert W_Q.shape == (2, 5, 2)
    torch.testing.assert_close(attention_of(Xb, W_Q, W_K), Pb)
