"""Finite-network covariance simulation and comparison with the SDE (docs/theory.md#rank-collapse,
#samplers and #checks)."""

from shapedtx.covariance import equicorrelated
from shapedtx.results import with_metrics, with_rho

from .advise import Advice, Candidate, Criteria, Measurement, advise, measure, measure_dataset
from .baselines import baselines
from .compare import QUANTILES, align_times, causal_pairs, collapse_report, compare, token_pairs
from .convergence import at_width, convergence
from .driver import DEFAULT_MEMORY_BUDGET, resolve_method, simulate
from .experiment import (
    Comparison,
    Experiment,
    format_collapse,
    format_summary,
    run_collapse,
    run_comparison,
    run_convergence,
    summarise,
)
from .gram import GramSampler
from .options import Auto, Exact, Gram, RunOptions, Weights
from .plots import (
    plot_collapse_metrics,
    plot_convergence,
    plot_mean_correlation,
    plot_quantile_bands,
    plot_rho_density,
    plot_token_pairs,
    save_figure,
)
from .presets import PRESETS
from .rng import GroupedNormal, group_seed
from .samplers import (
    SAMPLERS,
    ExactSampler,
    Sampler,
    TokenSampler,
    WeightsSampler,
    method_names,
)
from .sweep import SweepSummary, open_point, open_sweep, sweep
from .wishart import wishart, wishart_factor

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "PRESETS",
    "QUANTILES",
    "SAMPLERS",
    "Advice",
    "Auto",
    "Candidate",
    "Comparison",
    "Criteria",
    "Exact",
    "ExactSampler",
    "Experiment",
    "Gram",
    "GramSampler",
    "GroupedNormal",
    "Measurement",
    "RunOptions",
    "Sampler",
    "SweepSummary",
    "TokenSampler",
    "Weights",
    "WeightsSampler",
    "advise",
    "align_times",
    "at_width",
    "baselines",
    "causal_pairs",
    "collapse_report",
    "compare",
    "convergence",
    "equicorrelated",
    "format_collapse",
    "format_summary",
    "group_seed",
    "measure",
    "measure_dataset",
    "method_names",
    "open_point",
    "open_sweep",
    "plot_collapse_metrics",
    "plot_convergence",
    "plot_mean_correlation",
    "plot_quantile_bands",
    "plot_rho_density",
    "plot_token_pairs",
    "resolve_method",
    "run_collapse",
    "run_comparison",
    "run_convergence",
    "save_figure",
    "simulate",
    "summarise",
    "sweep",
    "token_pairs",
    "wishart",
    "wishart_factor",
    "with_metrics",
    "with_rho",
]
