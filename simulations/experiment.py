"""The main job as library calls: a finite network vs its covariance SDE, the convergence in the
width, and the rank-collapse report, from one :class:`Experiment`.

``run_comparison(Experiment(config))`` is what ``shapedtx compare`` runs::

    from shapedtx import ModelConfig
    from simulations import Experiment, run_comparison

    result = run_comparison(Experiment(ModelConfig(width=64, depth=48, mlp="shaped_relu")))
    print(result.summary["distances_T"])

It returns the Datasets, the summary (the numbers of ``summary.json``) and, when ``out`` is
given, writes every Dataset, ``summary.json`` and the figures there (each file atomically).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr

from sde import SOLVERS, SDEConstants, Solver, sde_constants
from sde.solve import DEFAULT_BOUND, SEED_MAX, solve_resolved
from sde.time_grid import time_grid
from shapedtx import ModelConfig, equicorrelated
from shapedtx._validation import (
    ParameterError,
    check_bool,
    check_choice,
    check_device,
    check_int,
    check_number,
    check_positive,
    check_progress,
    check_tokens,
)
from shapedtx.config import check_config
from shapedtx.covariance import check_correlation
from shapedtx.files import json_number, write_json
from shapedtx.options import DTYPES
from shapedtx.results import save_dataset

from .baselines import baselines, model_label
from .compare import collapse_report, compare, token_pairs
from .convergence import at_width, convergence
from .driver import DEFAULT_MEMORY_BUDGET, _resolve, _simulate
from .options import SAMPLERS, SamplerChoice


@dataclass(frozen=True)
class Experiment:
    """One network-vs-SDE comparison (validated on construction; ValueError names the field).

    Attributes:
        config: the model; it must have a covariance SDE (``sde.sde_constants``) unless
            ``sde`` is False.
        tokens, rho0: the input covariance ``equicorrelated(tokens, rho0)``.
        samples: finite networks and SDE paths.
        baseline_samples: networks per standard baseline of the collapse report.
        convergence_widths: widths of the convergence study at fixed ``T`` besides
            ``config.width`` (``()`` skips it); ``T * width`` must be an integer.
        method: finite-network sampler, a name of :data:`simulations.SAMPLERS` (``"auto"``:
            the fastest exact one that applies).
        sde_method: SDE solver, a name of :data:`sde.SOLVERS` (``"euler"``, ``"em"``,
            ``"torchsde"``); ``dt`` its step (default 0.005: at 0.01 the default run's step
            error of the 5% quantile of V^aa is 1.7 Monte Carlo SEs; docs/guide/compare.md).
        step_error: also solve the SDE at ``dt / 2`` on the same Brownian paths and report
            each statistic's step error beside its Monte Carlo SE (docs/theory.md#step-error;
            the SDE stage costs about 3 times as much; not with ``"torchsde"``).
        threshold: rank collapse is a mean correlation above it.
        seed: base seed (network ``seed``, SDE ``seed + 1``, baseline k ``seed + 2 + k``).
        device, dtype: where and in which precision (``"float64"`` or ``"float32"``).
        name, description: labels of the run (the ``compare`` preset).
        sde: False for a collapse-only experiment (:func:`run_collapse`): any model, vanilla
            ones included, since the collapse report needs no SDE limit; the SDE, its
            solver and the convergence widths are then not checked, and
            :func:`run_comparison` refuses it.
    """

    config: ModelConfig
    tokens: int = 4
    rho0: float = 0.2
    samples: int = 4096
    baseline_samples: int = 256
    convergence_widths: tuple[int, ...] = (4, 8, 16, 32, 64)
    method: str = "auto"
    sde_method: str = "euler"
    dt: float = 0.005
    step_error: bool = True
    threshold: float = 0.99
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float64"
    name: str = "custom"
    description: str = ""
    sde: bool = True

    def __post_init__(self) -> None:
        check_config(self.config)
        for label in ("name", "description"):
            if not isinstance(getattr(self, label), str):
                raise ParameterError(
                    label, f"{label} must be a string, got {getattr(self, label)!r}"
                )
        check_int("tokens", self.tokens, 2)
        check_tokens(self.tokens, self.config.width)
        check_correlation(self.rho0, self.tokens)
        check_int("samples", self.samples, 2)
        check_int("baseline_samples", self.baseline_samples, 2)
        check_device(self.device)
        object.__setattr__(self, "convergence_widths", tuple(self.convergence_widths))
        for w in self.convergence_widths:
            check_int("convergence_widths", w, 1)
        check_choice("method", self.method, tuple(SAMPLERS))
        check_choice("sde_method", self.sde_method, tuple(SOLVERS))
        check_positive("dt", self.dt)
        check_number("threshold", self.threshold, 0.0, 1.0, low_open=True, high_open=True)
        check_int("seed", self.seed, 0, SEED_MAX - 1)  # the SDE's seed is seed + 1
        check_choice("dtype", self.dtype, tuple(DTYPES))
        check_bool("sde", self.sde)
        check_bool("step_error", self.step_error)
        if self.sde and self.step_error and self.sde_method == "torchsde":
            raise ParameterError(
                "step_error",
                "step_error needs sde_method 'euler' or 'em' (torchsde has no stepper); "
                "pass step_error=False",
            )
        if not self.sde:  # collapse only: no SDE limit needed
            return
        self.constants  # noqa: B018  # computed once here: the model needs an SDE limit
        for w in self.widths:
            try:
                at_width(self.config, w)  # T * width must be an integer
            except ParameterError as err:  # at_width's widths are the convergence_widths here
                raise ParameterError("convergence_widths", str(err)) from None

    @property
    def dtype_torch(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def torch_device(self) -> torch.device:
        """``device`` as a torch.device (checked on construction)."""
        return torch.device(self.device)

    @cached_property
    def constants(self) -> SDEConstants:
        """The SDE constants of ``config`` for ``tokens`` tokens (:func:`sde.sde_constants`),
        computed once, on construction (``sde=True``), and handed to the SDE solve of
        :func:`run_comparison`. ParameterError for a model without an SDE limit."""
        return sde_constants(self.config, self.tokens)

    @property
    def solver(self) -> Solver:
        """The SDE solver object: ``sde_method``'s class of :data:`sde.SOLVERS` with ``dt``."""
        return SOLVERS[self.sde_method](self.dt)

    @property
    def widths(self) -> tuple[int, ...]:
        """Convergence widths other than ``config.width``, sorted."""
        return tuple(sorted(set(self.convergence_widths) - {self.config.width}))

    def V0(self) -> torch.Tensor:
        """The input covariance ``equicorrelated(tokens, rho0)`` on the device, in the dtype."""
        return equicorrelated(self.tokens, self.rho0, device=self.device, dtype=self.dtype_torch)

    def sampler(self, config: ModelConfig) -> SamplerChoice:
        """The finite-network sampler choice for ``config`` (the model, a baseline or the
        model at another width), resolved and checked: ``method``'s or, for ``"auto"``, the
        fastest exact-in-law one that supports it (``Gram()``, else ``Exact()``); a
        ParameterError (``method``) if an explicit one does not support ``config``."""
        return _resolve(config, self.method)

    def to_attrs(self) -> dict[str, Any]:
        """Flat, JSON- and netCDF-safe description (the config under ``config.``)."""
        out: dict[str, Any] = self.config.to_attrs()
        for f in fields(self):
            if f.name != "config":
                value = getattr(self, f.name)
                if isinstance(value, bool):  # netCDF has no booleans
                    value = int(value)
                out[f"experiment.{f.name}"] = list(value) if isinstance(value, tuple) else value
        return out


@dataclass
class Comparison:
    """What :func:`run_comparison` produced.

    ``network``, ``limit``: covariance Datasets; ``comparison``: :func:`simulations.compare`;
    ``collapse``: :func:`simulations.compare.collapse_report` of the model and its baselines
    (``baselines`` holds their Datasets); ``convergence`` (None if skipped) and
    ``token_pairs`` (causal models only); ``summary``: the numbers of ``summary.json``;
    ``files``: what was written (empty without ``out``).
    """

    experiment: Experiment
    network: xr.Dataset
    limit: xr.Dataset
    comparison: xr.Dataset
    collapse: xr.Dataset
    baselines: dict[str, xr.Dataset]
    convergence: xr.Dataset | None
    token_pairs: xr.Dataset | None
    summary: dict[str, Any]
    files: list[Path] = field(default_factory=list)


class _Timer:
    """Times named stages; ``report(k, total, text)`` is called as each starts."""

    def __init__(self, report: Callable[[int, int, str], None] | None, total: int) -> None:
        self.report, self.total, self.k = report, total, 0
        self.times: dict[str, float] = {}
        self.start = time.perf_counter()

    @contextmanager
    def __call__(self, name: str, text: str) -> Iterator[None]:
        self.k += 1
        if self.report is not None:
            self.report(self.k, self.total, text)
        t0 = time.perf_counter()
        yield
        self.times[name] = time.perf_counter() - t0


def run_collapse(
    experiment: Experiment,
    network: xr.Dataset | None = None,
    progress: bool | None = False,
    *,
    out: str | os.PathLike | None = None,
    figures: bool = True,
) -> tuple[xr.Dataset, dict[str, xr.Dataset]]:
    """The rank-collapse report of the model and its standard baselines
    (:func:`simulations.baselines`) at the same width and depth.

    Works for any model, vanilla ones included, with ``Experiment(config, sde=False)``
    (what ``shapedtx compare --no-sde`` runs); :func:`format_collapse` prints the report.

    Args:
        experiment: the model, input, samples, threshold and seed.
        network: the model's covariance Dataset if already simulated.
        progress: tqdm bars of the simulations (None: when stderr is a terminal).
        out: if given, a folder for ``collapse.nc``, ``network.nc`` and (``figures``)
            ``figures/mean_correlation`` and ``figures/collapse_metrics`` (PNG and PDF).

    Returns:
        ``(report, models)``: :func:`simulations.collapse_report` of the model and its
        baselines (median collapse layer :data:`shapedtx.metrics.NEVER` where fewer than
        half collapse) and the label -> covariance Dataset of each.
    """
    check_bool("figures", figures)
    check_progress(progress)
    e = experiment
    V0 = e.V0()
    if network is None:
        network = _network(e, e.config, V0, e.samples, e.seed, progress)
    report, models = _collapse(e, network, V0, progress)
    if out is not None:
        out = Path(out)
        save_dataset(report, out / "collapse.nc")
        save_dataset(network, out / "network.nc")
        if figures:
            from . import plots

            for name, plot in (("mean_correlation", plots.plot_mean_correlation),
                               ("collapse_metrics", plots.plot_collapse_metrics)):  # fmt: skip
                plot(models, threshold=e.threshold, path=out / "figures" / name)
    return report, models


def _collapse(
    e: Experiment, network: xr.Dataset, V0: torch.Tensor, progress: bool | None
) -> tuple[xr.Dataset, dict[str, xr.Dataset]]:
    """:func:`run_collapse`'s report and models on checked arguments (``V0 = e.V0()``)."""
    models = {f"{'shaped' if e.sde else 'model'} ({model_label(e.config)})": network}
    for k, (label, cfg) in enumerate(baselines(e.config).items()):
        models[f"{label} ({model_label(cfg)})"] = _network(
            e, cfg, V0, e.baseline_samples, e.seed + 2 + k, progress
        )
    report = collapse_report(models, e.threshold)
    report.attrs.update(e.to_attrs())
    return report, models


def _network(
    e: Experiment,
    config: ModelConfig,
    V0: torch.Tensor,
    samples: int,
    seed: int,
    progress: bool | None,
    sampler: SamplerChoice | None = None,
) -> xr.Dataset:
    """:func:`simulations.simulate` of ``config`` (the model or a baseline) on the checked
    experiment's settings: ``V0`` is ``e.V0()``, ``sampler`` (default ``e.sampler(config)``)
    resolved and checked for ``config``; nothing is checked again."""
    sampler = e.sampler(config) if sampler is None else sampler
    return _simulate(
        config, V0, samples, sampler=sampler, requested=sampler.name, seed=seed,
        device=e.torch_device, chunk_size=None, memory_budget=DEFAULT_MEMORY_BUDGET,
        progress=progress,
    )  # fmt: skip


def collapse_summary(collapse: xr.Dataset) -> dict[str, Any]:
    """The ``collapse`` entry of ``summary.json``."""
    return {
        "threshold": float(collapse.attrs["threshold"]),
        "models": {
            str(m): {
                "fraction_collapsed": _num(collapse["fraction_collapsed"].sel(model=m)),
                "median_collapse_layer": _num(collapse["median_collapse_layer"].sel(model=m)),
                "final_mean_rho": _num(collapse["final_mean_rho"].sel(model=m)),
                "samples": int(collapse["samples"].sel(model=m)),
            }
            for m in collapse["model"].values
        },
    }


def run_convergence(
    experiment: Experiment,
    limit: xr.Dataset | None = None,
    network: xr.Dataset | None = None,
    progress: bool | None = False,
) -> xr.Dataset:
    """The distance between network and SDE at ``T`` for ``convergence_widths`` and the
    model's width (:func:`simulations.convergence`)."""
    return _convergence(
        experiment, limit, network, progress, experiment.sampler(experiment.config),
        experiment.V0(),
    )  # fmt: skip


def _convergence(
    e: Experiment,
    limit: xr.Dataset | None,
    network: xr.Dataset | None,
    progress: bool | None,
    sampler: SamplerChoice,
    V0: torch.Tensor,
) -> xr.Dataset:
    """:func:`run_convergence` with the model's sampler object (used at every width,
    checked there per width) and ``V0 = e.V0()``."""
    return convergence(
        e.config, [*e.widths, e.config.width], V0, e.samples, limit=limit,
        networks={e.config.width: network} if network is not None else None,
        method=sampler, dt=e.dt, sde_method=e.sde_method, seed=e.seed,
        device=e.device, dtype=e.dtype_torch, progress=progress, step_error=e.step_error,
    )  # fmt: skip


def run_comparison(
    experiment: Experiment,
    out: str | os.PathLike | None = None,
    *,
    figures: bool = True,
    progress: bool | None = False,
    stages: Callable[[int, int, str], None] | None = None,
) -> Comparison:
    """Run the main job (README: ``shapedtx compare``) and, with ``out``, write it there.

    Args:
        experiment: what to compare.
        out: folder for ``network.nc``, ``sde.nc``, ``comparison.nc``, ``collapse.nc``,
            ``convergence.nc``, ``token_pairs.nc`` (causal), ``summary.json`` and
            ``figures/*.png|pdf`` (``figures=False``: no figures). Each file is written
            atomically; existing files of the same names are replaced.
        progress: tqdm bars of the simulations (None: when stderr is a terminal).
        stages: ``stages(k, total, text)`` is called as each stage starts.
    """
    check_bool("figures", figures)
    check_progress(progress)
    e = experiment
    if not e.sde:
        raise ParameterError(
            "experiment",
            "experiment.sde is False (collapse only): run_comparison needs the SDE limit; "
            "use run_collapse(experiment) for the collapse report",
        )
    # the experiment was checked on construction: from here on, resolved objects only
    cfg, V0, solver, sampler = e.config, e.V0(), e.solver, e.sampler(e.config)
    writes = out is not None
    timer = _Timer(stages, 4 + bool(e.widths) + writes + (writes and figures))
    with timer("network", f"finite network: {model_label(cfg)}, width {cfg.width}, depth "
               f"{cfg.depth}, {e.samples} samples"):  # fmt: skip
        network = _network(e, cfg, V0, e.samples, e.seed, progress, sampler)
    with timer("sde", f"SDE limit to T = {cfg.T:g}, dt {e.dt:g}"
               + (f" and {e.dt / 2:g} (step error)" if e.step_error else "")
               + f", {e.samples} paths"):  # fmt: skip
        limit = solve_resolved(cfg, V0, e.samples, solver=solver,
                               grid=time_grid(cfg, solver.dt, T=cfg.T), constants=e.constants,
                               seed=e.seed + 1, bound=DEFAULT_BOUND, progress=progress,
                               warn=False,  # reported below
                               step_error=e.step_error)  # fmt: skip
    with timer("baselines", f"baselines, {e.baseline_samples} samples each"):
        collapse, models = _collapse(e, network, V0, progress)
    with timer("statistics", "comparison statistics"):
        comparison = compare(network, limit)
        pairs = token_pairs(network, limit) if cfg.causal else None
    conv = None
    if e.widths:
        with timer("convergence", f"convergence at T = {cfg.T:g}: widths "
                   f"{', '.join(map(str, e.widths))} (+ {cfg.width})"):  # fmt: skip
            conv = _convergence(e, limit, network, progress, sampler, V0)
    for ds in (collapse, conv, pairs, comparison):
        if ds is not None:
            ds.attrs.update(e.to_attrs())
    result = Comparison(e, network, limit, comparison, collapse, models, conv, pairs, {})
    if out is not None:
        out = Path(out)
        with timer("write", f"writing Datasets to {out}"):
            for name, ds in (("network", network), ("sde", limit), ("comparison", comparison),
                             ("collapse", collapse), ("convergence", conv),
                             ("token_pairs", pairs)):  # fmt: skip
                if ds is not None:
                    result.files.append(save_dataset(ds, out / f"{name}.nc"))
        if figures:
            with timer("figures", f"figures in {out / 'figures'}"):
                result.files += write_figures(result, out / "figures")
    timer.times["total"] = time.perf_counter() - timer.start
    result.summary = summarise(result, timer.times)
    if out is not None:
        files = [*sorted(str(p.relative_to(out)) for p in result.files), "summary.json"]
        result.summary["files"] = files
        result.files.append(write_json(result.summary, Path(out) / "summary.json", allow_nan=False))
    return result


def write_figures(result: Comparison, folder: Path) -> list[Path]:
    """The figures of a comparison (PNG and PDF each) in ``folder``."""
    from . import plots

    threshold = result.experiment.threshold
    draw = {
        "mean_correlation": lambda p: plots.plot_mean_correlation(
            result.baselines, threshold=threshold, path=p
        ),
        "collapse_metrics": lambda p: plots.plot_collapse_metrics(
            result.baselines, threshold=threshold, path=p
        ),
        "rho_density": lambda p: plots.plot_rho_density(result.network, result.limit, path=p),
        "quantile_bands": lambda p: plots.plot_quantile_bands(result.comparison, path=p),
    }
    convergence, token_pairs = result.convergence, result.token_pairs
    if convergence is not None:
        draw["convergence"] = lambda p: plots.plot_convergence(convergence, path=p)
    if token_pairs is not None:
        draw["token_pairs"] = lambda p: plots.plot_token_pairs(token_pairs, path=p)
    paths = []
    for name, plot in draw.items():
        plot(folder / name)
        paths += [folder / f"{name}.png", folder / f"{name}.pdf"]
    return paths


# Summary ---------------------------------------------------------------------------------------
def _num(x: Any) -> float | None:
    """A JSON number: a finite float, else None (null), the library's convention
    (:func:`shapedtx.files.json_number`)."""
    return json_number(float(x))


def _nums(x: Any) -> list[float | None]:
    return [_num(v) for v in np.ravel(x)]


def summarise(result: Comparison, times: dict[str, float] | None = None) -> dict[str, Any]:
    """The headline numbers of a comparison (README: how to read ``summary.json``)."""
    e, comparison, limit = result.experiment, result.comparison, result.limit
    config = e.config
    last = comparison.isel(t=-1)
    summary: dict[str, Any] = {
        "preset": e.name,
        "description": e.description,
        "config": config.to_attrs(prefix=""),
        "T": config.T,
        "tokens": e.tokens,
        "rho0": e.rho0,
        "samples": e.samples,
        "dtype": e.dtype,
        "seed": e.seed,
        "method": {"network": comparison.attrs["network_method"], "sde": e.sde_method},
        "t_final": {"network": float(last["t_network"]), "sde": float(last["t_limit"])},
        "quantiles": _nums(comparison["quantile"].values),
    }
    for var in ("rho", "Vaa"):
        summary[f"{var}_T"] = {
            src: {
                "quantiles": _nums(last[f"{var}_quantile"].sel(source=src).values),
                "se": _nums(last[f"{var}_quantile_se"].sel(source=src).values),
            }
            for src in ("network", "sde")
        }
    summary["distances_T"] = {
        k: _num(last[k])
        for k in ("ks_rho", "ks_rho_pvalue", "w1_rho", "ks_logVaa", "ks_logVaa_pvalue",
                  "w1_logVaa")
    }  # fmt: skip
    summary["max_over_t"] = {
        "ks_rho": _num(comparison["ks_rho"].max()),
        "w1_rho": _num(comparison["w1_rho"].max()),
        "min_ks_rho_pvalue": _num(comparison["ks_rho_pvalue"].min()),
    }
    summary["sde"] = {
        "method": e.sde_method,
        "dt": _num(limit.attrs.get("dt", e.dt)),
        "exploded": int(limit["exploded"].sum()) if "exploded" in limit else 0,
        "samples": int(limit.sizes["sample"]),
        "excluded": int(comparison.attrs["n_excluded_limit"]),
    }
    summary["sde"]["step_error"] = _step_error_summary(comparison)
    summary["network_excluded"] = int(comparison.attrs["n_excluded_network"])
    summary["collapse"] = collapse_summary(result.collapse)
    conv = result.convergence
    summary["convergence"] = None
    if conv is not None:
        summary["convergence"] = {
            "widths": [int(w) for w in conv["width"].values],
            "depths": [int(d) for d in conv["depth"].values],
            **{k: _nums(conv[k].values) for k in ("w1_rho", "ks_rho", "median_rho_gap",
                                                  "median_rho_gap_se")},
            "w1_rho_slope": _num(conv.attrs["w1_rho_slope"]),
            "w1_rho_slope_se": _num(conv.attrs["w1_rho_slope_se"]),
            "w1_rho_noise_floor": _num(conv.attrs["w1_rho_noise_floor"]),
            "w1_rho_step_error": _num(conv.attrs.get("w1_rho_step_error", math.nan)),
        }  # fmt: skip
    if result.token_pairs is not None:
        summary["token_pairs"] = _pairs_summary(result.token_pairs)
    summary["run_times_s"] = {k: round(v, 2) for k, v in (times or {}).items()}
    return summary


def _step_error_summary(comparison: xr.Dataset) -> dict[str, Any] | None:
    """The ``sde.step_error`` entry of ``summary.json`` (None without the dt/2 solve): the
    step errors at T of the SDE's quantiles of rho and V^aa, mean rho and the distances, each
    ``S_dt - S_0`` by Richardson from dt and dt/2 on the same paths, with their SEs
    (docs/theory.md#step-error), and the largest ratios to the Monte Carlo SE."""
    if "rho_quantile_step_error" not in comparison:
        return None
    last = comparison.isel(t=-1)
    a = comparison.attrs
    return {
        "dt_half": _num(a["limit_dt_half"]),
        **{
            f"{var}_T": {
                "step_error": _nums(last[f"{var}_quantile_step_error"].values),
                "step_error_se": _nums(last[f"{var}_quantile_step_error_se"].values),
            }
            for var in ("rho", "Vaa")
        },
        "mean_rho_T": {
            "step_error": _num(last["mean_rho_step_error"]),
            "step_error_se": _num(last["mean_rho_step_error_se"]),
        },
        "distances_T": {
            k: _num(last[f"{k}_step_error"]) for k in ("ks_rho", "w1_rho", "ks_logVaa", "w1_logVaa")
        },
        "ratio": _num(a["step_error_ratio"]),
        "resolved_ratio": _num(a["step_error_resolved_ratio"]),
        "worst": str(a["step_error_worst"]),
    }


def _pairs_summary(pairs: xr.Dataset) -> dict[str, Any]:
    """Per-pair mean rho at T (causal runs), network and SDE, and the mean diagonal
    ``V^{aa}`` at T per token."""
    last = pairs.isel(t=-1)
    return {
        "pairs": [str(p) for p in pairs["pair"].values],
        **{
            key: {src: _nums(last[var].sel(source=src).values) for src in ("network", "sde")}
            for key, var in (("mean_rho_T", "mean_rho"), ("mean_rho_T_se", "mean_rho_se"),
                             ("V_diag_mean_T", "V_diag_mean"))
        },
    }  # fmt: skip
