"""Hypothesis strategies shared by the property-based tests."""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from shapedtx import ModelConfig
from shapedtx.config import (
    ATTENTIONS,
    INITS,
    LAYOUTS,
    MLPS,
    NORM_KINDS,
    NORMS,
    RESIDUALS,
    shaped_relu_slope,
)


@st.composite
def model_configs(
    draw, *, min_width: int = 2, max_width: int = 24, max_depth: int = 6, sde: bool = False
):
    """Valid ModelConfigs over every field (``sde``: only those with a covariance SDE)."""
    width = draw(st.integers(min_width, max_width))
    attention = "shaped" if sde else draw(st.sampled_from(ATTENTIONS))
    mlp = draw(st.sampled_from(("shaped_relu", "none") if sde else MLPS))
    if attention == "none" and mlp == "none":
        mlp = "shaped_relu"
    simplified = attention == "simplified"  # identity W^V, W^O: heads split the width
    fixed_head = not simplified and draw(st.booleans())
    divisors = [h for h in range(1, width + 1) if width % h == 0]
    heads = draw(st.integers(1, 4) if fixed_head else st.sampled_from(divisors))
    head_dim = draw(st.integers(1, 2 * width)) if fixed_head else None
    key_dim = draw(st.none() | st.integers(1, 2 * width))
    out_proj = True if fixed_head else (not simplified and draw(st.booleans()))
    residuals = RESIDUALS if simplified else tuple(r for r in RESIDUALS if r != "skipless")
    residual = "scaled" if sde else draw(st.sampled_from(residuals))
    skipless = residual == "skipless"
    norms = tuple(n for n in NORMS if n != "post") if skipless else NORMS
    bound = -math.sqrt(width)
    return ModelConfig(
        width=width,
        depth=draw(st.integers(1, max_depth)),
        attention=attention,
        mlp=mlp,
        norm="none" if sde else draw(st.sampled_from(norms)),
        norm_kind=draw(st.sampled_from(NORM_KINDS)),
        layout=draw(st.sampled_from(LAYOUTS)) if skipless else "sequential",
        mlp_gain=draw(st.floats(0.01, 2.0)),
        heads=heads,
        key_dim=key_dim,
        head_dim=head_dim,
        out_proj=out_proj,
        tau0=draw(st.floats(0.05, 20.0)),
        gamma=draw(st.floats(0.0, 1.0, exclude_min=True)),
        c_plus=(c_plus := draw(st.floats(bound, 3.0))),
        # not both slopes 0 (the config refuses an identically zero MLP)
        c_minus=draw(
            st.floats(bound, 3.0).filter(
                lambda c: shaped_relu_slope(c, width) or shaped_relu_slope(c_plus, width)
            )
        ),
        causal=draw(st.booleans()),
        residual=residual,
        init="fan_in" if sde else draw(st.sampled_from(INITS)),
        mlp_ratio=1 if sde else draw(st.integers(1, 4)),
        bias=draw(st.booleans()),
        final_norm=draw(st.booleans()),
    )


@st.composite
def covariances(draw, *, max_m: int = 6, dtype: torch.dtype = torch.float64):
    """A positive-definite V0 (m, m), m >= 2: X X^T / n for a seeded Gaussian X (n >= m)."""
    m = draw(st.integers(2, max_m))
    n = draw(st.integers(m, 3 * m))
    seed = draw(st.integers(0, 2**31 - 1))
    X = torch.randn(m, n, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    return X @ X.T / n
