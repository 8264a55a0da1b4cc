"""Named model presets: the shaped Transformer and the vanilla Transformers practitioners train.

A preset is a set of :class:`ModelConfig` fields; :func:`preset` builds the config with any
field overridden (width, depth, ...). On the command line: ``--model NAME``.

| preset    | attention | MLP (hidden) | norm | residual         | init   | bias | final LN |
|-----------|-----------|--------------|------|------------------|--------|------|----------|
| shaped    | shaped    | shaped ReLU n | none | lambda X + gamma f | fan_in | no  | no       |
| pre_ln    | softmax   | GELU 4n      | pre  | X + f            | gpt2   | yes  | yes      |
| post_ln   | softmax   | GELU 4n      | post | X + f            | fan_in | yes  | no       |
| no_norm   | softmax   | GELU 4n      | none | X + f            | fan_in | yes  | no       |

All four have 4 heads with W^O. ``pre_ln`` is the GPT-2 / nanoGPT block, ``post_ln`` the
original Transformer's.
"""

from __future__ import annotations

from typing import Any

from .config import ModelConfig

_VANILLA: dict[str, Any] = {
    "attention": "softmax",
    "mlp": "gelu",
    "mlp_ratio": 4,
    "residual": "unit",
    "heads": 4,
    "out_proj": True,
    "bias": True,
}

PRESETS: dict[str, dict[str, Any]] = {
    "shaped": {
        "attention": "shaped",
        "mlp": "shaped_relu",
        "norm": "none",
        "residual": "scaled",
        "init": "fan_in",
        "heads": 4,
        "out_proj": True,
    },
    "pre_ln": {**_VANILLA, "norm": "pre", "init": "gpt2", "final_norm": True},
    "post_ln": {**_VANILLA, "norm": "post", "init": "fan_in"},
    "no_norm": {**_VANILLA, "norm": "none", "init": "fan_in"},
}
"""Preset name -> the ModelConfig fields it sets (everything else keeps its default)."""

PRESET_DESCRIPTIONS: dict[str, str] = {
    "shaped": "shaped attention + shaped ReLU, scaled residual, no LayerNorm",
    "pre_ln": "GPT-2 / nanoGPT block: pre-LN, unit residual, GELU 4n, GPT-2 init, final LN",
    "post_ln": "original Transformer block: post-LN, unit residual, GELU 4n, fan_in init",
    "no_norm": "unit residual without LayerNorm, GELU 4n, fan_in init",
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """The :class:`ModelConfig` of preset ``name`` with ``overrides`` applied (validated).

    >>> preset("pre_ln", width=64, depth=6).mlp_width
    256
    """
    if name not in PRESETS:
        raise ValueError(f"name must be one of {', '.join(map(repr, PRESETS))}, got {name!r}")
    return ModelConfig(**{**PRESETS[name], **overrides})
