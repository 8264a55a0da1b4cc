"""Named experiment set-ups of ``shapedtx compare`` (docs/theory.md#rank-collapse and #checks).

A preset fixes the shaped model, its input (m tokens, equicorrelated with rho0), the sample
counts and the standard-attention baselines of the rank-collapse report.
"""

from __future__ import annotations

from dataclasses import dataclass

from shapedtx import ModelConfig, preset


@dataclass(frozen=True)
class Preset:
    """One comparison set-up; every field can be overridden on the command line."""

    description: str
    config: ModelConfig
    tokens: int = 4
    rho0: float = 0.2
    samples: int = 4096
    baseline_samples: int = 256
    convergence_widths: tuple[int, ...] = (4, 8, 16, 32, 64)


PRESETS: dict[str, Preset] = {
    "block": Preset(
        "shaped Transformer block: shaped attention + shaped ReLU MLP",
        ModelConfig(width=200, depth=150, attention="shaped", mlp="shaped_relu"),
    ),
    "attention": Preset(
        "attention-only network: shaped attention, one head, value weights only [ST]",
        ModelConfig(width=200, depth=150, attention="shaped", mlp="none"),
    ),
    "mlp": Preset(
        "MLP-only network: residual shaped-ReLU MLP blocks, no attention [LNR]",
        ModelConfig(width=200, depth=150, attention="none", mlp="shaped_relu"),
    ),
}
"""Presets by name; ``"block"`` is the default of ``shapedtx compare``."""

QUICK = {"width": 32, "depth": 24, "samples": 256, "baseline_samples": 64, "widths": (8, 16)}
"""Sizes of ``--quick`` (seconds, for smoke tests): width, depth (same T), samples."""


def baselines(config: ModelConfig) -> dict[str, ModelConfig]:
    """The standard-architecture baselines of a shaped model at its width, depth and causality.

    Two counterparts of the model itself (docs/theory.md#layers: shaped attention -> softmax, shaped
    ReLU -> ReLU, the same lambda/gamma and heads, without normalisation and with pre-LN), and
    the three vanilla Transformers practitioners train (:mod:`shapedtx.presets`: ``pre_ln``
    (GPT-2), ``post_ln`` and ``no_norm``, unit residual, GELU 4n; 4 heads with W^O, or the
    largest of 2 and 1 that divides the width).
    """
    std = config.replace(
        attention="softmax" if config.attention == "shaped" else config.attention,
        mlp="relu" if config.mlp == "shaped_relu" else config.mlp,
    )
    heads = next(h for h in (4, 2, 1) if config.width % h == 0)
    size = {"width": config.width, "depth": config.depth, "causal": config.causal, "heads": heads}
    return {
        "standard, no norm": std.replace(norm="none"),
        "standard, pre-LN": std.replace(norm="pre"),
        "GPT-2 pre-LN": preset("pre_ln", **size),
        "post-LN": preset("post_ln", **size),
        "no norm, unit residual": preset("no_norm", **size),
    }


def model_label(config: ModelConfig) -> str:
    """Short human-readable name: e.g. ``"shaped attn + shaped_relu MLP"``."""
    parts = []
    if config.attention != "none":
        parts.append(f"{config.attention} attn")
    if config.mlp != "none":
        parts.append(f"{config.mlp} MLP")
    label = " + ".join(parts)
    if config.mlp_ratio != 1 and config.mlp != "none":
        label += f" x{config.mlp_ratio}"
    if config.norm != "none":
        label += f", {config.norm}-LN"
    if config.residual == "unit":
        label += ", X + f(X)"
    label += ", gpt2 init" if config.init == "gpt2" else ""
    return label + (", causal" if config.causal else "")
