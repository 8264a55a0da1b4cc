"""The stability map (simulations.stability_map): cells with a known answer, network against
SDE on a cheap grid (tolerance from the order-statistic interval of each median), the figure,
and argument errors."""

import math

import numpy as np
import pytest
import torch

from shapedtx import ModelConfig, ParameterError
from shapedtx.covariance import equicorrelated
from simulations.formatting import format_stability_map
from simulations.stability import (
    exit_times,
    median_interval,
    plot_stability_map,
    stability_map,
)

ATTENTION = ModelConfig(width=64, depth=64, attention="shaped", mlp="none")


def test_exit_times_by_hand():
    """First saved time (after t = 0) with an eigenvalue outside [low, high]; inf if none."""
    t = torch.tensor([0.0, 0.1, 0.2, 0.3])
    inside = torch.eye(2, dtype=torch.float64)
    path = inside.expand(3, 4, 2, 2).clone()
    path[0, 2] = torch.diag(torch.tensor([1.0, 2e4], dtype=torch.float64))  # above high at 0.2
    path[1, 1] = torch.diag(torch.tensor([5e-5, 1.0], dtype=torch.float64))  # below low at 0.1
    path[1, 3] = math.nan
    out = exit_times(path, t, 1e-4, 1e4)
    assert out.tolist() == [pytest.approx(0.2), pytest.approx(0.1), math.inf]
    path[2, 3, 0, 0] = math.inf  # a non-finite covariance has left the region
    assert exit_times(path, t, 1e-4, 1e4)[2] == pytest.approx(0.3)


def test_median_interval_covers_at_its_level():
    """The order-statistic interval covers the median of a known law at >= 95%."""
    rng = np.random.default_rng(0)
    x = rng.exponential(size=(2000, 101))
    covered = [lo <= math.log(2) <= hi for lo, hi in (median_interval(r)[1:] for r in x)]
    assert 0.94 <= np.mean(covered) <= 0.99  # exact level of the j = 41 interval: 0.9646


def test_tiny_gamma_never_leaves_the_region():
    """gamma = 1e-3: V barely moves, so every cell is censored at T_max, on both sides."""
    ds = stability_map(
        ATTENTION, equicorrelated(4, 0.2), [1e-3, 2e-3], [0.5, 1.0], T_max=0.5, samples=16
    )
    assert np.all(ds["median_exit"].values == 0.5)
    assert np.all(ds["censored"].values == 1.0)
    assert ds.attrs["fraction_within_10pct"] == 1.0
    assert ds.attrs["cells_censored_both"] == 4
    assert np.isnan(ds.attrs["fraction_within_10pct_uncensored"])
    assert ds.attrs["depth"] == 32 and ds.attrs["method"] == "gram"
    report = format_stability_map(ds).splitlines()
    assert len(report) == 5 and report[2].split()[1:] == ["0.5c", "/", "0.5c"] * 2
    assert "(4 censored on both sides)" in report[-1]


@pytest.mark.parametrize("gamma, tau0", [(0.01, 1e-3), (0.014142135623730951, 1e-3)])
def test_fast_blow_up_matches_the_deterministic_blow_up_time(gamma, tau0):
    """m = 2, tiny tau0 and gamma: the attention drift dominates the noise, and with
    V = s [[1, rho], [rho, 1]] it is ds/dt = c s^3, c = gamma^2 (1 - rho)^2 / (4 tau0^2)
    (docs/theory.md#sde-attention, the m = 2 form), so the largest eigenvalue s (1 + rho)
    reaches 1e4 at t* = (1 - s_x^-2) / (2c), s_x = 1e4 / (1 + rho). The Euler scheme's
    lag near the blow-up is O(dt): Richardson-extrapolated from dt and 2 dt the median is
    within 1% of t* (at dt alone it is 2% late)."""
    rho = 0.2
    c = gamma**2 * (1 - rho) ** 2 / (4 * tau0**2)
    s_x = 1e4 / (1 + rho)
    t_star = (1 - s_x**-2) / (2 * c)
    V0 = equicorrelated(2, rho)
    med = []
    for dt in (1e-4 * t_star / 0.03125, 2e-4 * t_star / 0.03125):
        ds = stability_map(
            ATTENTION, V0, [gamma], [tau0], T_max=3 * t_star, samples=64, dt=dt, network=False
        )
        assert float(ds["censored"].sel(source="sde").squeeze()) == 0.0
        med.append(float(ds["median_exit"].sel(source="sde").squeeze()))
    assert med[0] == pytest.approx(t_star, rel=0.04)
    assert 2 * med[0] - med[1] == pytest.approx(t_star, rel=0.01)
    assert np.isnan(ds["median_exit"].sel(source="network")).all()


def test_network_and_sde_maps_agree_where_both_are_cheap():
    """gamma = 1 (no skip), tau0 in {0.5, 1}, width 128, T_max = 3: the paths leave the
    region at t ~ 1.5 on both sides. Each median has an order-statistic interval (95%); the
    medians differ by less than 3 combined SEs plus the two time grids' resolution
    (1 / width + dt: a network exits at a multiple of 1 / width, the SDE of dt)."""
    config = ModelConfig(width=128, depth=128, attention="shaped", mlp="none")
    ds = stability_map(
        config, equicorrelated(4, 0.2), [1.0], [0.5, 1.0], T_max=3.0, samples=128, seed=3
    )
    med, se = ds["median_exit"], ds["median_se"]
    assert float(ds["censored"].max()) < 0.5  # exits inside the horizon: a real comparison
    assert float(med.min()) > 0.5
    diff = np.abs(ds["difference"].values)
    combined = np.hypot(se.sel(source="network").values, se.sel(source="sde").values)
    assert np.all(diff <= 3 * combined + 1 / 128 + ds.attrs["dt"]), (diff, combined)
    assert ds.attrs["cells_censored_both"] == 0
    frac = np.mean(np.abs(ds["relative_difference"].values) <= 0.1)
    assert ds.attrs["fraction_within_10pct"] == ds.attrs["fraction_within_10pct_uncensored"] == frac
    worst = np.abs(ds["relative_difference"].values).max()
    assert abs(ds.attrs["worst_relative_difference"]) == pytest.approx(worst)


def test_plot_stability_map(tmp_path):
    ds = stability_map(
        ATTENTION, equicorrelated(2, 0.2), [1e-3, 0.5, 1.0], [0.1, 1.0], T_max=0.3, samples=8
    )
    fig = plot_stability_map(ds, tmp_path / "map")
    assert (tmp_path / "map.png").stat().st_size > 0
    assert len(fig.axes) == 5  # three maps, two colour bars
    assert fig.axes[0].get_xscale() == "log" and fig.axes[0].get_yscale() == "log"
    with pytest.raises(ParameterError) as err:
        plot_stability_map(ds.drop_vars("difference"))
    assert err.value.parameter == "ds"


V0 = equicorrelated(4, 0.2)


@pytest.mark.parametrize(
    "change, parameter",
    [
        ({"gammas": []}, "gammas"),
        ({"gammas": [0.0, 0.5]}, "gammas"),
        ({"gammas": [0.5, 0.5]}, "gammas"),
        ({"gammas": "0.5"}, "gammas"),
        ({"tau0s": [-1.0]}, "tau0s"),
        ({"T_max": 0.0}, "T_max"),
        ({"samples": 1}, "samples"),
        ({"sde_samples": 1}, "sde_samples"),
        ({"method": "nope"}, "method"),
        ({"dt": -0.1}, "dt"),
        ({"low": 0.0}, "low"),
        ({"high": 1e-5}, "high"),
        ({"V0": 1e5 * torch.eye(4, dtype=torch.float64)}, "V0"),
        ({"V0": torch.ones(4, 4)}, "V0"),
        ({"config": ModelConfig(attention="softmax")}, "attention"),
        ({"config": "block"}, "config"),
        ({"network": 1}, "network"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_input_names_the_parameter(change, parameter):
    args = {
        "config": ATTENTION,
        "V0": V0,
        "gammas": [0.5],
        "tau0s": [1.0],
        "T_max": 0.5,
        "samples": 4,
    }
    args.update(change)
    with pytest.raises(ParameterError) as err:
        stability_map(
            args.pop("config"), args.pop("V0"), args.pop("gammas"), args.pop("tau0s"), **args
        )
    assert err.value.parameter == parameter
