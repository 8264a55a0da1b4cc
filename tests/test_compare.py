"""simulations.compare statistics on synthetic Datasets with known answers."""

import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats

from shapedtx import ModelConfig, covariance_dataset
from shapedtx.metrics import NEVER
from simulations.compare import (
    align_times,
    collapse_report,
    compare,
    distances,
    moments_with_se,
    quantiles_with_se,
)

CONFIG = ModelConfig(width=20, depth=4)


def _two_token(r: np.ndarray, scale: np.ndarray | float = 1.0) -> torch.Tensor:
    """V (N, t, 2, 2) with correlation r (N, t) and diagonal ``scale``."""
    r = torch.as_tensor(r, dtype=torch.float64)
    V = torch.empty(*r.shape, 2, 2, dtype=torch.float64)
    V[..., 0, 0] = V[..., 1, 1] = 1.0
    V[..., 0, 1] = V[..., 1, 0] = r
    return V * torch.as_tensor(scale, dtype=torch.float64)[..., None, None]


def _dataset(V: torch.Tensor, t=None, **kw):
    t = np.arange(V.shape[1]) / CONFIG.width if t is None else t
    return covariance_dataset(V, t, CONFIG, source="test", method="synthetic", seed=0, **kw)


def _random_V(N: int, nt: int, m: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(N, nt, m, 3 * m, generator=g, dtype=torch.float64)
    return X @ X.transpose(-1, -2) / X.shape[-1]


def test_identical_samples_give_zero_distance():
    ds = _dataset(_random_V(300, 3, 4, 0))
    out = compare(ds, ds)
    for var in ("rho", "logVaa"):
        np.testing.assert_array_equal(out[f"ks_{var}"].values, 0.0)
        np.testing.assert_allclose(out[f"w1_{var}"].values, 0.0, atol=1e-15)
        np.testing.assert_array_equal(out[f"ks_{var}_pvalue"].values, 1.0)
    q = out["rho_quantile"].values
    np.testing.assert_array_equal(q[0], q[1])
    assert out.attrs["n_network"] == 300 and out.attrs["n_excluded_limit"] == 0
    assert out["rho_quantile"].dims == ("source", "t", "quantile")
    assert out["V_mean"].shape == (2, 3, 4, 4)


def test_shifted_samples_give_the_shift():
    rng = np.random.default_rng(1)
    r = rng.uniform(-0.5, 0.4, size=(500, 2))
    scale = np.exp(rng.normal(size=(500, 2)))
    a = _dataset(_two_token(r, scale))
    b = _dataset(_two_token(r + 0.1, scale))
    out = compare(a, b)
    np.testing.assert_allclose(out["w1_rho"].values, 0.1, rtol=1e-9)
    np.testing.assert_allclose(out["w1_logVaa"].values, 0.0, atol=1e-12)
    np.testing.assert_allclose(
        out["rho_quantile"].sel(source="sde") - out["rho_quantile"].sel(source="network"),
        0.1,
        rtol=1e-9,
    )
    # scaling V by c = 4 shifts log V^aa by log c and leaves rho unchanged (exactly)
    c = _dataset(_two_token(r, 4.0 * scale))
    out = compare(a, c)
    np.testing.assert_allclose(out["w1_logVaa"].values, np.log(4.0), rtol=1e-9)
    np.testing.assert_allclose(out["w1_rho"].values, 0.0, atol=1e-12)
    np.testing.assert_array_equal(out["ks_rho"].values, 0.0)
    # shifted beyond the whole range: KS = 1
    d = _dataset(_two_token(r, 1e3 * scale))
    np.testing.assert_allclose(compare(a, d)["ks_logVaa"].values, 1.0)


def test_ks_pvalue_matches_scipy_for_one_value_per_sample_and_has_power():
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(800, 1, 1)), rng.normal(size=(600, 1, 1))
    d = distances(a, b)
    ref = stats.ks_2samp(a.ravel(), b.ravel(), method="asymp")
    assert d["ks"][0] == pytest.approx(ref.statistic, abs=1e-14)
    assert d["ks_pvalue"][0] == pytest.approx(ref.pvalue, rel=1e-6)
    assert d["w1"][0] == pytest.approx(stats.wasserstein_distance(a.ravel(), b.ravel()))
    shifted = distances(a, b + 0.4)
    assert shifted["ks_pvalue"][0] < 1e-6 < d["ks_pvalue"][0]


def _clustered(N: int, R: int, k: int, rng) -> np.ndarray:
    """(N, R, k): k values per sample sharing a common component (correlation 0.6)."""
    common = rng.normal(size=(N, R, 1))
    return np.sqrt(0.6) * common + np.sqrt(0.4) * rng.normal(size=(N, R, k))


def test_quantile_se_is_calibrated_for_dependent_values():
    """The SE matches the spread of the quantile over independent replications (the time
    axis holds R = 400 replications); ignoring the dependence would be ~40% too small."""
    rng = np.random.default_rng(3)
    N, k = 400, 4
    x = _clustered(N, 400, k, rng)
    q, se = quantiles_with_se(x, (0.05, 0.25, 0.5, 0.75, 0.95))
    spread = q.std(axis=0, ddof=1)
    ratio = se.mean(axis=0) / spread
    np.testing.assert_allclose(ratio, 1.0, atol=0.15)
    iid = x.transpose(0, 2, 1).reshape(N * k, 400)[:, :, None]  # each value its own sample
    _, naive = quantiles_with_se(iid, (0.5,))
    assert naive.mean() / spread[2] < 0.75  # the naive (iid) formula is visibly wrong


def test_standard_errors_shrink_like_inverse_sqrt_n():
    rng = np.random.default_rng(4)
    small, large = rng.normal(size=(1000, 1, 3)), rng.normal(size=(16000, 1, 3))
    _, se_s = quantiles_with_se(small)
    _, se_l = quantiles_with_se(large)
    np.testing.assert_allclose(se_s / se_l, 4.0, rtol=0.2)
    m_s, m_l = moments_with_se(small), moments_with_se(large)
    np.testing.assert_allclose(m_s["mean_se"] / m_l["mean_se"], 4.0, rtol=0.1)
    np.testing.assert_allclose(m_s["var_se"] / m_l["var_se"], 4.0, rtol=0.2)


def test_moment_standard_errors_are_calibrated():
    rng = np.random.default_rng(5)
    x = rng.exponential(size=(300, 500))  # 500 replications of 300 samples
    mo = moments_with_se(x)
    np.testing.assert_allclose(mo["mean_se"].mean() / mo["mean"].std(ddof=1), 1.0, atol=0.1)
    np.testing.assert_allclose(mo["var_se"].mean() / mo["var"].std(ddof=1), 1.0, atol=0.2)
    np.testing.assert_allclose(mo["var"].mean(), 1.0, atol=4 * mo["var"].std() / 500**0.5)


def test_align_times_nearest_common_times():
    net = np.arange(151) / 200
    ia, ib = align_times(net, np.arange(76) * 0.01)
    np.testing.assert_allclose(net[ia], np.arange(76) * 0.01, atol=1e-12)
    np.testing.assert_array_equal(ib, np.arange(76))
    sde = np.arange(0, 0.7501, 0.003)
    ia, ib = align_times(net, sde)
    assert np.abs(net[ia] - sde[ib]).max() <= 0.0015 + 1e-12
    assert len(set(ia)) == len(ia) and len(set(ib)) == len(ib)
    with pytest.raises(ValueError, match="overlap"):
        align_times(net, net + 2.0)


def test_compare_aligns_and_excludes_exploded_paths():
    V = _random_V(50, 5, 3, 6)
    net = _dataset(V, t=np.arange(5) / 20, layer=np.arange(5))
    lim_V = _random_V(40, 3, 3, 7)
    lim_V[0, 2] = float("nan")
    exploded = np.zeros(40, dtype=bool)
    exploded[[0, 1, 2]] = True
    lim = _dataset(lim_V, t=[0.0, 0.1, 0.2], data_vars={"exploded": (("sample",), exploded)})
    out = compare(net, lim)
    np.testing.assert_allclose(out["t"].values, [0.0, 0.1, 0.2])
    np.testing.assert_array_equal(out["layer"].values, [0, 2, 4])
    assert out.attrs["n_limit"] == 37 and out.attrs["n_excluded_limit"] == 3
    assert np.isfinite(out["ks_logVaa"].values).all()
    direct = V[:, [0, 2, 4]].mean(0).numpy()
    np.testing.assert_allclose(out["V_mean"].sel(source="network").values, direct)


def test_compare_rejects_bad_input():
    a = _dataset(_random_V(10, 2, 3, 0))
    b = _dataset(_random_V(10, 2, 4, 0))
    with pytest.raises(ValueError, match="tokens"):
        compare(a, b)
    for probs in ((0.0, 0.5), (0.5, 1.0), ((0.5,),)):
        with pytest.raises(ValueError, match="probs"):
            quantiles_with_se(np.zeros((5, 1, 1)), probs)
    c = _dataset(_random_V(10, 2, 3, 1))
    for quantiles in ((1.5,), (), "x", ((0.5,),)):
        with pytest.raises(ValueError, match=r"quantiles must be a non-empty sequence in \(0, 1\)"):
            compare(a, c, quantiles=quantiles)
    with pytest.raises(ValueError, match="tolerance must be a finite number >= 0"):
        compare(a, c, tolerance=-1.0)


def test_collapse_report_known_layers():
    N, nt = 10, 8
    r = np.full((N, nt), 0.2)
    for s in range(N):
        if s < 6:  # sample s collapses at index s + 1
            r[s, s + 1 :] = 0.999
    ds = _dataset(_two_token(r), layer=np.arange(nt))
    rep = collapse_report(
        {"model": ds, "stable": _dataset(_two_token(np.full((N, nt), 0.2)))}, threshold=0.99
    )
    assert rep["fraction_collapsed"].sel(model="model") == pytest.approx(0.6)
    # first indices 1..6 then four never: lower median of [1,2,3,4,5,6,inf x4] is 5
    assert rep["median_collapse_layer"].sel(model="model") == 5
    assert rep["median_collapse_t"].sel(model="model") == pytest.approx(5 / CONFIG.width)
    assert rep["fraction_collapsed"].sel(model="stable") == 0
    assert rep["median_collapse_layer"].sel(model="stable") == NEVER == -1
    assert rep["median_collapse_t"].sel(model="stable") == NEVER
    assert rep["final_mean_rho"].sel(model="stable") == pytest.approx(0.2)


def test_convergence_fit_recovers_a_known_rate():
    """Networks whose rho_T is the limit's shifted by 0.3 / sqrt(n): W1 = 0.3 n^(-1/2)
    exactly, so the fitted slope is -1/2 and the intercept log 0.3 (no simulation runs)."""
    from simulations.convergence import at_width, convergence

    config = ModelConfig(width=8, depth=6)
    rng = np.random.default_rng(8)
    r = rng.uniform(-0.5, 0.5, size=(400, 1))
    limit = _dataset(_two_token(np.repeat(r, 2, axis=1)), t=[0.0, config.T])
    networks = {}
    for n in (8, 32, 128):
        cfg = at_width(config, n)
        V = _two_token(np.repeat(r + 0.3 / np.sqrt(n), 2, axis=1))
        networks[n] = covariance_dataset(V, [0.0, cfg.T], cfg, source="network", method="x",
                                         seed=0)  # fmt: skip
    out = convergence(config, [8, 32, 128], torch.eye(2), 400, limit=limit, networks=networks)
    np.testing.assert_allclose(out["w1_rho"].values, 0.3 / np.sqrt([8, 32, 128]), rtol=1e-9)
    assert out.attrs["w1_rho_slope"] == pytest.approx(-0.5, abs=1e-9)
    assert out.attrs["w1_rho_intercept"] == pytest.approx(np.log(0.3), abs=1e-9)
    np.testing.assert_allclose(out["median_rho_gap"].values, 0.3 / np.sqrt([8, 32, 128]),
                               rtol=1e-6)  # fmt: skip
    assert out["depth"].values.tolist() == [6, 24, 96]
    with pytest.raises(ValueError, match="widths"):
        convergence(config, [8], torch.eye(2), 400, limit=limit, networks=networks)
    with pytest.raises(ValueError, match="samples must be an integer >= 2"):
        convergence(config, [8, 32], torch.eye(2), 1)  # before any simulation or solve


def test_plot_functions_write_png_and_pdf(tmp_path):
    from simulations import plots

    net = _dataset(_random_V(60, 3, 3, 9), layer=np.arange(3))
    lim = _dataset(_random_V(50, 3, 3, 10))
    cmp = compare(net, lim)
    plots.plot_quantile_bands(cmp, path=tmp_path / "bands")
    plots.plot_rho_density(net, lim, path=tmp_path / "density")
    plots.plot_mean_correlation({"a": net, "b": lim}, path=tmp_path / "mean")
    for name in ("bands", "density", "mean"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
        assert (tmp_path / f"{name}.pdf").read_bytes()[:4] == b"%PDF"
    with pytest.raises(ValueError, match="quantiles"):
        plots.plot_quantile_bands(compare(net, lim, quantiles=(0.5,)))


def test_rho_density_is_reflected_at_the_bounds():
    """Issue 39: the KDE dropped at rho = +-1 where the histogram spikes; the reflected one
    keeps a uniform density flat up to the bounds and integrates to 1 over [-1, 1]."""
    from simulations.plots import bounded_kde

    x = np.random.default_rng(0).uniform(-1, 1, 20_000)
    grid = np.linspace(-1, 1, 2001)
    density = bounded_kde(x, grid)
    assert density[0] == pytest.approx(0.5, rel=0.1) and density[-1] == pytest.approx(0.5, rel=0.1)
    assert stats.gaussian_kde(x)(grid[-1:])[0] < 0.3  # the plain KDE halves it
    assert integrate.trapezoid(density, grid) == pytest.approx(1.0, abs=0.01)
    assert bounded_kde(x, np.array([1.5]))[0] == 0.0
    # the figure draws it: a collapse spike at rho = 1 keeps its height at the bound
    r = np.clip(1 - np.abs(np.random.default_rng(1).normal(0, 0.02, (200, 2))), -1, 1)
    net = _dataset(_two_token(r))
    from simulations import plots

    line = plots.plot_rho_density(net, net).axes[0].lines[0]
    xs, ys = line.get_xdata(), line.get_ydata()
    np.testing.assert_allclose(ys, bounded_kde(r[:, -1], xs))
    assert ys[-1] >= 0.9 * ys.max()


def test_collapse_report_final_mean_rho_is_at_the_last_time_over_finite_samples():
    """final_mean_rho: the mean over samples of the mean off-diagonal correlation at the last
    recorded time; samples whose V is not finite there are left out, and count as collapsed."""
    N, nt = 6, 4
    rng = np.random.default_rng(2)
    r = rng.uniform(-0.5, 0.9, size=(N, nt))
    V = _two_token(r, scale=rng.uniform(0.5, 2.0, size=(N, nt)))
    V[5, 2:] = np.inf  # overflowed from index 2 on
    rep = collapse_report({"m": _dataset(V)}, threshold=0.95)
    assert rep["final_mean_rho"].item() == pytest.approx(r[:5, -1].mean(), rel=1e-12)
    assert rep["samples"].item() == N
    expected_hits = ((r[:5] > 0.95).any(axis=1)).sum() + 1
    assert rep["fraction_collapsed"].item() == pytest.approx(expected_hits / N)


@pytest.mark.parametrize(("collapsing", "median"), [(5, 5.0), (4, NEVER), (1, NEVER)])
def test_collapse_report_median_counts_never_collapsed_as_infinite(collapsing, median):
    """Lower median over all 10 samples, never-collapsed ones counting as later than any: a
    layer iff at least half collapse, else the marker NEVER (sample s collapses at layer
    s + 1)."""
    N, nt = 10, 8
    r = np.full((N, nt), 0.2)
    for s in range(collapsing):
        r[s, s + 1 :] = 0.999
    rep = collapse_report({"m": _dataset(_two_token(r), layer=np.arange(nt))})
    assert rep["median_collapse_layer"].item() == median


def _shifted_networks(config, widths, r_T, r_0, shift, n_valid):
    """Networks at t = 0 and T whose rho_T is ``r_T + shift(n)`` (two tokens); at t = 0 all
    sources agree with ``r_0``. ``n_valid[n]`` samples are finite, the rest NaN."""
    from simulations.convergence import at_width

    networks = {}
    for n in widths:
        cfg = at_width(config, n)
        r = np.stack([r_0, r_T + shift(n)], axis=1)
        V = _two_token(r)
        V[n_valid[n] :] = np.nan
        networks[n] = covariance_dataset(V, [0.0, cfg.T], cfg, source="network", method="x",
                                         seed=0)  # fmt: skip
    return networks


def test_convergence_compares_at_T_not_at_the_start():
    """At t = 0 networks and limit are identical; at T they differ by 0.2 / n: the distances
    are those at T (W1 = 0.2 / n exactly, slope -1)."""
    from simulations.convergence import convergence

    config = ModelConfig(width=8, depth=4)
    rng = np.random.default_rng(3)
    r_T, r_0 = rng.uniform(-0.5, 0.5, 300), rng.uniform(-0.9, 0.9, 300)
    limit = _dataset(_two_token(np.stack([r_0, r_T], axis=1)), t=[0.0, config.T])
    widths = (8, 16, 64)
    networks = _shifted_networks(config, widths, r_T, r_0, lambda n: 0.2 / n,
                                 dict.fromkeys(widths, 300))  # fmt: skip
    out = convergence(config, widths, torch.eye(2), 300, limit=limit, networks=networks)
    np.testing.assert_allclose(out["w1_rho"].values, 0.2 / np.array(widths), rtol=1e-9)
    fitted = out.attrs["w1_rho_fit_widths"]  # widths above the noise floor + 2 spreads
    if len(fitted) >= 2:
        assert out.attrs["w1_rho_slope"] == pytest.approx(-1.0, abs=1e-9)
    else:
        assert math.isnan(out.attrs["w1_rho_slope"])


def test_convergence_slope_standard_error_and_noise_floor_by_hand():
    """The fit equals scipy.stats.linregress of log d on log n (slope, its standard error,
    intercept); the noise floor is the mean over the 16 seeded half-splits of the SDE sample
    of scipy's W1 / KS distances, times sqrt(1/n_net + 1/N) / sqrt(1/h + 1/(N - h)) with
    n_net the *smallest* number of usable network samples and N the usable SDE samples."""
    from simulations.convergence import convergence

    config = ModelConfig(width=8, depth=4)
    rng = np.random.default_rng(4)
    N = 301  # odd: h = 150, N - h = 151
    r_T, r_0 = rng.uniform(-0.5, 0.5, N), np.zeros(N)
    scale_T = rng.uniform(0.5, 2.0, N)
    V_lim = _two_token(np.stack([r_0, r_T], axis=1), scale=np.stack([np.ones(N), scale_T], 1))
    limit = _dataset(V_lim, t=[0.0, config.T])
    widths = (8, 16, 32, 64)
    shift = {8: 0.3, 16: 0.1, 32: 0.08, 64: 0.02}  # not a power law: residuals are non-zero
    n_valid = {8: 250, 16: 120, 32: 200, 64: 301}
    networks = _shifted_networks(config, widths, r_T, r_0, shift.get, n_valid)
    out = convergence(config, widths, torch.eye(2), N, limit=limit, networks=networks)
    assert out["n_network"].values.tolist() == [250, 120, 200, 301]
    # the fit uses exactly the widths whose distance exceeds the floor + 2 spreads
    d = out["w1_rho"].values
    above = d > out.attrs["w1_rho_noise_floor"] + 2 * out.attrs["w1_rho_noise_sd"]
    assert out.attrs["w1_rho_fit_widths"] == [w for w, a in zip(widths, above, strict=True) if a]
    assert above.sum() >= 3  # enough here for a slope and its standard error
    fit = stats.linregress(np.log(np.array(widths)[above]), np.log(d[above]))
    assert out.attrs["w1_rho_slope"] == pytest.approx(fit.slope, rel=1e-9)
    assert out.attrs["w1_rho_slope_se"] == pytest.approx(fit.stderr, rel=1e-9)
    assert out.attrs["w1_rho_intercept"] == pytest.approx(fit.intercept, rel=1e-9)

    values = {"rho": r_T, "logVaa": np.log(scale_T)}
    h = N // 2
    scale = np.sqrt(1 / 120 + 1 / N) / np.sqrt(1 / h + 1 / (N - h))
    split_rng = np.random.default_rng(0)
    perms = [split_rng.permutation(N) for _ in range(16)]
    for var, x in values.items():
        pooled = {"rho": lambda ix, x=x: x[ix], "logVaa": lambda ix, x=x: np.repeat(x[ix], 2)}
        w1 = np.mean([stats.wasserstein_distance(pooled[var](p[:h]), pooled[var](p[h:]))
                      for p in perms])  # fmt: skip
        ks = np.mean([stats.ks_2samp(pooled[var](p[:h]), pooled[var](p[h:])).statistic
                      for p in perms])  # fmt: skip
        assert out.attrs[f"w1_{var}_noise_floor"] == pytest.approx(w1 * scale, rel=1e-9)
        w1_sd = np.std([stats.wasserstein_distance(pooled[var](p[:h]), pooled[var](p[h:]))
                        for p in perms], ddof=1)  # fmt: skip
        assert out.attrs[f"w1_{var}_noise_sd"] == pytest.approx(w1_sd * scale, rel=1e-9)
        assert out.attrs[f"ks_{var}_noise_floor"] == pytest.approx(ks * scale, rel=1e-9)


# Exact values of the statistics (hand-computed small cases) -----------------------------------
def test_hall_sheather_bandwidth_by_hand():
    from simulations.compare import _hall_sheather

    z = 1.959963984540054  # Phi^{-1}(0.975)
    h = 100 ** (-1 / 3) * z ** (2 / 3) * (1.5 / (2 * np.pi)) ** (1 / 3)  # p = 1/2: z_p = 0
    assert _hall_sheather(100, np.array([0.5]))[0] == pytest.approx(h, rel=1e-12)
    zp = stats.norm.ppf(0.9)
    h9 = (
        1000 ** (-1 / 3)
        * z ** (2 / 3)
        * (1.5 * stats.norm.pdf(zp) ** 2 / (2 * zp**2 + 1)) ** (1 / 3)
    )
    assert _hall_sheather(1000, np.array([0.9]))[0] == pytest.approx(h9, rel=1e-12)
    # never reaches past 0 or 1: capped at 0.999 min(p, 1 - p)
    capped = _hall_sheather(5, np.array([0.01, 0.99]))
    np.testing.assert_allclose(capped, [0.00999, 0.00999], rtol=1e-9)


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.95])
def test_quantile_se_one_value_per_sample_is_the_classical_formula(p):
    """x_s = s / (N - 1): the empirical quantile function is the identity, so q_p = p, the
    sparsity 1/f is exactly 1 and se = sqrt(F (1 - F) / (N - 1)) with F = #{x <= q_p} / N
    (the ddof-1 variance of the indicators over N)."""
    N = 201
    x = (np.arange(N) / (N - 1))[:, None, None]
    q, se = quantiles_with_se(x, (p,))
    assert q[0, 0] == pytest.approx(p, abs=1e-12)
    F = np.count_nonzero(x.ravel() <= q[0, 0] + 1e-15) / N
    assert se[0, 0] == pytest.approx(np.sqrt(F * (1 - F) / (N - 1)), rel=1e-9)


def test_quantile_se_treats_a_sample_as_one_observation():
    """k identical copies of each sample's value carry no more information than one: the
    indicator fractions g_s are the same 0/1 values, so the SE is the k = 1 one (the
    sparsity of the pooled and unpooled empirical quantile functions agree up to O(1/N))."""
    N = 401
    x1 = (np.arange(N) / (N - 1))[:, None, None]
    x4 = np.repeat(x1, 4, axis=2)
    _, se1 = quantiles_with_se(x1, (0.5,))
    _, se4 = quantiles_with_se(x4, (0.5,))
    assert se4[0, 0] == pytest.approx(se1[0, 0], rel=0.02)


def test_moments_with_se_by_hand():
    x = np.array([0.0, 0.0, 0.0, 4.0])[:, None]
    mo = moments_with_se(np.concatenate([x, 2 * x], axis=1))
    # mean 1, var (1 + 1 + 1 + 9) / 3 = 4, mu_4 = (1 + 1 + 1 + 81) / 4 = 21
    np.testing.assert_allclose(mo["mean"], [1.0, 2.0])
    np.testing.assert_allclose(mo["var"], [4.0, 16.0])
    np.testing.assert_allclose(mo["mean_se"], [1.0, 2.0])  # sqrt(4 / 4)
    np.testing.assert_allclose(mo["var_se"], [np.sqrt(5 / 4), 4 * np.sqrt(5 / 4)])
    flat = moments_with_se(np.array([1.0, 2.0, 3.0, 4.0]))  # mu_4 < var^2: clipped to 0
    assert flat["var_se"] == 0.0 and flat["var"] == pytest.approx(5 / 3)
    with pytest.raises(ValueError, match="2 samples"):
        moments_with_se(np.ones((1, 3)))


def test_distances_pool_values_per_time_and_count_samples_for_the_pvalue():
    """a: 3 samples x 2 values, b: 5 samples x 1 value, two times: KS and W1 of the pooled
    values (scipy), p-value of kstwo at n = round(3 * 5 / 8) = 2."""
    rng = np.random.default_rng(9)
    a, b = rng.normal(size=(3, 2, 2)), rng.normal(size=(5, 2, 1)) + 0.5
    d = distances(a, b)
    for i in range(2):
        u, v = a[:, i].ravel(), b[:, i].ravel()
        ks = stats.ks_2samp(u, v).statistic
        assert d["ks"][i] == pytest.approx(ks, abs=1e-14)
        assert d["w1"][i] == pytest.approx(stats.wasserstein_distance(u, v), rel=1e-12)
        assert d["ks_pvalue"][i] == pytest.approx(stats.kstwo.sf(ks, 2), rel=1e-12)
    # values equal up to rounding are ties (a point mass computed twice): KS 0, not 1
    one = np.full((4, 1, 1), 0.3)
    assert distances(one, one * (1 + 1e-15))["ks"][0] == 0.0
    assert distances(one, one + 1e-9)["ks"][0] == 1.0
    # also at 0 (log V^aa of a fixed V0 with V^aa = 1, rounded differently by two samplers)
    zero = np.zeros((4, 1, 1))
    jitter = np.array([1, -1, 2, 0], dtype=float).reshape(4, 1, 1) * 1e-16
    assert distances(zero, jitter)["ks"][0] == 0.0 and distances(zero, jitter)["ks_pvalue"][0] == 1
    assert distances(zero, zero + 1e-9)["ks"][0] == 1.0


def test_compare_mean_rho_and_token_values_by_hand():
    """m = 3: rho pools the pairs (0,1), (0,2), (1,2) of each sample; mean_rho is the mean
    over samples of their average, with se = sd / sqrt(N); Vaa the diagonal."""
    from simulations.compare import token_values

    V = _random_V(5, 2, 3, 11)
    ds = _dataset(V)
    vals = token_values(ds)
    Vn = V.numpy()
    d = np.sqrt(np.diagonal(Vn, axis1=-2, axis2=-1))
    rho = Vn / (d[..., :, None] * d[..., None, :])
    np.testing.assert_allclose(vals["rho"], rho[..., [0, 0, 1], [1, 2, 2]], rtol=1e-12)
    np.testing.assert_allclose(vals["logVaa"], np.log(d**2), rtol=1e-12)
    out = compare(ds, ds)
    per_sample = rho[..., [0, 0, 1], [1, 2, 2]].mean(-1)  # (N, t)
    np.testing.assert_allclose(out["mean_rho"].values[0], per_sample.mean(0), rtol=1e-12)
    np.testing.assert_allclose(out["mean_rho_se"].values[0],
                               per_sample.std(0, ddof=1) / np.sqrt(5), rtol=1e-12)  # fmt: skip
    np.testing.assert_allclose(out["V_var"].values[0], Vn.var(0, ddof=1), rtol=1e-12)


def test_align_times_explicit_tolerance_and_one_pair_per_time():
    """The grid with fewer points in the common range is the reference, whichever argument it
    is; each of its times pairs with the nearest other time if within ``tolerance``."""
    a, b = [0.0, 0.1, 0.2, 0.3, 0.4], [0.0, 0.12, 0.29, 0.4]
    ia, ib = align_times(a, b, tolerance=0.015)
    assert ia.tolist() == [0, 3, 4] and ib.tolist() == [0, 2, 3]
    ia, ib = align_times(a, b, tolerance=0.025)
    assert ia.tolist() == [0, 1, 3, 4] and ib.tolist() == [0, 1, 2, 3]
    ib2, ia2 = align_times(b, a, tolerance=0.025)
    assert (ia2.tolist(), ib2.tolist()) == (ia.tolist(), ib.tolist())
    # default tolerance: half the largest spacing of the other grid (any in-range time)
    ia, ib = align_times(a, b)
    assert ia.tolist() == [0, 1, 3, 4]
    with pytest.raises(ValueError, match="no common times"):
        align_times([0.0, 0.25, 0.5], [0.2, 0.3], tolerance=0.01)
    # only times in the common range count: a has 6 times but 3 in [0, 0.4], so it is the
    # reference, and b's extra times are skipped
    ia, ib = align_times([0.0, 0.2, 0.4, 0.6, 0.8, 1.0], [0.0, 0.11, 0.2, 0.31, 0.4])
    assert ia.tolist() == [0, 1, 2] and ib.tolist() == [0, 2, 4]
    for bad in ([], [[0.0, 0.1]]):
        with pytest.raises(ValueError, match="non-empty 1-d"):
            align_times(bad, [0.0, 0.1])
        with pytest.raises(ValueError, match="non-empty 1-d"):
            align_times([0.0, 0.1], bad)


def test_two_usable_samples_are_enough_and_one_is_not():
    V = _random_V(3, 2, 2, 12)
    q, se = quantiles_with_se(np.array([[[0.0]], [[1.0]]]), (0.5,))
    assert q[0, 0] == 0.5 and np.isfinite(se).all()
    with pytest.raises(ValueError, match="N >= 2"):
        quantiles_with_se(np.zeros((1, 1, 3)))
    two = V.clone()
    two[0] = float("nan")
    out = compare(_dataset(two), _dataset(V))
    assert out.attrs["n_network"] == 2 and out.attrs["n_excluded_network"] == 1
    two[1] = float("nan")
    with pytest.raises(ValueError, match="network: fewer than 2 usable samples"):
        compare(_dataset(two), _dataset(V))


def test_at_width_keeps_T_and_rejects_widths_without_an_integer_depth():
    from simulations.convergence import at_width

    config = ModelConfig(width=8, depth=6, heads=2)  # T = 3/4, head_dim 4 derived
    wide = at_width(config, 32)
    assert (wide.width, wide.depth, wide.head_dim, wide.key_dim, wide.heads) == (32, 24, 16, 16, 2)
    fixed = at_width(config.replace(head_dim=3, out_proj=True), 16)
    assert (fixed.depth, fixed.head_dim, fixed.key_dim) == (12, 3, 4)  # explicit: kept
    keys = at_width(config.replace(key_dim=5), 16)
    assert (keys.head_dim, keys.key_dim) == (8, 5)
    # 3 heads of size 2 = 8 // 3 on width 8 are a fixed head size (3 does not divide 8)
    odd = at_width(ModelConfig(width=8, depth=4, heads=3, head_dim=2, out_proj=True), 16)
    assert (odd.head_dim, odd.key_dim, odd.depth) == (2, 2, 8)
    for bad in (0, -8, 8.0, True, "8"):
        with pytest.raises(ValueError, match="integers >= 1"):
            at_width(config, bad)
    with pytest.raises(ValueError, match="positive integer"):
        at_width(config, 10)  # depth 7.5
    with pytest.raises(ValueError, match="positive integer"):
        at_width(ModelConfig(width=8, depth=1), 4)  # depth 0.5


def test_fit_uses_only_positive_finite_distances():
    from simulations.convergence import _fit

    logn = np.log([8.0, 16.0, 32.0, 64.0, 128.0])
    d = np.array([0.3, 0.0, 0.11, np.nan, 0.04])
    ref = stats.linregress(logn[[0, 2, 4]], np.log(d[[0, 2, 4]]))
    out = _fit(logn, d, "x")
    assert out["x_slope"] == pytest.approx(ref.slope, rel=1e-12)
    assert out["x_slope_se"] == pytest.approx(ref.stderr, rel=1e-9)
    two = _fit(logn[:2], np.array([0.2, 0.1]), "x")  # exact line, no degrees of freedom
    assert two["x_slope"] == pytest.approx(-1.0) and np.isnan(two["x_slope_se"])
    assert np.isnan(_fit(logn[:2], np.array([0.2, 0.0]), "x")["x_slope"])


def test_noise_floor_needs_two_samples_per_half():
    from simulations.convergence import _noise_floor

    r = np.array([[0.1], [0.5], [-0.2], [0.3]])
    ds = _dataset(_two_token(r), t=[0.0])
    floors, spreads = _noise_floor(ds, 4)
    assert np.isfinite(list(floors.values())).all()  # N = 4: halves of 2
    assert np.isfinite(list(spreads.values())).all()
    assert all(np.isnan(v) for v in _noise_floor(ds.isel(sample=[0, 1, 2]), 4)[0].values())


def test_convergence_needs_the_limit_at_T():
    from simulations.convergence import convergence

    config = ModelConfig(width=8, depth=4)  # T = 0.5
    r = np.random.default_rng(0).uniform(-0.5, 0.5, size=(20, 2))
    limit = _dataset(_two_token(r), t=[0.0, 0.49])
    with pytest.raises(ValueError, match=r"no time at T = 0\.5"):
        convergence(config, [8, 16], torch.eye(2), 20, limit=limit, networks={})


def test_convergence_runs_the_direct_calls_it_documents():
    """Without ``networks``/``limit`` it equals passing simulate(seed) at each width and
    sde.solve(seed + 1) at T: runs are reproducible from the seed alone."""
    import sde
    from simulations import simulate
    from simulations.convergence import at_width, convergence

    config = ModelConfig(width=4, depth=2, mlp="shaped_relu")
    V0 = torch.tensor([[1.0, 0.3], [0.3, 1.0]], dtype=torch.float64)
    kw = {"seed": 3, "dt": 0.1}
    run = convergence(config, [4, 8], V0, 24, progress=False, **kw)
    limit = sde.solve(config, V0, 24, T=config.T, dt=0.1, seed=4, progress=False)
    nets = {w: simulate(at_width(config, w), V0, 24, seed=3, progress=False) for w in (4, 8)}
    given = convergence(config, [4, 8], V0, 24, limit=limit, networks=nets, **kw)
    np.testing.assert_array_equal(run["w1_rho"].values, given["w1_rho"].values)
    np.testing.assert_array_equal(run["ks_logVaa"].values, given["ks_logVaa"].values)


def _mean_rho_np(V: np.ndarray) -> np.ndarray:
    """Mean off-diagonal correlation (N, t) by hand."""
    d = np.sqrt(np.diagonal(V, axis1=-2, axis2=-1))
    r = V / (d[..., :, None] * d[..., None, :])
    m = V.shape[-1]
    return (r.sum((-1, -2)) - m) / (m * (m - 1))


def _band_ys(collection) -> np.ndarray:
    return np.concatenate([p.vertices[:, 1] for p in collection.get_paths()])


def test_plots_draw_the_documented_statistics():
    """The figures show what their docs say: mean rho (finite samples) with its 5-95% band
    and the threshold; quantile-band medians and 5/95% lines; token-pair means with a +-2 SE
    band; per panel the median collapse layer; KDE over the histogram's range."""
    from simulations import plots
    from simulations.compare import token_pairs

    V = _random_V(40, 4, 3, 11)
    V[3, 2] = float("nan")  # excluded sample
    net = _dataset(V, layer=np.arange(4))
    ax = plots.plot_mean_correlation({"a": net}, threshold=0.9).axes[0]
    r = _mean_rho_np(V.numpy())
    r = r[np.isfinite(r).all(1)]
    line, thr = ax.get_lines()
    np.testing.assert_allclose(line.get_xdata(), np.arange(4))
    np.testing.assert_allclose(line.get_ydata(), r.mean(0), rtol=1e-12)
    assert list(thr.get_ydata()) == [0.9, 0.9]
    band = _band_ys(ax.collections[0])
    for y in np.quantile(r, [0.05, 0.95], axis=0).ravel():
        assert np.isclose(band, y, rtol=1e-12).any()

    lim = _dataset(_random_V(50, 4, 3, 12))
    # extra quantiles besides the five the figure needs: the network as its median line and
    # 5-95% / 25-75% bands, the SDE as lines at 5, 25, 50, 75 and 95%
    cmp = compare(net, lim, quantiles=(0.01, 0.05, 0.25, 0.5, 0.55, 0.75, 0.95, 0.99))
    fig = plots.plot_quantile_bands(cmp)
    for ax, var in zip(fig.axes, ("rho_quantile", "Vaa_quantile"), strict=True):
        ys = [ln.get_ydata() for ln in ax.get_lines()]
        assert len(ys) == 6  # the network's median and the SDE's five quantile lines
        shown = [("network", 0.5)] + [("sde", p) for p in (0.05, 0.25, 0.5, 0.75, 0.95)]
        for src, p in shown:
            q = cmp[var].sel(source=src, quantile=p).values
            assert any(np.allclose(y, q, rtol=1e-12) for y in ys), (var, src, p)
        bands = np.concatenate([_band_ys(c) for c in ax.collections])
        for p in (0.05, 0.25, 0.75, 0.95):
            for y in cmp[var].sel(source="network", quantile=p).values.ravel():
                assert np.isclose(bands, y, rtol=1e-12).any(), (var, p)

    pairs = token_pairs(net, lim)
    ax = plots.plot_token_pairs(pairs).axes[0]
    mean = pairs["mean_rho"].sel(source="network").values[0]
    se = pairs["mean_rho_se"].sel(source="network").values[0]
    band = _band_ys(ax.collections[0])
    for y in (*(mean - 2 * se), *(mean + 2 * se)):
        assert np.isclose(band, y, rtol=1e-12).any()

    # a model whose every sample collapses at layer 2: the dashed line on the rho panel
    collapsing = np.full((8, 4), 0.5)
    collapsing[:, 2:] = 0.999
    fig = plots.plot_collapse_metrics({"c": _dataset(_two_token(collapsing), layer=np.arange(4))})
    vlines = [ln for ln in fig.axes[0].get_lines() if ln.get_linestyle() == "--"]
    assert len(vlines) == 1 and list(vlines[0].get_xdata()) == [2.0, 2.0]
    assert not any(ln.get_linestyle() == "--" for ax in fig.axes[1:] for ln in ax.get_lines())

    ax = plots.plot_rho_density(net, lim).axes[0]
    kde = ax.get_lines()[0].get_xdata()  # network's KDE grid: the range of its rho at T
    last = V.numpy()[:, -1]  # every sample finite at the last time
    d = np.sqrt(np.diagonal(last, axis1=-2, axis2=-1))
    rho = (last / (d[:, :, None] * d[:, None, :]))[:, [0, 0, 1], [1, 2, 2]]
    assert (kde[0], kde[-1]) == pytest.approx((rho.min(), rho.max()), rel=1e-12)


def test_convergence_plot_draws_the_fit_floor_and_reference():
    """plot_convergence: the points, the n^(-1/2) reference through the first point, the
    noise-floor line, and the fit ``exp(intercept) n^slope`` over the fitted widths only (a
    note instead when fewer than two widths were fitted)."""
    import xarray as xr

    from simulations import plots

    n = np.array([4.0, 8.0, 16.0, 32.0])
    d = np.array([0.2, 0.15, 0.1, 0.02])
    attrs = {"w1_rho_slope": -0.6, "w1_rho_intercept": 0.1, "w1_rho_fit_widths": [4, 8, 16],
             "w1_rho_noise_floor": 0.03, "w1_rho_noise_sd": 0.004, "w1_rho_slope_se": 0.1,
             "T": 0.75}  # fmt: skip
    conv = xr.Dataset({"w1_rho": ("width", d)}, coords={"width": n.astype(int)}, attrs=attrs)
    ax = plots.plot_convergence(conv).axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    fit = next(ln for k, ln in lines.items() if k.startswith("fit above the floor"))
    np.testing.assert_allclose(fit.get_xdata(), [4, 8, 16])
    np.testing.assert_allclose(fit.get_ydata(), np.exp(0.1) * np.array([4, 8, 16]) ** -0.6)
    ref = lines[r"$n^{-1/2}$ reference"]
    np.testing.assert_allclose(ref.get_ydata(), 0.2 * (n / 4) ** -0.5)
    assert list(lines["Monte Carlo noise floor"].get_ydata()) == [0.03, 0.03]
    assert not ax.texts
    for few in ([16], []):
        ax = plots.plot_convergence(conv.assign_attrs(w1_rho_fit_widths=few)).axes[0]
        assert not any(ln.get_label().startswith("fit") for ln in ax.get_lines())
        assert "no slope fitted" in ax.texts[0].get_text()
    ax = plots.plot_convergence(conv.assign_attrs(w1_rho_slope=float("nan"))).axes[0]
    assert "no slope fitted" in ax.texts[0].get_text()
