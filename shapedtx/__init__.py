"""shapedtx: shaped Transformers, their covariance at initialisation, and their training.

Public API of the layer library; the covariance SDE lives in ``sde`` and the finite-network
simulator in ``simulations``.
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from . import metrics
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
from .config import ModelConfig, check_config
from .covariance import check_covariance, check_covariance_batch, equicorrelated, initial_tokens
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
from .probe import CovarianceProbe, find_blocks, probe

# Loaded on first use, so that ``import shapedtx`` stays light (layers, config and metrics:
# no xarray, scipy, matplotlib or trainer): public name -> module that defines it.
_LAZY: dict[str, str] = {
    **dict.fromkeys(("bottleneck", "design", "results", "training"), ""),
    **dict.fromkeys(("fit_attention", "realise_attention"), "bottleneck"),
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
    "covariance_dataset",
    "depth_threshold",
    "design",
    "detect_collapse",
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
    "metrics",
    "mlp_branch",
    "optimal_shape",
    "optimal_width",
    "param_count",
    "plot_collapse",
    "plot_losses",
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
