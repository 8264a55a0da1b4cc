"""The simulator's law: exact vs weights, one-step moments vs the SDE, rank collapse.

docs/theory.md#sde, #rank-collapse, #samplers and #checks. All statistical tests use fixed seeds;
tolerances come from the Monte Carlo standard error (plus a stated finite-width allowance), and each
test shows it can fail.
"""

import pytest
import torch

import sde
from sde.coefficients import sigma_lin
from shapedtx import ModelConfig, preset
from shapedtx.metrics import correlation, mean_correlation
from simulations import Exact, ExactSampler, equicorrelated, simulate

from mc_stats import assert_mean_within_se, two_sample_pvalue

# Different-method samples are independent, so the KS p-values are uniform under the null;
# 6 statistics x 7 configs: family-wise false-alarm rate <= 4.2e-2 (Bonferroni).
P_MIN = 1e-3


_V0 = torch.tensor([[1.5, 0.3, -0.2], [0.3, 1.0, 0.4], [-0.2, 0.4, 2.0]], dtype=torch.float64)


def _statistics(V: torch.Tensor, layer: int) -> dict[str, torch.Tensor]:
    """rho^{01}, V^{00} and the mean correlation at ``layer``; V: (sample, t, m, m)."""
    return {
        "rho01": correlation(V[:, layer])[:, 0, 1],
        "V00": V[:, layer, 0, 0],
        "mean_rho": mean_correlation(V[:, layer]),
    }


def _V(ds) -> torch.Tensor:
    return torch.from_numpy(ds["V"].values)


LAW_CONFIGS = {
    "pre-LN softmax + ReLU MLP": ModelConfig(
        width=32, depth=8, attention="softmax", mlp="relu", norm="pre"
    ),
    "2 heads, fixed head size, W^O": ModelConfig(
        width=32, depth=8, heads=2, head_dim=4, out_proj=True, gamma=0.6, tau0=0.5
    ),
    "3 heads of size 1 < m, W^O": ModelConfig(
        width=32, depth=8, heads=3, head_dim=1, out_proj=True, gamma=0.8, tau0=0.3
    ),
    "shaped block with shaped MLP, causal": ModelConfig(
        width=32, depth=8, mlp="shaped_relu", gamma=0.6, tau0=0.5, c_minus=-2.0, causal=True
    ),
    "GPT-2 pre-LN: unit residual, GELU 4n, gpt2 init, causal": preset(
        "pre_ln", width=32, depth=8, causal=True
    ),
    "post-LN: unit residual, GELU 4n": preset("post_ln", width=32, depth=8),
    "no norm: unit residual, GELU 4n": preset("no_norm", width=32, depth=4),
}


@pytest.mark.parametrize("name", LAW_CONFIGS)
def test_exact_and_weights_agree_in_distribution(name):
    """Two-sample KS tests on rho^{01}, V^{00}, mean rho at the middle and final layer."""
    cfg = LAW_CONFIGS[name]
    V0 = equicorrelated(4, 0.3)
    a = _V(simulate(cfg, V0, 600, method="exact", seed=1))
    b = _V(simulate(cfg, V0, 600, method="weights", seed=2))
    for layer in (cfg.depth // 2, cfg.depth):
        sa, sb = _statistics(a, layer), _statistics(b, layer)
        for key in sa:
            p = two_sample_pvalue(sa[key], sb[key])
            assert p > P_MIN, f"{name}: {key} at layer {layer} differs (KS p = {p:.2g})"


class _TransposedR(ExactSampler):
    """A plausible bug: ``R Z`` instead of ``R^T Z`` (wrong covariance R R^T != X X^T)."""

    def linear(self, x, out_features, name):
        R = torch.linalg.qr(x.mT, mode="r").R
        shape = (*R.shape[1:-2], R.shape[-2], out_features)
        return self.rng.map(lambda R_g, Z: R_g @ Z, R, shape) / x.shape[-1] ** 0.5


class _Buggy(Exact):
    """The choice object of :class:`_TransposedR` (a user's own sampler, passed as an object)."""

    name = "buggy"
    sampler_class = _TransposedR


def test_distribution_test_has_power():
    """The same KS statistics reject a sampler with the factor transposed."""
    cfg = LAW_CONFIGS["2 heads, fixed head size, W^O"]
    V0 = torch.tensor([[1.0, 0.5, 0.0, 0.2], [0.5, 2.0, 0.3, 0.0], [0.0, 0.3, 1.0, 0.1],
                       [0.2, 0.0, 0.1, 0.5]], dtype=torch.float64)  # fmt: skip
    a = _V(simulate(cfg, V0, 600, method=_Buggy(), seed=1))
    b = _V(simulate(cfg, V0, 600, method="weights", seed=2))
    pvalues = [
        two_sample_pvalue(x, y)
        for x, y in zip(
            _statistics(a, cfg.depth).values(), _statistics(b, cfg.depth).values(), strict=True
        )
    ]
    assert min(pvalues) < P_MIN


def _one_step(cfg: ModelConfig, samples: int, seed: int) -> torch.Tensor:
    """dV = V_1 - V_0 of one block from V_0 = _V0: (samples, m, m)."""
    V = _V(simulate(cfg, _V0, samples, seed=seed))
    return V[:, 1] - V[:, 0]


def _assert_diffusion(dV: torch.Tensor, n: int, Sigma: torch.Tensor, rel: float) -> None:
    """n Cov(dV) = Sigma within 5 SE + ``rel`` max|Sigma| (finite-width allowance)."""
    d = dV - dV.mean(0)
    products = n * torch.einsum("sab,scd->sabcd", d, d)
    assert_mean_within_se(products, Sigma, z=5.0, floor=rel * Sigma.abs().max().item())


ONE_STEP = {
    "attention, 1 head, value only": dict(mlp="none", gamma=0.7, tau0=0.5),
    "shaped block (attention + shaped MLP)": dict(
        mlp="shaped_relu", gamma=0.7, tau0=0.5, c_minus=-2.0
    ),
}


@pytest.mark.parametrize("name", ONE_STEP)
def test_one_step_diffusion_matches_sde(name):
    """n Cov(V_1 - V_0) -> Sigma(V_0) (docs/theory.md#sde; about 1% at this width)."""
    n = 256
    cfg = ModelConfig(width=n, depth=1, **ONE_STEP[name])
    dV = _one_step(cfg, 6000, seed=3)
    Sigma = sde.diffusion(cfg, _V0)
    _assert_diffusion(dV, n, Sigma, rel=0.02)
    if cfg.mlp == "none":
        # power: the Sigma_lin coefficient of the W^O variant (2 gamma^2) is rejected
        wrong = Sigma + cfg.gamma**4 * sigma_lin(_V0)
        with pytest.raises(AssertionError):
            _assert_diffusion(dV, n, wrong, rel=0.02)


@pytest.mark.parametrize("name", ONE_STEP)
def test_one_step_drift_matches_sde(name):
    """n E[V_1 - V_0] -> b(V_0) (docs/theory.md#sde).

    Small width and a large drift (gamma = 0.7, tau0 = 0.5, c_- = -2) so that max|b| is about
    30 MC standard errors. The allowance of 0.1 max|b| covers the finite-width bias, measured
    at n = 64 and 128 with 2e5 samples: at most 0.09 max|b| (SE 0.03).
    """
    n = 64
    cfg = ModelConfig(width=n, depth=1, **ONE_STEP[name])
    dV = n * _one_step(cfg, 100_000, seed=4)
    b = sde.drift(cfg, _V0)
    floor = 0.1 * b.abs().max().item()
    assert_mean_within_se(dV, b, z=4.0, floor=floor)
    # power: no drift (the linear residual network) and twice the drift are both rejected
    for wrong in (0 * b, 2 * b):
        with pytest.raises(AssertionError):
            assert_mean_within_se(dV, wrong, z=4.0, floor=floor)
