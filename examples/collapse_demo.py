"""Rank collapse in one screen: standard vs shaped attention at initialisation.

Runs random ``Transformer`` modules (explicit weights) on an equicorrelated input and prints the
mean token correlation after each group of blocks (docs/theory.md#rank-collapse).

    python examples/collapse_demo.py
"""

from __future__ import annotations

import torch

from shapedtx import ModelConfig, Transformer, equicorrelated, initial_tokens
from shapedtx.metrics import mean_correlation


def main(width: int = 200, depth: int = 50, tokens: int = 4, samples: int = 16) -> None:
    torch.set_default_dtype(torch.float64)
    gen = torch.Generator().manual_seed(0)
    X = initial_tokens(equicorrelated(tokens, 0.2), width, samples, gen)  # X X^T / n = V0
    print(f"mean token correlation, width {width}, {samples} networks, rho0 = 0.2")
    print(f"{'layer':>6} {'standard':>10} {'shaped':>10}")
    rhos = {}
    for kind in ("softmax", "shaped"):
        torch.manual_seed(1)
        config = ModelConfig(width=width, depth=depth, attention=kind)
        with torch.no_grad():
            V = torch.stack([Transformer(config).covariances(x[None])[0] for x in X])
        rhos[kind] = mean_correlation(V).mean(0)
    for layer in (0, 1, 5, 10, 25, depth):
        print(f"{layer:>6} {rhos['softmax'][layer]:>10.3f} {rhos['shaped'][layer]:>10.3f}")


if __name__ == "__main__":
    main()
