"""One-step Monte Carlo of the finite network vs drift and diffusion (docs/theory.md#checks).

The finite block is the project's own ``shapedtx.block`` with an exact weight sampler
(docs/theory.md#samplers : ``x W / sqrt(fan_in)`` has the law of ``chol(x x^T / fan_in) Z``, one
fresh Z per weight name), float64, n = 2048. Drift: ``n E[V' - V]`` with variance reduction by
(i) a control network driven by the same Z with A = I (zero queries) and phi = identity
(``c_pm = 0``), whose expected increment is exactly 0, and (ii) antithetic signs of the query
and first MLP weights. Diffusion: ``n Cov(V')``. Tolerances: z standard errors plus a small
finite-width allowance (next order is O(n^{-1/2})); each test also rejects a wrong constant.
"""

from __future__ import annotations

import math

import pytest
import torch

import sde
from sde.coefficients import attention_sigma, sigma_lin
from shapedtx import ModelConfig, block, initial_tokens

N_WIDTH = 2048
Z_SCORE = 4.5


class ExactLinear:
    """``linear(x, out, name)`` returning ``chol(x x^T / fan_in) Z[name] * sign[name]``.

    Z[name]: (N, m, out) iid N(0, 1), drawn once and reused by every pass (coupling).
    Names in ``zero`` return zeros (control network: zero queries give A = I exactly).
    """

    def __init__(self, store: dict, generator: torch.Generator, N: int, signs=None, zero=()):
        self.store, self.g, self.N = store, generator, N
        self.signs, self.zero = signs or {}, zero

    def __call__(self, x: torch.Tensor, out_features: int, name: str) -> torch.Tensor:
        m = x.shape[-2]
        if name not in self.store:
            self.store[name] = torch.randn(
                self.N, m, out_features, generator=self.g, dtype=x.dtype, device=x.device
            )
        Z = self.store[name] * self.signs.get(name, 1.0)
        if name in self.zero:
            return torch.zeros_like(Z)
        L = torch.linalg.cholesky(x @ x.transpose(-1, -2) / x.shape[-1])
        return L @ Z


def one_step(config: ModelConfig, V: torch.Tensor, N: int, seed: int, chunk: int = 100):
    """Per-sample drift estimates ``n (V' - V'_control)`` and ``sqrt(n) (V' - V)``: (N, m, m)."""
    g = torch.Generator().manual_seed(seed)
    X = initial_tokens(V, config.width, 1, g)  # law depends on V only; shared by all samples
    control = config.replace(c_plus=0.0, c_minus=0.0) if config.mlp != "none" else config
    flips = [1.0, -1.0]
    mlp_flips = flips if config.mlp != "none" else [1.0]
    n = config.width
    drifts, increments = [], []
    for start in range(0, N, chunk):
        size = min(chunk, N - start)
        store: dict = {}
        zero_att = []
        shaped = []
        for sq in flips:
            for sm in mlp_flips:
                lin = ExactLinear(store, g, size, {"query": sq, "mlp_in": sm})
                Y = block(X, config, lin)
                shaped.append(Y @ Y.mT / n)
        for sm in mlp_flips:
            lin = ExactLinear(store, g, size, {"mlp_in": sm}, zero=("query",))
            Y = block(X, control, lin)
            zero_att.append(Y @ Y.mT / n)
        mean_shaped = torch.stack(shaped).mean(0)
        mean_control = torch.stack(zero_att).mean(0)
        drifts.append(n * (mean_shaped - mean_control))
        increments.append(math.sqrt(n) * (shaped[0] - V))
    return torch.cat(drifts), torch.cat(increments)


def random_V(m: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(m, m + 1, generator=g, dtype=torch.float64)
    return X @ X.T / (m + 1) + 0.3 * torch.eye(m, dtype=torch.float64)


def check_drift(est: torch.Tensor, b: torch.Tensor, allowance: float) -> torch.Tensor:
    """Boolean mask of entries outside z SE + allowance * max|b|."""
    mean = est.mean(0)
    se = est.std(0) / math.sqrt(est.shape[0])
    return (mean - b).abs() > Z_SCORE * se + allowance * b.abs().max()


def check_diffusion(inc: torch.Tensor, Sigma: torch.Tensor, allowance: float) -> torch.Tensor:
    """Boolean mask of entries of ``n Cov(V')`` outside z SE + allowance * max|Sigma|."""
    N, m = inc.shape[0], inc.shape[-1]
    x = inc.flatten(1)
    x = x - x.mean(0)
    prod = x[:, :, None] * x[:, None, :]
    cov = prod.sum(0) / (N - 1)
    se = prod.std(0) / math.sqrt(N)
    flat = Sigma.reshape(m * m, m * m)
    return (cov - flat).abs() > Z_SCORE * se + allowance * flat.abs().max()


BASE = dict(width=N_WIDTH, gamma=math.sqrt(0.5), tau0=0.5, key_dim=64)
VARIANTS = {
    "attention_1head_value_only": ModelConfig(**BASE),
    "attention_4heads_out_proj": ModelConfig(**BASE, heads=4, out_proj=True),
    "attention_4heads_no_out_proj": ModelConfig(**BASE, heads=4),
    "attention_out_proj_value_half_width": ModelConfig(
        **BASE, heads=2, head_dim=N_WIDTH // 4, out_proj=True
    ),
    "shaped_relu_mlp": ModelConfig(
        **BASE | {"gamma": math.sqrt(0.5)},
        attention="none",
        mlp="shaped_relu",
        c_plus=1.0,
        c_minus=-2.0,
    ),
    "block": ModelConfig(**BASE, mlp="shaped_relu", c_plus=1.0, c_minus=-2.0),
}


def wrong_diffusions(config: ModelConfig, V: torch.Tensor) -> list[torch.Tensor]:
    """Plausible wrong constants that the test must reject."""
    const = sde.sde_constants(config, V.shape[-1])
    g2, g4 = config.gamma**2, config.gamma**4
    if config.attention != "none" and config.mlp != "none":  # MLP part forgotten
        out = [sde.diffusion(config, V) - 2 * g2 * sigma_lin(V)]
    else:  # one Gaussian matrix too many / too few
        out = [sde.diffusion(config, V) + s * g4 * sigma_lin(V) for s in (1.0, -1.0)]
    if const.k_att:  # attention term without its 1 / n_h (one head: doubled)
        factor = config.heads if config.heads > 1 else 2
        out.append(sde.diffusion(config, V) + (factor - 1) * const.k_att * attention_sigma(V))
    return out


@pytest.mark.parametrize("name", list(VARIANTS))
def test_one_step_moments(name):
    config = VARIANTS[name]
    m = 3
    V = random_V(m, seed=7)
    est, inc = one_step(config, V, N=8000, seed=11)
    b = sde.drift(config, V)
    bad = check_drift(est, b, allowance=0.04)
    assert not bad.any(), (name, est.mean(0), b)
    Sigma = sde.diffusion(config, V)
    bad = check_diffusion(inc, Sigma, allowance=0.04)
    assert not bad.any(), name
    # power: wrong constants are rejected by the same statistics
    const = sde.sde_constants(config, m)
    if const.a_att:
        assert check_drift(est, 1.25 * b, allowance=0.04).any()
    if const.k_mlp:
        mlp_drift = sde.drift(config.replace(attention="none"), V)
        assert check_drift(est, b + 0.25 * mlp_drift, allowance=0.04).any()
    for wrong in wrong_diffusions(config, V):
        assert check_diffusion(inc, wrong, allowance=0.04).any(), name
