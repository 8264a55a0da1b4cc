"""Named experiment set-ups of ``shapedtx compare`` (docs/theory.md#rank-collapse and #checks).

A preset is an :class:`simulations.Experiment`: the shaped model, its input (m tokens,
equicorrelated with rho0), the sample counts and the convergence widths.
"""

from __future__ import annotations

from shapedtx import ModelConfig

from .experiment import Experiment

PRESETS: dict[str, Experiment] = {
    preset.name: preset
    for preset in (
        Experiment(
            ModelConfig(width=200, depth=150, attention="shaped", mlp="shaped_relu"),
            name="block",
            description="shaped Transformer block: shaped attention + shaped ReLU MLP",
        ),
        Experiment(
            ModelConfig(width=200, depth=150, attention="shaped", mlp="none"),
            name="attention",
            description=(
                "attention-only network: shaped attention, one head, value weights only [ST]"
            ),
        ),
        Experiment(
            ModelConfig(width=200, depth=150, attention="none", mlp="shaped_relu"),
            name="mlp",
            description="MLP-only network: residual shaped-ReLU MLP blocks, no attention [LNR]",
        ),
    )
}
"""Presets by name: :class:`simulations.Experiment` s with the default sizes (tokens, samples,
baselines, convergence widths) and these models; ``"block"`` is the default of
``shapedtx compare``, whose options override any field."""

QUICK = {
    "width": 32,
    "depth": 24,
    "samples": 256,
    "baseline_samples": 64,
    "convergence_widths": (8, 16),
}
"""Sizes of ``--quick`` (seconds, for smoke tests): the model's width and depth (same T),
then :class:`simulations.Experiment` fields."""
