"""The covariance SDE of a shaped ReLU MLP of hidden width r n (docs/theory.md#sde-mlp-ratio).

Only the ``Sigma_lin`` coefficient depends on r: ``2 lambda^2 gamma^2 + gamma^4 (1 + 1/r)``;
the drift does not. Checked against the library's own block (``shapedtx.block`` with the exact
weight sampler of ``test_sde_onestep``: float64, n = 2048, antithetic MLP signs and a control
network for the drift) at r = 4, MLP alone and in a block, causal or not; r = 1 is
``test_sde_onestep``'s ``shaped_relu_mlp`` and ``block`` variants, whose formulas are unchanged.
Every check also rejects the r = 1 coefficient at r = 4 and a 1/r on a term that has none.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_sde_onestep import ExactLinear, check_diffusion, check_drift, random_V

import sde
from sde import mlp_k_lin
from sde.coefficients import sigma_lin
from shapedtx import ModelConfig, block, equicorrelated, initial_tokens

N_WIDTH = 2048
ALLOWANCE = 0.04  # finite-width allowance (next order O(n^{-1/2})), as in test_sde_onestep
BASE = dict(width=N_WIDTH, gamma=math.sqrt(0.5), tau0=0.5, key_dim=64)
MLP = dict(mlp="shaped_relu", c_plus=1.0, c_minus=-2.0, mlp_ratio=4)


def one_step(config: ModelConfig, V: torch.Tensor, N: int, seed: int, chunk: int = 100):
    """Per-sample drift estimates ``n (V' - V'_control)`` and ``sqrt(n) (V' - V)``: (N, m, m).

    As ``test_sde_onestep.one_step``, without the query flips when there is no attention."""
    g = torch.Generator().manual_seed(seed)
    X = initial_tokens(V, config.width, 1, g)
    control = config.replace(c_plus=0.0, c_minus=0.0)
    query_flips = [1.0, -1.0] if config.attention != "none" else [1.0]
    n = config.width
    drifts, increments = [], []
    for start in range(0, N, chunk):
        size = min(chunk, N - start)
        store: dict = {}
        shaped, zero_att = [], []
        for sq in query_flips:
            for sm in (1.0, -1.0):
                Y = block(X, config, ExactLinear(store, g, size, {"query": sq, "mlp_in": sm}))
                shaped.append(Y @ Y.mT / n)
        for sm in (1.0, -1.0):
            lin = ExactLinear(store, g, size, {"mlp_in": sm}, zero=("query",))
            Y = block(X, control, lin)
            zero_att.append(Y @ Y.mT / n)
        drifts.append(n * (torch.stack(shaped).mean(0) - torch.stack(zero_att).mean(0)))
        increments.append(math.sqrt(n) * (shaped[0] - V))
    return torch.cat(drifts), torch.cat(increments)


def test_mlp_k_lin_values():
    """The coefficient at a few (gamma, r), and r = 1 is the old ``2 gamma^2``."""
    for gamma in (0.1, 1 / math.sqrt(8), math.sqrt(0.5), 1.0):
        g2 = gamma**2
        assert mlp_k_lin(gamma, 1) == pytest.approx(2 * g2, rel=1e-14)
        for r in (2, 4, 16):
            assert mlp_k_lin(gamma, r) == pytest.approx(2 * g2 - g2**2 * (1 - 1 / r), rel=1e-14)
    assert mlp_k_lin(math.sqrt(0.5), 4) == pytest.approx(0.8125, rel=1e-14)
    assert mlp_k_lin(1 / math.sqrt(8), 4) == pytest.approx(0.25 - 0.75 / 64, rel=1e-14)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [1, 4])
def test_constants_add_per_sub_block(causal, heads):
    """In a block only ``k_lin`` changes with r, by the MLP's share; the drift is r-free."""
    m = 3
    V = random_V(m, seed=3)
    one = ModelConfig(**BASE, **(MLP | {"mlp_ratio": 1}), heads=heads, out_proj=heads > 1,
                      causal=causal)  # fmt: skip
    for r in (2, 4):
        cfg = one.replace(mlp_ratio=r)
        c1, cr = sde.sde_constants(one, m), sde.sde_constants(cfg, m)
        g4 = cfg.gamma**4
        assert cr.k_lin == pytest.approx(c1.k_lin - g4 * (1 - 1 / r), rel=1e-14)
        assert (cr.k_att, cr.a_att, cr.k_mlp, cr.causal) == (c1.k_att, c1.a_att, c1.k_mlp, causal)
        torch.testing.assert_close(sde.drift(cfg, V), sde.drift(one, V), rtol=0, atol=0)
        diff = sde.diffusion(one, V) - sde.diffusion(cfg, V)
        torch.testing.assert_close(diff, g4 * (1 - 1 / r) * sigma_lin(V), rtol=1e-12, atol=1e-12)
    # mlp_ratio is irrelevant without an MLP
    att = ModelConfig(**BASE, causal=causal)
    assert sde.sde_constants(att.replace(mlp_ratio=4), m) == sde.sde_constants(att, m)


def wrong_diffusions(config: ModelConfig, V: torch.Tensor) -> dict[str, torch.Tensor]:
    """Plausible wrong r-dependences that the one-step check must reject. In a block the
    attention's own Sigma_lin share dilutes them: only those that change ``k_lin`` by about
    20% or more are resolved there (the cross term's is checked on the MLP alone)."""
    r, g2 = config.mlp_ratio, config.gamma**2
    lam2, right = 1 - g2, sde.diffusion(config, V)
    S = sigma_lin(V)
    wrong = {
        "r = 1 coefficient": sde.diffusion(config.replace(mlp_ratio=1), V),
        "1/r on W^post too": right - g2**2 * (1 - 1 / r) * S,
    }
    if config.attention == "none":
        wrong["1/r on the cross term"] = right - 2 * lam2 * g2 * (1 - 1 / r) * S
    return wrong


# In a block gamma^2 = 0.8 (k_lin 2.08 at r = 4, 2.56 at r = 1) so that r is resolved.
STRONG = BASE | {"gamma": math.sqrt(0.8), "tau0": 1.0}
VARIANTS = {
    "mlp_r4": ModelConfig(**BASE | {"attention": "none"}, **MLP),
    "block_r4": ModelConfig(**STRONG, **MLP),
    "causal_block_r4": ModelConfig(**STRONG, **MLP, causal=True),
}


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, marks=[pytest.mark.slow] if "block" in name else []) for name in VARIANTS],
)
def test_one_step_moments_mlp_ratio(name):
    config = VARIANTS[name]
    V = random_V(3, seed=7)
    est, inc = one_step(config, V, N=6000, seed=23)
    b = sde.drift(config, V)
    assert not check_drift(est, b, ALLOWANCE).any(), (name, est.mean(0), b)
    Sigma = sde.diffusion(config, V)
    assert not check_diffusion(inc, Sigma, ALLOWANCE).any(), name
    # power: an r in the drift, and wrong r-dependences of the diffusion, are rejected
    b_mlp = sde.drift(config.replace(attention="none"), V)
    r = config.mlp_ratio
    for wrong_b in (b - b_mlp + b_mlp / r, b - b_mlp + r * b_mlp):
        assert check_drift(est, wrong_b, ALLOWANCE).any(), name
    for label, wrong in wrong_diffusions(config, V).items():
        assert check_diffusion(inc, wrong, ALLOWANCE).any(), (name, label)


def _log_diagonal(ds) -> np.ndarray:
    """``log V^{aa}`` at the last time: (samples, m), exploded SDE paths dropped."""
    V = ds["V"].isel(t=-1).values
    x = np.log(np.diagonal(V, axis1=-2, axis2=-1))
    return x[~ds["exploded"].values] if "exploded" in ds else x


def _moments_and_se(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of the pooled ``log V^{aa}`` and their standard errors, from the
    per-sample averages (the tokens of one sample are dependent)."""
    mean_s = x.mean(1)
    sq_s = ((x - x.mean()) ** 2).mean(1)
    N = x.shape[0]
    moments = np.array([x.mean(), x.var()])
    se = np.array([mean_s.std(ddof=1), sq_s.std(ddof=1)]) / math.sqrt(N)
    return moments, se


def _diagonal_law(config: ModelConfig, T: float) -> np.ndarray:
    """Mean and variance of ``log V_T^{aa}`` (V_0^{aa} = 1) under the SDE of a shaped MLP
    alone: on the diagonal the drift vanishes (nu(1) = 0) and ``Sigma^{aa,aa} = 2 k_lin
    (V^{aa})^2``, so V^{aa} is a geometric Brownian motion, ``log V_T^{aa} ~ N(-k_lin T,
    2 k_lin T)`` exactly."""
    k = sde.sde_constants(config).k_lin
    return np.array([-k * T, 2 * k * T])


def test_network_and_sde_agree_at_mlp_ratio_4():
    """Whole network (``simulations.simulate``, exact sampler, n = 256, T = 0.5, 400 samples)
    at r = 4 against the SDE: the mean and variance of ``log V_T^{aa}`` against their exact SDE
    values within z standard errors (the finite-width bias of both is O(1/n), below 0.01 here),
    the SDE solver against the same law, and the quartiles of rho_T of network and solver
    within z bootstrap errors plus the finite-width allowance of ``test_sde_network``. Power:
    the law of r = 1, and that of a 1/r on the output term, are rejected by the same check.
    gamma^2 = 0.8 makes the r-dependence large (k_lin 1.12 at r = 4, 1.6 at r = 1)."""
    simulations = pytest.importorskip("simulations")
    from test_sde_network import final_rho, quartiles_and_se

    n, T, z = 256, 0.5, 4.0
    cfg = ModelConfig(
        width=n, depth=round(T * n), attention="none", mlp="shaped_relu", mlp_ratio=4,
        gamma=math.sqrt(0.8),
    )  # fmt: skip
    V0 = equicorrelated(2, 0.2)
    net = simulations.simulate(cfg, V0, 400, method="exact", seed=11, progress=False)
    sol = sde.solve(cfg, V0, 4000, dt=0.01, seed=12, progress=False)
    assert sol.attrs["exploded_fraction"] == 0
    law = _diagonal_law(cfg, T)
    for ds in (net, sol):
        moments, se = _moments_and_se(_log_diagonal(ds))
        assert (np.abs(moments - law) <= z * se).all(), (moments, law, se)
    q_net, se_net = quartiles_and_se(final_rho(net), seed=1)
    q_sde, se_sde = quartiles_and_se(final_rho(sol), seed=2)
    assert (np.abs(q_net - q_sde) <= z * np.hypot(se_net, se_sde) + 0.02).all(), (q_net, q_sde)
    # power
    moments, se = _moments_and_se(_log_diagonal(net))
    g2 = cfg.gamma**2
    k_wrong = 2 * (1 - g2) * g2 + g2**2 * 2 / cfg.mlp_ratio  # 1/r on W^post too
    for wrong in (
        _diagonal_law(cfg.replace(mlp_ratio=1), T),
        np.array([-k_wrong, 2 * k_wrong]) * T,
    ):
        assert (np.abs(moments - wrong) > z * se).any(), (moments, wrong, se)


@pytest.mark.parametrize("causal", [False, True])
def test_batched_stepper_takes_each_configurations_mlp_ratio(causal):
    """``FactoredEulerStep`` over configurations that differ only in r: each configuration's
    rows are its own solution with the same normals (per-row ``k_lin``), and r changes them."""
    from test_sde_batch import STEPS, M, _final, _rows

    from sde.solvers import FactoredEulerStep

    base = ModelConfig(width=64, depth=16, mlp="shaped_relu", gamma=0.8, causal=causal)
    configs, paths = [base, base.replace(mlp_ratio=4), base.replace(mlp_ratio=2)], [3, 3, 2]
    V0 = equicorrelated(M, 0.3).double()
    B = sum(paths)
    normals = torch.randn(STEPS, B, 2, M, M, generator=torch.Generator().manual_seed(5)).double()
    VT, _ = _final(FactoredEulerStep(configs, M, paths=paths), V0, normals.__getitem__, B)
    start = 0
    for config, n in zip(configs, paths, strict=True):
        rows = slice(start, start + n)
        alone, _ = _final(FactoredEulerStep(config, M), V0, _rows(normals, rows), n)
        torch.testing.assert_close(VT[rows], alone, rtol=1e-10, atol=1e-12)
        other, _ = _final(
            FactoredEulerStep(config.replace(mlp_ratio=3), M), V0, _rows(normals, rows), n
        )
        assert (VT[rows] - other).abs().max() > 1e-3
        start += n


def test_advise_and_comparison_use_the_mlp_ratio():
    """``advise(mlp_ratio=r)`` screens with the SDE of hidden width r n (same seed, different
    numbers than r = 1) and advises that model; ``Experiment`` accepts r = 4 (it refused it)."""
    simulations = pytest.importorskip("simulations")
    from shapedtx import ParameterError

    grid = dict(gammas=(0.4,), tau0s=(1.0,), samples=64, screen_samples=64, max_confirm=1)
    one = simulations.advise(64, 16, 3, **grid)
    four = simulations.advise(64, 16, 3, mlp_ratio=4, **grid)
    assert four.mlp_ratio == 4 and four.to_dict()["mlp_ratio"] == 4
    assert four.config is not None and four.config.mlp_ratio == 4
    m1, m4 = one.candidates[0].measurement, four.candidates[0].measurement
    assert m1.rho_spread != m4.rho_spread
    with pytest.raises(ParameterError) as info:
        simulations.advise(64, 16, 3, mlp="none", mlp_ratio=4, **grid)
    assert info.value.parameter == "mlp_ratio"
    cfg = ModelConfig(width=32, depth=16, mlp="shaped_relu", mlp_ratio=4)
    assert simulations.Experiment(config=cfg, tokens=3, samples=64).config.mlp_ratio == 4
