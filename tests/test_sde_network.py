"""Whole finite network (``simulations.simulate``, exact sampler) vs the SDE
(docs/theory.md#checks).

n = 200, d = 150 (T = 0.75), gamma = 1/sqrt(8), tau0 = 1, rho0 = 0.2: quartiles of the
off-diagonal rho_T agree within z bootstrap standard errors plus a small finite-width
allowance; and the distance between network and SDE shrinks as n grows at fixed T.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import sde
from shapedtx import ModelConfig, equicorrelated
from shapedtx.results import rho

simulations = pytest.importorskip("simulations")

QUARTILES = (0.25, 0.5, 0.75)
ALLOWANCE = 0.02  # finite-width allowance on rho quartiles at n = 200
Z_SCORE = 4.0


def final_rho(ds) -> np.ndarray:
    """Off-diagonal rho at the last time, (samples, pairs), exploded SDE paths dropped."""
    r = rho(ds).isel(t=-1).values
    iu = np.triu_indices(r.shape[-1], 1)
    r = r[:, iu[0], iu[1]]
    if "exploded" in ds:
        r = r[~ds["exploded"].values]
    return r


def quartiles_and_se(r: np.ndarray, seed: int, boot: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """Quartiles of the pooled values and their bootstrap SE (resampling whole samples, since
    the pairs of one sample are dependent)."""
    rng = np.random.default_rng(seed)
    q = np.quantile(r, QUARTILES)
    idx = rng.integers(0, r.shape[0], size=(boot, r.shape[0]))
    qb = np.stack([np.quantile(r[i], QUARTILES) for i in idx])
    return q, qb.std(0)


@pytest.mark.parametrize("mlp", ["none", "shaped_relu"])
@pytest.mark.parametrize("m", [2, 4])
def test_network_and_sde_rho_quartiles_agree(m, mlp):
    cfg = ModelConfig(width=200, depth=150, mlp=mlp)  # gamma = 1/sqrt(8), tau0 = 1
    V0 = equicorrelated(m, 0.2)
    samples = 600 if m == 2 else 400
    net = simulations.simulate(cfg, V0, samples, method="exact", seed=11, progress=False)
    sol = sde.solve(cfg, V0, 4000, dt=0.01, seed=12, progress=False)
    assert sol.attrs["exploded_fraction"] < 0.01
    q_net, se_net = quartiles_and_se(final_rho(net), seed=1)
    q_sde, se_sde = quartiles_and_se(final_rho(sol), seed=2)
    tol = Z_SCORE * np.hypot(se_net, se_sde) + ALLOWANCE
    assert (np.abs(q_net - q_sde) <= tol).all(), (q_net, q_sde, tol)
    # power: the SDE of a wrong branch weight (gamma = 0.5, i.e. a diffusion coefficient about
    # twice too large) is rejected by the same check
    if m == 4 and mlp == "none":
        hot = sde.solve(cfg.replace(gamma=0.5), V0, 4000, dt=0.01, seed=12, progress=False)
        q_hot, se_hot = quartiles_and_se(final_rho(hot), seed=3)
        assert (np.abs(q_net - q_hot) > Z_SCORE * np.hypot(se_net, se_hot) + ALLOWANCE).any()


def test_gap_to_sde_shrinks_with_width():
    """Fixed T = 0.75, m = 2, shaped block: the Kolmogorov-Smirnov distance between the
    network's rho_T and the SDE's is clearly larger at n = 2 than at n = 24, and at n = 24 it
    is compatible with sampling error. (Finite-width effects on rho_T are small: at n = 8 the
    quartile gaps are already about 0.01, below what 8000 samples resolve.)"""
    V0 = equicorrelated(2, 0.2)
    sol = sde.solve(
        ModelConfig(width=100, depth=75, mlp="shaped_relu"),
        V0,
        16000,
        dt=0.01,
        seed=4,
        progress=False,
    )
    r_sde = final_rho(sol).ravel()
    ks = {}
    for n in (2, 24):
        net = simulations.simulate(
            ModelConfig(width=n, depth=round(0.75 * n), mlp="shaped_relu"),
            V0,
            8000,
            seed=5,
            progress=False,
        )
        ks[n] = stats.ks_2samp(final_rho(net).ravel(), r_sde)
    assert ks[2].statistic > 2 * ks[24].statistic, ks
    assert ks[2].pvalue < 1e-4 and ks[24].pvalue > 1e-3, ks
