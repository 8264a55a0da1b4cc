"""Finite-network covariance simulation and comparison with the SDE (THEORY sections 4-6)."""

from shapedtx.covariance import equicorrelated
from shapedtx.results import with_metrics, with_rho

from .compare import QUANTILES, align_times, collapse_report, compare
from .convergence import at_width, convergence
from .driver import DEFAULT_MEMORY_BUDGET, resolve_method, simulate
from .gram import GramSampler
from .plots import (
    plot_convergence,
    plot_mean_correlation,
    plot_quantile_bands,
    plot_rho_density,
    save_figure,
)
from .presets import PRESETS, Preset, baselines
from .rng import GroupedNormal, group_seed
from .samplers import SAMPLERS, ExactSampler, Sampler, TokenSampler, WeightsSampler
from .sweep import SweepSummary, open_point, open_sweep, sweep
from .wishart import wishart, wishart_factor

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "PRESETS",
    "QUANTILES",
    "SAMPLERS",
    "ExactSampler",
    "GramSampler",
    "GroupedNormal",
    "Preset",
    "Sampler",
    "SweepSummary",
    "TokenSampler",
    "WeightsSampler",
    "align_times",
    "at_width",
    "baselines",
    "collapse_report",
    "compare",
    "convergence",
    "equicorrelated",
    "group_seed",
    "open_point",
    "open_sweep",
    "plot_convergence",
    "plot_mean_correlation",
    "plot_quantile_bands",
    "plot_rho_density",
    "resolve_method",
    "save_figure",
    "simulate",
    "sweep",
    "wishart",
    "wishart_factor",
    "with_metrics",
    "with_rho",
]
