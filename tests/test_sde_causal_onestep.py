"""One-step Monte Carlo of the project's causal shaped attention vs docs/theory.md#causal-sde.

Large n (10^6), following docs/theory.md#checks: the value weights are integrated out analytically
(one head, or n_h heads with W^O: ``E[V' | A] = lambda^2 V + gamma^2 mean_h A_h V A_h^T``),
so only the queries and keys are sampled (``q = chol(V) Z_q``, the law of ``X W^Q / sqrt(n)``)
and the project's ``attention_matrix`` (causal mask and causal centring) is applied. Drift:
``n gamma^2 (mean_h A_h V A_h^T - V)`` with antithetic query signs. Attention diffusion:
``n Cov(gamma^2 mean_h A_h V A_h^T)`` is the attention term of the diffusion (the Sigma_lin
part comes from the value weights and is unchanged by the mask; the whole diffusion of the
finite network at n = 2048 is checked with the exact sampler of ``test_sde_onestep``). Both
must reject the non-causal formulas.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_sde_onestep import check_diffusion, check_drift, one_step, random_V

import sde
from sde.coefficients import causal_attention_sigma
from shapedtx import ModelConfig
from shapedtx.blocks import attention_matrix

N_LARGE = 10**6
KEY_DIM = 16


def integrated_moments(
    config: ModelConfig, V: torch.Tensor, samples: int, seed: int, chunk: int = 20_000
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-draw drift estimates (antithetic) and ``sqrt(n) gamma^2 (mean_h A_h V A_h^T - V)``
    (for the attention covariance), each (samples, m, m)."""
    g = torch.Generator().manual_seed(seed)
    m, h, n = V.shape[-1], config.heads, config.width
    L = torch.linalg.cholesky(V)
    g2 = config.gamma**2
    drifts, fluct = [], []
    for start in range(0, samples, chunk):
        size = min(chunk, samples - start)
        Zq, Zk = torch.randn(2, size, h, m, KEY_DIM, generator=g, dtype=V.dtype)
        out = []
        for sign in (1.0, -1.0):
            A = attention_matrix(sign * L @ Zq, L @ Zk, config)  # (size, h, m, m)
            out.append((A @ V @ A.transpose(-1, -2)).mean(1) - V)
        drifts.append(n * g2 * (out[0] + out[1]) / 2)
        fluct.append(math.sqrt(n) * g2 * out[0])
    return torch.cat(drifts), torch.cat(fluct)


def attention_cov_bad(fluct: torch.Tensor, Sigma_att: torch.Tensor) -> torch.Tensor:
    """Entries of ``n Cov`` outside z SE + 1% of max |Sigma_att|."""
    return check_diffusion(fluct, Sigma_att, allowance=0.01)


@pytest.mark.parametrize("heads", [1, 4])
def test_causal_drift_and_attention_diffusion_at_large_width(heads):
    config = ModelConfig(
        width=N_LARGE, heads=heads, key_dim=KEY_DIM, out_proj=heads > 1,
        gamma=0.8, tau0=0.7, causal=True,
    )  # fmt: skip
    m = 4
    V = random_V(m, seed=3)
    drifts, fluct = integrated_moments(config, V, 100_000, seed=5)
    b = sde.drift(config, V)
    mean, se = drifts.mean(0), drifts.std(0) / math.sqrt(drifts.shape[0])
    rel = ((mean - b).abs().max() / b.abs().max()).item()
    assert not check_drift(drifts, b, allowance=0.01).any(), (mean, b, se)
    assert rel < 0.01, rel
    b_noncausal = sde.drift(config.replace(causal=False), V)
    assert check_drift(drifts, b_noncausal, allowance=0.01).any()
    const = sde.sde_constants(config, m)
    Sigma_att = const.k_att * causal_attention_sigma(V)
    assert not attention_cov_bad(fluct, Sigma_att).any()
    noncausal = config.replace(causal=False)
    wrong = sde.diffusion(noncausal, V) - sde.sde_constants(noncausal, m).k_lin * (
        sde.coefficients.sigma_lin(V)
    )
    assert attention_cov_bad(fluct, wrong).any()
    assert attention_cov_bad(fluct, Sigma_att * heads if heads > 1 else 2 * Sigma_att).any()


def test_causal_network_one_step_diffusion_and_drift():
    """The whole causal attention sub-block (value weights sampled) at n = 2048, m = 4: drift
    (control-variate estimate of test_sde_onestep) and the whole diffusion match section 3b and
    reject the non-causal formulas."""
    config = ModelConfig(width=2048, gamma=math.sqrt(0.5), tau0=0.5, key_dim=64, causal=True)
    m = 4
    V = random_V(m, seed=7)
    est, inc = one_step(config, V, N=4000, seed=11)
    b, Sigma = sde.drift(config, V), sde.diffusion(config, V)
    assert not check_drift(est, b, allowance=0.04).any(), (est.mean(0), b)
    assert not check_diffusion(inc, Sigma, allowance=0.04).any()
    noncausal = config.replace(causal=False)
    assert check_drift(est, sde.drift(noncausal, V), allowance=0.04).any()
    assert check_diffusion(inc, sde.diffusion(noncausal, V), allowance=0.04).any()
