"""Named experiment set-ups of ``shapedtx compare`` (docs/theory.md#rank-collapse and #checks).

A preset is an :class:`simulations.Experiment`: the shaped model, its input (m tokens,
equicorrelated with rho0), the sample counts and the convergence widths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shapedtx import ModelConfig

if TYPE_CHECKING:  # built on first use: simulations.experiment loads torch and xarray
    from .experiment import Experiment

PRESET_MODELS: dict[str, tuple[ModelConfig, str]] = {
    "block": (
        ModelConfig(width=200, depth=150, attention="shaped", mlp="shaped_relu"),
        "shaped Transformer block: shaped attention + shaped ReLU MLP",
    ),
    "attention": (
        ModelConfig(width=200, depth=150, attention="shaped", mlp="none"),
        "attention-only network: shaped attention, one head, value weights only [ST]",
    ),
    "mlp": (
        ModelConfig(width=200, depth=150, attention="none", mlp="shaped_relu"),
        "MLP-only network: residual shaped-ReLU MLP blocks, no attention [LNR]",
    ),
}
"""The presets' models and descriptions by name, as plain data (torch-free: ``shapedtx compare
--help`` and its usage errors read them); :data:`PRESETS` are the experiments built on them."""

PRESETS: dict[str, Experiment]  # no value here: __getattr__ builds it on first use
"""Presets by name: :class:`simulations.Experiment` s with the default sizes (tokens, samples,
baselines, convergence widths) and the models of :data:`PRESET_MODELS`; ``"block"`` is the
default of ``shapedtx compare``, whose options override any field. Built on first use
(simulations.experiment loads torch)."""


def __getattr__(name: str) -> Any:
    """:data:`PRESETS`, built on first use."""
    if name != "PRESETS":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .experiment import Experiment

    presets = {
        key: Experiment(config, name=key, description=description)
        for key, (config, description) in PRESET_MODELS.items()
    }
    globals()["PRESETS"] = presets
    return presets


QUICK = {
    "width": 32,
    "depth": 24,
    "samples": 256,
    "baseline_samples": 64,
    "convergence_widths": (8, 16),
}
"""Sizes of ``--quick`` (seconds, for smoke tests): the model's width and depth (same T),
then :class:`simulations.Experiment` fields."""
