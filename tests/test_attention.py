"""Shaped / standard attention matrices, logit scaling, fused == explicit
(docs/theory.md#layers)."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shapedtx import Attention, ModelConfig, shaped_attention_matrix
from shapedtx.attention import causal_uniform, shaped_attention, token_mean

pytestmark = pytest.mark.usefixtures("float64_default")


def _logits(n: int, n_k: int, m: int, gen: torch.Generator) -> torch.Tensor:
    X = torch.randn(m, n, generator=gen)
    Wq = torch.randn(n, n_k, generator=gen)
    Wk = torch.randn(n, n_k, generator=gen)
    return (X @ Wq / math.sqrt(n)) @ (X @ Wk / math.sqrt(n)).T


@pytest.mark.parametrize("causal", [False, True])
def test_shaped_rows_sum_to_one_and_tend_to_identity(causal):
    gen = torch.Generator().manual_seed(0)
    Y = _logits(128, 128, 6, gen)
    dists = []
    for tau in (1.0, 10.0, 100.0, 1000.0):
        A = shaped_attention_matrix(Y, tau, causal=causal)
        torch.testing.assert_close(A.sum(-1), torch.ones(6))
        if causal:
            assert torch.all(A.triu(1) == 0)
        dists.append((A - torch.eye(6)).abs().max().item())
    assert all(b < a for a, b in itertools.pairwise(dists))
    assert dists[-1] < 1e-2


def test_causal_uniform():
    C = causal_uniform(4)
    torch.testing.assert_close(C.sum(-1), torch.ones(4))
    assert C[2, 0] == pytest.approx(1 / 3) and C[2, 3] == 0


def test_logit_scaling():
    """Shaped logits Y/tau are O(n^{-1/2}); standard logits Y/sqrt(n_k) are O(1)."""
    gen = torch.Generator().manual_seed(1)
    shaped, standard = {}, {}
    for n in (64, 1024):
        Ys = torch.stack([_logits(n, n, 4, gen) for _ in range(50)])
        cfg = ModelConfig(width=n)
        shaped[n] = (Ys / cfg.tau).std().item()
        standard[n] = (Ys / math.sqrt(cfg.key_dim)).std().item()
    # std of Y/tau scales as n^{-1/2}: ratio 4 between n=64 and n=1024 (MC error ~ 5%)
    assert shaped[64] / shaped[1024] == pytest.approx(4.0, rel=0.15)
    assert standard[64] / standard[1024] == pytest.approx(1.0, rel=0.15)
    assert 0.5 < standard[1024] < 2.0


@pytest.mark.parametrize("kind", ["shaped", "softmax"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "heads, head_dim, out_proj", [(1, None, False), (4, None, True), (4, 3, True)]
)
def test_fused_equals_explicit(kind, causal, heads, head_dim, out_proj):
    torch.manual_seed(0)
    cfg = ModelConfig(
        width=32,
        attention=kind,
        heads=heads,
        head_dim=head_dim,
        out_proj=out_proj,
        causal=causal,
        tau0=0.05,
    )
    fused = Attention(cfg, fused=True)
    explicit = Attention(cfg, fused=False)
    explicit.load_state_dict(fused.state_dict())
    X = torch.randn(3, 7, 32)
    torch.testing.assert_close(fused(X), explicit(X), rtol=1e-10, atol=1e-10)


def test_fused_shaped_matches_matrix_times_values():
    torch.manual_seed(2)
    cfg = ModelConfig(width=16, tau0=0.1, causal=True)
    attn = Attention(cfg)
    X = torch.randn(2, 5, 16)
    A = attn.attention_matrix(X)[:, 0]
    V = attn.layers["value"](X)
    torch.testing.assert_close(attn(X), A @ V)


def test_fixed_head_size_limits_logit_rank():
    torch.manual_seed(3)
    cfg = ModelConfig(width=64, heads=4, head_dim=3, out_proj=True, attention="softmax")
    attn = Attention(cfg)
    X = torch.randn(10, 64)
    q = attn.layers["query"](X).unflatten(-1, (4, 3)).transpose(0, 1)
    k = attn.layers["key"](X).unflatten(-1, (4, 3)).transpose(0, 1)
    ranks = torch.linalg.matrix_rank(q @ k.transpose(-1, -2))
    assert ranks.tolist() == [3, 3, 3, 3]
    assert attn(X[None]).shape == (1, 10, 64)


# Laws for every input (property-based) ---------------------------------------------------------
@settings(deadline=None)
@given(st.integers(1, 12), st.integers(0, 2**31 - 1), st.floats(0.05, 20.0))
def test_causal_centring_rows_sum_to_one_and_never_look_ahead(m, seed, tau):
    """C: row i holds 1/(i+1) on j <= i (rows sum to one, zero above the diagonal); the causal
    shaped attention I + softmax_causal(Y / tau) - C then has rows summing to one, nothing
    above the diagonal, and its fused form equals the matrix form."""
    C = causal_uniform(m)
    torch.testing.assert_close(C.sum(-1), torch.ones(m))
    assert (C.triu(1) == 0).all()
    for i in range(m):
        torch.testing.assert_close(C[i, : i + 1], torch.full((i + 1,), 1.0 / (i + 1)))
    g = torch.Generator().manual_seed(seed)
    Y = torch.randn(m, m, generator=g) * 5
    A = shaped_attention_matrix(Y, tau, causal=True)
    torch.testing.assert_close(A.sum(-1), torch.ones(m))
    assert (A.triu(1) == 0).all()
    v = torch.randn(m, 3, generator=g)
    torch.testing.assert_close(token_mean(v, causal=True), C @ v)
    q, k = torch.randn(m, 2, generator=g), torch.randn(m, 2, generator=g)
    fused = shaped_attention(q, k, v, tau, causal=True)
    torch.testing.assert_close(fused, shaped_attention_matrix(q @ k.T, tau, causal=True) @ v)
