"""Finite network vs covariance SDE, time by time (docs/theory.md#sde and #checks).

:func:`compare` aligns two covariance Datasets (the contract of ``shapedtx.results``) on
depth time ``t`` and returns a Dataset of distribution summaries with Monte Carlo standard
errors and two-sample distances. Both inputs must share the number of tokens ``m``.

Conventions (one place, used everywhere below):

* **Time alignment: nearest common times, no interpolation.** The grid with fewer points in
  the common time range is the reference; each reference time is paired with the nearest time
  of the other grid. Pairs further apart than ``tolerance`` (default: half the largest spacing
  of the other grid, i.e. any in-range time) are dropped. The coordinates ``t_network`` and
  ``t_limit`` record the times actually used; ``attrs["max_time_gap"]`` the largest mismatch.
* **Excluded samples.** A sample whose ``V`` is non-finite at any aligned time, or which is
  flagged ``exploded`` (SDE blow-up), is dropped from *all* times so that every statistic uses
  the same paths; the counts are in ``attrs`` (``n_excluded_network``, ``n_excluded_limit``).
* **Pooled statistics.** ``rho`` pools the off-diagonal pairs ``a < b`` of every sample and
  ``V^{aa}`` the diagonal; values of one sample are dependent, so standard errors and
  p-values treat each *sample* as one observation (cluster-robust; exact when m = 2 for rho).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import torch
import xarray as xr
from scipy import stats

from shapedtx import metrics
from shapedtx._validation import ParameterError, check_bool, check_number
from shapedtx.metrics import detect_collapse
from shapedtx.results import rho as _rho

QUANTILES: tuple[float, ...] = (0.05, 0.25, 0.5, 0.75, 0.95)
"""Quantile levels reported by :func:`compare` (and ``shapedtx compare``)."""
SOURCES: tuple[str, str] = ("network", "sde")


# --------------------------------------------------------------------------------------------
# Statistics on arrays x: (N, t, k) (N samples, t times, k dependent values per sample)
# --------------------------------------------------------------------------------------------
def quantiles_with_se(
    x: np.ndarray, probs: Sequence[float] = QUANTILES
) -> tuple[np.ndarray, np.ndarray]:
    """Pooled quantiles and their cluster-robust standard errors.

    x: (N, t, k) -> q, se: (t, P). The quantile ``q_p`` of the N k pooled values has, to first
    order, error ``-(F_N(q_p) - p) / f(q_p)``; ``Var F_N(q_p) = Var_s(g_s) / N`` with ``g_s``
    the fraction of sample s's k values <= q_p (so dependence within a sample is accounted
    for; for k = 1 this is the classical ``sqrt(p(1 - p) / N) / f``). The sparsity ``1 / f`` is
    the difference quotient of the empirical quantile function with the Hall-Sheather
    bandwidth.
    """
    q, g, sparsity = _quantile_parts(x, probs)
    se = np.sqrt(g.var(axis=0, ddof=1) / g.shape[0]) * sparsity
    return q, se


def _quantile_parts(
    x: np.ndarray, probs: Sequence[float]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``q (t, P)``, ``g (N, t, P)`` (each sample's fraction of values <= q) and the
    sparsity ``1 / f(q)`` (t, P) of :func:`quantiles_with_se`: to first order
    ``q - q_true = -(mean_s g_s - p) * sparsity``."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 3 or x.shape[0] < 2:
        raise ParameterError("x", f"x must have shape (N, t, k) with N >= 2, got {x.shape}")
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 1 or not ((p > 0) & (p < 1)).all():
        raise ParameterError("probs", f"probs must be a 1-d sequence in (0, 1), got {p}")
    N, nt, k = x.shape
    pooled = np.moveaxis(x, 1, 0).reshape(nt, N * k)
    q = np.quantile(pooled, p, axis=1).T  # (t, P)
    h = _hall_sheather(N * k, p)
    lo = np.quantile(pooled, np.clip(p - h, 0.0, 1.0), axis=1).T
    hi = np.quantile(pooled, np.clip(p + h, 0.0, 1.0), axis=1).T
    sparsity = (hi - lo) / (np.clip(p + h, 0.0, 1.0) - np.clip(p - h, 0.0, 1.0))
    g = (x[..., None] <= q[None, :, None, :]).mean(axis=2)  # (N, t, P)
    return q, g, sparsity


def quantile_step_error(
    coarse: np.ndarray, fine: np.ndarray, probs: Sequence[float] = QUANTILES
) -> tuple[np.ndarray, np.ndarray]:
    """Step error of pooled quantiles from paired solves (docs/theory.md#step-error).

    coarse, fine: (N, t, k), sample s of both driven by the same Brownian path, at steps dt
    and dt / 2. Returns ``error, se`` (t, P): the Richardson estimate ``2 (q_dt - q_dt/2)``
    of ``q_dt - q_0`` (weak order 1) and its Monte Carlo standard error, from the paired
    linearised quantiles (per sample ``-2 (g_s^dt s_dt - g_s^dt/2 s_dt/2)``, s the sparsity
    of :func:`quantiles_with_se`), so the coupling of the two solves is accounted for.
    """
    qc, gc, sc = _quantile_parts(coarse, probs)
    qf, gf, sf = _quantile_parts(fine, probs)
    if gc.shape != gf.shape:
        raise ParameterError("fine", f"fine must have the shape of coarse, {np.shape(coarse)}")
    d = gc * sc - gf * sf  # (N, t, P)
    return 2 * (qc - qf), 2 * np.sqrt(d.var(axis=0, ddof=1) / d.shape[0])


def moment_step_error(coarse: np.ndarray, fine: np.ndarray) -> dict[str, np.ndarray]:
    """Step error of the mean and variance over samples (axis 0) from paired solves
    (docs/theory.md#step-error): ``mean``, ``mean_se``, ``var``, ``var_se`` (...), each the
    Richardson ``2 (S_dt - S_dt/2)`` and the standard error of the paired difference (the
    variance's by its influence function ``(x - mean)^2``)."""
    c = np.asarray(coarse, dtype=np.float64)
    f = np.asarray(fine, dtype=np.float64)
    N = c.shape[0]
    d = c - f
    u = (c - c.mean(axis=0)) ** 2 - (f - f.mean(axis=0)) ** 2
    return {
        "mean": 2 * d.mean(axis=0),
        "mean_se": 2 * d.std(axis=0, ddof=1) / np.sqrt(N),
        "var": 2 * (c.var(axis=0, ddof=1) - f.var(axis=0, ddof=1)),
        "var_se": 2 * u.std(axis=0, ddof=1) / np.sqrt(N),
    }


def _check_quantiles(quantiles: Sequence[float]) -> None:
    """ParameterError naming ``quantiles`` unless it is a non-empty sequence in (0, 1)."""
    try:
        q = np.asarray(quantiles, dtype=np.float64)
    except (TypeError, ValueError):
        q = np.empty(0)
    if q.ndim != 1 or q.size == 0 or not np.all((q > 0) & (q < 1)):
        raise ParameterError(
            "quantiles", f"quantiles must be a non-empty sequence in (0, 1), got {quantiles!r}"
        )


def _hall_sheather(n: int, probs: np.ndarray, alpha: float = 0.05) -> np.ndarray:
    """Hall-Sheather (1988) bandwidth for the sparsity function at ``probs``."""
    z = stats.norm.ppf(probs)
    za = stats.norm.ppf(1 - alpha / 2)
    h = n ** (-1 / 3) * za ** (2 / 3) * (1.5 * stats.norm.pdf(z) ** 2 / (2 * z**2 + 1)) ** (1 / 3)
    return np.minimum(h, np.minimum(probs, 1 - probs) * 0.999)


def moments_with_se(x: np.ndarray) -> dict[str, np.ndarray]:
    """Mean and variance over samples (axis 0) with standard errors.

    x: (N, ...) -> ``mean``, ``mean_se = sd / sqrt(N)``, ``var`` (ddof 1),
    ``var_se = sqrt((mu_4 - var^2) / N)`` (mu_4 the central fourth moment), each (...).
    """
    x = np.asarray(x, dtype=np.float64)
    N = x.shape[0]
    if N < 2:
        raise ValueError(f"need at least 2 samples, got {N}")
    mean = x.mean(axis=0)
    var = x.var(axis=0, ddof=1)
    mu4 = ((x - mean) ** 4).mean(axis=0)
    return {
        "mean": mean,
        "mean_se": np.sqrt(var / N),
        "var": var,
        "var_se": np.sqrt(np.clip(mu4 - var**2, 0.0, None) / N),
    }


def distances(a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    """Two-sample distances per time between pooled values.

    a: (N_a, t, k), b: (N_b, t, k') -> ``ks`` (Kolmogorov-Smirnov statistic), ``ks_pvalue``
    and ``w1`` (1-Wasserstein), each (t,). The p-value is scipy's asymptotic two-sample one
    (``kstwo`` at ``N_a N_b / (N_a + N_b)``) with effective sizes N_a, N_b: each *sample*
    counted once, which is conservative for pooled dependent values and the usual test when
    k = 1.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim != 3 or b.ndim != 3 or a.shape[1] != b.shape[1]:
        raise ValueError(f"a, b must be (N, t, k) with the same t, got {a.shape}, {b.shape}")
    nt = a.shape[1]
    ks = np.empty(nt)
    w1 = np.empty(nt)
    for i in range(nt):
        u, v = a[:, i].ravel(), b[:, i].ravel()
        ks[i] = _ks_statistic(u, v)
        w1[i] = stats.wasserstein_distance(u, v)
    en = a.shape[0] * b.shape[0] / (a.shape[0] + b.shape[0])
    pvalue = stats.kstwo.sf(ks, max(round(en), 1))
    return {"ks": ks, "ks_pvalue": pvalue, "w1": w1}


def _ks_statistic(u: np.ndarray, v: np.ndarray) -> float:
    """sup_x |F_u(x) - F_v(x)| of two 1-d samples (exact, ties handled). Values equal to
    within 1e-12 of max(1, the largest magnitude) count as ties (rho and log V^aa are O(1)
    numbers), so that a point mass computed twice with different rounding (rho, or log V^aa
    = 0, at t = 0 from a fixed V0) gives 0, not a spurious 1."""
    scale = 1e-12 * max(np.abs(u).max(), np.abs(v).max(), 1.0)
    u, v = np.sort(np.round(u / scale)), np.sort(np.round(v / scale))
    grid = np.concatenate([u, v])
    Fu = np.searchsorted(u, grid, side="right") / u.size
    Fv = np.searchsorted(v, grid, side="right") / v.size
    return float(np.abs(Fu - Fv).max())


# --------------------------------------------------------------------------------------------
# Datasets
# --------------------------------------------------------------------------------------------
def align_times(
    t_a: np.ndarray, t_b: np.ndarray, tolerance: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs (i, j) pairing times of two grids at nearest common times (see module doc).

    Returns ``idx_a, idx_b`` (same length, increasing). Raises ValueError if nothing pairs.
    """
    t_a, t_b = np.asarray(t_a, dtype=np.float64), np.asarray(t_b, dtype=np.float64)
    if t_a.ndim != 1 or t_b.ndim != 1 or t_a.size == 0 or t_b.size == 0:
        raise ParameterError("t_a", "time grids must be non-empty 1-d arrays")
    lo, hi = max(t_a.min(), t_b.min()), min(t_a.max(), t_b.max())
    eps = 1e-9 * max(1.0, abs(hi))
    in_a = np.flatnonzero((t_a >= lo - eps) & (t_a <= hi + eps))
    in_b = np.flatnonzero((t_b >= lo - eps) & (t_b <= hi + eps))
    swap = in_b.size < in_a.size
    ref_t, other_t, ref_idx = (t_b, t_a, in_b) if swap else (t_a, t_b, in_a)
    if ref_idx.size == 0:
        raise ParameterError(
            "t_b",
            f"the time ranges do not overlap: [{t_a.min():.4g}, {t_a.max():.4g}] vs "
            f"[{t_b.min():.4g}, {t_b.max():.4g}]",
        )
    if tolerance is None:
        spacing = np.diff(np.sort(other_t)).max() if other_t.size > 1 else 0.0
        tolerance = spacing / 2 + eps
    order = np.argsort(other_t)
    pos = np.clip(np.searchsorted(other_t[order], ref_t[ref_idx]), 1, max(other_t.size - 1, 1))
    cand = np.stack([order[pos - 1], order[np.minimum(pos, other_t.size - 1)]])
    gaps = np.abs(other_t[cand] - ref_t[ref_idx])
    other_idx = cand[gaps.argmin(0), np.arange(ref_idx.size)]
    gap = gaps.min(0)
    keep = gap <= tolerance
    keep &= np.r_[True, other_idx[1:] != other_idx[:-1]]  # one pair per time
    if not keep.any():
        raise ParameterError("tolerance", f"no common times within tolerance {tolerance:.3g}")
    ref_idx, other_idx = ref_idx[keep], other_idx[keep]
    return (other_idx, ref_idx) if swap else (ref_idx, other_idx)


def valid_samples(ds: xr.Dataset) -> np.ndarray:
    """Boolean mask (sample,): finite ``V`` (and ``V_half``, where present) at every time and
    not flagged ``exploded`` (nor ``exploded_half``)."""
    ok = np.isfinite(ds["V"].values).all(axis=(1, 2, 3))
    if "V_half" in ds:
        ok &= np.isfinite(ds["V_half"].values).all(axis=(1, 2, 3))
    for flag in ("exploded", "exploded_half"):
        if flag in ds:
            ok &= ~ds[flag].values.astype(bool)
    return ok


def token_values(ds: xr.Dataset) -> dict[str, np.ndarray]:
    """Pooled per-sample values: ``rho`` (N, t, m(m-1)/2) off-diagonal pairs a < b,
    ``Vaa`` and ``logVaa`` (N, t, m) diagonals."""
    m = ds.sizes["token_a"]
    iu = np.triu_indices(m, 1)
    V = ds["V"].values.astype(np.float64, copy=False)
    diag = np.diagonal(V, axis1=-2, axis2=-1)
    with np.errstate(all="ignore"):
        return {
            "rho": _rho(ds).values[..., iu[0], iu[1]],
            "Vaa": diag,
            "logVaa": np.log(diag),
        }


def compare(
    network: xr.Dataset,
    limit: xr.Dataset,
    *,
    quantiles: Sequence[float] = QUANTILES,
    tolerance: float | None = None,
    warn: bool = True,
) -> xr.Dataset:
    """Distributions of a finite network and of the SDE (or any two covariance Datasets),
    time by time (docs/theory.md#checks: compare distributions of rho and quantiles, not means).

    Returns a Dataset over ``source = ("network", "sde")``, ``t`` (aligned times, see module
    doc), ``quantile`` and tokens with:

    * ``rho_quantile``, ``rho_quantile_se`` (source, t, quantile): pooled off-diagonal rho;
    * ``Vaa_quantile``, ``Vaa_quantile_se`` (source, t, quantile): pooled diagonal V^{aa};
    * ``mean_rho``, ``mean_rho_se`` (source, t): mean off-diagonal correlation per sample,
      averaged over samples;
    * ``V_mean``, ``V_mean_se``, ``V_var``, ``V_var_se`` (source, t, token_a, token_b);
    * ``ks_rho``, ``ks_rho_pvalue``, ``w1_rho``, ``ks_logVaa``, ``ks_logVaa_pvalue``,
      ``w1_logVaa`` (t): two-sample distances between the pooled values.

    If ``limit`` holds ``V_half`` (``sde.solve(..., step_error=True)``), the SDE's step error
    (docs/theory.md#step-error) of each statistic, ``S_dt - S_0`` estimated as
    ``2 (S_dt - S_dt/2)`` on the same Brownian paths, with its Monte Carlo SE:
    ``<stat>_step_error`` and ``<stat>_step_error_se`` for ``rho_quantile``,
    ``Vaa_quantile`` (t, quantile), ``mean_rho`` (t), ``V_mean`` and ``V_var`` (t, token_a,
    token_b), and ``<distance>_step_error`` (t), ``2 <distance>(SDE at dt, SDE at dt / 2)``,
    the distances' error bar. Over the SDE's quantiles of rho and V^aa and its mean rho at
    the last time (the headline numbers of ``shapedtx compare``; at the first steps the
    scheme's law is relatively further off, docs/theory.md#step-error),
    ``attrs["step_error_ratio"]`` is the largest ``|step error| / Monte Carlo SE`` and
    ``step_error_resolved_ratio`` the largest ``(|step error| - 2 its SE) / Monte Carlo SE``
    (``step_error_worst`` says where); when that is above 1 (a step error resolved above the
    Monte Carlo SE) a :class:`StepErrorWarning` names both numbers (unless ``warn`` is
    False).

    ``attrs``: the network's config, sample counts used and excluded, ``max_time_gap``.
    """
    for name, ds in (("network", network), ("limit", limit)):
        if "V" not in ds or ds["V"].dims != ("sample", "t", "token_a", "token_b"):
            raise ParameterError(
                name, f"{name} must be a covariance Dataset with V(sample, t, token_a, token_b)"
            )
    if network.sizes["token_a"] != limit.sizes["token_a"]:
        raise ParameterError(
            "limit",
            f"network and limit must have the same number of tokens, got "
            f"{network.sizes['token_a']} and {limit.sizes['token_a']}",
        )
    if network.sizes["token_a"] < 2:
        raise ParameterError(
            "network", f"network must have m >= 2 tokens, got m = {network.sizes['token_a']}"
        )
    _check_quantiles(quantiles)
    if tolerance is not None:
        check_number("tolerance", tolerance, 0.0)
    check_bool("warn", warn)
    ia, ib = align_times(network["t"].values, limit["t"].values, tolerance)
    parts = [network.isel(t=ia), limit.isel(t=ib)]
    counts = {}
    for src, name, ds in zip(SOURCES, ("network", "limit"), list(parts), strict=True):
        ok = valid_samples(ds)
        counts[src] = (int(ok.sum()), int((~ok).sum()))
        if ok.sum() < 2:
            raise ParameterError(
                name, f"{src}: fewer than 2 usable samples ({int(ok.sum())} valid)"
            )
    parts = [ds.isel(sample=valid_samples(ds)) for ds in parts]
    values = [token_values(ds) for ds in parts]

    out: dict[str, tuple[tuple[str, ...], np.ndarray]] = {}
    for var in ("rho", "Vaa"):
        q, se = zip(*(quantiles_with_se(v[var], quantiles) for v in values), strict=True)
        out[f"{var}_quantile"] = (("source", "t", "quantile"), np.stack(q))
        out[f"{var}_quantile_se"] = (("source", "t", "quantile"), np.stack(se))
    mean_rho = [moments_with_se(v["rho"].mean(axis=-1)) for v in values]
    out["mean_rho"] = (("source", "t"), np.stack([mr["mean"] for mr in mean_rho]))
    out["mean_rho_se"] = (("source", "t"), np.stack([mr["mean_se"] for mr in mean_rho]))
    mom = [moments_with_se(ds["V"].values) for ds in parts]
    for key in ("mean", "mean_se", "var", "var_se"):
        out[f"V_{key}"] = (
            ("source", "t", "token_a", "token_b"),
            np.stack([mo[key] for mo in mom]),
        )
    for var in ("rho", "logVaa"):
        d = distances(values[0][var], values[1][var])
        out[f"ks_{var}"] = (("t",), d["ks"])
        out[f"ks_{var}_pvalue"] = (("t",), d["ks_pvalue"])
        out[f"w1_{var}"] = (("t",), d["w1"])

    t_net = network["t"].values[ia]
    t_lim = limit["t"].values[ib]
    step_attrs: dict[str, str | float] = {}
    if "V_half" in parts[1]:
        step_attrs = _step_errors(out, parts[1], values[1], quantiles, t_lim)
    m = network.sizes["token_a"]
    coords = {
        "source": list(SOURCES),
        "t": t_net,
        "t_network": ("t", t_net),
        "t_limit": ("t", t_lim),
        "quantile": np.asarray(quantiles, dtype=np.float64),
        "token_a": np.arange(m),
        "token_b": np.arange(m),
    }
    if "layer" in network.coords:
        coords["layer"] = ("t", network["layer"].values[ia])
    attrs = {k: v for k, v in network.attrs.items() if k.startswith("config.")}
    attrs.update(
        {
            "alignment": "nearest",
            "max_time_gap": float(np.abs(t_net - t_lim).max()),
            "n_network": counts["network"][0],
            "n_excluded_network": counts["network"][1],
            "n_limit": counts["sde"][0],
            "n_excluded_limit": counts["sde"][1],
            "network_method": str(network.attrs.get("method", "")),
            "limit_method": str(limit.attrs.get("method", "")),
            "limit_source": str(limit.attrs.get("source", "")),
        }
    )
    if "dt" in limit.attrs:
        attrs["limit_dt"] = float(limit.attrs["dt"])
    attrs.update(step_attrs)
    if warn and float(step_attrs.get("step_error_resolved_ratio", -math.inf)) > 1:
        warnings.warn(
            f"the SDE's step error exceeds its Monte Carlo SE: {step_attrs['step_error_worst']}"
            f" (dt = {attrs.get('limit_dt', math.nan):.4g}; docs/theory.md#step-error): lower "
            "dt, or read the SDE's values with their step errors",
            StepErrorWarning,
            stacklevel=2,
        )
    return xr.Dataset(out, coords=coords, attrs=attrs)


class StepErrorWarning(RuntimeWarning):
    """The SDE's estimated step error exceeds a statistic's Monte Carlo SE
    (:func:`compare`; docs/theory.md#step-error)."""


_STEP_CHECKED = (("rho_quantile", "rho quantile"), ("Vaa_quantile", "V^aa quantile"),
                 ("mean_rho", "mean rho"))  # fmt: skip
"""The statistics whose step error :func:`compare` weighs against their Monte Carlo SE."""


def _step_errors(
    out: dict[str, tuple[tuple[str, ...], np.ndarray]],
    limit: xr.Dataset,
    coarse: dict[str, np.ndarray],
    quantiles: Sequence[float],
    t: np.ndarray,
) -> dict[str, str | float]:
    """Add the step errors of the SDE's statistics to ``out`` (``limit``: the aligned, valid
    SDE samples with ``V_half``; ``coarse``: their :func:`token_values`); returns the attrs
    ``step_error_ratio`` and ``step_error_worst``."""
    fine = token_values(limit.assign(V=limit["V_half"]))
    for var in ("rho", "Vaa"):
        err, se = quantile_step_error(coarse[var], fine[var], quantiles)
        out[f"{var}_quantile_step_error"] = (("t", "quantile"), err)
        out[f"{var}_quantile_step_error_se"] = (("t", "quantile"), se)
    mr = moment_step_error(coarse["rho"].mean(axis=-1), fine["rho"].mean(axis=-1))
    out["mean_rho_step_error"] = (("t",), mr["mean"])
    out["mean_rho_step_error_se"] = (("t",), mr["mean_se"])
    mom = moment_step_error(limit["V"].values, limit["V_half"].values)
    for key in ("mean", "var"):
        dims = ("t", "token_a", "token_b")
        out[f"V_{key}_step_error"] = (dims, mom[key])
        out[f"V_{key}_step_error_se"] = (dims, mom[f"{key}_se"])
    for var in ("rho", "logVaa"):
        d = distances(coarse[var], fine[var])
        out[f"ks_{var}_step_error"] = (("t",), 2 * d["ks"])
        out[f"w1_{var}_step_error"] = (("t",), 2 * d["w1"])
    point, worst = 0.0, (-math.inf, "")
    probs = np.asarray(quantiles, dtype=np.float64)
    for name, label in _STEP_CHECKED:
        # at the last time (the headline numbers), the SDE's Monte Carlo SE
        err, err_se = out[f"{name}_step_error"][1][-1:], out[f"{name}_step_error_se"][1][-1:]
        se = out[name + "_se"][1][1][-1:]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(err != 0, np.abs(err) / se, 0.0)
            low = np.where(err != 0, (np.abs(err) - 2 * err_se) / se, -math.inf)
        point = max(point, float(np.nanmax(ratio, initial=0.0)))
        if low.size and np.nanmax(low, initial=-math.inf) > worst[0]:
            i = np.unravel_index(int(np.nanargmax(low)), low.shape)
            at = f" {100 * probs[i[1]]:g}%" if len(i) > 1 else ""
            worst = (
                float(low[i]),
                f"{label}{at} at t = {t[-1]:.4g}: step error {err[i]:+.3g} ± {err_se[i]:.2g} "
                f"against Monte Carlo SE {se[i]:.3g}",
            )
    return {"step_error": str(limit.attrs.get("step_error", "paired dt/2")),
            "limit_dt_half": float(limit.attrs.get("dt_half", math.nan)),
            "step_error_ratio": point, "step_error_resolved_ratio": worst[0],
            "step_error_worst": worst[1]}  # fmt: skip


def causal_pairs(m: int) -> list[tuple[int, int]]:
    """Token pairs (1-based) that behave differently under a causal mask
    (docs/theory.md#causal-sde): (1, 2) (token 1 has no attention at all), (1, m) and (m - 1, m)
    (the last tokens attend to every token); duplicates removed for small m."""
    pairs = [(1, 2), (1, m), (m - 1, m)]
    return list(dict.fromkeys(pairs))


def token_pairs(
    network: xr.Dataset,
    limit: xr.Dataset,
    pairs: Sequence[tuple[int, int]] | None = None,
    *,
    tolerance: float | None = None,
) -> xr.Dataset:
    """Mean correlation of individual token pairs over time, network vs SDE
    (docs/theory.md#causal-sde: under a causal mask the pairs are not exchangeable).

    ``pairs``: 1-based token pairs (default :func:`causal_pairs`). Times are aligned and
    samples excluded as in :func:`compare`. Returns ``mean_rho``, ``mean_rho_se`` (source,
    pair, t) and ``V_diag_mean`` (source, token, t), with coordinate ``pair`` ("1-2", ...).
    """
    m = network.sizes["token_a"]
    pairs = causal_pairs(m) if pairs is None else list(pairs)
    for a, b in pairs:
        if not (1 <= a <= m and 1 <= b <= m and a != b):
            raise ParameterError(
                "pairs", f"pairs must be distinct 1-based tokens <= {m}, got ({a}, {b})"
            )
    ia, ib = align_times(network["t"].values, limit["t"].values, tolerance)
    means, ses, diags = [], [], []
    for ds, idx in ((network, ia), (limit, ib)):
        ds = ds.isel(t=idx)
        ds = ds.isel(sample=valid_samples(ds))
        r = _rho(ds).values  # (N, t, m, m)
        x = np.stack([r[:, :, a - 1, b - 1] for a, b in pairs], axis=1)  # (N, pair, t)
        means.append(x.mean(0))
        ses.append(x.std(0, ddof=1) / np.sqrt(x.shape[0]))
        diags.append(np.diagonal(ds["V"].values, axis1=-2, axis2=-1).mean(0).T)
    coords = {
        "source": list(SOURCES),
        "pair": [f"{a}-{b}" for a, b in pairs],
        "token": np.arange(1, m + 1),
        "t": network["t"].values[ia],
    }
    return xr.Dataset(
        {
            "mean_rho": (("source", "pair", "t"), np.stack(means)),
            "mean_rho_se": (("source", "pair", "t"), np.stack(ses)),
            "V_diag_mean": (("source", "token", "t"), np.stack(diags)),
        },
        coords=coords,
        attrs={k: v for k, v in network.attrs.items() if k.startswith("config.")},
    )


def collapse_report(models: Mapping[str, xr.Dataset], threshold: float = 0.99) -> xr.Dataset:
    """Rank-collapse summary per model (docs/theory.md#rank-collapse) via
    ``shapedtx.detect_collapse``.

    models: label -> covariance Dataset. Returns a Dataset over ``model`` with
    ``fraction_collapsed`` (mean off-diagonal rho above ``threshold`` at some recorded time,
    non-finite V counting as collapsed), ``median_collapse_layer`` and ``median_collapse_t``
    (median over *all* samples of the first collapse time, never-collapsed samples counting
    as later than any: so it is ``shapedtx.metrics.NEVER`` (-1), the library's one marker of
    "never collapsed", when fewer than half collapse), ``final_mean_rho`` (mean over
    samples at the last time, finite samples only) and ``samples``. Layers come from the
    ``layer`` coordinate, else ``t * width``.
    """
    if not models:
        raise ParameterError("models", "models must name at least one Dataset")
    rows: dict[str, list[float]] = {
        k: []
        for k in (
            "fraction_collapsed",
            "median_collapse_layer",
            "median_collapse_t",
            "final_mean_rho",
            "samples",
        )
    }
    for ds in models.values():
        V = torch.from_numpy(np.ascontiguousarray(ds["V"].values))
        with np.errstate(all="ignore"):
            res = detect_collapse(V, threshold)
            final = metrics.mean_correlation(V[:, -1]).numpy()
        first = res.first_index.numpy()
        t = ds["t"].values
        layer = (
            ds["layer"].values.astype(np.float64)
            if "layer" in ds.coords
            else t * float(ds.attrs.get("config.width", np.nan))
        )
        hit = first >= 0
        t_first = np.where(hit, t[np.maximum(first, 0)], np.inf)
        l_first = np.where(hit, layer[np.maximum(first, 0)], np.inf)
        finite = np.isfinite(final)
        rows["fraction_collapsed"].append(float(hit.mean()))
        rows["median_collapse_t"].append(_never_if_inf(_median_inf(t_first)))
        rows["median_collapse_layer"].append(_never_if_inf(_median_inf(l_first)))
        rows["final_mean_rho"].append(float(final[finite].mean()) if finite.any() else np.nan)
        rows["samples"].append(float(first.size))
    data = {k: (("model",), np.asarray(v)) for k, v in rows.items()}
    return xr.Dataset(data, coords={"model": list(models)}, attrs={"threshold": threshold})


def _never_if_inf(x: float) -> float:
    """+inf (no collapse) as the marker ``NEVER`` (-1)."""
    return float(metrics.NEVER) if x == np.inf else x


def _median_inf(x: np.ndarray) -> float:
    """Median allowing +inf entries (lower median: inf only if more than half are inf)."""
    s = np.sort(x)
    return float(s[(s.size - 1) // 2])
