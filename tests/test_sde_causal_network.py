"""Whole causal network vs the causal SDE (docs/theory.md#causal-sde and #checks).

m = 4, n = 200, d = 100 (T = 0.5), gamma = 0.8, tau0 = 0.7, rho0 = 0.2, attention only. The
mean correlation between tokens 1 and 4 at T is about 0.19 in the causal network and 0.22 in
the non-causal one; at this width both networks sit about 0.02 above their SDE limits (strong
drift, about 5% of SDE paths blow up), so the test compares the causal effect
``D = mean rho14(causal) - mean rho14(non-causal)`` of the network with that of the SDE. Each
pair of runs shares its seed (common random numbers), so D has a small standard error. Blown-up
SDE paths enter with their last finite state (rho is bounded; dropping them biases the mean,
since blow-up is correlated with rho).
"""

from __future__ import annotations

import numpy as np
import pytest

import sde
from shapedtx import ModelConfig, equicorrelated
from shapedtx.results import rho

simulations = pytest.importorskip("simulations")

CONFIG = ModelConfig(width=200, depth=100, gamma=0.8, tau0=0.7)
Z_SCORE = 4.0
NET_SAMPLES, SDE_SAMPLES = 3000, 6000


def rho14(ds) -> np.ndarray:
    """rho between tokens 1 and m at the last time, per sample."""
    return rho(ds).isel(t=-1).values[:, 0, -1]


def causal_effect(causal: np.ndarray, noncausal: np.ndarray) -> tuple[float, float]:
    """Mean and standard error of the paired difference."""
    d = causal - noncausal
    return float(d.mean()), float(d.std(ddof=1) / np.sqrt(d.size))


def test_causal_effect_of_network_and_sde_agree():
    V0 = equicorrelated(4, 0.2)
    net, lim = {}, {}
    for causal in (True, False):
        cfg = CONFIG.replace(causal=causal)
        ds = simulations.simulate(cfg, V0, NET_SAMPLES, method="gram", seed=1, progress=False)
        net[causal] = rho14(ds)
        sol = sde.solve(cfg, V0, SDE_SAMPLES, dt=0.01, seed=2, progress=False)
        assert sol.attrs["exploded_fraction"] < 0.1
        lim[causal] = rho14(sol)
    d_net, se_net = causal_effect(net[True], net[False])
    d_sde, se_sde = causal_effect(lim[True], lim[False])
    # the causal model ends with a lower rho between tokens 1 and 4: both the network and the
    # SDE resolve a negative effect ...
    assert d_net < -Z_SCORE * se_net, (d_net, se_net)
    assert d_sde < -Z_SCORE * se_sde, (d_sde, se_sde)
    # ... of the same size (an SDE with the non-causal formulas has d_sde = 0 exactly)
    assert abs(d_net - d_sde) <= Z_SCORE * np.hypot(se_net, se_sde), (d_net, d_sde)
    # levels: the causal network's mean is near the causal SDE's (finite-width allowance)
    mean_net, mean_sde = net[True].mean(), lim[True].mean()
    assert abs(mean_net - mean_sde) < 0.04, (mean_net, mean_sde)
    print(
        f"rho14 network causal {mean_net:.3f} non-causal {net[False].mean():.3f}; SDE causal "
        f"{mean_sde:.3f} non-causal {lim[False].mean():.3f}; effect network {d_net:.4f} "
        f"± {se_net:.4f}, SDE {d_sde:.4f} ± {se_sde:.4f}"
    )
