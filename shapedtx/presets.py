"""Named model presets: the shaped Transformer and the vanilla Transformers practitioners train.

A preset is a set of :class:`ModelConfig` fields; :func:`preset` builds the config with any
field overridden (width, depth, ...). On the command line: ``--model NAME``.

| preset    | attention | MLP (hidden) | norm | residual         | init   | bias | final LN |
|-----------|-----------|--------------|------|------------------|--------|------|----------|
| shaped    | shaped    | shaped ReLU n | none | lambda X + gamma f | fan_in | no  | no       |
| pre_ln    | softmax   | GELU 4n      | pre  | X + f            | gpt2   | yes  | yes      |
| post_ln   | softmax   | GELU 4n      | post | X + f            | fan_in | yes  | no       |
| no_norm   | softmax   | GELU 4n      | none | X + f            | fan_in | yes  | no       |
| sas       | simplified | ReLU 4n     | pre RMS | skipless, sequential | gpt2 | no | yes      |
| sas_p     | simplified | ReLU 4n     | pre RMS | skipless, parallel | gpt2 | no  | yes      |
| sas_p_no_norm | simplified | ReLU 4n | none | skipless, parallel | gpt2   | no   | yes      |
| shaped_t  | shaped (tau0 1/4) | shaped ReLU n | none | gamma^2 d/n = 0.005625 | fan_in | no | no |
| pre_ln_depth_mup | softmax | GELU 4n   | pre  | X + f / sqrt(d)  | fan_in | yes  | yes      |
| pre_ln_completep | softmax | GELU 4n   | pre  | X + f / d        | fan_in | yes  | yes      |
| pre_ln_completep_ref | softmax/d_k | GELU 4n | pre | X + f / (d/4) | mup, out 64/n | yes | yes |
| shaped_free | shaped+gains, tau | shaped ReLU 4n | none | lambda X + gamma f | fan_in | no | no |

All have 4 heads; the first four with W^O. ``pre_ln`` is the GPT-2 / nanoGPT block,
``post_ln`` the original Transformer's. ``sas`` and ``sas_p`` are He & Hofmann's simplified
blocks ("Simplifying Transformer Blocks", ICLR 2024; their code's ``skipless`` and
``skipless-parallel`` configs, with ``norm_type=none`` for ``sas_p_no_norm``): shaped attention
with trainable gains and identity value/output maps, no attention skip, trainable branch
gains (MLP 0.1), every weight N(0, 0.02^2), a trainable query bias (zero at initialisation)
and the first block's value map ``r W + s I`` (W zero, r = s = 1, trainable) as their code
builds them (docs/theory.md#simplified; ``ModelConfig.query_bias``, ``first_value``).

The last three are the parametrisations of learning-rate transfer (docs/guide/transfer.md,
:func:`shapedtx.lr_multipliers`): ``shaped_t`` holds ``gamma^2 d / n`` at
:data:`SHAPED_T_GAMMA_T` (``ModelConfig.gamma_t``), the value of ``shapedtx advise`` at width
64, depth 16 (gamma 0.15, tau0 0.25); ``pre_ln_depth_mup`` (Yang et al. 2023, Tensor Programs
VI; Bordelon et al. 2023) and ``pre_ln_completep`` (Dey et al. 2025) are the pre-LN block with
the branch multiplier ``depth^(-1/2)`` or ``depth^(-1)`` (``ModelConfig.depth_alpha``) and
muP's ``1/fan_in`` weight variance instead of GPT-2's init (whose ``1/sqrt(2 depth)`` would
count depth twice). ``pre_ln_completep_ref`` is CompleteP as its reference runs it
(EleutherAI/nanoGPT-mup, branch ``completep``; docs/guide/transfer.md): logits ``q k^T /
d_head`` (``attention_scale="inverse"``), muP's init as the reference draws it (block weights
N(0, 0.02^2 / m_N), embeddings and unembedding N(0, 0.02^2); ``init="mup"``), the output
multiplier ``1 / m_N`` (``output_multiplier``), with ``m_N = width / base_width`` and
``m_L = depth / base_depth`` from the transfer study's base shape, width 64 and its smallest
depth 4 (override ``base_width`` and ``base_depth`` for another base). Train it with
``shapedtx.training.completep_reference_train(base_width, base_depth, ...)`` (AdamW beta2
0.95, epsilon 1e-12 m_N^-1 m_L^-1, lr rules from the base shape).

``shaped_free`` is the shaped Transformer at initialisation, free to learn its shape
(docs/theory.md#trainable-shape): the shaped ReLU's slopes are trainable per hidden unit
(``mlp_slopes="channel"``: every unit can become as nonlinear as it needs, at 2 x 4n
parameters per block, 0.4% of its MLP weights at width 64) and the shaped attention's per-head
gains alpha, beta, gamma_c (``attention_gains="trainable"``) and temperature
(``temperature="trainable"``), all starting at the shaped values, so ``compare``, ``simulate``
and the SDE describe it at initialisation unchanged. It is the ablation's (f), the variant
closest to the strongest baseline among those it ran with 3 seeds at both depths
(examples/ablation/results.md). Take gamma and tau0 from ``shapedtx advise``, as for
``shaped``; its MLP is 4n wide, as in training.
"""

from __future__ import annotations

from typing import Any

from ._validation import ParameterError
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

_SIMPLIFIED: dict[str, Any] = {
    "attention": "simplified",
    "mlp": "relu",
    "mlp_ratio": 4,
    "residual": "skipless",
    "mlp_gain": 0.1,
    "init": "gpt2",
    "heads": 4,
    "out_proj": False,
    "bias": False,
    "final_norm": True,
    "query_bias": True,
    "first_value": "reparametrised",
}

SHAPED_T_GAMMA_T = 0.15**2 * 16 / 64
"""``gamma^2 d / n`` of the ``shaped_t`` preset: ``shapedtx advise`` at width 64, depth 16,
8 causal tokens, 4 heads (gamma 0.15, examples/long_horizon/advice.json)."""

COMPLETEP_REF_BASE = (64, 4)
"""(``base_width``, ``base_depth``) of the ``pre_ln_completep_ref`` preset: the transfer
study's width and smallest depth (examples/transfer)."""

_TRANSFER_PRE_LN: dict[str, Any] = {**_VANILLA, "norm": "pre", "init": "fan_in", "final_norm": True}

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
    "sas": {**_SIMPLIFIED, "layout": "sequential", "norm": "pre", "norm_kind": "rms"},
    "sas_p": {**_SIMPLIFIED, "layout": "parallel", "norm": "pre", "norm_kind": "rms"},
    "sas_p_no_norm": {**_SIMPLIFIED, "layout": "parallel", "norm": "none"},
    "shaped_t": {
        "attention": "shaped",
        "mlp": "shaped_relu",
        "norm": "none",
        "residual": "scaled",
        "init": "fan_in",
        "heads": 4,
        "out_proj": True,
        "tau0": 0.25,
        "gamma_t": SHAPED_T_GAMMA_T,
    },
    "pre_ln_depth_mup": {**_TRANSFER_PRE_LN, "depth_alpha": 0.5},
    "pre_ln_completep": {**_TRANSFER_PRE_LN, "depth_alpha": 1.0},
    "pre_ln_completep_ref": {
        **_TRANSFER_PRE_LN,
        "depth_alpha": 1.0,
        "attention_scale": "inverse",
        "init": "mup",
        "output_multiplier": True,
        "base_width": COMPLETEP_REF_BASE[0],
        "base_depth": COMPLETEP_REF_BASE[1],
    },
    "shaped_free": {
        "attention": "shaped",
        "mlp": "shaped_relu",
        "mlp_ratio": 4,
        "norm": "none",
        "residual": "scaled",
        "init": "fan_in",
        "heads": 4,
        "out_proj": True,
        "mlp_slopes": "channel",
        "attention_gains": "trainable",
        "temperature": "trainable",
    },
}
"""Preset name -> the ModelConfig fields it sets (everything else keeps its default)."""

PRESET_DESCRIPTIONS: dict[str, str] = {
    "shaped": "shaped attention + shaped ReLU, scaled residual, no LayerNorm",
    "pre_ln": "GPT-2 / nanoGPT block: pre-LN, unit residual, GELU 4n, GPT-2 init, final LN",
    "post_ln": "original Transformer block: post-LN, unit residual, GELU 4n, fan_in init",
    "no_norm": "unit residual without LayerNorm, GELU 4n, fan_in init",
    "sas": "He & Hofmann's SAS block: simplified attention, no attention skip, pre-RMSNorm, "
    "ReLU 4n, trainable gains",
    "sas_p": "He & Hofmann's parallel SAS-P block: simplified attention and ReLU 4n MLP in "
    "parallel, no skips, pre-RMSNorm, trainable gains",
    "sas_p_no_norm": "SAS-P without normalisation (a LayerNorm on the first block's input only)",
    "shaped_t": "shaped, tau0 0.25, gamma from T: gamma^2 depth / width held at 0.005625",
    "pre_ln_depth_mup": "pre-LN with branch multiplier 1/sqrt(depth) and 1/fan_in init (depth-muP)",
    "pre_ln_completep": "pre-LN with branch multiplier 1/depth and 1/fan_in init (CompleteP)",
    "pre_ln_completep_ref": "CompleteP as its reference runs it: pre-LN, branch multiplier "
    "base_depth/depth, logits / d_head, muP init (0.02), output multiplier base_width/width",
    "shaped_free": "shaped at initialisation, free to learn: shaped ReLU 4n with trainable "
    "per-channel slopes, shaped attention with trainable per-head gains and temperature",
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """The :class:`ModelConfig` of preset ``name`` with ``overrides`` applied (validated).

    >>> preset("pre_ln", width=64, depth=6).mlp_width
    256
    """
    if name not in PRESETS:
        raise ParameterError(
            "name", f"name must be one of {', '.join(map(repr, PRESETS))}, got {name!r}"
        )
    return ModelConfig(**{**PRESETS[name], **overrides})
