"""The standard-architecture baselines of a shaped model and short model labels
(docs/theory.md#layers and #rank-collapse): what ``shapedtx compare`` sets beside the
shaped model in its rank-collapse report."""

from __future__ import annotations

from shapedtx import ModelConfig, preset


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
        # the trainable shape (docs/theory.md#trainable-shape) is the shaped layers'
        mlp_slopes="fixed",
        attention_gains="fixed",
        temperature="fixed",
        residual_gains="fixed",
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
