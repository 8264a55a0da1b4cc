"""Finite-network covariance simulation and comparison with the SDE (docs/theory.md#rank-collapse,
#samplers and #checks).

Every public name is loaded on first use (``import simulations`` and the command line's
``--help`` cost nothing; torch, xarray and Dask load with the first simulation)."""

import sys
import types
from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shapedtx.covariance import equicorrelated
    from shapedtx.results import with_metrics, with_rho

    from .advise import (
        Advice,
        Candidate,
        Criteria,
        Measurement,
        advise,
        measure,
        measure_dataset,
        trained_checks,
    )
    from .baselines import baselines
    from .compare import QUANTILES, align_times, causal_pairs, collapse_report, compare, token_pairs
    from .convergence import at_width, convergence
    from .driver import DEFAULT_MEMORY_BUDGET, resolve_method, simulate
    from .experiment import (
        Comparison,
        Experiment,
        run_collapse,
        run_comparison,
        run_convergence,
        summarise,
    )
    from .formatting import format_advice, format_collapse, format_stability_map, format_summary
    from .gram import GramSampler
    from .options import SAMPLERS, Auto, Exact, Gram, SamplerChoice, Weights
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
    from .samplers import ExactSampler, Sampler, TokenSampler, WeightsSampler
    from .stability import plot_stability_map, stability_map
    from .sweep import (
        SweepSummary,
        TaskSummary,
        open_point,
        open_sweep,
        run_replanned,
        run_tasks,
        sweep,
    )
    from .training_runs import (
        TrainingRun,
        check_run_options,
        horizon_loss,
        one_corpus,
        run_planned,
        run_training,
        run_trainings,
    )
    from .transfer import TransferAdvice, transfer_lr
    from .wishart import wishart, wishart_factor

_LAZY: dict[str, str] = {
    "equicorrelated": "shapedtx.covariance",
    "with_metrics": "shapedtx.results",
    "with_rho": "shapedtx.results",
    "Advice": ".advise",
    "Candidate": ".advise",
    "Criteria": ".advise",
    "Measurement": ".advise",
    "advise": ".advise",
    "measure": ".advise",
    "measure_dataset": ".advise",
    "trained_checks": ".advise",
    "baselines": ".baselines",
    "QUANTILES": ".compare",
    "align_times": ".compare",
    "causal_pairs": ".compare",
    "collapse_report": ".compare",
    "compare": ".compare",
    "token_pairs": ".compare",
    "at_width": ".convergence",
    "convergence": ".convergence",
    "DEFAULT_MEMORY_BUDGET": ".driver",
    "resolve_method": ".driver",
    "simulate": ".driver",
    "Comparison": ".experiment",
    "Experiment": ".experiment",
    "run_collapse": ".experiment",
    "run_comparison": ".experiment",
    "run_convergence": ".experiment",
    "summarise": ".experiment",
    "format_advice": ".formatting",
    "format_collapse": ".formatting",
    "format_stability_map": ".formatting",
    "format_summary": ".formatting",
    "GramSampler": ".gram",
    "Auto": ".options",
    "Exact": ".options",
    "Gram": ".options",
    "SAMPLERS": ".options",
    "SamplerChoice": ".options",
    "Weights": ".options",
    "plot_collapse_metrics": ".plots",
    "plot_convergence": ".plots",
    "plot_mean_correlation": ".plots",
    "plot_quantile_bands": ".plots",
    "plot_rho_density": ".plots",
    "plot_token_pairs": ".plots",
    "save_figure": ".plots",
    "PRESETS": ".presets",
    "GroupedNormal": ".rng",
    "group_seed": ".rng",
    "ExactSampler": ".samplers",
    "Sampler": ".samplers",
    "TokenSampler": ".samplers",
    "WeightsSampler": ".samplers",
    "plot_stability_map": ".stability",
    "stability_map": ".stability",
    "SweepSummary": ".sweep",
    "open_point": ".sweep",
    "open_sweep": ".sweep",
    "sweep": ".sweep",
    "TaskSummary": ".sweep",
    "run_replanned": ".sweep",
    "run_tasks": ".sweep",
    "TrainingRun": ".training_runs",
    "check_run_options": ".training_runs",
    "horizon_loss": ".training_runs",
    "one_corpus": ".training_runs",
    "run_planned": ".training_runs",
    "run_training": ".training_runs",
    "run_trainings": ".training_runs",
    "TransferAdvice": ".transfer",
    "transfer_lr": ".transfer",
    "wishart": ".wishart",
    "wishart_factor": ".wishart",
}
"""Public name -> the module that defines it (relative to this package, or absolute)."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """``simulations`` itself: loading a submodule named like a public function
    (``compare``, ``sweep``, ``advise``, ...) must not replace the function (Python sets a
    package's attribute to each submodule it loads; the eager imports used to rebind the
    function afterwards)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and name in _LAZY:
            return  # a public name of another object, loaded by __getattr__
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

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
    "Sampler",
    "SamplerChoice",
    "SweepSummary",
    "TaskSummary",
    "TokenSampler",
    "TrainingRun",
    "TransferAdvice",
    "Weights",
    "WeightsSampler",
    "advise",
    "align_times",
    "at_width",
    "baselines",
    "causal_pairs",
    "check_run_options",
    "collapse_report",
    "compare",
    "convergence",
    "equicorrelated",
    "format_advice",
    "format_collapse",
    "format_stability_map",
    "format_summary",
    "group_seed",
    "horizon_loss",
    "measure",
    "measure_dataset",
    "one_corpus",
    "open_point",
    "open_sweep",
    "plot_collapse_metrics",
    "plot_convergence",
    "plot_mean_correlation",
    "plot_quantile_bands",
    "plot_rho_density",
    "plot_stability_map",
    "plot_token_pairs",
    "resolve_method",
    "run_collapse",
    "run_comparison",
    "run_convergence",
    "run_planned",
    "run_replanned",
    "run_tasks",
    "run_training",
    "run_trainings",
    "save_figure",
    "simulate",
    "stability_map",
    "summarise",
    "sweep",
    "token_pairs",
    "trained_checks",
    "transfer_lr",
    "wishart",
    "wishart_factor",
    "with_metrics",
    "with_rho",
]
