"""Convergence of finite networks to the covariance SDE at fixed T = depth / width
(docs/theory.md#checks: the gap must shrink as n grows; the expected rate is about n^(-1/2))."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
import xarray as xr
from torch import Tensor

from shapedtx import ModelConfig
from shapedtx._validation import ParameterError, check_int

from .compare import compare, distances, token_values, valid_samples
from .options import SamplerChoice

STATISTICS: tuple[str, ...] = ("w1_rho", "ks_rho", "w1_logVaa", "ks_logVaa")


def at_width(config: ModelConfig, width: int) -> ModelConfig:
    """``config`` at another width with the same T = depth / width (depth = T width).

    Head sizes that were derived from the width (``width // heads``) follow it; explicitly
    different ones are kept. Raises ValueError if ``T * width`` is not an integer.
    """
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ParameterError("widths", f"widths must be integers >= 1, got {width!r}")
    depth = config.depth * width / config.width
    if abs(depth - round(depth)) > 1e-9 or round(depth) < 1:
        raise ParameterError(
            "widths",
            f"widths must make depth = T * width a positive integer (T = {config.T:g}), "
            f"got width {width} (depth {depth:g})",
        )
    changes: dict = {"width": width, "depth": round(depth)}
    derived = config.width % config.heads == 0 and config.head_dim == config.width // config.heads
    if derived:
        changes["head_dim"] = None
        if config.key_dim == config.head_dim:
            changes["key_dim"] = None
    return config.replace(**changes)


def convergence(
    config: ModelConfig,
    widths: Sequence[int],
    V0: Tensor,
    samples: int,
    *,
    limit: xr.Dataset | None = None,
    networks: Mapping[int, xr.Dataset] | None = None,
    method: str | SamplerChoice = "auto",
    dt: float = 0.01,
    sde_method: str = "euler",
    seed: int = 0,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float64,
    progress: bool | None = None,
    on_width: Callable[[int], None] | None = None,
    step_error: bool = True,
) -> xr.Dataset:
    """Distance between finite networks and the SDE at the final time T = config.T.

    Runs :func:`simulations.simulate` (``method``, default ``"auto"`` as there) at every
    width (depth = T width, see :func:`at_width`) and :func:`sde.solve` once at T (unless
    given as ``networks`` / ``limit``, e.g. from a previous run), then compares the
    distributions at T with :func:`simulations.compare`.

    Returns a Dataset over ``width`` with the distances ``w1_rho``, ``ks_rho``,
    ``ks_rho_pvalue``, ``w1_logVaa``, ``ks_logVaa``, the ``rho_quantile`` of both sources
    (width, source, quantile) and the median gap with its standard error. ``attrs`` hold, per
    distance, ``<stat>_noise_floor``: the distance expected from Monte Carlo noise alone
    (between two halves of the SDE sample, rescaled to the compared sample sizes; mean over
    16 fixed-seed splits) and ``<stat>_noise_sd`` (its spread over the splits, the error bar
    of one distance), and the least-squares fit ``log d = intercept + slope log n``
    (``<stat>_slope``, ``<stat>_slope_se``, ``<stat>_intercept``) through the widths whose
    distance is above ``floor + 2 sd`` only (``<stat>_fit_widths``; a slope through points at
    the floor measures the noise, not the convergence). With fewer than 2 such widths the slope
    is NaN: no slope can be fitted.

    The SDE's own step error (docs/theory.md#step-error) enters when ``limit`` holds the
    solve at ``dt / 2`` on the same paths (``step_error``: so does the solve made here;
    ``sde.solve(..., step_error=True)``): ``<stat>_step_error`` (attrs, twice the distance
    between the SDE at dt and at dt / 2) is added to the threshold, so a width is fitted
    only if its distance exceeds ``floor + 2 sd + step error``, and ``median_rho_gap`` is
    taken against the SDE's median extrapolated to dt -> 0, its SE including the
    extrapolation's (``attrs["median_rho_gap_reference"]`` says which).
    """
    widths = [int(w) if isinstance(w, (int, np.integer)) else w for w in widths]
    if len(widths) < 2 or len(set(widths)) != len(widths):
        raise ParameterError(
            "widths", f"widths must list at least 2 distinct widths, got {widths!r}"
        )
    check_int("samples", samples, 2)  # compare needs two per source: refused before any run
    configs = {w: at_width(config, w) for w in sorted(widths)}
    T = config.T
    if limit is None:
        from sde import solve

        limit = solve(config, V0, samples, T=T, dt=dt, method=sde_method, seed=seed + 1,
                      device=device, dtype=dtype, progress=progress, warn=False,
                      step_error=step_error)  # fmt: skip  # compare drops them
    k_T = int(np.abs(limit["t"].values - T).argmin())
    if abs(limit["t"].values[k_T] - T) > 1e-6 * max(1.0, T):
        raise ParameterError(
            "limit", f"limit has no time at T = {T:g} (last time {limit['t'].values[-1]:g})"
        )
    lim_T = limit.isel(t=[k_T])

    rows = []
    for w, cfg in configs.items():
        net = (networks or {}).get(w)
        if net is None:
            from .driver import simulate

            net = simulate(cfg, V0, samples, method=method, seed=seed, device=device,
                           dtype=dtype, progress=progress)  # fmt: skip
        net_T = net.isel(t=[-1]).assign_coords(t=[T])
        rows.append(compare(net_T, lim_T.assign_coords(t=[T]), warn=False).isel(t=0))
        if on_width is not None:
            on_width(w)
    cmp = xr.concat(rows, dim=xr.DataArray(list(configs), dims="width", name="width"))
    gap = cmp["rho_quantile"].sel(quantile=0.5, method="nearest")
    gap_se = cmp["rho_quantile_se"].sel(quantile=0.5, method="nearest")
    sde_median, sde_se = gap.sel(source="sde"), gap_se.sel(source="sde")
    stepped = "rho_quantile_step_error" in cmp
    if stepped:  # the SDE's median at dt -> 0: minus its step error, whose SE adds
        err = cmp["rho_quantile_step_error"].sel(quantile=0.5, method="nearest")
        err_se = cmp["rho_quantile_step_error_se"].sel(quantile=0.5, method="nearest")
        sde_median, sde_se = sde_median - err, np.hypot(sde_se, err_se)
    out = xr.Dataset(
        {
            **{s: cmp[s] for s in STATISTICS},
            "ks_rho_pvalue": cmp["ks_rho_pvalue"],
            "rho_quantile": cmp["rho_quantile"],
            "median_rho_gap": gap.sel(source="network") - sde_median,
            "median_rho_gap_se": np.hypot(gap_se.sel(source="network"), sde_se),
            "depth": ("width", [c.depth for c in configs.values()]),
            "n_network": ("width", [r.attrs["n_network"] for r in rows]),
        }
    ).drop_vars([c for c in ("t", "t_network", "t_limit", "layer") if c in cmp.coords])
    out.attrs.update({k: v for k, v in cmp.attrs.items() if k.startswith("config.")})
    out.attrs.update(
        {"T": T, "n_limit": rows[0].attrs["n_limit"],
         "n_excluded_limit": rows[0].attrs["n_excluded_limit"]}
    )  # fmt: skip
    out.attrs["median_rho_gap_reference"] = "sde, dt -> 0" if stepped else "sde at dt"
    floors, spreads = _noise_floor(lim_T, int(np.min(out["n_network"].values)))
    n = np.asarray(list(configs), dtype=np.float64)
    for s in STATISTICS:
        d = out[s].values
        step = float(rows[0][f"{s}_step_error"]) if stepped else 0.0  # one SDE for all widths
        if stepped:
            out.attrs[f"{s}_step_error"] = step
        above = np.isfinite(d) & (d > floors[s] + 2 * spreads[s] + step)
        out.attrs.update(_fit(np.log(n[above]), d[above], s))
        out.attrs[f"{s}_noise_floor"] = floors[s]
        out.attrs[f"{s}_noise_sd"] = spreads[s]
        out.attrs[f"{s}_fit_widths"] = [int(w) for w in n[above]]
        out[s].attrs.update(long_name=_LONG_NAMES[s], units="1")
    return out


_LONG_NAMES = {
    "w1_rho": "Wasserstein-1 distance of rho at T, network vs SDE",
    "ks_rho": "Kolmogorov-Smirnov statistic of rho at T, network vs SDE",
    "w1_logVaa": "Wasserstein-1 distance of log V^aa at T, network vs SDE",
    "ks_logVaa": "Kolmogorov-Smirnov statistic of log V^aa at T, network vs SDE",
}


def _fit(logn: np.ndarray, d: np.ndarray, name: str) -> dict[str, float]:
    """Least-squares fit of log d on log n: slope, its standard error and the intercept."""
    ok = np.isfinite(d) & (d > 0)
    if ok.sum() < 2:
        return {f"{name}_slope": math.nan, f"{name}_slope_se": math.nan,
                f"{name}_intercept": math.nan}  # fmt: skip
    x, y = logn[ok], np.log(d[ok])
    A = np.stack([np.ones_like(x), x], axis=1)
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    dof = ok.sum() - 2
    if dof > 0:
        s2 = ((y - A @ coef) ** 2).sum() / dof
        se = math.sqrt(s2 / ((x - x.mean()) ** 2).sum())
    else:
        se = math.nan
    return {f"{name}_slope": float(coef[1]), f"{name}_slope_se": se,
            f"{name}_intercept": float(coef[0])}  # fmt: skip


def _noise_floor(
    limit_T: xr.Dataset, n_network: int, splits: int = 16
) -> tuple[dict[str, float], dict[str, float]]:
    """Mean and standard deviation of the distance between two random halves of the SDE
    sample over ``splits`` fixed-seed splits, rescaled by ``sqrt(1/n_network + 1/n_limit) /
    sqrt(1/h + 1/(N - h))`` to the compared sample sizes."""
    ok = limit_T.isel(sample=valid_samples(limit_T))
    N = ok.sizes["sample"]
    h = N // 2
    if h < 2:
        return {s: math.nan for s in STATISTICS}, {s: math.nan for s in STATISTICS}
    vals = token_values(ok)
    scale = math.sqrt(1 / n_network + 1 / N) / math.sqrt(1 / h + 1 / (N - h))
    rng = np.random.default_rng(0)
    draws: dict[str, list[float]] = {s: [] for s in STATISTICS}
    for _ in range(splits):
        perm = rng.permutation(N)
        for var in ("rho", "logVaa"):
            d = distances(vals[var][perm[:h]], vals[var][perm[h:]])
            draws[f"w1_{var}"].append(float(d["w1"][0]) * scale)
            draws[f"ks_{var}"].append(float(d["ks"][0]) * scale)
    means = {s: float(np.mean(v)) for s, v in draws.items()}
    return means, {s: float(np.std(v, ddof=1)) for s, v in draws.items()}
