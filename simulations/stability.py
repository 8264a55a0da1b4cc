"""Stability map over (gamma, tau0): when the covariance first leaves a bounded region, from the
finite network and from the SDE side by side (docs/theory.md#sde-structure and #limits).

:func:`stability_map` computes, for every cell of a (gamma, tau0) grid, the median first depth
time ``t = layer / width`` at which an eigenvalue of ``V`` leaves ``[low, high]`` (default
``[1e-4, 1e4]``), capped at ``T_max``; :func:`plot_stability_map` draws the two maps and their
difference. The conventions (exit rule, censoring, time grids, the agreement numbers) are in
docs/guide/stability.md.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.colors import LogNorm, TwoSlopeNorm
from matplotlib.figure import Figure
from scipy import stats
from torch import Tensor

from shapedtx._validation import (
    ParameterError,
    check_device,
    check_dtype,
    check_int,
    check_number,
    check_positive,
    check_progress,
)
from shapedtx.config import TAU0_RANGE, ModelConfig, check_config
from shapedtx.covariance import check_covariance

if TYPE_CHECKING:
    from .options import SamplerChoice

SOURCES: tuple[str, str] = ("network", "sde")
DEFAULT_LOW, DEFAULT_HIGH = 1e-4, 1e4
"""The default region ``[low, high]`` for the eigenvalues of ``V`` (the issue's and, as far as
its text could be checked, the Shaped Transformer paper's bounds)."""
AGREEMENT_TOLERANCE = 0.1
"""A cell agrees when ``|network - sde| <= 0.1 * sde`` (medians)."""
MEDIAN_LEVEL = 0.95
"""Coverage of the distribution-free (order-statistic) interval of each median."""
SDE_MEMORY = 2**28
"""Bytes of saved SDE states per batch of cells (every step is kept to date the exits)."""


# --------------------------------------------------------------------------------------------
# Exit times
# --------------------------------------------------------------------------------------------
def exit_times(V: Tensor, t: Tensor, low: float, high: float) -> Tensor:
    """First time at which an eigenvalue of V leaves ``[low, high]`` (inf if never).

    V: (B, S, m, m) covariances at the times ``t: (S,)`` -> (B,). A non-finite V counts as
    having left the region. ``t[0]`` is the start and is not examined.
    """
    finite = torch.isfinite(V).all(dim=(-1, -2))
    safe = torch.where(finite[..., None, None], V, torch.eye(V.shape[-1], dtype=V.dtype))
    eig = torch.linalg.eigvalsh(safe)  # (B, S, m), ascending
    outside = ~finite | (eig[..., 0] < low) | (eig[..., -1] > high)
    outside[:, 0] = False
    first = outside.to(torch.int8).argmax(dim=-1)
    times = t.to(V.dtype)[first]
    return torch.where(outside.any(dim=-1), times, torch.full_like(times, math.inf))


def median_interval(x: np.ndarray, level: float = MEDIAN_LEVEL) -> tuple[float, float, float]:
    """Median of ``x: (N,)`` and its distribution-free ``level`` interval from order statistics.

    The interval is ``[x_(j), x_(N + 1 - j)]`` (1-based order statistics) with ``j`` the
    largest index such that ``P(Binomial(N, 1/2) < j) <= (1 - level) / 2``; it covers the
    population median with probability >= ``level`` for any continuous law (ties, e.g.
    censored values, make it conservative). ``j`` is at least 1.
    """
    x = np.sort(np.asarray(x, dtype=np.float64))
    N = x.size
    j = max(int(stats.binom.ppf((1 - level) / 2, N, 0.5)), 1)
    return float(np.median(x)), float(x[j - 1]), float(x[N - j])


# --------------------------------------------------------------------------------------------
# The map
# --------------------------------------------------------------------------------------------
def stability_map(
    config: ModelConfig,
    V0: Tensor,
    gammas: Sequence[float],
    tau0s: Sequence[float],
    *,
    T_max: float,
    samples: int,
    method: str | SamplerChoice = "gram",
    sde_samples: int | None = None,
    dt: float | None = None,
    low: float = DEFAULT_LOW,
    high: float = DEFAULT_HIGH,
    seed: int = 0,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float64,
    network: bool = True,
    progress: bool | None = False,
) -> xr.Dataset:
    """Median first exit time of ``V`` from ``[low, high]`` over a (gamma, tau0) grid, from the
    finite network and from the covariance SDE (docs/theory.md#sde-structure and #limits).

    For every cell, ``config`` with that ``gamma`` and ``tau0`` (everything else kept, in
    particular ``width``) is simulated to depth ``ceil(T_max * width)``
    (:func:`simulations.simulate`, times ``layer / width``) and its SDE solved to ``T_max``
    (the factored Euler scheme, all cells' paths integrated together, each row with its cell's
    constants: :class:`sde.solvers.FactoredEulerStep`). A path's exit time is the first saved
    time at which the smallest eigenvalue of ``V`` is below ``low``, the largest above
    ``high``, or ``V`` is non-finite (SDE: or the path was flagged as blown up). A path that
    does not exit by ``T_max`` is *censored* and counted at ``T_max``; the median is then
    exact as long as fewer than half the paths are censored, and equals ``T_max`` otherwise.

    Args:
        config: the model (must have a covariance SDE, ``sde.sde_constants``); its ``gamma``
            and ``tau0`` are replaced cell by cell.
        V0: (m, m) positive-definite input covariance with eigenvalues inside ``[low, high]``.
        gammas: values of gamma, each in (0, 1]; tau0s: values of tau0, each in [1e-6, 1e6].
        T_max: the cap on depth time, > 0.
        samples: networks per cell (>= 2); ``sde_samples``: SDE paths per cell (default
            ``samples``).
        method: the network sampler (a name of :data:`simulations.SAMPLERS`, default
            ``"gram"``).
        dt: the SDE's largest step (default ``min(0.01, T_max / 100)``); the step used is
            ``T_max / ceil(T_max / dt)`` and every step is examined.
        low, high: the region of the eigenvalues, ``0 < low < high``.
        seed: the SDE's seed; cell k (row-major over ``gammas`` x ``tau0s``) simulates its
            networks with seed ``seed + 1 + k``.
        device, dtype: where and in which precision (default: V0's device, float64).
        network: False computes the SDE map only (the network entries are NaN).
        progress: progress bars of the samplers and the solver (default off).

    Returns:
        Dataset with dims ``source`` (``"network"``, ``"sde"``), ``gamma``, ``tau0`` and data
        variables ``median_exit``, ``median_low``/``median_high`` (the order-statistic
        interval, :func:`median_interval`), ``median_se`` (its half-width / 1.96),
        ``censored`` (fraction of paths not exiting by ``T_max``), ``exploded`` (SDE paths
        flagged as blown up), ``difference`` (network - SDE) and ``relative_difference``
        (difference / SDE). Attrs: the base config, ``T_max``, ``low``, ``high``, ``samples``,
        ``sde_samples``, ``method``, ``dt``, ``seed``, ``tokens``, and the agreement:
        ``fraction_within_10pct`` (cells with ``|relative_difference| <= 0.1``),
        ``cells_censored_both``, ``fraction_within_10pct_uncensored`` (:func:`agreement`),
        ``worst_gamma``, ``worst_tau0``, ``worst_network``, ``worst_sde``,
        ``worst_relative_difference`` (the cell with the largest ``|relative_difference|``).

    Raises:
        ParameterError: naming the argument, before any computation.
    """
    from sde.coefficients import sde_constants

    from .driver import resolve_method, simulate

    check_config(config)
    g = _grid("gammas", gammas, 0.0, 1.0, low_open=True)
    k = _grid("tau0s", tau0s, *TAU0_RANGE)
    T_max = check_positive("T_max", T_max)
    samples = check_int("samples", samples, 2)
    sde_samples = samples if sde_samples is None else check_int("sde_samples", sde_samples, 2)
    method_used = resolve_method(config, method)  # ParameterError naming method
    dt = min(0.01, T_max / 100) if dt is None else check_positive("dt", dt)
    low = check_positive("low", low)
    high = check_number("high", high, low, low_open=True)
    check_int("seed", seed, 0, 2**63 - len(g) * len(k) - 2)
    check_dtype(dtype)
    if not isinstance(network, bool):
        raise ParameterError("network", f"network must be True or False, got {network!r}")
    check_progress(progress)
    V0 = check_covariance(V0)
    device = check_device(device) if device is not None else V0.device
    V0 = V0.to(device=device, dtype=dtype)
    eig0 = torch.linalg.eigvalsh(V0)
    if not (float(eig0[0]) >= low and float(eig0[-1]) <= high):
        raise ParameterError(
            "V0",
            f"the eigenvalues of V0 must lie in [low, high] = [{low:g}, {high:g}], got "
            f"[{float(eig0[0]):.4g}, {float(eig0[-1]):.4g}]",
        )
    m = V0.shape[-1]
    cells = [dataclasses.replace(config, gamma=a, tau0=b) for a in g for b in k]
    for cell in cells:
        sde_constants(cell, m)  # ParameterError for configurations without an SDE
    depth = math.ceil(T_max * config.width - 1e-9)
    if network:  # the sampler's own checks (its domain), on one block of two networks
        simulate(dataclasses.replace(config, depth=1), V0, 2, method=method, progress=False)

    steps = math.ceil(T_max / dt - 1e-9)
    sde_exit, exploded = _sde_exits(cells, V0, sde_samples, T_max, steps, seed, low, high, progress)
    net_exit = np.full((len(cells), samples), np.nan)
    if network:
        net_exit = _network_exits(
            cells, V0, samples, depth, method, seed, low, high, dtype, progress
        )
    shape = (len(g), len(k))
    values: dict[str, np.ndarray] = {
        key: np.full((2, *shape), np.nan)
        for key in ("median_exit", "median_low", "median_high", "censored")
    }
    for s, exits in enumerate((net_exit, sde_exit)):
        if s == 0 and not network:
            continue
        for c in range(len(cells)):
            x = np.minimum(exits[c], T_max)
            i, j = divmod(c, len(k))
            med, lo, hi = median_interval(x)
            values["median_exit"][s, i, j] = med
            values["median_low"][s, i, j] = lo
            values["median_high"][s, i, j] = hi
            values["censored"][s, i, j] = float(np.mean(exits[c] > T_max))
    z = stats.norm.ppf(0.5 + MEDIAN_LEVEL / 2)
    dims = ("source", "gamma", "tau0")
    ds = xr.Dataset(
        {
            **{key: (dims, v) for key, v in values.items()},
            "median_se": (dims, (values["median_high"] - values["median_low"]) / (2 * z)),
            "exploded": (("gamma", "tau0"), exploded.reshape(shape)),
        },
        coords={"source": list(SOURCES), "gamma": g, "tau0": k},
    )
    ds["difference"] = ds["median_exit"].sel(source="network") - ds["median_exit"].sel(source="sde")
    ds["relative_difference"] = ds["difference"] / ds["median_exit"].sel(source="sde")
    for var, text in _LONG_NAMES.items():
        ds[var].attrs["long_name"] = text
    ds.attrs.update(
        {
            **config.to_attrs(),
            "T_max": T_max,
            "low": low,
            "high": high,
            "samples": samples,
            "sde_samples": sde_samples,
            "method": method_used if network else "none",
            "depth": depth,
            "dt": T_max / steps,
            "seed": seed,
            "tokens": m,
            "dtype": str(dtype).removeprefix("torch."),
        }
    )
    if network:
        ds.attrs.update(agreement(ds))
    return ds


_LONG_NAMES = {
    "median_exit": "median first t at which an eigenvalue of V leaves [low, high] (capped)",
    "median_low": "lower end of the median's order-statistic interval",
    "median_high": "upper end of the median's order-statistic interval",
    "median_se": "standard error of the median (interval half-width / 1.96)",
    "censored": "fraction of paths not leaving [low, high] by T_max",
    "exploded": "fraction of SDE paths flagged as blown up",
    "difference": "median exit time, network - SDE",
    "relative_difference": "(network - SDE) / SDE, median exit times",
}


def agreement(ds: xr.Dataset, tolerance: float = AGREEMENT_TOLERANCE) -> dict[str, float]:
    """The agreement numbers of a :func:`stability_map` Dataset: ``fraction_within_10pct``
    (cells with ``|relative_difference| <= tolerance``), ``cells_censored_both`` (cells where
    both medians are the cap, which agree trivially) and ``fraction_within_10pct_uncensored``
    (the fraction among the other cells; NaN if none), and the worst cell (``worst_gamma``,
    ``worst_tau0``, ``worst_network``, ``worst_sde``, ``worst_relative_difference``)."""
    rel = np.abs(ds["relative_difference"].values)
    i, j = np.unravel_index(int(np.nanargmax(rel)), rel.shape)
    med = ds["median_exit"]
    both = (ds["censored"].values >= 0.5).all(axis=0)  # both medians are the cap
    return {
        "fraction_within_10pct": float(np.mean(rel <= tolerance)),
        "cells_censored_both": int(both.sum()),
        "fraction_within_10pct_uncensored": (
            float(np.mean(rel[~both] <= tolerance)) if (~both).any() else math.nan
        ),
        "worst_gamma": float(ds["gamma"].values[i]),
        "worst_tau0": float(ds["tau0"].values[j]),
        "worst_network": float(med.sel(source="network").values[i, j]),
        "worst_sde": float(med.sel(source="sde").values[i, j]),
        "worst_relative_difference": float(ds["relative_difference"].values[i, j]),
    }


def _grid(
    name: str, values: Sequence[float], low: float, high: float, *, low_open: bool = False
) -> np.ndarray:
    """The sorted grid ``values`` as floats; ParameterError naming ``name`` unless it is a
    non-empty sequence of distinct numbers in the range."""
    if isinstance(values, str | bytes) or not hasattr(values, "__len__") or len(values) == 0:
        raise ParameterError(
            name, f"{name} must be a non-empty sequence of numbers, got {values!r}"
        )
    out = np.array([check_number(name, v, low, high, low_open=low_open) for v in values])
    if np.unique(out).size != out.size:
        raise ParameterError(name, f"{name} must not repeat a value, got {list(values)!r}")
    return np.sort(out)


def _sde_exits(
    cells: list[ModelConfig],
    V0: Tensor,
    samples: int,
    T_max: float,
    steps: int,
    seed: int,
    low: float,
    high: float,
    progress: bool | None,
) -> tuple[np.ndarray, np.ndarray]:
    """SDE exit times ``(cells, samples)`` (inf: censored) and exploded fractions ``(cells,)``.

    The cells' paths are integrated together in batches of whole cells holding at most
    :data:`SDE_MEMORY` bytes of saved states (every step is saved); batch b draws its normals
    from a generator seeded with ``seed + b`` (:func:`sde.solvers.gaussian_noise`). The bound
    of the blow-up flag is ``10 high / max_a V0^{aa}``, so that a flagged path has left the
    region (it exits at its flag time)."""
    from sde.solvers import FactoredEulerStep, gaussian_noise, integrate

    m = V0.shape[-1]
    dt = T_max / steps
    per_path = (steps + 1) * m * m * V0.element_size()
    per_batch = max(1, SDE_MEMORY // (per_path * samples))
    times = torch.arange(steps + 1, dtype=V0.dtype) * dt
    bound = 10 * high / float(torch.diagonal(V0).max())
    exits, exploded = [], []
    for b, start in enumerate(range(0, len(cells), per_batch)):
        batch = cells[start : start + per_batch]
        rows = [samples] * len(batch)
        stepper = FactoredEulerStep(batch, m, paths=rows)
        B = sum(rows)
        generator = torch.Generator(device=V0.device).manual_seed(seed + b)
        sol = integrate(
            stepper,
            V0.expand(B, m, m).contiguous(),
            steps=steps,
            dt=dt,
            save_every=1,
            noise=gaussian_noise((B, 2, m, m), generator, V0.dtype, V0.device),
            bound=bound,
            progress=progress,
        )
        t_exit = exit_times(sol.V.cpu(), times, low, high)
        t_exit = torch.where(sol.exploded.cpu(), torch.minimum(t_exit, sol.t_explode.cpu()), t_exit)
        exits.append(t_exit.numpy().reshape(len(batch), samples))
        exploded.append(sol.exploded.cpu().numpy().reshape(len(batch), samples).mean(axis=1))
    return np.concatenate(exits), np.concatenate(exploded)


def _network_exits(
    cells: list[ModelConfig],
    V0: Tensor,
    samples: int,
    depth: int,
    method: str | SamplerChoice,
    seed: int,
    low: float,
    high: float,
    dtype: torch.dtype,
    progress: bool | None,
) -> np.ndarray:
    """Network exit times ``(cells, samples)`` (inf: censored), one :func:`simulate` per cell
    (seed ``seed + 1 + k`` for cell k); non-finite covariances count as exits (simulate's
    warning about them is silenced: here they are data)."""
    from .driver import simulate

    out = np.empty((len(cells), samples))
    for c, cell in enumerate(cells):
        cell = dataclasses.replace(cell, depth=depth)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ds = simulate(
                cell, V0, samples, method=method, seed=seed + 1 + c, dtype=dtype, progress=progress
            )
        V = torch.from_numpy(np.array(ds["V"].values))
        out[c] = exit_times(V, torch.from_numpy(np.array(ds["t"].values)), low, high).numpy()
    return out


# --------------------------------------------------------------------------------------------
# Figure
# --------------------------------------------------------------------------------------------
def plot_stability_map(ds: xr.Dataset, path: str | os.PathLike | None = None) -> Figure:
    """Network map, SDE map and their difference (network - SDE) of a :func:`stability_map`
    Dataset as three heat maps over (tau0, gamma).

    Each axis is logarithmic when its grid spans more than a factor 4 (cell edges at the
    geometric midpoints), else linear. Cells whose median is censored (half the paths or
    more never leave the region, so the median is the cap ``T_max``) carry a red ``x``;
    the colour scale of the two maps is logarithmic and shared. The difference map uses a
    diverging scale centred at 0 and prints the agreement numbers in its title. Saved as
    PNG and PDF when ``path`` is given.
    """
    from .plots import _finish

    for var in ("median_exit", "censored", "difference"):
        if var not in ds:
            raise ParameterError("ds", f"ds must be a stability_map Dataset (no {var!r})")
    g, k = ds["gamma"].values, ds["tau0"].values
    fig = Figure(figsize=(15.0, 4.2), layout="constrained")
    axes = fig.subplots(1, 3)
    med = ds["median_exit"]
    finite = med.values[np.isfinite(med.values)]
    vmin, vmax = float(finite.min()), float(ds.attrs.get("T_max", finite.max()))
    norm = LogNorm(vmin=min(vmin, vmax / 1.01), vmax=vmax)
    for ax, source in zip(axes[:2], SOURCES, strict=True):
        values = med.sel(source=source).values
        mesh = ax.pcolormesh(_edges(k), _edges(g), values, norm=norm, cmap="viridis")
        censored = ds["censored"].sel(source=source).values >= 0.5
        ii, jj = np.nonzero(censored)
        ax.scatter(k[jj], g[ii], marker="x", color="red", s=30, linewidths=1.2)
        ax.set_title(f"{'finite network' if source == 'network' else 'SDE'}: median exit t")
        _log_axes(ax, k, g)
    fig.colorbar(mesh, ax=axes[:2], label="median first t out of [low, high]")
    diff = ds["difference"].values
    span = float(np.nanmax(np.abs(diff))) if np.isfinite(diff).any() else 1.0
    span = span if span > 0 else 1.0
    mesh = axes[2].pcolormesh(
        _edges(k), _edges(g), diff, norm=TwoSlopeNorm(0.0, -span, span), cmap="RdBu_r"
    )
    fig.colorbar(mesh, ax=axes[2], label="network - SDE")
    fig.suptitle(
        f"first t at which an eigenvalue of V leaves [{ds.attrs.get('low', DEFAULT_LOW):g}, "
        f"{ds.attrs.get('high', DEFAULT_HIGH):g}]; red x: median censored at T_max"
    )
    title = "difference"
    if "fraction_within_10pct" in ds.attrs:
        a = ds.attrs
        title += f": {100 * a['fraction_within_10pct']:.0f}% of cells within 10%"
        rest = ds["gamma"].size * ds["tau0"].size - int(a["cells_censored_both"])
        if rest:
            title += (
                f"\n({100 * a['fraction_within_10pct_uncensored']:.0f}% of the {rest} cells "
                "not censored on both sides)"
            )
    axes[2].set_title(title)
    _log_axes(axes[2], k, g)
    return _finish(fig, path)


def _edges(x: np.ndarray) -> np.ndarray:
    """Cell edges of the grid ``x`` (sorted): geometric midpoints on a wide positive grid,
    arithmetic ones otherwise; a single value gets a cell of +-50% (or +-0.5)."""
    x = np.asarray(x, dtype=np.float64)
    log = _is_log(x)
    y = np.log(x) if log else x
    if y.size == 1:
        half = math.log(1.5) if log else 0.5 * max(abs(float(y[0])), 1.0)
        e = np.array([y[0] - half, y[0] + half])
    else:
        mid = (y[1:] + y[:-1]) / 2
        e = np.concatenate([[2 * y[0] - mid[0]], mid, [2 * y[-1] - mid[-1]]])
    return np.exp(e) if log else e


def _is_log(x: np.ndarray) -> bool:
    return bool(x.size > 1 and x.min() > 0 and x.max() / x.min() > 4)


def _log_axes(ax: Axes, tau0: np.ndarray, gamma: np.ndarray) -> None:
    if _is_log(tau0):
        ax.set_xscale("log")
    if _is_log(gamma):
        ax.set_yscale("log")
    ax.set_xlabel("tau0")
    ax.set_ylabel("gamma")
