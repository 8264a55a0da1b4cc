"""SDE solvers: Dataset contract, PSD safety, weak order, log-normal diagonal, blow-up flags,
agreement with torchsde under the same Brownian increments."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
import torch
import torchsde
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import sde
from sde.solvers import EulerMaruyamaStep, FactoredEulerStep, integrate
from shapedtx import ModelConfig, config_of, equicorrelated, load_dataset, save_dataset

from mc_stats import assert_mean_within_se
from strategies import covariances, model_configs

ATT = ModelConfig(width=200, depth=150)  # gamma = 1/sqrt(8), tau0 = 1: T = 0.75
BLOCK = ATT.replace(mlp="shaped_relu")
MLP = ModelConfig(attention="none", mlp="shaped_relu", gamma=math.sqrt(0.5))


def test_dataset_contract_and_reproducibility(tmp_path):
    V0 = equicorrelated(3, 0.2)
    ds = sde.solve(BLOCK, V0, 16, dt=0.05, seed=3, progress=False)
    assert ds["V"].dims == ("sample", "t", "token_a", "token_b")
    assert ds.sizes["sample"] == 16 and ds.sizes["token_a"] == 3
    assert ds["t"].values[0] == 0 and ds["t"].values[-1] == pytest.approx(BLOCK.T)
    np.testing.assert_allclose(ds["V"].values[:, 0], np.broadcast_to(V0.numpy(), (16, 3, 3)))
    assert ds.attrs["source"] == "sde" and ds.attrs["solver"] == "euler"
    assert ds.attrs["dt"] == pytest.approx(0.75 / 15) and ds.attrs["steps"] == 15
    assert ds["exploded"].dtype == bool and ds["exploded"].dims == ("sample",)
    assert ds["t_explode"].dims == ("sample",) and np.isnan(ds["t_explode"].values).all()
    assert ds.attrs["exploded_fraction"] == 0.0
    assert config_of(ds) == BLOCK
    again = sde.solve(BLOCK, V0, 16, dt=0.05, seed=3, progress=False)
    np.testing.assert_array_equal(ds["V"].values, again["V"].values)
    other = sde.solve(BLOCK, V0, 16, dt=0.05, seed=4, progress=False)
    assert not np.allclose(ds["V"].values[:, -1], other["V"].values[:, -1])
    back = load_dataset(save_dataset(ds, tmp_path / "sde.nc"))
    np.testing.assert_array_equal(back["V"].values, ds["V"].values)
    assert back["exploded"].dtype == bool
    ds2 = sde.solve(BLOCK, V0, 4, T=0.1, dt=0.01, save_every=3, progress=False)
    np.testing.assert_allclose(ds2["t"].values, [0, 0.03, 0.06, 0.09, 0.1], atol=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"method": "rk4"}, "method must be one of"),
        ({"dt": 0.0}, "dt must be"),
        ({"T": -1.0}, "T must be"),
        ({"samples": 0}, "samples must be"),
        ({"save_every": 0}, "save_every must be"),
        ({"bound": float("nan")}, "bound must be"),
        ({"V0": torch.tensor([[1.0, 2.0], [2.0, 1.0]])}, "positive definite"),
        ({"dtype": torch.float16}, "dtype must be"),
        ({"device": "tpu"}, "device"),
        ({"method": sde.FactoredEuler(0.01), "dt": 0.02}, "conflicts"),
        ({"method": ["euler"]}, "method must be one of"),
        ({"seed": -1}, "seed must be"),
        ({"seed": 1.5}, "seed must be"),
        ({"seed": True}, "seed must be"),
        ({"seed": 2**64}, "seed must be"),
        ({"V0": "x"}, "V0 must be a real"),
        ({"V0": torch.eye(2, dtype=torch.complex128)}, "V0 must be a real"),
    ]
    + ([] if torch.cuda.is_available() else [({"device": "cuda"}, "CUDA is not available")]),
)
def test_bad_input(kwargs, match):
    args = {"V0": equicorrelated(2, 0.1), "samples": 2}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        sde.solve(ATT, args.pop("V0"), args.pop("samples"), **args)


def test_solve_rejects_a_config_that_is_not_one():
    with pytest.raises(ValueError, match=r"config must be a shapedtx\.ModelConfig"):
        sde.solve("x", equicorrelated(2, 0.1), 2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dt": 0.0}, "dt must be"),  # torchsde would loop forever
        ({"dt": math.nan}, "dt must be"),
        ({"bound": 0.0}, "bound must be"),
        ({"seed": -1}, "seed must be"),
        ({"ts": torch.tensor([0.0])}, "ts must be"),
        ({"ts": torch.tensor([0.2, 0.0])}, "ts must be"),
        ({"ts": torch.tensor([0.0, math.inf])}, "ts must be"),
        ({"V0": torch.eye(2, dtype=torch.float64)}, r"V0 must have shape \(B, m, m\)"),
        ({"V0": torch.eye(2)[None].int()}, "V0 must be a float32 or float64 tensor"),
        ({"V0": torch.full((1, 2, 2), math.nan, dtype=torch.float64)}, "V0 must be finite"),
    ],
)
def test_solve_torchsde_checks_its_arguments(kwargs, match):
    from sde.torchsde_solver import solve_torchsde

    args = {"V0": equicorrelated(2, 0.1)[None], "ts": torch.tensor([0.0, 0.1], dtype=torch.float64)}
    args |= {"dt": 0.05, "bound": 1e8} | kwargs
    with pytest.raises(ValueError, match=match):
        solve_torchsde(ATT, args.pop("V0"), args.pop("ts"), **args)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"steps": -1}, "steps must be"),
        ({"save_every": 0}, "save_every must be"),
        ({"dt": -1.0}, "dt must be"),
        ({"dt": math.nan}, "dt must be"),
        ({"bound": math.nan}, "bound must be"),
        ({"V0": equicorrelated(2, 0.1)}, r"V0 must have shape \(B, m, m\)"),
    ],
)
def test_integrate_checks_its_arguments(kwargs, match):
    from sde.solvers import gaussian_noise

    args = {"V0": equicorrelated(2, 0.1)[None], "steps": 2, "dt": 0.01, "save_every": 1}
    args |= {"bound": 1e8} | kwargs
    noise = gaussian_noise((1, 2, 2, 2), torch.Generator(), torch.float64, torch.device("cpu"))
    with pytest.raises(ValueError, match=match):
        sde.integrate(sde.FactoredEuler().stepper(ATT, 2), args.pop("V0"), noise=noise, **args)


def test_factored_euler_stays_psd_where_em_fails():
    """Near collapse (rho0 = 0.95) with a coarse step, plain EM leaves the PSD cone on almost
    every path (flagged, never returned as NaN); the factored scheme never does, and EM's
    failures vanish as dt shrinks (numerical, not a blow-up of the SDE)."""
    V0 = equicorrelated(4, 0.95)
    cfg = MLP.replace(gamma=0.7)
    with pytest.warns(RuntimeWarning, match=r"sde\.solve: \d+ of 400 paths exploded") as caught:
        em = sde.solve(cfg, V0, 400, T=1.0, dt=0.1, method="em", seed=1, progress=False)
    assert em.attrs["exploded_fraction"] > 0.5
    assert f"{int(em['exploded'].sum())} of 400" in str(caught[0].message)
    assert caught[0].filename == __file__  # attributed to the caller of sde.solve
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warn=False: flagged in the Dataset only
        quiet = sde.solve(cfg, V0, 400, T=1.0, dt=0.1, method="em", seed=1, progress=False,
                          warn=False)  # fmt: skip
    assert quiet.attrs["exploded_fraction"] == em.attrs["exploded_fraction"]
    with pytest.raises(ValueError, match="warn must be"):
        sde.solve(cfg, V0, 4, T=1.0, warn="no")
    assert np.isfinite(em["V"].values).all()
    assert (em["t_explode"].values[em["exploded"].values] <= 1.0 + 1e-12).all()
    fine = sde.solve(cfg, V0, 400, T=1.0, dt=0.01, method="em", seed=1, progress=False)
    assert fine.attrs["exploded_fraction"] < 0.01
    for c in (cfg, BLOCK.replace(gamma=0.7)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no blow-up here: no warning either
            ds = sde.solve(c, V0, 400, T=1.0, dt=0.1, seed=1, progress=False)
        V = torch.from_numpy(ds["V"].values)
        evals = torch.linalg.eigvalsh(V)
        assert (evals[..., 0] >= -1e-12 * evals[..., -1]).all()
        if c is cfg:  # no attention: nothing can blow up
            assert ds.attrs["exploded_fraction"] == 0.0


def test_mlp_diagonal_is_lognormal():
    """MLP-only: d V^aa = sqrt(2k) V^aa dB (nu(1) = 0), so log V^aa_T ~ N(log V0 - kT, 2kT)
    with k = 2 gamma^2 the Sigma_lin coefficient; the wrong k = gamma^2 (2 - gamma^2) fails."""
    V0 = equicorrelated(3, 0.3, 1.5)
    T, N = 1.0, 4000
    ds = sde.solve(MLP, V0, N, T=T, dt=0.01, seed=5, progress=False)
    logv = torch.from_numpy(np.log(ds["V"].values[:, -1, 0, 0]))
    k = 2 * MLP.gamma**2
    assert sde.sde_constants(MLP, 3).k_lin == pytest.approx(k)
    z = (logv - (math.log(1.5) - k * T)) / math.sqrt(2 * k * T)
    assert stats.kstest(z.numpy(), "norm").pvalue > 1e-3
    assert_mean_within_se(logv, torch.tensor(math.log(1.5) - k * T), z=4.0)
    g2 = MLP.gamma**2
    wrong = g2 * (2 - g2)
    zw = (logv - (math.log(1.5) - wrong * T)) / math.sqrt(2 * wrong * T)
    assert stats.kstest(zw.numpy(), "norm").pvalue < 1e-6


@pytest.mark.slow
def test_weak_order_one_on_known_mean():
    """MLP diagonal: E[V^aa_T] = V0^aa exactly. The factored scheme's mean error is O(dt)
    (per step factor (1 - x/2)^2 (1 + x), x = k_lin m dt / 2): it halves with dt and equals
    that prediction within Monte Carlo error."""
    cfg = MLP.replace(gamma=1.0)  # k_lin = 2
    m, T, N = 4, 0.2, 20000
    V0 = equicorrelated(m, 0.2)
    errors = []
    for dt in (0.04, 0.02, 0.01):
        ds = sde.solve(cfg, V0, N, T=T, dt=dt, seed=0, progress=False)
        diag = torch.from_numpy(np.trace(ds["V"].values[:, -1], axis1=-2, axis2=-1)) / m
        x = 2.0 * m * dt / 2
        predicted = ((1 - x / 2) ** 2 * (1 + x)) ** round(T / dt)
        assert_mean_within_se(diag, torch.tensor(predicted), z=4.0)
        errors.append(1.0 - diag.mean().item())
    assert errors[0] > 0.05  # the bias is resolved, not hidden in MC noise
    for coarse, fine in itertools.pairwise(errors):
        assert 0.35 < fine / coarse < 0.65


def test_blowup_flagged_and_scale_invariance():
    """Small tau0 and large norms: the cubic attention drift explodes in finite time; such paths
    are frozen (finite values) and flagged, and the flagged fraction is stable in dt. Norms act
    as an inverse temperature: (s tau0, s V0) gives exactly s times the paths of (tau0, V0)."""
    cfg = ATT.replace(tau0=0.5)
    V0 = equicorrelated(4, 0.2, 4.0)
    fractions = []
    for dt in (0.02, 0.01):
        ds = sde.solve(cfg, V0, 500, dt=dt, seed=1, progress=False)
        fractions.append(ds.attrs["exploded_fraction"])
        assert np.isfinite(ds["V"].values).all()
        flagged = ds["exploded"].values
        assert ds.attrs["exploded_fraction"] == pytest.approx(flagged.mean())
        te = ds["t_explode"].values
        assert np.isfinite(te[flagged]).all() and np.isnan(te[~flagged]).all()
        assert (te[flagged] <= cfg.T + 1e-12).all()
    assert min(fractions) > 0.6 and abs(fractions[0] - fractions[1]) < 0.1
    # scale invariance of the SDE: V -> s V with tau0 -> s tau0 (same noise: exact)
    small = sde.solve(ATT, equicorrelated(3, 0.2), 50, dt=0.05, seed=2, progress=False)
    big = sde.solve(
        ATT.replace(tau0=2.0), equicorrelated(3, 0.2, 2.0), 50, dt=0.05, seed=2, progress=False
    )
    np.testing.assert_allclose(big["V"].values, 2.0 * small["V"].values, rtol=1e-9, atol=1e-12)


def test_flags_vanish_as_dt_shrinks_without_blowup():
    """Blow-up-free regime (no attention, so the SDE cannot explode): what plain EM flags is
    numerical failure (leaving the PSD cone), and the flagged fraction decreases to 0 with dt."""
    V0 = equicorrelated(4, 0.95)
    cfg = MLP.replace(gamma=0.7)
    fractions = [
        sde.solve(cfg, V0, 300, T=1.0, dt=dt, method="em", seed=2, progress=False).attrs[
            "exploded_fraction"
        ]
        for dt in (0.1, 0.03, 0.005)
    ]
    assert fractions[0] > fractions[1] > fractions[2] and fractions[2] == 0.0


def _brownian_noise(bm, dt: float, B: int, m: int):
    def noise(k: int) -> torch.Tensor:
        return (bm(k * dt, (k + 1) * dt) / math.sqrt(dt)).view(B, 2, m, m)

    return noise


@pytest.mark.slow
def test_euler_and_torchsde_converge_under_same_brownian_motion():
    """Own EM equals torchsde's Euler (same scheme, same increments) to rounding on every path
    EM keeps PSD; the factored scheme converges to torchsde strongly as dt -> 0 (strong order
    1/2: the gap halves per 4x smaller dt). Pathwise comparisons need the same square root of V
    in both schemes (``canonical=True``; the default factored state differs by a rotation of the
    noise, which changes the coupling, not the law)."""
    cfg = BLOCK.replace(gamma=0.5, tau0=2.0)
    m, B, T = 3, 200, 0.3
    V0 = equicorrelated(m, 0.2).expand(B, m, m).contiguous()
    bm = torchsde.BrownianInterval(
        t0=0.0, t1=T, size=(B, 2 * m * m), dtype=torch.float64, entropy=7, cache_size=None
    )
    gaps, em_flagged = [], []
    for steps in (16, 64, 256):
        dt = T / steps
        ts = torch.tensor([0.0, T], dtype=torch.float64)
        ref, exploded, _ = sde.solve_torchsde(cfg, V0, ts, dt=dt, bound=1e8, bm=bm)
        assert not exploded.any()
        own = {}
        for name, stepper in (
            ("euler", FactoredEulerStep(cfg, m, canonical=True)),
            ("em", EulerMaruyamaStep(cfg, m)),
        ):
            sol = integrate(
                stepper,
                V0,
                steps=steps,
                dt=dt,
                save_every=steps,
                noise=_brownian_noise(bm, dt, B, m),
                bound=1e8,
                progress=False,
            )
            own[name] = sol
        assert not own["euler"].exploded.any()
        ok = ~own["em"].exploded
        em_flagged.append(1 - ok.double().mean().item())
        # (rtol: torchsde accumulates its time grid, so its Brownian queries differ by rounding)
        torch.testing.assert_close(own["em"].V[ok, -1], ref[ok, -1], rtol=1e-5, atol=1e-6)
        diff = (own["euler"].V[ok, -1] - ref[ok, -1]).abs().mean()
        gaps.append((diff / ref[ok, -1].abs().mean()).item())
    assert em_flagged[-1] == 0.0 and em_flagged[0] < 0.2
    assert gaps[1] < 0.7 * gaps[0] and gaps[2] < 0.7 * gaps[1], gaps
    assert gaps[2] < 0.03


def test_factored_step_moments_match_drift_and_diffusion():
    """One step of the PSD-safe scheme from V: with antithetic normals, (E[V'] - V) / dt equals
    b(V) (so the Ito corrections eps^2 m V and k_att dt Q V are right) and Cov(V') / dt equals
    Sigma(V), up to O(dt); dropping the attention Ito correction is rejected."""
    cfg = ModelConfig(width=512, gamma=0.8, tau0=0.7, mlp="shaped_relu", heads=2, out_proj=True)
    m, N, dt = 3, 100_000, 1e-3
    g = torch.Generator().manual_seed(3)
    X = torch.randn(m, m + 1, generator=g, dtype=torch.float64)
    V = X @ X.T / (m + 1) + 0.3 * torch.eye(m, dtype=torch.float64)
    stepper = FactoredEulerStep(cfg, m, canonical=True)
    L = stepper.init(V.expand(N, m, m))
    normals = torch.randn(N, 2, m, m, generator=g, dtype=torch.float64)
    _, plus, _ = stepper.step(L, normals, dt)
    _, minus, _ = stepper.step(L, -normals, dt)
    b = sde.drift(cfg, V)
    mean_est = ((plus + minus) / 2 - V) / dt
    assert_mean_within_se(mean_est, b, z=4.5, floor=0.01 * b.abs().max().item())
    Q = ((V - V.mean(0) - V.mean(1, keepdim=True) + V.mean()) * V).sum()
    ito = sde.sde_constants(cfg, m).k_att * Q * V  # the attention Ito correction
    with pytest.raises(AssertionError):
        assert_mean_within_se(mean_est, b + ito, z=4.5, floor=0.01 * b.abs().max().item())
    inc = (plus - V).flatten(1) / math.sqrt(dt)
    inc = inc - inc.mean(0)
    prod = inc[:, :, None] * inc[:, None, :]
    Sigma = sde.diffusion(cfg, V).reshape(m * m, m * m)
    se = prod.std(0) / math.sqrt(N)
    assert ((prod.mean(0) - Sigma).abs() <= 4.5 * se + 0.01 * Sigma.abs().max()).all()


def test_jittered_cholesky_factor_of_collapsed_and_invalid_matrices():
    """The sync-free MLP re-factorisation: exact up to the jitter on a rank-1 (collapsed) V,
    NaN (so flagged by integrate) on a matrix that is not PSD."""
    from sde.solvers import _jittered_cholesky

    x = torch.tensor([1.0, 2.0, -0.5], dtype=torch.float64)
    collapsed = torch.outer(x, x)[None]
    L = _jittered_cholesky(collapsed)
    torch.testing.assert_close(L @ L.mT, collapsed, rtol=0, atol=1e-13)
    indefinite = torch.diag(torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64))[None]
    assert torch.isnan(_jittered_cholesky(torch.cat([collapsed, indefinite]))[1]).all()
    assert torch.isfinite(_jittered_cholesky(torch.cat([collapsed, indefinite]))[0]).all()


def test_solver_objects_and_names_agree():
    """``method=FactoredEuler(dt)`` is ``method="euler", dt=dt`` exactly; every solver object
    reaches the same law (KS on rho and V^aa at T), and blow-up dates are on the step grid."""
    from scipy import stats

    V0 = equicorrelated(3, 0.2)
    a = sde.solve(ATT, V0, 400, method=sde.FactoredEuler(0.02), seed=3)
    b = sde.solve(ATT, V0, 400, method="euler", dt=0.02, seed=3)
    assert np.array_equal(a["V"].values, b["V"].values)
    grid = sde.time_grid(ATT, 0.02)
    assert np.allclose(a["t"].values, grid.times) and a.attrs["steps"] == grid.steps
    em = sde.solve(ATT, V0, 400, method=sde.EulerMaruyama(0.02), seed=4)
    ts = sde.solve(ATT, V0, 400, method=sde.TorchSDE(0.02), seed=5)
    for other in (em, ts):
        for stat in (lambda d: d["V"].values[:, -1, 0, 0], lambda d: d["V"].values[:, -1, 0, 1]):
            assert stats.ks_2samp(stat(a), stat(other)).pvalue > 1e-3
    strong = ATT.replace(tau0=0.1, gamma=0.9)
    for method in (sde.FactoredEuler(0.05), sde.TorchSDE(0.05)):
        out = sde.solve(strong, equicorrelated(3, 0.2, 4.0), 64, method=method, seed=0, bound=50.0)
        t = out["t_explode"].values[out["exploded"].values]
        assert t.size and np.allclose(t / 0.05, np.round(t / 0.05))  # step times


# Laws for every input (property-based) ---------------------------------------------------------
@settings(deadline=None)
@given(model_configs(min_width=4, max_width=64, sde=True), covariances(max_m=4),
       st.sampled_from(["euler", "em"]), st.floats(0.01, 0.2), st.integers(0, 1000))  # fmt: skip
def test_every_sde_covariance_is_psd(config, V0, method, dt, seed):
    """Every saved V of every path is symmetric PSD: by construction for the factored Euler
    scheme (nothing flagged below the blow-up bound), and for EM on the paths it did not
    flag (a path is frozen at its last accepted, PSD, state)."""
    ds = sde.solve(config, V0, 3, T=0.3, dt=dt, method=method, seed=seed, progress=False)
    V = ds["V"].values
    assert np.isfinite(V).all()
    np.testing.assert_allclose(V, np.swapaxes(V, -1, -2), rtol=0, atol=1e-12 * np.abs(V).max())
    eig = np.linalg.eigvalsh(V)
    tol = 1e-8 * np.abs(eig).max(-1, keepdims=True) + 1e-300
    assert (eig >= -tol).all(), eig.min()


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("samples", True, "samples must be an integer >= 1"),
        ("samples", 2.5, "samples must be an integer >= 1"),
        ("samples", "4", "samples must be an integer >= 1"),
        ("bound", True, "bound must be a finite number > 0"),
        ("bound", "10", "bound must be a finite number > 0"),
        ("bound", 0.0, "bound must be a finite number > 0"),
        ("bound", math.inf, "bound must be a finite number > 0"),
    ],
)
def test_samples_and_bound_must_be_positive_numbers_of_their_kind(name, value, match):
    args = {"samples": 2, "bound": 1e8}
    args[name] = value
    with pytest.raises(ValueError, match=match):
        sde.solve(ATT, equicorrelated(2, 0.1), args.pop("samples"), T=0.02, **args)


def test_smallest_positive_samples_and_bound_and_the_default_dt():
    """One path and a bound below 1 are accepted; without dt the largest step is 0.01, so
    T = 0.75 takes ceil(0.75 / 0.01) = 75 steps of 0.01."""
    ds = sde.solve(ATT, equicorrelated(2, 0.1), 1, bound=0.5, progress=False)
    assert ds.sizes["sample"] == 1 and ds.attrs["bound"] == 0.5
    assert ds.attrs["steps"] == 75 and ds.attrs["dt"] == pytest.approx(0.01)
    assert ds["t"].values[-1] == pytest.approx(0.75)


@pytest.mark.parametrize("method", ["euler", "torchsde"])
def test_blowups_are_only_dated_inside_the_horizon(method):
    """Strong attention from V0 with a large diagonal: every path exceeds the bound by the
    second step (T = 0.1), few or (torchsde's plain Euler step) none in the single step to
    T = 0.05; a blow-up is never flagged after T (the integration stops at T)."""
    strong = ATT.replace(tau0=0.1, gamma=0.9)
    V0 = equicorrelated(3, 0.2, 4.0)
    for T in (0.05, 0.1):
        ds = sde.solve(strong, V0, 32, T=T, dt=0.05, method=method, seed=0, bound=50.0)
        fraction = ds.attrs["exploded_fraction"]
        if T == 0.1:
            assert fraction == 1.0
        else:
            assert fraction <= (0.0 if method == "torchsde" else 0.25), fraction
        t = ds["t_explode"].values[ds["exploded"].values]
        assert np.all(t <= T + 1e-12)


def test_pack_and_unpack_are_inverse_on_any_batch_shape():
    """pack keeps the upper triangle (row-major), unpack rebuilds the symmetric matrix:
    (..., m, m) <-> (..., m (m + 1) / 2) for no, one and two batch dimensions."""
    from sde.torchsde_solver import pack, unpack

    m = 3
    g = torch.Generator().manual_seed(0)
    for batch in ((), (4,), (2, 5)):
        X = torch.randn(*batch, m, m, generator=g, dtype=torch.float64)
        V = X + X.mT
        y = pack(V)
        assert y.shape == (*batch, 6)
        torch.testing.assert_close(y[..., 1], V[..., 0, 1], rtol=0, atol=0)
        torch.testing.assert_close(y[..., 3], V[..., 1, 1], rtol=0, atol=0)
        torch.testing.assert_close(unpack(y, m), V, rtol=0, atol=0)


def test_torchsde_coefficients_vanish_beyond_the_bound_or_when_not_finite():
    """CovarianceSDE: f = g = 0 on a state whose largest |V^{ab}| exceeds the path's limit or
    that is not finite; the drift and the diffusion matrix of pack(V) otherwise."""
    from sde.torchsde_solver import CovarianceSDE, pack

    m = 3
    V = equicorrelated(m, 0.3)
    big, bad = 10.0 * V, V.clone()
    bad[0, 1] = bad[1, 0] = math.nan
    y = pack(torch.stack([V, big, bad]))
    model = CovarianceSDE(BLOCK, m, torch.tensor([2.0, 2.0, 2.0], dtype=torch.float64))
    f, G = model.f(None, y), model.g(None, y)
    assert f.shape == (3, 6) and G.shape == (3, 6, 2 * m * m)
    torch.testing.assert_close(f[0], pack(sde.drift(BLOCK, V)))
    assert G[0].abs().max() > 0
    assert (f[1:] == 0).all() and (G[1:] == 0).all()
    # g is the linear map of the normals: G G^T is the packed diffusion
    Sigma = sde.diffusion(BLOCK, V)
    i, j = torch.triu_indices(m, m)
    torch.testing.assert_close(G[0] @ G[0].T, Sigma[i, j][:, i, j], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method", ["euler", "em", "torchsde"])
def test_a_path_at_the_bound_is_not_flagged(method):
    """Flagged means exceeding ``bound * max_a V0^{aa}``: with bound = 1 the initial state
    (whose largest entry is max_a V0^{aa}) is at the bound, not beyond it, so no path is
    flagged at t = 0."""
    ds = sde.solve(ATT, equicorrelated(3, 0.2), 16, T=0.1, dt=0.05, method=method, bound=1.0)
    t = ds["t_explode"].values[ds["exploded"].values]
    assert np.all(t > 0)
    np.testing.assert_array_equal(
        ds["V"].values[:, 0], np.broadcast_to(equicorrelated(3, 0.2), (16, 3, 3))
    )


def test_time_grid_steps_saved_times_and_argument_checks():
    """steps = ceil(T / dt) of size T / steps <= dt ending at T; saved every save_every steps
    (1: every step) and at T; by default every max(1, steps // 200) steps (an integer);
    T and dt must be > 0, save_every >= 1; the grid is an immutable value."""
    import dataclasses

    grid = sde.time_grid(ATT, 0.02, T=0.1, save_every=1)
    assert grid.steps == 5 and grid.dt == pytest.approx(0.02) and grid.saved == (0, 1, 2, 3, 4, 5)
    np.testing.assert_allclose(grid.times, [0, 0.02, 0.04, 0.06, 0.08, 0.1], atol=1e-15)
    odd = sde.time_grid(ATT, 0.03, T=0.1, save_every=2)  # 4 steps of 0.025
    assert odd.steps == 4 and odd.dt == pytest.approx(0.025) and odd.saved == (0, 2, 4)
    long = sde.time_grid(ATT, 0.01, T=10.0)  # 1000 steps: every 5th of them, 201 times
    assert long.steps == 1000 and long.save_every == 5 and isinstance(long.save_every, int)
    assert long.saved == tuple(range(0, 1001, 5))
    uneven = sde.time_grid(ATT, 0.01, T=7.5)  # 750 steps: every 3rd, and the last
    assert uneven.save_every == 3 and uneven.saved[-2:] == (747, 750)
    for bad in ({"T": 0.0}, {"T": math.nan}, {"T": True}, {"dt": 0.0}, {"save_every": 0}):
        args = {"dt": 0.01, **bad}
        with pytest.raises(ValueError, match=next(iter(bad))):
            sde.time_grid(ATT, args.pop("dt"), **args)
    assert sde.time_grid(ATT, 1e-7, T=1.0).steps == 10**7  # the most steps of one solve
    with pytest.raises(ValueError, match=r"T / dt must be at most 1e\+07 steps"):
        sde.time_grid(ATT, 1e-7, T=1.0 + 1e-6)
    with pytest.raises(ValueError, match="raise dt or lower T"):
        sde.time_grid(ATT, 1e-12)
    with pytest.raises(dataclasses.FrozenInstanceError):
        grid.steps = 3


@pytest.mark.parametrize("cls", [sde.FactoredEuler, sde.EulerMaruyama, sde.TorchSDE])
def test_solver_objects_check_dt_and_default_to_the_string_names_step(cls):
    """A solver's dt is a finite number > 0; its default is the step the string names mean
    (solve's default dt, 0.01: T = 0.75 in 75 steps)."""
    for bad in (0.0, -0.01, math.inf, math.nan, True, "0.01"):
        with pytest.raises(ValueError, match="dt must be a finite number > 0"):
            cls(bad)
    assert cls(0.5).dt == 0.5 and cls(1).dt == 1
    by_object = sde.solve(ATT, equicorrelated(2, 0.1), 1, method=cls(), progress=False)
    by_name = sde.solve(ATT, equicorrelated(2, 0.1), 1, method=cls.name, progress=False)
    assert by_object.attrs["steps"] == by_name.attrs["steps"] == 75
    assert by_object.attrs["dt"] == by_name.attrs["dt"]


FACTOR_CASES = {
    "attention_cholesky_state": (ATT.replace(tau0=0.5, heads=2, out_proj=True), "cholesky"),
    "block_jittered_cholesky": (BLOCK.replace(gamma=0.8, c_minus=-2.0), "init"),
    "block_canonical": (BLOCK.replace(gamma=0.8, c_minus=-2.0), "canonical"),
    "causal_block_cholesky_state": (BLOCK.replace(causal=True, c_minus=-2.0), "cholesky"),
}


@pytest.mark.parametrize("case", list(FACTOR_CASES))
def test_factored_step_noise_has_the_diffusion_for_any_factor(case):
    """The new V of one factored Euler step is a polynomial in the normals whose linear part
    J z (J its Jacobian at z = 0) is the SDE noise times sqrt(dt): J J^T / dt = Sigma(V) + O(dt),
    whatever the factor of V the state holds -- a non-symmetric (Cholesky) state, the jittered
    Cholesky re-factorisation after an MLP drift step, or the canonical V^{1/2}. Deterministic:
    dt = 1e-7 leaves a relative O(dt) error far below the tolerance."""
    config, kind = FACTOR_CASES[case]
    m, dt = 3, 1e-7
    g = torch.Generator().manual_seed(11)
    X = torch.randn(m, m + 1, generator=g, dtype=torch.float64)
    V = (X @ X.T / (m + 1) + 0.3 * torch.eye(m, dtype=torch.float64))[None]
    stepper = FactoredEulerStep(config, m, canonical=kind == "canonical")
    state = torch.linalg.cholesky(V) if kind == "cholesky" else stepper.init(V)
    if kind == "cholesky":
        assert (state - state.mT).abs().max() > 0.1  # a genuinely non-symmetric factor

    def new_V(z: torch.Tensor) -> torch.Tensor:
        return stepper.step(state, z.view(1, 2, m, m), dt)[1].reshape(-1)

    J = torch.autograd.functional.jacobian(new_V, torch.zeros(2 * m * m, dtype=torch.float64))
    Sigma = sde.diffusion(config, V[0]).reshape(m * m, m * m)
    # measured relative error <= 5.4e-7 over the cases; 1e-5 fails for any wrong constant
    torch.testing.assert_close(J @ J.T / dt, Sigma, rtol=0, atol=1e-5 * Sigma.abs().max().item())


@pytest.mark.parametrize(
    ("method", "causal"),
    # not ("euler", False): its F F^T comes out bitwise symmetric without the symmetrisation,
    # so that case could not fail (checked by replacing sde.solvers._symmetrise by identity)
    [("euler", True), ("em", False), ("em", True)],
)
def test_saved_covariances_are_exactly_symmetric(method, causal):
    """Every state is symmetrised (module docstring of sde.solvers): saved V equal their
    transposes bitwise, also where round-off makes F F^T + (Hadamard term) or the EM update
    slightly asymmetric."""
    config = BLOCK.replace(causal=causal)
    ds = sde.solve(config, equicorrelated(4, 0.3), 64, dt=0.05, method=method, seed=1)
    V = ds["V"].values
    np.testing.assert_array_equal(V, np.swapaxes(V, -1, -2))
