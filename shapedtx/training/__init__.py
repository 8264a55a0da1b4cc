"""Training shaped vs vanilla Transformers as causal byte-level language models.

``train(model_config, load_corpus(), TrainConfig(...))`` returns the model and its log
(an ``xarray.Dataset``, see :mod:`shapedtx.training.log`); ``plots`` draws loss curves and
rank collapse over training; ``transfer`` holds the learning-rate transfer rules the trainer
applies (``TrainConfig.lr_proxy_width``/``lr_proxy_depth``).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time __getattr__ imports each name on first use
    from .config import COMPLETEP_REFERENCE, TrainConfig, completep_reference_train
    from .data import ByteCorpus, export_corpus, load_corpus, unigram_baseline
    from .horizons import horizon_configs, train_horizons
    from .log import final_val_loss, log_dataset
    from .many import Run, train_many
    from .model import LanguageModel
    from .plots import plot_collapse, plot_losses
    from .probing import DataMismatch, probe_run
    from .trainer import (
        ResumeMismatch,
        TrainingDiverged,
        TrainResult,
        configs_of,
        lr_factor,
        train,
    )
    from .transfer import GROUPS, lr_multipliers, lr_rule, proxy_config

# Every public name is loaded on first use, so that ``from shapedtx.training import TrainConfig``
# costs no torch (the command line's ``train --help`` and argument errors stay fast; torch loads
# with the corpus, the model or the trainer; matplotlib with the plots): public name -> module.
_LAZY: dict[str, str] = {
    **dict.fromkeys(("COMPLETEP_REFERENCE", "TrainConfig", "completep_reference_train"), "config"),
    **dict.fromkeys(("ByteCorpus", "export_corpus", "load_corpus", "unigram_baseline"), "data"),
    **dict.fromkeys(("horizon_configs", "train_horizons"), "horizons"),
    **dict.fromkeys(("final_val_loss", "log_dataset"), "log"),
    "LanguageModel": "model",
    **dict.fromkeys(("Run", "train_many"), "many"),
    **dict.fromkeys(("plot_collapse", "plot_losses"), "plots"),
    **dict.fromkeys(("DataMismatch", "probe_run"), "probing"),
    **dict.fromkeys(
        ("ResumeMismatch", "TrainingDiverged", "TrainResult", "configs_of", "lr_factor", "train"),
        "trainer",
    ),
    **dict.fromkeys(("GROUPS", "lr_multipliers", "lr_rule", "proxy_config"), "transfer"),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "COMPLETEP_REFERENCE",
    "GROUPS",
    "ByteCorpus",
    "DataMismatch",
    "LanguageModel",
    "ResumeMismatch",
    "Run",
    "TrainConfig",
    "TrainResult",
    "TrainingDiverged",
    "completep_reference_train",
    "configs_of",
    "export_corpus",
    "final_val_loss",
    "horizon_configs",
    "load_corpus",
    "log_dataset",
    "lr_factor",
    "lr_multipliers",
    "lr_rule",
    "plot_collapse",
    "plot_losses",
    "probe_run",
    "proxy_config",
    "train",
    "train_horizons",
    "train_many",
    "unigram_baseline",
]
