"""The SDE's step error (docs/theory.md#step-error): paired solves at dt and dt/2 on the same
Brownian paths, the Richardson estimate of each statistic's step error with its Monte Carlo
SE, against a case whose step bias is known in closed form, and the warning of compare."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
import torch
from torch import Tensor

import sde
from sde.options import pair_seed
from sde.time_grid import time_grid
from shapedtx import ModelConfig, equicorrelated
from shapedtx._validation import ParameterError
from simulations.compare import (
    StepErrorWarning,
    compare,
    moment_step_error,
    quantile_step_error,
    quantiles_with_se,
)

M = 4
V0 = equicorrelated(M, 0.2)
# attention with tau0 = 1e6: the attention terms are ~1e-13, what is left is the linear SDE
# dV = sqrt(k_lin) Sigma_lin^{1/2} dB, a martingale (E V_T = V0). The factored Euler step has
# E[V' | V] = c V exactly, c = (1 - x/2)^2 (1 + x), x = k_lin dt m / 2 (docs/theory.md#sde-noise:
# F = alpha L (I + eps N1), alpha = 1 - eps^2 m / 2, eps^2 = k_lin dt / 2), so at dt the mean
# is c^(T/dt) V0: a step bias of (c^(T/dt) - 1) V0, known in closed form.
LINEAR = ModelConfig(width=100, depth=100, gamma=0.9, tau0=1e6)  # T = 1


def _c(dt: float) -> float:
    x = sde.sde_constants(LINEAR, M).k_lin * dt * M / 2
    return (1 - x / 2) ** 2 * (1 + x)


def test_known_step_bias_within_its_own_error():
    dt, N = 0.05, 4096
    steps = round(LINEAR.T / dt)
    truth = _c(dt) ** steps - 1  # relative bias of E[V_T] at dt (dt -> 0: 0)
    richardson = 2 * (_c(dt) ** steps - _c(dt / 2) ** (2 * steps))  # what the estimate targets
    ds = sde.solve(LINEAR, V0, N, dt=dt, seed=0, progress=False, step_error=True)
    # per path the mean diagonal entry, relative to V0^aa = 1: one number per path
    coarse = np.diagonal(ds["V"].values[:, -1], axis1=-2, axis2=-1).mean(-1)
    fine = np.diagonal(ds["V_half"].values[:, -1], axis1=-2, axis2=-1).mean(-1)
    est = moment_step_error(coarse, fine)
    err, se = float(est["mean"]), float(est["mean_se"])
    assert abs(truth) > 8 * se  # the bias is resolved, so a wrong factor (1 or 3) fails below
    assert abs(richardson - truth) < se / 2  # the O(dt^2) remainder is below the noise
    assert abs(err - truth) < 3 * se, (err, se, truth)


def test_paired_increments_sum_to_the_coarse_increment():
    """A stepper that adds its Brownian increment (V + sqrt(dt) N): at dt and dt/2 the end
    points coincide exactly when the two half steps' normals sum to sqrt 2 times the step's."""

    class BrownianStep:
        def init(self, V0: Tensor) -> Tensor:
            return V0

        def step(self, V: Tensor, normals: Tensor, dt: float) -> tuple[Tensor, Tensor, None]:
            new = V + math.sqrt(dt) * normals[:, 0]
            return new, new, None

    @dataclass(frozen=True)
    class Brownian(sde.Solver):
        name: ClassVar[str] = "brownian"

        def stepper(self, config, m, *, paths=None):  # type: ignore[no-untyped-def]
            return BrownianStep()

    grid = time_grid(LINEAR, 0.1)
    V0s = V0.double().expand(64, M, M).contiguous()
    constants = sde.sde_constants(LINEAR, M)
    V, V_half, *_ = Brownian(0.1).paired_paths(
        LINEAR, V0s, grid, seed=3, bound=1e8, progress=False, constants=constants
    )
    np.testing.assert_allclose(V.numpy(), V_half.numpy(), atol=1e-12)
    assert V[:, -1].std() > 0.5  # and they moved: about sqrt(T) per entry


def test_solve_keeps_V_and_adds_the_half_step_solution():
    plain = sde.solve(LINEAR, V0, 32, dt=0.1, seed=5, progress=False)
    ds = sde.solve(LINEAR, V0, 32, dt=0.1, seed=5, progress=False, step_error=True)
    np.testing.assert_array_equal(ds["V"].values, plain["V"].values)
    np.testing.assert_array_equal(ds["exploded"].values, plain["exploded"].values)
    assert ds["V_half"].dims == ds["V"].dims and ds["V_half"].shape == ds["V"].shape
    assert not np.allclose(ds["V_half"].values[:, -1], ds["V"].values[:, -1])
    assert ds.attrs["dt_half"] == pytest.approx(ds.attrs["dt"] / 2)
    assert ds.attrs["step_error"] == "paired dt/2"
    assert ds["exploded_half"].dtype == bool
    assert pair_seed(5) != 5 and pair_seed(5) == pair_seed(5) and pair_seed(5) != pair_seed(6)


def test_step_error_refusals():
    with pytest.raises(ParameterError, match="step_error") as err:
        sde.solve(LINEAR, V0, 4, dt=0.1, method="torchsde", step_error=True)
    assert err.value.parameter == "step_error"
    with pytest.raises(ParameterError, match="step_error must be True or False"):
        sde.solve(LINEAR, V0, 4, dt=0.1, step_error=1)  # type: ignore[arg-type]


def test_quantile_step_error_of_a_known_shift():
    """fine = coarse - delta on every path: the quantiles move by delta exactly, so the
    estimate is 2 delta with no noise (a paired design cancels it)."""
    rng = np.random.default_rng(0)
    coarse = rng.standard_normal((500, 2, 3))
    err, se = quantile_step_error(coarse, coarse - 0.01)
    np.testing.assert_allclose(err, 0.02, atol=1e-12)
    np.testing.assert_allclose(se, 0.0, atol=1e-12)


def test_quantile_step_error_se_is_calibrated():
    """Independent (unpaired) normal samples, shift delta: the estimates average 2 delta and
    their spread over replicates is the reported SE (2 sqrt(2) times one quantile's SE)."""
    rng = np.random.default_rng(1)
    N, delta, reps = 1000, 0.05, 300
    errs, ses = [], []
    for _ in range(reps):
        fine = rng.standard_normal((N, 1, 1))
        coarse = rng.standard_normal((N, 1, 1)) + delta
        e, s = quantile_step_error(coarse, fine, [0.25, 0.5, 0.9])
        errs.append(e[0])
        ses.append(s[0])
    errs_a, ses_a = np.array(errs), np.array(ses)
    mean_se = ses_a.mean(0)
    np.testing.assert_allclose(errs_a.mean(0), 2 * delta, atol=3 * mean_se.max() / math.sqrt(reps))
    # spread of the estimate over replicates against its SE: within 15% (300 replicates:
    # the sd of a sample sd is about 4%)
    np.testing.assert_allclose(errs_a.std(0, ddof=1) / mean_se, 1.0, atol=0.15)
    one = quantiles_with_se(rng.standard_normal((N, 1, 1)), [0.5])[1][0, 0]
    assert mean_se[1] == pytest.approx(2 * math.sqrt(2) * one, rel=0.15)


def test_moment_step_error_formulas():
    rng = np.random.default_rng(2)
    f = rng.standard_normal((4000, 3))
    c = 1.5 * f + 0.1 + 0.01 * rng.standard_normal((4000, 3))
    out = moment_step_error(c, f)
    np.testing.assert_allclose(out["mean"], 2 * (c.mean(0) - f.mean(0)))
    np.testing.assert_allclose(out["var"], 2 * (c.var(0, ddof=1) - f.var(0, ddof=1)))
    # variance of the paired variance difference: var((c - mc)^2 - (f - mf)^2) / N, c = 1.5 f
    # (+ small noise): (1.25)^2 var(f^2) = 1.5625 * 2
    np.testing.assert_allclose(out["var_se"], 2 * math.sqrt(1.5625 * 2 / 4000), rtol=0.1)
    np.testing.assert_allclose(out["mean_se"], 2 * math.sqrt(0.25 / 4000), rtol=0.1)


def _linear_pair(dt: float, samples: int) -> tuple:
    network = sde.solve(LINEAR, V0, samples, dt=0.01, seed=11, progress=False)
    limit = sde.solve(LINEAR, V0, samples, dt=dt, seed=12, progress=False, step_error=True)
    return network, limit


def test_compare_reports_step_errors_and_warns_when_dt_is_too_large():
    network, limit = _linear_pair(0.25, 1024)
    with pytest.warns(StepErrorWarning, match=r"step error [-+]\d.* against Monte Carlo SE"):
        out = compare(network, limit)
    for name in ("rho_quantile", "Vaa_quantile"):
        assert out[f"{name}_step_error"].dims == ("t", "quantile")
        assert out[f"{name}_step_error_se"].dims == ("t", "quantile")
    for name in ("mean_rho", "ks_rho", "w1_rho", "ks_logVaa", "w1_logVaa"):
        assert out[f"{name}_step_error"].dims == ("t",)
    assert out["V_mean_step_error"].dims == ("t", "token_a", "token_b")
    assert out.attrs["step_error_resolved_ratio"] > 1
    assert out.attrs["step_error_ratio"] >= out.attrs["step_error_resolved_ratio"]
    assert out.attrs["limit_dt_half"] == pytest.approx(0.125)
    # the step error is the one of the closed form (mean of V^aa at T, within its SE)
    last = out.isel(t=-1)
    truth = _c(0.25) ** 4 - 1
    err = np.diagonal(last["V_mean_step_error"].values)
    se = np.diagonal(last["V_mean_step_error_se"].values)
    assert np.all(np.abs(err - truth) < 4 * se)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compare(network, limit, warn=False)


def test_no_warning_when_dt_is_small_and_none_without_V_half():
    network, limit = _linear_pair(0.02, 512)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = compare(network, limit)
        assert out.attrs["step_error_resolved_ratio"] <= 1
        plain = compare(network, limit.drop_vars(["V_half", "exploded_half", "t_explode_half"]))
    assert "rho_quantile_step_error" not in plain and "step_error_ratio" not in plain.attrs


def test_paired_solve_is_the_same_law_at_dt_half():
    """The dt/2 paths are driven by (Z + W)/sqrt 2 and (Z - W)/sqrt 2: iid N(0, 1), so V_half
    has the law of a plain solve at dt/2 (mean of V^aa at T within 4 SE of it)."""
    ds = sde.solve(LINEAR, V0, 2048, dt=0.1, seed=7, progress=False, step_error=True)
    plain = sde.solve(LINEAR, V0, 2048, dt=0.05, seed=8, progress=False)
    a = np.diagonal(ds["V_half"].values[:, -1], axis1=-2, axis2=-1).mean(-1)
    b = np.diagonal(plain["V"].values[:, -1], axis1=-2, axis2=-1).mean(-1)
    se = math.hypot(a.std() / math.sqrt(a.size), b.std() / math.sqrt(b.size))
    assert abs(a.mean() - b.mean()) < 4 * se
    # and the exact mean of the scheme at dt/2 (closed form above)
    assert abs(a.mean() - _c(0.05) ** 20) < 4 * a.std() / math.sqrt(a.size)


def test_euler_maruyama_pairs_too():
    ds = sde.solve(LINEAR, V0, 16, dt=0.1, method="em", seed=1, progress=False, step_error=True)
    assert np.isfinite(ds["V_half"].values).all()
    assert torch.tensor(ds["V_half"].values).shape == (16, ds.sizes["t"], M, M)
