"""shapedtx: shaped Transformers, their covariance at initialisation, and their training.

Public API of the layer library; the covariance SDE lives in ``sde`` and the finite-network
simulator in ``simulations``.
"""

import sys
import types
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time __getattr__ imports each name on first use
    from . import bottleneck, design, metrics
    from ._validation import ParameterError
    from .activation import relu_slopes, shaped_relu
    from .attention import (
        causal_centring,
        causal_uniform,
        shaped_attention,
        shaped_attention_heads,
        shaped_attention_matrix,
        softmax_attention,
        softmax_attention_matrix,
        token_cumsum,
        token_mean,
    )
    from .blocks import attention_branch, block, gaussian_linear, mlp_branch, residual
    from .bottleneck import fit_attention, realise_attention
    from .config import ModelConfig, check_config
    from .covariance import (
        check_covariance,
        check_covariance_batch,
        equicorrelated,
        initial_tokens,
    )
    from .design import (
        depth_threshold,
        extrapolation_warning,
        gpt3_table,
        head_size_report,
        optimal_shape,
        optimal_width,
        param_count,
        regime,
    )
    from .diagnostics import (
        CovarianceProbe,
        Monitor,
        coord_check,
        find_blocks,
        plot_coord_check,
        plot_monitor,
        probe,
    )
    from .metrics import detect_collapse
    from .nn import (
        MLP,
        Attention,
        Block,
        ShapedAttention,
        ShapedReLU,
        SoftmaxAttention,
        Transformer,
    )
    from .norm import layer_norm
    from .presets import PRESETS, preset
    from .results import (
        config_of,
        covariance_dataset,
        load_dataset,
        save_dataset,
        with_metrics,
        with_rho,
    )
    from .training import TrainConfig, TrainingDiverged, load_corpus, train
    from .training.plots import plot_collapse, plot_losses, plot_runs
    from .training.transfer import eps_multiplier, lr_multipliers, lr_rule

# Every public name is loaded on first use, so that ``import shapedtx`` costs nothing (the
# command line's --help and argument errors stay fast; torch loads with the first layer,
# metric or model): public name -> module that defines it ("" for a submodule).
_LAZY: dict[str, str] = {
    **dict.fromkeys(("bottleneck", "design", "diagnostics", "metrics", "results", "training"), ""),
    **dict.fromkeys(("relu_slopes", "shaped_relu"), "activation"),
    **dict.fromkeys(
        (
            "causal_centring",
            "causal_uniform",
            "shaped_attention",
            "shaped_attention_heads",
            "shaped_attention_matrix",
            "softmax_attention",
            "softmax_attention_matrix",
            "token_cumsum",
            "token_mean",
        ),
        "attention",
    ),
    **dict.fromkeys(
        ("attention_branch", "block", "gaussian_linear", "mlp_branch", "residual"), "blocks"
    ),
    **dict.fromkeys(("fit_attention", "realise_attention"), "bottleneck"),
    **dict.fromkeys(("ModelConfig", "check_config"), "config"),
    "ParameterError": "_validation",
    **dict.fromkeys(
        ("check_covariance", "check_covariance_batch", "equicorrelated", "initial_tokens"),
        "covariance",
    ),
    **dict.fromkeys(
        (
            "depth_threshold",
            "extrapolation_warning",
            "gpt3_table",
            "head_size_report",
            "optimal_shape",
            "optimal_width",
            "param_count",
            "regime",
        ),
        "design",
    ),
    "detect_collapse": "metrics",
    **dict.fromkeys(
        (
            "MLP",
            "Attention",
            "Block",
            "ShapedAttention",
            "ShapedReLU",
            "SoftmaxAttention",
            "Transformer",
        ),
        "nn",
    ),
    "layer_norm": "norm",
    **dict.fromkeys(("PRESETS", "preset"), "presets"),
    **dict.fromkeys(
        (
            "CovarianceProbe",
            "Monitor",
            "coord_check",
            "find_blocks",
            "plot_coord_check",
            "plot_monitor",
            "probe",
        ),
        "diagnostics",
    ),
    **dict.fromkeys(
        (
            "config_of",
            "covariance_dataset",
            "load_dataset",
            "save_dataset",
            "with_metrics",
            "with_rho",
        ),
        "results",
    ),
    **dict.fromkeys(("TrainConfig", "TrainingDiverged", "load_corpus", "train"), "training"),
    **dict.fromkeys(("plot_collapse", "plot_losses", "plot_runs"), "training.plots"),
    **dict.fromkeys(("eps_multiplier", "lr_multipliers", "lr_rule"), "training.transfer"),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if module == "":
        return import_module(f".{name}", __name__)
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """``shapedtx`` itself: importing a submodule named like a public name must not replace
    that name (Python sets a package's attribute to each submodule it loads; the eager imports
    used to rebind the function afterwards)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _LAZY.get(name, "") != "":
            return  # a public name of another object, loaded by __getattr__
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


try:
    __version__ = version("shapedtx")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+unknown"

__all__ = [
    "MLP",
    "PRESETS",
    "Attention",
    "Block",
    "CovarianceProbe",
    "ModelConfig",
    "Monitor",
    "ParameterError",
    "ShapedAttention",
    "ShapedReLU",
    "SoftmaxAttention",
    "TrainConfig",
    "TrainingDiverged",
    "Transformer",
    "__version__",
    "attention_branch",
    "block",
    "bottleneck",
    "causal_centring",
    "causal_uniform",
    "check_config",
    "check_covariance",
    "check_covariance_batch",
    "config_of",
    "coord_check",
    "covariance_dataset",
    "depth_threshold",
    "design",
    "detect_collapse",
    "eps_multiplier",
    "equicorrelated",
    "extrapolation_warning",
    "find_blocks",
    "fit_attention",
    "gaussian_linear",
    "gpt3_table",
    "head_size_report",
    "initial_tokens",
    "layer_norm",
    "load_corpus",
    "load_dataset",
    "lr_multipliers",
    "lr_rule",
    "metrics",
    "mlp_branch",
    "optimal_shape",
    "optimal_width",
    "param_count",
    "plot_collapse",
    "plot_coord_check",
    "plot_losses",
    "plot_monitor",
    "plot_runs",
    "preset",
    "probe",
    "realise_attention",
    "regime",
    "relu_slopes",
    "residual",
    "save_dataset",
    "shaped_attention",
    "shaped_attention_heads",
    "shaped_attention_matrix",
    "shaped_relu",
    "softmax_attention",
    "softmax_attention_matrix",
    "token_cumsum",
    "token_mean",
    "train",
    "with_metrics",
    "with_rho",
]
