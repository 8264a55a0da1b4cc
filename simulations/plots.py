"""Figures of covariance Datasets (docs/theory.md#rank-collapse and #checks): one function per
figure.

Every function takes Datasets of the shared contract (or the outputs of
:func:`simulations.compare` / :func:`simulations.convergence`), draws into ``ax`` if given
(else a new figure), saves PNG and PDF when ``path`` is given (the suffix is replaced) and
returns the matplotlib Figure. No pyplot state is used (safe on headless machines).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from scipy import stats

from shapedtx import metrics
from shapedtx._validation import ParameterError
from shapedtx.files import atomic_path

from .compare import SOURCES, align_times, token_values, valid_samples

COLORS = {"network": "tab:blue", "sde": "tab:orange"}
LABELS = {"network": "finite network", "sde": "SDE limit"}


def save_figure(fig: Figure, path: str | os.PathLike) -> list[Path]:
    """Write ``fig`` as ``<path>.png`` and ``<path>.pdf`` (atomically); returns both paths."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for suffix in (".png", ".pdf"):
        target = path.with_suffix(suffix)
        with atomic_path(target) as tmp:
            fig.savefig(tmp, format=suffix[1:], dpi=150, bbox_inches="tight")
        out.append(target)
    return out


def _figure(ax: Axes) -> Figure:
    """The Figure that holds ``ax`` (the root one when ``ax`` is in a SubFigure)."""
    fig = ax.figure
    return fig if isinstance(fig, Figure) else fig.figure


def _axes(ax: Axes | None, figsize: tuple[float, float] = (6.0, 4.0)) -> tuple[Figure, Axes]:
    if ax is not None:
        return _figure(ax), ax
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def _finish(fig: Figure, path: str | os.PathLike | None) -> Figure:
    if path is not None:
        save_figure(fig, path)
    return fig


def _layers(ds: xr.Dataset) -> np.ndarray:
    """Layer index of every time: the ``layer`` coordinate, else ``t * width``."""
    if "layer" in ds.coords:
        return ds["layer"].values.astype(np.float64)
    return ds["t"].values * float(ds.attrs.get("config.width", 1.0))


def plot_mean_correlation(
    models: Mapping[str, xr.Dataset],
    *,
    threshold: float | None = 0.99,
    ax: Axes | None = None,
    path: str | os.PathLike | None = None,
) -> Figure:
    """Mean off-diagonal token correlation vs layer, one curve per model: the average over
    samples with a 5-95% band across samples; rank collapse is the curve reaching 1
    (docs/theory.md#rank-collapse). ``threshold`` draws the collapse threshold."""
    fig, ax = _axes(ax)
    for label, ds in models.items():
        with np.errstate(all="ignore"):
            V = torch.from_numpy(np.ascontiguousarray(ds["V"].values))
            r = metrics.mean_correlation(V).numpy()
        r = r[np.isfinite(r).all(axis=1)]
        x = _layers(ds)
        (line,) = ax.plot(x, r.mean(axis=0), lw=2, label=label)
        lo, hi = np.quantile(r, [0.05, 0.95], axis=0)
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, lw=0)
    if threshold is not None:
        ax.axhline(threshold, color="k", ls=":", lw=1.5, label=f"collapse threshold {threshold:g}")
    ax.set_xlabel("layer")
    ax.set_ylabel(r"mean token correlation $\rho$")
    ax.set_ylim(min(0.0, ax.get_ylim()[0]), 1.02)
    ax.set_title("Rank collapse: mean correlation vs depth (band: 5-95% of samples)")
    # below the axes: inside, it would hide a band or a curve
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), fontsize="small", ncols=1)
    ax.grid(alpha=0.3)
    return _finish(fig, path)


def plot_collapse_metrics(
    models: Mapping[str, xr.Dataset],
    *,
    threshold: float = 0.99,
    path: str | os.PathLike | None = None,
) -> Figure:
    """Three panels by layer, one curve per model (median over samples, band 25-75%): mean
    off-diagonal correlation rho (with the threshold and each model's median collapse layer
    marked), stable rank of V, and ``log V^aa`` (docs/theory.md#rank-collapse)."""
    fig = Figure(figsize=(15.0, 5.2), layout="constrained")
    axes = fig.subplots(1, 3)
    for k, (label, ds) in enumerate(models.items()):
        V = torch.from_numpy(np.ascontiguousarray(ds["V"].values))
        finite = torch.isfinite(V).flatten(1).all(dim=1)
        V = V[finite]
        x = _layers(ds)
        eye = torch.eye(V.shape[-1], dtype=V.dtype)
        with np.errstate(all="ignore"):
            rho = metrics.mean_correlation(V).numpy()
            rank = metrics.stable_rank(V + 1e-300 * eye).numpy()
            log_vaa = np.log(np.diagonal(V.numpy(), axis1=-2, axis2=-1)).mean(axis=-1)
        colour = f"C{k}"
        for ax, y in zip(axes, (rho, rank, log_vaa), strict=True):
            lo, mid, hi = np.nanquantile(y, [0.25, 0.5, 0.75], axis=0)
            ax.plot(x, mid, lw=2, color=colour, label=label)
            ax.fill_between(x, lo, hi, color=colour, alpha=0.2, lw=0)
        collapse = metrics.detect_collapse(V, threshold)
        first = collapse.first_index.numpy()
        if collapse.collapsed.double().mean() >= 0.5:
            layer = x[int(np.median(np.where(first >= 0, first, len(x) - 1)))]
            axes[0].axvline(layer, color=colour, ls="--", lw=1)
    axes[0].axhline(threshold, color="k", ls=":", lw=1.5, label=f"threshold {threshold:g}")
    axes[0].set_ylabel(r"mean token correlation $\rho$")
    axes[0].set_title("mean $\\rho$ (dashed: median collapse layer)")
    axes[1].set_ylabel(r"stable rank $\|V\|_F^2 / \|V\|_2^2$")
    axes[1].set_title("stable rank of V")
    axes[2].set_ylabel(r"mean $\log V^{aa}$")
    axes[2].set_title("token norms")
    for ax in axes:
        ax.set_xlabel("layer")
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize="small")
    fig.suptitle("Covariance by layer at initialisation: median over samples, band 25-75%")
    return _finish(fig, path)


def bounded_kde(
    x: np.ndarray, grid: np.ndarray, low: float = -1.0, high: float = 1.0
) -> np.ndarray:
    """Gaussian kernel density of samples ``x`` in ``[low, high]`` at ``grid``, by reflection
    at both bounds: ``f(g) + f(2 low - g) + f(2 high - g)`` with ``f`` scipy's Gaussian KDE
    of ``x`` (Scott's bandwidth). Unlike ``f`` alone it does not drop to half the density at
    a bound (correlations pile up at rho = 1 as tokens collapse) and integrates to about 1
    over ``[low, high]``; 0 outside it."""
    kde = stats.gaussian_kde(x)
    grid = np.asarray(grid, dtype=np.float64)
    density = kde(grid) + kde(2 * low - grid) + kde(2 * high - grid)
    return np.where((grid >= low) & (grid <= high), density, 0.0)


def plot_rho_density(
    network: xr.Dataset,
    limit: xr.Dataset,
    *,
    t: float | None = None,
    bins: int = 60,
    ax: Axes | None = None,
    path: str | os.PathLike | None = None,
) -> Figure:
    """Density of the off-diagonal correlations at time ``t`` (default: the last common
    time), network vs SDE: normalised histogram plus a Gaussian KDE reflected at rho = -1 and
    +1 (:func:`bounded_kde`: rho lives in [-1, 1], and a plain KDE would halve the density at
    a bound where collapse piles samples up). Excluded samples (non-finite or exploded) are
    left out, as in :func:`simulations.compare`."""
    fig, ax = _axes(ax)
    ia, ib = align_times(network["t"].values, limit["t"].values)
    k = len(ia) - 1
    if t is not None:
        k = int(np.abs(network["t"].values[ia] - t).argmin())
    edges = None
    for src, ds, idx in zip(SOURCES, (network, limit), (ia[k], ib[k]), strict=True):
        one = ds.isel(t=[idx])
        one = one.isel(sample=valid_samples(one))
        x = token_values(one)["rho"].ravel()
        if edges is None:
            edges = np.linspace(x.min(), x.max(), bins + 1)
        # the network filled, the SDE as an outline: two fills would blend into one colour
        # (bins as a list: matplotlib's stubs take a sequence, not an ndarray)
        style = {"alpha": 0.35} if src == "network" else {"histtype": "step", "lw": 1.2}
        ax.hist(x, bins=edges.tolist(), density=True, color=COLORS[src], **style)
        grid = np.linspace(edges[0], edges[-1], 400)
        ax.plot(grid, bounded_kde(x, grid), color=COLORS[src], lw=2,
                label=f"{LABELS[src]} ({one.sizes['sample']} samples)")  # fmt: skip
    ax.set_xlabel(rf"token correlation $\rho$ at $t = {float(network['t'].values[ia[k]]):.3g}$")
    ax.set_ylabel("density")
    ax.set_title(r"Distribution of $\rho$: histogram (network filled, SDE outline) and KDE")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return _finish(fig, path)


def plot_quantile_bands(
    comparison: xr.Dataset,
    *,
    axes: tuple[Axes, Axes] | None = None,
    path: str | os.PathLike | None = None,
) -> Figure:
    """Quantiles over time of ρ (left) and V^aa (right), network vs SDE, from
    :func:`simulations.compare`: the network as median (line), 25-75% (dark band) and 5-95%
    (light band), the SDE as lines (median solid, 25/75% dashed, 5/95% dotted)."""
    if axes is None:
        fig = Figure(figsize=(11.0, 4.0), layout="constrained")
        axes = tuple(fig.subplots(1, 2))
    else:
        fig = _figure(axes[0])
    t = comparison["t"].values
    probs = list(comparison["quantile"].values)
    need = {0.05, 0.25, 0.5, 0.75, 0.95}
    if not need <= {round(p, 6) for p in probs}:
        raise ParameterError(
            "comparison", f"comparison must hold the quantiles {sorted(need)}, got {probs}"
        )

    def q(var: str, src: str, p: float) -> np.ndarray:
        return comparison[var].sel(source=src).sel(quantile=p, method="nearest").values

    # network: filled bands; SDE: lines only (overlapping fills would blend into one colour)
    # SDE quantile -> (line style, legend label; None for the second line of a pair)
    styles = {
        0.5: ("-", "SDE limit: median"),
        0.25: ("--", "SDE limit: 25%, 75%"),
        0.75: ("--", None),
        0.05: (":", "SDE limit: 5%, 95%"),
        0.95: (":", None),
    }
    for ax, var, ylabel in zip(
        axes,
        ("rho_quantile", "Vaa_quantile"),
        (r"token correlation $\rho$", r"squared norm $V^{aa}$"),
        strict=True,
    ):
        c = COLORS["network"]
        ax.fill_between(t, q(var, "network", 0.05), q(var, "network", 0.95), color=c,
                        alpha=0.15, lw=0, label="finite network: 5-95%")  # fmt: skip
        ax.fill_between(t, q(var, "network", 0.25), q(var, "network", 0.75), color=c,
                        alpha=0.35, lw=0, label="finite network: 25-75%")  # fmt: skip
        ax.plot(t, q(var, "network", 0.5), color=c, lw=2, label="finite network: median")
        for p, (ls, label) in styles.items():
            lw = 2 if p == 0.5 else 1.2
            ax.plot(t, q(var, "sde", p), color=COLORS["sde"], lw=lw, ls=ls, label=label)
        ax.set_xlabel("t = layer / width")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].set_title(r"$\rho$: median, 25-75% and 5-95% quantiles")
    axes[1].set_title(r"$V^{aa}$: median, 25-75% and 5-95% quantiles")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize="small")
    axes[1].set_yscale("log")
    return _finish(fig, path)


def plot_token_pairs(
    pairs: xr.Dataset,
    *,
    ax: Axes | None = None,
    path: str | os.PathLike | None = None,
) -> Figure:
    """Mean ρ of individual token pairs vs t, network (solid, ±2 SE band) vs SDE (dashed),
    from :func:`simulations.compare.token_pairs` (causal models: docs/theory.md#causal-sde)."""
    fig, ax = _axes(ax)
    t = pairs["t"].values
    for k, label in enumerate(pairs["pair"].values):
        color = f"C{k}"
        for src, ls in zip(SOURCES, ("-", "--"), strict=True):
            mean = pairs["mean_rho"].sel(source=src, pair=label).values
            se = pairs["mean_rho_se"].sel(source=src, pair=label).values
            ax.plot(t, mean, color=color, ls=ls, lw=2 if src == "network" else 1.5,
                    label=f"tokens {label}, {LABELS[src]}")  # fmt: skip
            if src == "network":
                ax.fill_between(t, mean - 2 * se, mean + 2 * se, color=color, alpha=0.2, lw=0)
    ax.set_xlabel("t = layer / width")
    ax.set_ylabel("mean token correlation ρ of the pair")
    ax.set_title("Token pairs: network (±2 SE) vs SDE limit")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return _finish(fig, path)


def plot_convergence(
    convergence: xr.Dataset,
    *,
    statistic: str = "w1_rho",
    ax: Axes | None = None,
    path: str | os.PathLike | None = None,
) -> Figure:
    """Distance between network and SDE at time T vs width on log-log axes (output of
    :func:`simulations.convergence`): error bars of one Monte Carlo spread, the noise floor
    (line and 2-spread band), the power-law fit through the widths above the band only (or
    a note that none can be fitted) and an n^(-1/2) reference."""
    if statistic not in convergence:
        raise ParameterError(
            "statistic",
            f"statistic must be a variable of the convergence Dataset, got {statistic!r}",
        )
    fig, ax = _axes(ax)
    n = convergence["width"].values.astype(np.float64)
    d = convergence[statistic].values
    label = _STAT_LABELS.get(statistic, statistic)
    sd = convergence.attrs.get(f"{statistic}_noise_sd", np.nan)
    ax.errorbar(n, d, yerr=sd if np.isfinite(sd) else None, fmt="o", color="tab:blue",
                capsize=3, label=f"{label}, network vs SDE (bars: MC spread)")  # fmt: skip
    floor = convergence.attrs.get(f"{statistic}_noise_floor", np.nan)
    if np.isfinite(floor):
        ax.axhline(floor, color="k", ls=":", lw=1.5, label="Monte Carlo noise floor")
        if np.isfinite(sd):
            # the band's lower edge stays within the data's range on the log axis
            positive = d[np.isfinite(d) & (d > 0)]
            bottom = 0.5 * min(floor, positive.min()) if positive.size else 0.5 * floor
            ax.axhspan(max(floor - 2 * sd, bottom), floor + 2 * sd, color="k", alpha=0.08, lw=0,
                       label="noise floor ± 2 MC spreads")  # fmt: skip
    slope = convergence.attrs.get(f"{statistic}_slope", np.nan)
    fitted = np.asarray(convergence.attrs.get(f"{statistic}_fit_widths", []), dtype=np.float64)
    if np.isfinite(slope) and fitted.size >= 2:
        intercept = convergence.attrs[f"{statistic}_intercept"]
        se = convergence.attrs.get(f"{statistic}_slope_se", np.nan)
        ax.loglog(fitted, np.exp(intercept) * fitted**slope, color="tab:red", lw=1.5,
                  label=f"fit above the floor: slope {slope:.2f} ± {se:.2f}")  # fmt: skip
    else:
        ax.text(0.02, 0.04, "no slope fitted: fewer than 2 widths above the noise floor",
                transform=ax.transAxes, fontsize="small")  # fmt: skip
    ref = d[0] * (n / n[0]) ** -0.5
    ax.loglog(n, ref, color="gray", ls="--", lw=1, label=r"$n^{-1/2}$ reference")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("width $n$ (depth $= T n$)")
    ax.set_ylabel(label)
    ax.set_title(f"Convergence to the SDE at fixed $T = {convergence.attrs.get('T', np.nan):.3g}$")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), fontsize="small")
    ax.grid(alpha=0.3, which="both")
    return _finish(fig, path)


_STAT_LABELS = {
    "w1_rho": r"$W_1(\rho_T)$",
    "ks_rho": r"KS$(\rho_T)$",
    "w1_logVaa": r"$W_1(\log V^{aa}_T)$",
    "ks_logVaa": r"KS$(\log V^{aa}_T)$",
}
