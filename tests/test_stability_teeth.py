"""``simulations.stability.median_interval``: the order-statistic indices, exactly (issue 66:
the seeded coverage test of test_stability.py decides an index only on the third decimal of
a coverage estimate)."""

from __future__ import annotations

import dataclasses
import math
from math import comb

import numpy as np
import pytest
import torch
import xarray as xr

import simulations.stability as stability
from shapedtx import ModelConfig, ParameterError
from shapedtx.covariance import equicorrelated
from simulations.stability import (
    AGREEMENT_TOLERANCE,
    DEFAULT_HIGH,
    DEFAULT_LOW,
    MEDIAN_LEVEL,
    SOURCES,
    _edges,
    _is_log,
    agreement,
    median_interval,
    plot_stability_map,
    stability_map,
)


def _j(N: int, level: float) -> int:
    """docs: the largest j with P(Binomial(N, 1/2) < j) <= (1 - level) / 2, at least 1."""
    alpha, best, below = (1 - level) / 2, 1, 0
    for j in range(1, N + 1):
        below += comb(N, j - 1)  # 2^N P(Binomial(N, 1/2) < j)
        if below <= alpha * 2**N:
            best = j
    return best


@pytest.mark.parametrize("level", [MEDIAN_LEVEL, 0.9, 0.99, 0.6])
def test_interval_ends_are_the_documented_order_statistics(level):
    rng = np.random.default_rng(0)
    for N in range(1, 90):
        values = rng.permutation(N).astype(float) * 1.5  # x_(k) = 1.5 (k - 1)
        med, lo, hi = median_interval(values, level)
        j = _j(N, level)
        assert (lo, hi) == (1.5 * (j - 1), 1.5 * (N - j)), N
        assert med == 1.5 * (N - 1) / 2


def test_default_level_and_known_indices():
    """N = 100 at 95%: j = 40 (P(B < 40) = 0.0176, P(B < 41) = 0.0284), the 40th and 61st."""
    assert MEDIAN_LEVEL == 0.95
    assert _j(100, 0.95) == 40
    assert median_interval(np.arange(100.0)) == (49.5, 39.0, 60.0)
    assert median_interval(np.arange(5.0)) == (2.0, 0.0, 4.0)  # j = 1 at least
    assert median_interval([3.0]) == (3.0, 3.0, 3.0)


# --------------------------------------------------------------------------------------------
# The map's bookkeeping, exactly: the exits replaced by hand-built ones (no simulation)
# --------------------------------------------------------------------------------------------
CONFIG = ModelConfig(width=100, depth=100, attention="shaped", mlp="none")
Z95 = 1.959963984540054  # the normal's 97.5% quantile


def _exits(c: int, n: int, T_max: float) -> np.ndarray:
    """n exits of cell c: distinct values below the cap, one exactly at it (not censored), and
    c % 3 + (c == 4) * n never-exiting ones (inf) from the top; cell 4 fully censored."""
    x = T_max * (np.arange(1, n + 1) / (n + 1)) * (1 + 0.01 * c)
    x[-1] = T_max
    x[n - (c % 3) - 1 : n - 1] = math.inf
    if c == 4:
        x[:] = math.inf
    return x


@pytest.fixture
def fake_exits(monkeypatch):
    calls: dict[str, tuple] = {}

    def sde(cells, V0, samples, T_max, steps, seed, low, high, progress):
        calls["sde"] = (cells, V0, samples, T_max, steps, seed, low, high, progress)
        exploded = np.arange(len(cells)) / 10
        return np.stack([_exits(c, samples, T_max) * 0.9 for c in range(len(cells))]), exploded

    def net(cells, V0, samples, depth, method, seed, low, high, dtype, progress):
        calls["network"] = (cells, V0, samples, depth, method, seed, low, high, dtype, progress)
        return np.stack([_exits(c, samples, calls["sde"][3]) for c in range(len(cells))])

    monkeypatch.setattr(stability, "_sde_exits", sde)
    monkeypatch.setattr(stability, "_network_exits", net)
    return calls


def _summary(x: np.ndarray, T_max: float) -> tuple[float, float, float, float]:
    """median, interval ends (docs: x_(j), x_(N + 1 - j), values capped at T_max), censored."""
    capped = np.sort(np.minimum(x, T_max))
    j = _j(x.size, MEDIAN_LEVEL)
    return float(np.median(capped)), capped[j - 1], capped[x.size - j], float(np.mean(x > T_max))


T_MAX = 0.07  # T_max * width = 7.000000000000001 and T_max / dt = 7.000000000000001: 7, not 8


def test_every_cell_gets_its_own_exits_medians_and_intervals(fake_exits):
    V0 = equicorrelated(2, 0.2)
    ds = stability_map(
        CONFIG, V0, [0.5, 0.2], [1.0, 0.1, 3.0], T_max=T_MAX, samples=9, sde_samples=11,
        dt=0.01, low=1e-3, high=1e3, seed=5, progress=None,
    )  # fmt: skip
    g, k = [0.2, 0.5], [0.1, 1.0, 3.0]  # sorted; cells row-major over gamma x tau0
    assert ds["gamma"].values.tolist() == g and ds["tau0"].values.tolist() == k
    assert ds["source"].values.tolist() == ["network", "sde"]
    cells, V0_sde, n, T_max, steps, seed, low, high, progress = fake_exits["sde"]
    assert [(c.gamma, c.tau0) for c in cells] == [(a, b) for a in g for b in k]
    assert all(
        dataclasses.replace(c, gamma=CONFIG.gamma, tau0=CONFIG.tau0) == CONFIG for c in cells
    )
    assert (n, T_max, steps, seed, low, high, progress) == (11, T_MAX, 7, 5, 1e-3, 1e3, None)
    assert torch.equal(V0_sde, V0)
    net = fake_exits["network"]
    assert [(c.gamma, c.tau0) for c in net[0]] == [(c.gamma, c.tau0) for c in cells]
    assert net[2:] == (9, 7, "gram", 5, 1e-3, 1e3, torch.float64, None)
    for c in range(6):
        i, j = divmod(c, 3)
        for source, x in (("network", _exits(c, 9, T_MAX)), ("sde", _exits(c, 11, T_MAX) * 0.9)):
            cell = ds.isel(gamma=i, tau0=j).sel(source=source)
            med, lo, hi, censored = _summary(x, T_MAX)
            assert float(cell["median_exit"]) == med, (c, source)
            assert (float(cell["median_low"]), float(cell["median_high"])) == (lo, hi)
            assert float(cell["median_se"]) == pytest.approx((hi - lo) / (2 * Z95), rel=1e-12)
            assert float(cell["censored"]) == censored
        assert float(ds["exploded"][i, j]) == c / 10
        net_med, sde_med = (float(ds["median_exit"].sel(source=s)[i, j]) for s in SOURCES)
        assert float(ds["difference"][i, j]) == net_med - sde_med
        assert float(ds["relative_difference"][i, j]) == (net_med - sde_med) / sde_med
    assert float(ds["censored"].sel(source="network")[1, 1]) == 1.0  # cell 4
    assert float(ds["median_exit"].sel(source="network")[1, 1]) == T_MAX
    attrs = {key: ds.attrs[key] for key in ("T_max", "low", "high", "samples", "sde_samples")}
    assert attrs == {"T_max": T_MAX, "low": 1e-3, "high": 1e3, "samples": 9, "sde_samples": 11}
    assert (ds.attrs["method"], ds.attrs["depth"], ds.attrs["seed"]) == ("gram", 7, 5)
    assert (ds.attrs["tokens"], ds.attrs["dtype"]) == (2, "float64")
    assert ds.attrs["dt"] == T_MAX / 7 and ds.attrs["config.width"] == 100
    assert {key: ds.attrs[key] for key in agreement(ds)} == pytest.approx(agreement(ds))


def test_defaults_and_the_sde_only_map(fake_exits):
    """dt defaults to min(0.01, T_max / 100), sde_samples to samples, the region to
    [1e-4, 1e4], seed 0, progress off; network=False computes no network exits: its entries
    are NaN, method 'none', no agreement numbers."""
    ds = stability_map(CONFIG, equicorrelated(2, 0.2), [0.5], [1.0], T_max=3.0, samples=4,
                       network=False)  # fmt: skip
    assert "network" not in fake_exits
    _, _, n, _, steps, seed, low, high, progress = fake_exits["sde"]
    assert (n, steps, seed, low, high, progress) == (4, 300, 0, 1e-4, 1e4, False)
    assert (DEFAULT_LOW, DEFAULT_HIGH) == (1e-4, 1e4)
    assert ds.attrs["dt"] == 0.01 and ds.attrs["sde_samples"] == 4 and ds.attrs["depth"] == 300
    for var in ("median_exit", "median_low", "median_high", "censored", "median_se"):
        assert np.isnan(ds[var].sel(source="network")).all(), var
        assert np.isfinite(ds[var].sel(source="sde")).all(), var
    assert ds.attrs["method"] == "none" and "fraction_within_10pct" not in ds.attrs
    stability_map(CONFIG, equicorrelated(2, 0.2), [0.5], [1.0], T_max=0.5, samples=2)
    assert fake_exits["sde"][4] == 100  # dt = T_max / 100 below 0.01
    assert fake_exits["network"][3] == 50


def test_v0_on_the_region_boundary_is_accepted(fake_exits):
    """V0's eigenvalues may sit on low and high (a closed region); just outside: refused."""
    V0 = torch.diag(torch.tensor([0.5, 2.0], dtype=torch.float64))
    stability_map(CONFIG, V0, [0.5], [1.0], T_max=0.5, samples=2, low=0.5, high=2.0,
                  network=False)  # fmt: skip
    for low, high in ((0.51, 2.0), (0.5, 1.99)):
        with pytest.raises(ParameterError) as err:
            stability_map(CONFIG, V0, [0.5], [1.0], T_max=0.5, samples=2, low=low, high=high)
        assert err.value.parameter == "V0"
    with pytest.raises(ParameterError) as err:
        stability_map(CONFIG, V0, [0.5], [1.0], T_max=0.5, samples=2, low=2.0, high=2.0)
    assert err.value.parameter == "high"
    seed_max = 2**63 - 2 * 3 - 2  # cell k's networks use seed + 1 + k: all within int64
    stability_map(CONFIG, equicorrelated(2, 0.2), [0.4, 0.5], [0.1, 1.0, 2.0], T_max=0.5,
                  samples=2, sde_samples=2, seed=seed_max)  # fmt: skip
    with pytest.raises(ParameterError) as err:
        stability_map(CONFIG, equicorrelated(2, 0.2), [0.4, 0.5], [0.1, 1.0, 2.0], T_max=0.5,
                      samples=2, seed=seed_max + 1)  # fmt: skip
    assert err.value.parameter == "seed"


def _dataset(net: list[list[float]], sde: list[list[float]], censored) -> xr.Dataset:
    med = np.array([net, sde])
    ds = xr.Dataset(
        {
            "median_exit": (("source", "gamma", "tau0"), med),
            "censored": (("source", "gamma", "tau0"), np.array(censored, dtype=float)),
        },
        coords={"source": list(SOURCES), "gamma": [0.2, 0.5], "tau0": [0.2, 1.0, 5.0]},
    )
    ds["difference"] = ds["median_exit"].sel(source="network") - ds["median_exit"].sel(source="sde")
    ds["relative_difference"] = ds["difference"] / ds["median_exit"].sel(source="sde")
    return ds


def test_agreement_counts_cells_within_the_tolerance_and_names_the_worst():
    """|relative difference| <= 0.1 agrees (0.1 itself too); a cell is censored on both
    sides when both censored fractions are >= 0.5; the worst cell keeps its sign."""
    sde = [[10.0, 20.0, 40.0], [10.0, 10.0, 20.0]]
    net = [[11.0, 20.0, 45.0], [7.5, 10.5, 20.0]]  # rel 0.1, 0, 0.125 / -0.25, 0.05, 0
    censored = [[[0, 0.5, 0], [0, 0, 0.5]], [[0, 0.5, 0], [0, 0, 0.49]]]  # cell (0, 1) both
    out = agreement(_dataset(net, sde, censored))
    assert out == {
        "fraction_within_10pct": 4 / 6,
        "cells_censored_both": 1,
        "fraction_within_10pct_uncensored": 3 / 5,
        "worst_gamma": 0.5,
        "worst_tau0": 0.2,
        "worst_network": 7.5,
        "worst_sde": 10.0,
        "worst_relative_difference": -0.25,
    }
    assert (
        agreement(_dataset(net, sde, censored), tolerance=0.125)["fraction_within_10pct"] == 5 / 6
    )
    assert AGREEMENT_TOLERANCE == 0.1
    everything = agreement(_dataset(net, sde, np.ones((2, 2, 3))))
    assert everything["cells_censored_both"] == 6
    assert math.isnan(everything["fraction_within_10pct_uncensored"])


# --------------------------------------------------------------------------------------------
# The figure: cell edges, axis scales, censored marks, colour scales and titles
# --------------------------------------------------------------------------------------------
def test_cell_edges_and_axis_scales():
    """Linear edges at arithmetic midpoints up to a span of a factor 4 (4 itself linear),
    geometric midpoints beyond; a single value: +-0.5 max(|x|, 1)."""
    assert _edges(np.array([1.0, 4.0])).tolist() == [-0.5, 2.5, 5.5]
    assert not _is_log(np.array([1.0, 4.0])) and _is_log(np.array([1.0, 4.01]))
    assert _edges(np.array([1.0, 9.0])) == pytest.approx([1 / 3, 3.0, 27.0], rel=1e-12)
    assert _edges(np.array([1.0, 2.0, 4.0])).tolist() == [0.5, 1.5, 3.0, 5.0]
    assert _edges(np.array([3.0])).tolist() == [1.5, 4.5]
    assert _edges(np.array([0.2])).tolist() == [-0.3, 0.7]
    assert _edges(np.array([-2.0, 1.0])).tolist() == [-3.5, -0.5, 2.5]
    assert not _is_log(np.array([-1.0, 10.0])) and not _is_log(np.array([5.0]))


def test_figure_marks_censored_cells_and_titles_the_agreement():
    sde = [[10.0, 20.0, 40.0], [10.0, 10.0, 20.0]]
    net = [[11.0, 20.0, 45.0], [7.5, 10.5, 20.0]]
    censored = [[[0, 0.5, 0], [0, 0, 0.49]], [[0, 0.5, 0], [0.7, 0, 0]]]
    ds = _dataset(net, sde, censored)
    ds.attrs.update({"T_max": 50.0, "low": 0.001, "high": 100.0, **agreement(ds)})
    fig = plot_stability_map(ds)
    net_ax, sde_ax, diff_ax = fig.axes[:3]
    for ax in (net_ax, sde_ax, diff_ax):
        assert (ax.get_xscale(), ax.get_yscale()) == ("log", "linear")
        assert (ax.get_xlabel(), ax.get_ylabel()) == ("tau0", "gamma")
    marks = [
        sorted(map(tuple, ax.collections[1].get_offsets().tolist())) for ax in (net_ax, sde_ax)
    ]
    assert marks == [[(1.0, 0.2)], [(0.2, 0.5), (1.0, 0.2)]]  # (tau0, gamma), censored >= 0.5
    norm = net_ax.collections[0].norm
    assert (norm.vmin, norm.vmax) == (7.5, 50.0) and sde_ax.collections[0].norm is norm
    diff_norm = diff_ax.collections[0].norm
    assert (diff_norm.vmin, diff_norm.vcenter, diff_norm.vmax) == (-5.0, 0.0, 5.0)
    maps_bar, diff_bar = fig.axes[3:]  # the shared bar right of both maps, the difference's
    assert maps_bar.get_ylabel() == "median first t out of [low, high]"
    assert diff_bar.get_ylabel() == "network - SDE"
    fig.draw_without_rendering()
    right_of_maps = sde_ax.get_position().x1
    assert right_of_maps < maps_bar.get_position().x0 < diff_ax.get_position().x0
    assert net_ax.get_title() == "finite network: median exit t"
    assert sde_ax.get_title() == "SDE: median exit t"
    assert diff_ax.get_title() == (
        "difference: 67% of cells within 10%\n(60% of the 5 cells not censored on both sides)"
    )
    assert fig._suptitle.get_text() == (
        "first t at which an eigenvalue of V leaves [0.001, 100]; red x: median censored at T_max"
    )


def test_figure_of_equal_maps_without_agreement_numbers():
    """A zero difference keeps a unit colour span; no agreement attrs: the title is
    'difference'; every cell censored on both sides: no second line; the colour scale's
    floor is T_max / 1.01 when every median is the cap; the default region in the title."""
    same = [[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]
    ds = _dataset(same, same, np.ones((2, 2, 3)))
    fig = plot_stability_map(ds)
    assert fig.axes[2].get_title() == "difference"
    assert (fig.axes[2].collections[0].norm.vmin, fig.axes[2].collections[0].norm.vmax) == (-1, 1)
    assert fig.axes[0].collections[0].norm.vmin == pytest.approx(2.0 / 1.01)
    assert fig.axes[0].collections[0].norm.vmax == 2.0
    assert "[0.0001, 10000]" in fig._suptitle.get_text()
    ds.attrs.update({"T_max": 2.0, **agreement(ds)})
    assert plot_stability_map(ds).axes[2].get_title() == "difference: 100% of cells within 10%"


def test_blow_up_limit_is_ten_times_high_whatever_v0s_diagonal(monkeypatch):
    """docs: the SDE paths' blow-up flag sits at ``10 high`` in absolute value (``integrate``
    scales its ``bound`` by ``max_a V0^{aa}``), so a flagged path has left the region; a V0
    whose largest diagonal entry is not 1 tells ``10 high / max V0^{aa}`` from ``* max``."""
    import sde.solvers

    bounds: list[float] = []
    integrate = sde.solvers.integrate

    def spy(*args, **kwargs):
        bounds.append(kwargs["bound"])
        return integrate(*args, **kwargs)

    monkeypatch.setattr(sde.solvers, "integrate", spy)
    V0 = torch.tensor([[2.0, 0.5], [0.5, 1.5]], dtype=torch.float64)
    exits, exploded = stability._sde_exits(
        [CONFIG], V0, 4, T_max=0.02, steps=2, seed=0, low=0.5, high=3.0, progress=False
    )
    assert bounds and all(b * 2.0 == pytest.approx(10 * 3.0) for b in bounds)
    assert exits.shape == (1, 4) and exploded.shape == (1,)
