"""Training shaped vs vanilla Transformers as causal byte-level language models.

``train(model_config, load_corpus(), TrainConfig(...))`` returns the model and its log
(an ``xarray.Dataset``, see :mod:`shapedtx.training.log`); ``plots`` draws loss curves and
rank collapse over training.
"""

from typing import TYPE_CHECKING

from .config import TrainConfig
from .data import ByteCorpus, load_corpus, unigram_baseline
from .horizons import horizon_configs, train_horizons
from .log import final_val_loss, log_dataset
from .model import LanguageModel
from .trainer import ResumeMismatch, TrainingDiverged, TrainResult, configs_of, lr_factor, train

if TYPE_CHECKING:  # at run time __getattr__ imports them (and matplotlib) on first use
    from .plots import plot_collapse, plot_losses

__all__ = [
    "ByteCorpus",
    "LanguageModel",
    "ResumeMismatch",
    "TrainConfig",
    "TrainResult",
    "TrainingDiverged",
    "configs_of",
    "final_val_loss",
    "horizon_configs",
    "load_corpus",
    "log_dataset",
    "lr_factor",
    "plot_collapse",
    "plot_losses",
    "train",
    "train_horizons",
    "unigram_baseline",
]


def __getattr__(name: str) -> object:
    # plots import matplotlib: load them only when asked for
    if name in ("plot_collapse", "plot_losses"):
        from . import plots

        return getattr(plots, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
