"""Layers at initialisation: one-block covariance expectations and module plumbing."""

import math

import pytest
import torch

from shapedtx import (
    MLP,
    Block,
    ModelConfig,
    ShapedReLU,
    Transformer,
    attention_branch,
    block,
    gaussian_linear,
    layer_norm,
    relu_slopes,
    shaped_relu,
)
from shapedtx.blocks import attention_matrix, split_heads
from shapedtx.metrics import covariance

from mc_stats import assert_mean_within_se

pytestmark = pytest.mark.usefixtures("float64_default")


def _relu_moment(V: torch.Tensor, s_plus: float, s_minus: float) -> torch.Tensor:
    """E[phi(h) phi(h)^T] for h ~ N(0, V): s_+ s_- V + (s_+ - s_-)^2 sqrt(V_aa V_bb) K(rho)."""
    d = V.diagonal().sqrt()
    norms = d[:, None] * d[None, :]
    rho = (V / norms).clamp(-1, 1)
    K = (torch.sqrt(1 - rho**2) + (math.pi - torch.arccos(rho)) * rho) / (2 * math.pi)
    return s_plus * s_minus * V + (s_plus - s_minus) ** 2 * norms * K


def _input(m: int, n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(m, n, generator=gen) * torch.linspace(0.7, 1.3, m)[:, None]


@pytest.mark.parametrize("mlp", ["shaped_relu", "relu"])
def test_mlp_block_expected_covariance(mlp):
    """E[V'] = lambda^2 V + gamma^2 c E[phi phi^T] exactly at any width (docs/theory.md#layers)."""
    n, m, S = 64, 4, 4000
    gen = torch.Generator().manual_seed(10)
    cfg = ModelConfig(width=n, depth=1, attention="none", mlp=mlp, gamma=0.6, c_minus=-2.0)
    X = _input(m, n, gen)
    out = block(X.expand(S, m, n), cfg, gaussian_linear(gen))
    V = covariance(X)
    s_plus, s_minus, c = relu_slopes(cfg)
    expected = cfg.lam**2 * V + cfg.gamma**2 * c * _relu_moment(V, s_plus, s_minus)
    assert_mean_within_se(covariance(out), expected)
    # the test has power: a normaliser of 1 instead of c is detected
    wrong = cfg.lam**2 * V + cfg.gamma**2 * _relu_moment(V, s_plus, s_minus)
    with pytest.raises(AssertionError):
        assert_mean_within_se(covariance(out), wrong)


@pytest.mark.parametrize("kind", ["shaped", "softmax"])
def test_attention_block_expected_covariance(kind):
    """Given W^Q, W^K: E_{W^V}[V'] = lambda^2 V + gamma^2 A V A^T (one head, value only)."""
    n, m, S = 64, 4, 4000
    gen = torch.Generator().manual_seed(11)
    cfg = ModelConfig(width=n, depth=1, attention=kind, gamma=0.5, tau0=0.2)
    X = _input(m, n, gen)
    WQ, WK = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
    fresh = gaussian_linear(gen)

    def linear(x, out, name):
        fixed = {"query": WQ, "key": WK}
        return x @ fixed[name] / math.sqrt(n) if name in fixed else fresh(x, out, name)

    out = block(X.expand(S, m, n), cfg, linear)
    q = split_heads(X @ WQ / math.sqrt(n), 1)
    k = split_heads(X @ WK / math.sqrt(n), 1)
    A = attention_matrix(q, k, cfg)[0]
    V = covariance(X)
    expected = cfg.lam**2 * V + cfg.gamma**2 * A @ V @ A.T
    assert_mean_within_se(covariance(out), expected)
    with pytest.raises(AssertionError):  # power: ignoring the attention matrix is detected
        assert_mean_within_se(covariance(out), cfg.lam**2 * V + cfg.gamma**2 * V)


def test_shaped_attention_branch_tends_to_value_map_at_large_width():
    """Shaped A = I + O(n^{-1/2}): the branch approaches X W^V / sqrt(n) as n grows."""
    gen = torch.Generator().manual_seed(12)
    errs = []
    for n in (64, 1024):
        cfg = ModelConfig(width=n)
        X = _input(4, n, gen)
        W = {k: torch.randn(n, n, generator=gen) for k in ("query", "key", "value")}
        out = attention_branch(X, cfg, lambda x, o, name, W=W, n=n: x @ W[name] / math.sqrt(n))
        plain = X @ W["value"] / math.sqrt(n)
        errs.append(((out - plain).norm() / plain.norm()).item())
    assert errs[1] < errs[0] / 2.5  # ~ n^{-1/2}: expected ratio 4


def test_layer_norm_per_token():
    X = torch.randn(3, 5, 40) * 3 + 1
    Y = layer_norm(X)
    torch.testing.assert_close(Y.mean(-1), torch.zeros(3, 5), atol=1e-12, rtol=0)
    torch.testing.assert_close(Y.pow(2).mean(-1), torch.ones(3, 5), atol=1e-5, rtol=0)


def test_shaped_relu_slopes_and_normaliser():
    cfg = ModelConfig(width=100, attention="none", mlp="shaped_relu", c_plus=1.0, c_minus=-2.0)
    s_plus, s_minus, c = relu_slopes(cfg)
    assert (s_plus, s_minus) == pytest.approx((1.1, 0.8))
    assert c == pytest.approx(2 / (1.1**2 + 0.8**2))
    act = ShapedReLU.from_config(cfg)
    torch.testing.assert_close(act(torch.tensor([-1.0, 2.0])), torch.tensor([-0.8, 2.2]))


def test_modules_init_and_hidden_states():
    torch.manual_seed(0)
    cfg = ModelConfig(width=256, depth=3, mlp="shaped_relu", norm="pre", heads=2, out_proj=True)
    model = Transformer(cfg)
    linear_params = [name for name, _ in model.named_parameters() if ".norms." not in name]
    assert not any("bias" in name for name in linear_params)
    w = model.blocks[0].attention.layers["query"].weight
    assert w.std().item() == pytest.approx(1 / math.sqrt(256), rel=0.02)
    X = torch.randn(2, 5, 256)
    out, hidden = model(X, return_hidden=True)
    assert len(hidden) == 4 and hidden[-1] is out and out.shape == X.shape
    assert model.covariances(X).shape == (2, 4, 5, 5)
    assert isinstance(model.blocks[0], Block) and isinstance(model.blocks[0].mlp, MLP)
    # the module block is the functional block with the module's weights
    blk = model.blocks[1]
    torch.testing.assert_close(blk(X), block(X, cfg, blk._linear, fused=False))


@pytest.mark.parametrize("s_plus, s_minus", [(1.1, 0.8), (1.0, 0.0), (0.0, 0.5), (0.9, 1.3)])
def test_shaped_relu_matches_definition(s_plus, s_minus):
    x = torch.linspace(-3, 3, 61)
    expected = s_plus * x.clamp(min=0) + s_minus * x.clamp(max=0)
    torch.testing.assert_close(shaped_relu(x, s_plus, s_minus), expected)
